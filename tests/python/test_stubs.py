"""The hand-written stubs match the extension module, document it, and
give type checkers a complete picture of the package."""

import ast
import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("mypy")


def test_stubtest():
    proc = subprocess.run(
        [sys.executable, "-m", "mypy.stubtest", "reconq"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


STUB = pathlib.Path(__file__).resolve().parents[2] / "python" / "reconq" / "_native.pyi"


def test_every_public_class_function_and_method_of_the_stub_has_a_docstring():
    """Editors show the stub's docstrings on hover: an undocumented name shows
    nothing. A constructor (``__new__``) is documented by its class."""
    tree = ast.parse(STUB.read_text())
    missing = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
            if ast.get_docstring(node) is None:
                missing.append(node.name)
        if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            if ast.get_docstring(node) is None:
                missing.append(node.name)
            for member in node.body:
                if isinstance(member, ast.FunctionDef) and not member.name.startswith("_"):
                    if ast.get_docstring(member) is None:
                        missing.append(f"{node.name}.{member.name}")
    assert not missing, f"no docstring in _native.pyi: {missing}"


def test_type_completeness_of_the_public_api():
    """``pyright --verifytypes`` (basedpyright, which bundles its runtime) over
    the installed package: every exported symbol's type is known."""
    proc = subprocess.run(
        [sys.executable, "-m", "basedpyright", "--verifytypes", "reconq", "--outputjson"],
        capture_output=True,
        text=True,
        timeout=300,
        # pyright asks the first `python` on PATH where packages are.
        env={**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")},
    )
    report = json.loads(proc.stdout)
    completeness = report["typeCompleteness"]
    assert completeness["exportedSymbolCounts"]["withKnownType"] > 50, completeness
    assert completeness["completenessScore"] >= 0.95, [
        (s["name"], [d["message"] for d in s["diagnostics"]])
        for s in completeness["symbols"]
        if not s["isTypeKnown"]
    ]


def strict_type_errors(tmp_path, source: str) -> list:
    """The error lines `mypy --strict` reports for `source` (as prog.py)."""
    prog = tmp_path / "prog.py"
    prog.write_text(source)
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", str(prog)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    return [line for line in proc.stdout.splitlines() if ": error:" in line]


#: Programs that use the stubs as users do: `mypy --strict` must accept each
#: but for the one line marked `# E:`, which it must reject.
PROGRAMS = {
    "a_typical_program": """
        import reconq
        q = reconq.WorkQueue(reconq.MaxOf(reconq.ExponentialBackoff(0.005, 10), reconq.TokenBucket(10, 100)))
        q.add(('ns', 'name'))
        q.add_after(1, 0.5)
        key = q.get(timeout=1.0)
        q.done(key)
        n: int = len(q) + q.num_requeues(key)
        ok: bool = q.shut_down_with_drain() and q.shutting_down
        w: float = reconq.default_rate_limiter().when(b'k')
        r = reconq.Requeue(after=1)
        e: Exception = reconq.RetryAfter(2, 'busy')
        q.add(1.5)  # E: not a key
    """,
    "manager_usage": """
        import reconq
        with reconq.Manager() as m:
            m.update('sync', lambda: None, stop=print, interval=1, error_retry_base=0.5, no_error_retry=True)
            m.trigger('sync')
            s = m.status()[0]
            n: int = s['failures'] + len(m)
            err: 'str | None' = s['last_error']
            ok: bool = 'sync' in m
            m.remove('sync', wait=True)
            m.remove_all()
        m.update(1, lambda: None)  # E: not a name
    """,
    "status_usage": """
        import reconq
        for e in reconq.status():
            n: int = e['successes'] + e['failures'] + e['consecutive_failures']
            err: 'str | None' = e['last_error']
            t: 'float | None' = e['last_success_time']
            if e['kind'] == 'controller':
                depth: int = e['depth'] + len(e['hanging'])
            elif e['kind'] == 'periodic':
                manager: str = e['manager']
            else:
                synced: bool = e['synced'] and e['keys'] + e['relists'] > 0
                position: 'str | None' = e['position']
        table: str = reconq.format_status()
        name: str = reconq.Manager(name='jobs').name
        reconq.status()[0]['is_leader']  # E: cache entries have no leader fields
    """,
    "cache_and_sources_usage": """
        import threading
        from typing import Any, Iterator, Union
        import reconq
        def changes(position: Any, stop: threading.Event) -> Iterator[Union[reconq.Put, reconq.Delete, reconq.Bookmark]]:
            yield reconq.Put('k', {'a': 1}, position=1, version=1)
            yield reconq.Delete('k', position=2)
            yield reconq.Bookmark(3)
            raise reconq.PositionExpired('compacted')
        source = reconq.Source(lambda: ({'k': 1}, 0), changes, name='mine')
        polled = reconq.PollingSource(lambda: [('a', 1), ('b', 2, 'v2')], interval=30)
        etcd = reconq.EtcdSource(['http://127.0.0.1:2379'], '/items/', decode=bytes.decode)
        cache = reconq.Cache(polled, name='items', indexes={'size': lambda key, obj: [obj]})
        cache.start()
        ok: bool = cache.wait_synced(timeout=5) and cache.synced and 'a' in cache
        obj = cache.get('a')
        keys: 'list[Any]' = cache.keys() + cache.by_index('size', 1)
        stats = cache.stats()
        n: int = len(cache) + stats['relists'] + stats['events'] + stats['errors']
        err: 'str | None' = stats['last_error']
        c = reconq.Controller(lambda key: None, sync_timeout=30)
        c.watch_cache(cache, map=lambda key, obj: [key, ('owner', key)], predicate=lambda old, new: old != new,
                      resync=600, priority=10, list_priority=-100)
        c.watch_cache(cache, map=lambda key, obj: key)
        synced: bool = c.wait_synced(timeout=5)
        errors: int = c.stats()['handler_errors']
        cache.stop()
        cache.flush()
        reconq.Cache(polled, name='kept', store='state.db').flush()
        reconq.Cache(polled, store=3)  # E: store= takes a path or a SqliteStore
    """,
    "context_and_scheduling_usage": """
        import reconq
        def reconcile(key: object) -> None:
            ctx = reconq.context()
            n: int = ctx.attempt + ctx.priority
            token: 'int | None' = ctx.fencing_token
            if ctx.cancelled or ctx.wait_cancelled(timeout=0.5):
                return
        c = reconq.Controller(reconcile, workers=4, timeout=30, group=lambda key: key[0], max_in_flight_per_group=2)
        c.enqueue(('tenant', 'x'), priority=10)
        c.enqueue_after('y', 1.5, priority=-1)
        ready: int = sum(c.stats()['by_priority'].values())
        reconq.WorkQueue().add('z', priority=3)
        reconq.Manager().update('m', lambda: None, max_retry_interval=10)
        c.enqueue('k', priority='high')  # E: not an int
    """,
    "reject_reconciles_returning_the_wrong_thing": """
        import reconq
        def ok(key: reconq.Key) -> 'reconq.Requeue | None':
            return reconq.Requeue(after=60)
        def wrong(key: object) -> int:
            return 1
        reconq.Controller(ok)
        reconq.Controller(wrong)  # E: returns int
        v: str = reconq.__version__
    """,
    "testing_and_stopping_usage": """
        import reconq
        clock = reconq.FakeClock()
        clock.advance(0.5)
        t: float = clock.now()
        c = reconq.Controller(lambda key: None, clock=clock, jitter=(0.1, 42), parked_capacity=100)
        q = reconq.WorkQueue(clock=clock)
        report = c.stop_with_report(timeout=5)
        done: bool = report['finished']
        left: 'list[reconq.Key]' = report['unfinished'] + report['dropped']
        c.run(stop_timeout=10)
        reconq.Controller(lambda key: None, jitter=0.1)  # E: not a tuple
    """,
}


@pytest.mark.parametrize("source", PROGRAMS.values(), ids=PROGRAMS.keys())
def test_stubs_type_check(tmp_path, source):
    source = textwrap.dedent(source).lstrip("\n")
    (marked,) = [n for n, line in enumerate(source.splitlines(), 1) if "# E:" in line]
    errors = strict_type_errors(tmp_path, source)
    assert len(errors) == 1 and f"prog.py:{marked}:" in errors[0], errors

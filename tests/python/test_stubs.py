"""The hand-written stubs match the extension module."""

import subprocess
import sys

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


def test_stubs_type_check_a_typical_program(tmp_path):
    errors = strict_type_errors(
        tmp_path,
        "import reconq\n"
        "q = reconq.WorkQueue(reconq.MaxOf(reconq.ExponentialBackoff(0.005, 10), reconq.TokenBucket(10, 100)))\n"
        "q.add(('ns', 'name'))\n"
        "q.add_after(1, 0.5)\n"
        "key = q.get(timeout=1.0)\n"
        "q.done(key)\n"
        "n: int = len(q) + q.num_requeues(key)\n"
        "ok: bool = q.shut_down_with_drain() and q.shutting_down\n"
        "w: float = reconq.default_rate_limiter().when(b'k')\n"
        "r = reconq.Requeue(after=1)\n"
        "e: Exception = reconq.RetryAfter(2, 'busy')\n"
        "q.add(1.5)  # E: not a key\n",
    )
    assert len(errors) == 1 and "prog.py:12:" in errors[0], errors


def test_stubs_type_check_manager_usage(tmp_path):
    errors = strict_type_errors(
        tmp_path,
        "import reconq\n"
        "with reconq.Manager() as m:\n"
        "    m.update('sync', lambda: None, stop=print, interval=1, error_retry_base=0.5, no_error_retry=True)\n"
        "    m.trigger('sync')\n"
        "    s = m.status()[0]\n"
        "    n: int = s['failures'] + len(m)\n"
        "    err: 'str | None' = s['last_error']\n"
        "    ok: bool = 'sync' in m\n"
        "    m.remove('sync', wait=True)\n"
        "    m.remove_all()\n"
        "m.update(1, lambda: None)  # E: not a name\n",
    )
    assert len(errors) == 1 and "prog.py:11:" in errors[0], errors


def test_stubs_type_check_status_usage(tmp_path):
    errors = strict_type_errors(
        tmp_path,
        "import reconq\n"
        "for e in reconq.status():\n"
        "    n: int = e['successes'] + e['failures'] + e['consecutive_failures']\n"
        "    err: 'str | None' = e['last_error']\n"
        "    t: 'float | None' = e['last_success_time']\n"
        "    if e['kind'] == 'controller':\n"
        "        depth: int = e['depth'] + len(e['hanging'])\n"
        "    else:\n"
        "        manager: str = e['manager']\n"
        "table: str = reconq.format_status()\n"
        "name: str = reconq.Manager(name='jobs').name\n"
        "reconq.status()[0]['depth']  # E: periodic entries have no depth\n",
    )
    assert len(errors) == 1 and "prog.py:12:" in errors[0], errors


def test_stubs_type_check_context_and_scheduling_usage(tmp_path):
    errors = strict_type_errors(
        tmp_path,
        "import reconq\n"
        "def reconcile(key: object) -> None:\n"
        "    ctx = reconq.context()\n"
        "    n: int = ctx.attempt + ctx.priority\n"
        "    token: 'int | None' = ctx.fencing_token\n"
        "    if ctx.cancelled or ctx.wait_cancelled(timeout=0.5):\n"
        "        return\n"
        "c = reconq.Controller(reconcile, workers=4, timeout=30, group=lambda key: key[0], max_in_flight_per_group=2)\n"
        "c.enqueue(('tenant', 'x'), priority=10)\n"
        "c.enqueue_after('y', 1.5, priority=-1)\n"
        "ready: int = sum(c.stats()['by_priority'].values())\n"
        "reconq.WorkQueue().add('z', priority=3)\n"
        "reconq.Manager().update('m', lambda: None, max_retry_interval=10)\n"
        "c.enqueue('k', priority='high')  # E: not an int\n",
    )
    assert len(errors) == 1 and "prog.py:14:" in errors[0], errors


def test_stubs_reject_reconciles_returning_the_wrong_thing(tmp_path):
    errors = strict_type_errors(
        tmp_path,
        "import reconq\n"
        "def ok(key: reconq.Key) -> 'reconq.Requeue | None':\n"
        "    return reconq.Requeue(after=60)\n"
        "def wrong(key: object) -> int:\n"
        "    return 1\n"
        "reconq.Controller(ok)\n"
        "reconq.Controller(wrong)  # E: returns int\n"
        "v: str = reconq.__version__\n",
    )
    assert len(errors) == 1 and "prog.py:7:" in errors[0], errors


def test_stubs_type_check_testing_and_stopping_usage(tmp_path):
    errors = strict_type_errors(
        tmp_path,
        "import reconq\n"
        "clock = reconq.FakeClock()\n"
        "clock.advance(0.5)\n"
        "t: float = clock.now()\n"
        "c = reconq.Controller(lambda key: None, clock=clock, jitter=(0.1, 42), parked_capacity=100)\n"
        "q = reconq.WorkQueue(clock=clock)\n"
        "report = c.stop_with_report(timeout=5)\n"
        "done: bool = report['finished']\n"
        "left: 'list[reconq.Key]' = report['unfinished'] + report['dropped']\n"
        "c.run(stop_timeout=10)\n"
        "reconq.Controller(lambda key: None, jitter=0.1)  # E: not a tuple\n",
    )
    assert len(errors) == 1 and "prog.py:11:" in errors[0], errors

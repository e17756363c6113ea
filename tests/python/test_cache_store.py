"""Caches with a store from Python (guarantees E9): a restart reconciles
exactly the keys created, changed or deleted while the program was down
(a Python Source with versions, without (digests of the objects, also
for a PollingSource, across processes), and with versions that cannot be
kept; an EtcdSource over a real etcd), a delete found then reaches map and
predicate with None (with the kept object, over etcd: it resumed),
Cache.flush() (and a SIGKILL right after it), and bad
input refused with nothing changed."""

from __future__ import annotations

import inspect
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Dict, Iterator, List, Set, Tuple

import pytest

import reconq
from etcd_server import Etcd
from waiting import PATIENCE

HOUR = 3600.0


def quiet_changes(position: Any, stop: threading.Event) -> Iterator[Any]:
    """A stream with no changes: blocks until the cache stops."""
    stop.wait()
    return iter(())


class System:
    """Items key -> (value, version) a Source lists; version None: none."""

    def __init__(self, n: int) -> None:
        self.items: Dict[str, Tuple[int, Any]] = {f"k{i:02}": (i, 1) for i in range(n)}

    def source(self, versions: str = "int") -> reconq.Source:
        def version(v: Any) -> Any:
            return {"int": v, "str": f"v{v}", "none": None, "unkept": (v, "tuple")}[versions]

        listed = [(key, value, version(v)) for key, (value, v) in self.items.items()]
        return reconq.Source(lambda: (listed, 1), quiet_changes)

    def change_while_down(self) -> Set[str]:
        """Changes 2 keys, deletes 2, creates 2; returns them."""
        for key in ("k00", "k01"):
            value, version = self.items[key]
            self.items[key] = (value + 100, version + 1)
        del self.items["k02"], self.items["k03"]
        self.items["new0"] = (7, 1)
        self.items["new1"] = (8, 1)
        return {"k00", "k01", "k02", "k03", "new0", "new1"}


class Run:
    """One run of a controller watching a stored cache, to the end of its
    reconciles: what it reconciled, and what map and predicate were given."""

    def __init__(self, db: Path, source: Any, name: str = "items") -> None:
        self.lock = threading.Lock()
        self.reconciled: Set[Any] = set()
        self.mapped: List[Tuple[Any, Any]] = []
        self.predicated: List[Tuple[Any, Any]] = []
        self.cache = reconq.Cache(source, name=name, store=str(db))
        self.controller = reconq.Controller(self.reconcile, name="sync", store=str(db))
        self.controller.watch_cache(self.cache, map=self.map, predicate=self.predicate)
        self.controller.start()
        assert self.cache.wait_synced(PATIENCE)
        # The deletes a restart finds are enqueued by the time it returns.
        self.cache.flush()
        assert self.controller.wait_idle(PATIENCE)

    def reconcile(self, key: Any) -> None:
        with self.lock:
            self.reconciled.add(key)

    def map(self, key: Any, obj: Any) -> List[Any]:
        with self.lock:
            self.mapped.append((key, obj))
        return [key]

    def predicate(self, old: Any, new: Any) -> bool:
        with self.lock:
            self.predicated.append((old, new))
        return True

    def stop(self) -> "Run":
        self.cache.flush()
        self.controller.stop(drain=True)
        self.cache.stop()
        return self


@pytest.mark.parametrize("versions", ["int", "str", "none"])
def test_a_restart_reconciles_exactly_what_changed_while_down(tmp_path: Path, versions: str) -> None:
    db = tmp_path / "state.db"
    system = System(20)
    assert len(Run(db, system.source(versions)).stop().reconciled) == 20
    changed = system.change_while_down()
    second = Run(db, system.source(versions)).stop()
    assert second.reconciled == changed
    deletes = sorted(entry for entry in second.mapped if entry[0] in ("k02", "k03"))
    assert deletes == [("k02", None), ("k03", None)], "a delete found at a restart reaches map with None"
    assert (None, None) in second.predicated, "and predicate with (None, None)"
    assert Run(db, system.source(versions)).stop().reconciled == set(), "nothing changed: nothing reconciled"


def test_with_versions_that_cannot_be_kept_every_listed_key_counts_as_changed(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    system = System(10)
    Run(db, system.source("unkept")).stop()
    system.change_while_down()
    second = Run(db, system.source("unkept")).stop()
    assert second.reconciled == set(system.items) | {"k02", "k03"}, "10 listed + 2 deletes found"


def objects(n: int) -> Dict[str, Any]:
    """Objects of a source without versions, the same in every process:
    plain data (digested) and one holding a frozenset (no digest: always
    changed)."""
    items: Dict[str, Any] = {}
    for i in range(n):
        spec = {"replicas": i, "image": f"app:{i}", "ratio": i / 4, "big": 2**80 + i, "ports": [80, 443 + i]}
        spec["extra"] = ("a", b"b", None, True, {3: "x"})
        items[f"k{i:02}"] = {"spec": spec}
    items["odd"] = {"tags": frozenset({"x"})}
    return items


DIGEST_CHILD = "from typing import Any, Dict\n" + inspect.getsource(objects) + r"""
import sys, reconq
reconciled = set()
store = reconq.SqliteStore(sys.argv[1])
cache = reconq.Cache(reconq.PollingSource(lambda: objects(int(sys.argv[2])), 3600), name="items", store=store)
c = reconq.Controller(reconciled.add, name="sync", store=store)
c.watch_cache(cache)
c.start()
assert cache.wait_synced(60)
cache.flush()
assert c.wait_idle(60)
cache.flush()
c.stop(drain=True)
cache.stop()
print(len(reconciled), flush=True)
"""


def test_without_versions_a_restart_compares_digests_of_the_objects(tmp_path: Path) -> None:
    """A PollingSource gives no versions: the store keeps a digest of each
    object, stable across processes (the first run is another process,
    with its own hash seed), so a restart reconciles the 2 keys changed
    and the 1 deleted while down, not all 21; an object that has no digest
    (it holds a frozenset) counts as changed at every restart."""
    db = tmp_path / "state.db"
    n = 20
    first = subprocess.run(
        [sys.executable, "-c", DIGEST_CHILD, str(db), str(n)],
        capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONHASHSEED": "random"},
    )
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip() == str(n + 1), "the first run reconciles every key"
    system = objects(n)
    system["k00"]["spec"]["replicas"] = 100
    system["k01"]["spec"]["extra"][4][3] = "y"
    del system["k02"]
    second = Run(db, reconq.PollingSource(lambda: system, HOUR)).stop()
    assert second.reconciled == {"k00", "k01", "k02", "odd"}
    assert ("k02", None) in second.mapped, "the delete found at the restart"
    third = Run(db, reconq.PollingSource(lambda: system, HOUR)).stop()
    assert third.reconciled == {"odd"}, "nothing changed: only the object without a digest"


def test_a_watching_controller_needs_the_cache_s_store_file(tmp_path: Path) -> None:
    cache = reconq.Cache(System(3).source(), name="items", store=str(tmp_path / "a.db"))
    for store in (None, str(tmp_path / "b.db")):
        controller = reconq.Controller(lambda key: None, name="sync", store=store)
        controller.watch_cache(cache)
        with pytest.raises(ValueError, match='cannot watch cache "items"'):
            controller.start()
    assert not cache.synced and cache.stats()["keys"] == 0, "the cache was not started"
    assert not any(p.name.endswith(".lock") for p in tmp_path.iterdir()), "no name was claimed"
    # After start, watch_cache itself refuses.
    running = reconq.Controller(lambda key: None, name="other", store=str(tmp_path / "b.db"))
    running.start()
    try:
        with pytest.raises(ValueError, match='cannot watch cache "items"'):
            running.watch_cache(cache)
    finally:
        running.stop()
    cache.stop()


def test_cache_names_are_unique_among_a_file_s_caches(tmp_path: Path) -> None:
    db = str(tmp_path / "a.db")
    first = reconq.Cache(System(1).source(), name="items", store=db)
    with pytest.raises(ValueError, match="unique"):
        reconq.Cache(System(1).source(), name="items", store=reconq.SqliteStore(db))
    reconq.Cache(System(1).source(), name="other", store=db)
    reconq.Cache(System(1).source(), name="items", store=str(tmp_path / "b.db"))
    del first
    reconq.Cache(System(1).source(), name="items", store=db)


def test_flush_without_a_store_or_a_watching_controller_returns_at_once(tmp_path: Path) -> None:
    reconq.Cache(System(1).source(), name="plain").flush()
    reconq.Cache(System(1).source(), name="alone", store=str(tmp_path / "a.db")).flush()


FLUSH_CHILD = r"""
import sys, threading, reconq
n = int(sys.argv[2])
def quiet(position, stop):
    stop.wait()
    return iter(())
items = [(f"k{i}", i, 1) for i in range(n)]
# Flushes an hour apart: only flush() can have written anything by the kill.
store = reconq.SqliteStore(sys.argv[1], flush_interval=3600.0)
cache = reconq.Cache(reconq.Source(lambda: (items, 1), quiet), name="items", store=store)
# Every reconcile blocks: each key stays pending.
c = reconq.Controller(lambda key: threading.Event().wait(), name="sync", workers=2, store=store)
c.watch_cache(cache)
c.start()
assert cache.wait_synced(60)
cache.flush()
print("flushed", flush=True)
threading.Event().wait()
"""


def test_sigkill_right_after_cache_flush_keeps_everything_applied_before(tmp_path: Path) -> None:
    """The key set and the keys its list enqueued are on disk once
    Cache.flush() returned: the restart delivers nothing again (kept),
    and every key comes back pending (section 9)."""
    n = 50
    for round in range(3):
        db = tmp_path / f"round-{round}.db"
        proc = subprocess.Popen([sys.executable, "-c", FLUSH_CHILD, str(db), str(n)], stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "flushed"
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
        listed = [(f"k{i}", i, 1) for i in range(n)]
        again = Run(db, reconq.Source(lambda: (listed, 1), quiet_changes)).stop()
        assert again.mapped == [], f"round {round}: the kept key set survived: no key delivered again"
        assert again.reconciled == {f"k{i}" for i in range(n)}, f"round {round}: every pending key came back"


PREFIX = "/w11/"


def test_an_etcd_cache_restart_reconciles_exactly_what_changed(tmp_path: Path, etcd: Etcd) -> None:
    db = tmp_path / "state.db"
    for i in range(20):
        etcd.put(f"{PREFIX}k{i:02}", str(i))

    def source() -> reconq.EtcdSource:
        return reconq.EtcdSource(etcd.endpoint, PREFIX)

    assert len(Run(db, source()).stop().reconciled) == 20
    etcd.put(f"{PREFIX}k00", "changed")
    etcd.put(f"{PREFIX}k01", "1")  # the same value, a new mod_revision: changed
    etcd.delete(f"{PREFIX}k02")
    etcd.put(f"{PREFIX}new", "x")
    second = Run(db, source()).stop()
    assert second.reconciled == {"k00", "k01", "k02", "new"}
    # The restart resumed from the kept revision (issue 36): the delete
    # came from etcd's stream, with the object the cache had kept, where
    # a relist found it with None.
    assert ("k02", b"2") in second.mapped
    assert Run(db, source()).stop().reconciled == set()



FAILED_FLUSH_CHILD = r"""
import resource, signal, sys, threading, reconq
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # "file too large" as an error, not a kill
def quiet(position, stop):
    stop.wait()
    return iter(())
release = threading.Event()
items = [(f"{i:0>100}", i, 1) for i in range(3000)]
store = reconq.SqliteStore(sys.argv[1], flush_interval=3600.0)
cache = reconq.Cache(reconq.Source(lambda: (release.wait(), (items, 1))[1], quiet), name="items", store=store)
c = reconq.Controller(lambda key: threading.Event().wait(), name="sync", store=store)
c.watch_cache(cache)
c.start()
c.flush()  # the file exists before the limit
resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, resource.RLIM_INFINITY))
release.set()
assert cache.wait_synced(60)
try:
    cache.flush()
    raise AssertionError("a write past the file size limit fails")
except OSError as e:
    assert "store I/O error" in str(e), e
assert c.stats()["store_error"] is not None, c.stats()
resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
cache.flush()
assert c.stats()["store_pending"] == 0 and c.stats()["store_error"] is None, c.stats()
print("raised, then flushed", flush=True)
"""


def test_a_failed_write_raises_from_cache_flush_and_keeps_the_rows_for_the_next(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    out = subprocess.run(
        [sys.executable, "-c", FAILED_FLUSH_CHILD, str(db)], capture_output=True, text=True, timeout=120
    )
    assert out.stdout.strip() == "raised, then flushed", out.stderr
    # The rows the failed write lost were written by the next: a restart
    # delivers nothing again.
    listed = [(f"{i:0>100}", i, 1) for i in range(3000)]
    again = Run(db, reconq.Source(lambda: (listed, 1), quiet_changes)).stop()
    assert again.mapped == [] and len(again.reconciled) == 3000


def test_wait_idle_waits_for_the_creates_held_until_their_trace_is_written(tmp_path: Path) -> None:
    """With a store, a watched cache's creates reach the queue only once
    their trace is written (E9); until then they are work the controller
    has, so `wait_idle` after `wait_synced` returns once they ran (it used
    to return at once, before the first write: 46 of 60 runs)."""
    for run in range(10):
        state = str(tmp_path / f"state-{run}.db")
        desired = {f"k{i}": i for i in range(20)}
        cache = reconq.Cache(reconq.PollingSource(lambda: dict(desired), 0.05), name="held", store=state)
        ran: Set[str] = set()
        lock = threading.Lock()

        def reconcile(key: str) -> None:
            with lock:
                ran.add(key)

        c = reconq.Controller(reconcile, workers=2, name="held", store=state)
        c.watch_cache(cache)
        c.set_dependencies("report", ["k0"])  # enqueued when k0's run ends (D2)
        c.start()
        try:
            assert c.wait_synced(PATIENCE)
            assert c.wait_idle(PATIENCE)
            with lock:
                assert ran == {*desired, "report"}, (run, sorted(ran))
        finally:
            c.stop()
            cache.stop(PATIENCE)

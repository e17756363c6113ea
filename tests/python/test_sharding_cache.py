"""Replicas with caches on a real etcd (guarantees §17, C1): a replica that
gains partitions reconciles the keys its watched caches hold in them, and
the deletes they applied while another replica owned the keys (``map``
given None), with ``partition_by``, the gained keys ordered by their
dependencies. The user report of issue 34 runs with real processes
(``sharding_cache_child.py``): the owner of ``k3`` is SIGKILLed inside
``k3``'s reconcile, and the survivor, owning every partition, reconciles
``k3``. The other tests run two replicas in this process. The Rust side is
tests/sharding_cache.rs.
"""

from __future__ import annotations

import math
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import pytest

import reconq
from etcd_server import Etcd
from gil_holds import GilHolds
from waiting import PATIENCE, wait_for

HERE = Path(__file__).parent
PREFIX = "/objects/"
PARTITIONS = 4


@pytest.fixture
def etcd() -> Iterator[Etcd]:
    server = Etcd()
    try:
        yield server
    finally:
        server.close()


def record_lines(path: Path) -> List[Tuple[int, str, str, float]]:
    """(pid, key, value seen, time) of every reconcile begun."""
    if not path.exists():
        return []
    lines = []
    for line in path.read_text().splitlines():
        pid, key, seen, _, at = line.split()
        lines.append((int(pid), key, seen, float(at)))
    return lines


def test_the_owner_sigkilled_inside_a_reconcile_leaves_its_keys_to_the_survivor(etcd: Etcd, tmp_path: Path) -> None:
    record = tmp_path / "record"
    procs: Dict[int, "subprocess.Popen[str]"] = {}
    try:
        for who in ("a", "b"):
            proc = subprocess.Popen(
                [sys.executable, str(HERE / "sharding_cache_child.py"), etcd.endpoint, str(record), who,
                 "--hang", "k3"],
                stdout=subprocess.PIPE, text=True, cwd=str(HERE),
            )
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
            procs[proc.pid] = proc
        partitions = "/reconq/shard/objects/partitions/"

        def split() -> bool:
            holders = Counter(etcd.keys(partitions).values())
            return sorted(holders.values()) == [2, 2]

        wait_for(split, timeout=PATIENCE + 10, what="two partitions each")
        for i in range(5):
            etcd.put(f"{PREFIX}k{i}", f"v{i}")
        owner = wait_for(
            lambda: next((pid for pid, key, _, _ in record_lines(record) if key == "k3"), None),
            what="k3's reconcile to begin",
        )
        wait_for(lambda: {key for _, key, _, _ in record_lines(record)} >= {f"k{i}" for i in range(5)},
                 what="every key reconciled once")
        killed = time.monotonic()
        procs.pop(owner).send_signal(signal.SIGKILL)
        survivor = next(iter(procs))

        def survivor_holds_every_partition() -> bool:
            holders = etcd.keys(partitions)
            return len(holders) == PARTITIONS and len(set(holders.values())) == 1

        wait_for(survivor_holds_every_partition, timeout=PATIENCE + 10, what="the survivor to own every partition")
        wait_for(
            lambda: any(pid == survivor and key == "k3" and seen == "v3" and at > killed
                        for pid, key, seen, at in record_lines(record)),
            timeout=PATIENCE + 10,
            what="the survivor to reconcile k3",
        )
    finally:
        for proc in procs.values():
            proc.kill()
            proc.wait()


class Replica:
    """A sharded controller of this process watching its own cache."""

    def __init__(self, etcd: Etcd, group: str, who: str, runs: List[Tuple[str, str, Optional[str], float]],
                 partition_by: Optional[Callable[[Any], Any]] = None,
                 map: Optional[Callable[[str, Any], Any]] = None) -> None:
        self.cache = reconq.Cache(reconq.EtcdSource(etcd.endpoint, PREFIX, decode=bytes.decode), name=f"{group}-{who}")
        lock = threading.Lock()

        def reconcile(key: str) -> None:
            with lock:
                runs.append((who, key, self.cache.get(key), time.monotonic()))

        sharding = reconq.Sharding(etcd.endpoint, group, partitions=PARTITIONS, ttl=2.0, identity=who,
                                   partition_by=partition_by)
        self.controller = reconq.Controller(reconcile, name=f"{group}-{who}", workers=2, sharding=sharding)
        self.controller.watch_cache(self.cache, map=map)

    def start(self) -> "Replica":
        self.controller.start()
        return self


def ran(runs: List[Tuple[str, str, Optional[str], float]], who: str, key: str, value: Optional[str],
        since: float = 0.0) -> bool:
    return any(w == who and k == key and v == value and at >= since for w, k, v, at in runs)


def two_each(a: Replica, b: Replica) -> bool:
    return len(a.controller.owned_partitions()) == 2 and len(b.controller.owned_partitions()) == 2


def pipeline(key: str) -> str:
    return key.split("/")[0]


def test_a_delete_applied_while_not_owning_reaches_the_next_owner_with_map_none(etcd: Etcd) -> None:
    runs: List[Tuple[str, str, Optional[str], float]] = []
    mapped: List[Tuple[str, bool, float]] = []

    def map_of_b(key: str, obj: Any) -> List[str]:
        mapped.append((key, obj is None, time.monotonic()))
        return [key]

    a = Replica(etcd, "tomb", "a", runs, partition_by=pipeline).start()
    b = Replica(etcd, "tomb", "b", runs, partition_by=pipeline, map=map_of_b).start()
    try:
        wait_for(lambda: two_each(a, b), timeout=PATIENCE + 10, what="two partitions each")
        mine = a.controller.owned_partitions()
        of_a = [f"p{i}" for i in range(40) if reconq.partition_of(f"p{i}", PARTITIONS) in mine][:2]
        keys = [f"{p}/{stage}" for p in of_a for stage in ("x", "y")]
        for key in keys:
            etcd.put(PREFIX + key, "v1")
        wait_for(lambda: all(ran(runs, "a", k, "v1") for k in keys), what="a reconciled its keys")
        gone = keys[0]
        deleted = time.monotonic()
        etcd.delete(PREFIX + gone)
        wait_for(lambda: ran(runs, "a", gone, None, deleted), what="a reconciled the delete")
        wait_for(lambda: any(k == gone and at >= deleted for k, _, at in mapped), what="b's cache applied it")
        stopped = time.monotonic()
        a.controller.stop()
        wait_for(lambda: len(b.controller.owned_partitions()) == PARTITIONS, timeout=PATIENCE + 10,
                 what="b to own every partition")
        wait_for(lambda: ran(runs, "b", gone, None, stopped), what="b reconciled the deleted key")
        assert any(k == gone and none and at >= stopped for k, none, at in mapped), "a gain maps a tombstone with None"
        # partition_by kept each pipeline together: b reconciled the rest.
        wait_for(lambda: all(ran(runs, "b", k, "v1", stopped) for k in keys[1:]), what="b reconciled the rest")
    finally:
        a.controller.stop()
        b.controller.stop()


def test_gained_keys_run_parents_first(etcd: Etcd) -> None:
    runs: List[Tuple[str, str, Optional[str], float]] = []
    a = Replica(etcd, "dag", "a", runs, partition_by=pipeline).start()
    b = Replica(etcd, "dag", "b", runs, partition_by=pipeline).start()
    try:
        wait_for(lambda: two_each(a, b), timeout=PATIENCE + 10, what="two partitions each")
        mine = a.controller.owned_partitions()
        of_a = [f"p{i}" for i in range(40) if reconq.partition_of(f"p{i}", PARTITIONS) in mine][:4]
        stages = {p: [f"{p}/{i}" for i in range(3)] for p in of_a}
        for keys in stages.values():
            for replica in (a, b):
                replica.controller.set_dependencies(keys[1], [keys[0]])
                replica.controller.set_dependencies(keys[2], [keys[1]])
            for key in keys:
                etcd.put(PREFIX + key, "v1")
        every = [k for keys in stages.values() for k in keys]
        wait_for(lambda: all(ran(runs, "a", k, "v1") for k in every), what="a reconciled its pipelines")
        stopped = time.monotonic()
        a.controller.stop()
        wait_for(lambda: all(ran(runs, "b", k, "v1", stopped) for k in every), timeout=PATIENCE + 10,
                 what="b reconciled every stage")
        order = [k for w, k, _, at in list(runs) if w == "b" and at >= stopped]
        for keys in stages.values():
            firsts = [order.index(k) for k in keys]
            assert firsts == sorted(firsts), f"stages out of order: {order}"
    finally:
        a.controller.stop()
        b.controller.stop()


def test_a_gain_maps_a_run_of_keys_under_one_hold_of_the_gil(etcd: Etcd) -> None:
    """C1's walk at a gain passes the cache's keys to a Python `map` a run
    (up to 256) at a time under one hold of the GIL, as a list and a
    resync do: a hold per key waits for every running Python thread to
    hand the GIL over, once a key."""
    keys = 600
    etcd.put_all({f"{PREFIX}k{i:04d}": "v" for i in range(keys)})
    runs: List[Tuple[str, str, Optional[str], float]] = []
    holds: List[GilHolds] = []

    def map_of_b(key: str, obj: Any) -> List[str]:
        if holds:
            holds[0].note()
        return [key]

    a = Replica(etcd, "gain-runs", "a", runs).start()
    b = Replica(etcd, "gain-runs", "b", runs, map=map_of_b).start()
    try:
        wait_for(lambda: two_each(a, b), timeout=PATIENCE + 10, what="two partitions each")
        wait_for(lambda: len({k for _, k, _, _ in list(runs)}) == keys, what="every key reconciled once")
        with GilHolds() as gil:
            holds.append(gil)
            a.controller.stop()
            wait_for(lambda: len(b.controller.owned_partitions()) == PARTITIONS, timeout=PATIENCE + 10,
                     what="b to own every partition")
            # The walk maps every key the cache holds, to find those of
            # the gained partitions.
            wait_for(lambda: len(gil.seen) >= keys, what="b's walk over the cache")
            holds.clear()
        # b may gain a's two partitions in one look or in two: a walk each.
        walks = math.ceil(len(gil.seen) / keys)
        runs_per_walk = math.ceil(keys / 256)
        assert gil.holds() <= walks * runs_per_walk + 1, f"{gil.holds()} holds of the GIL for {len(gil.seen)} calls"
    finally:
        a.controller.stop()
        b.controller.stop()


def test_stored_keys_wait_for_their_partition_after_a_restart(etcd: Etcd, tmp_path: Path) -> None:
    """C2 with a store: keys stored pending come back at a restart and are
    reconciled once their partitions are claimed, not dropped as another
    replica's before the first claim."""
    calls: List[str] = []

    def controller(block: bool, identity: str) -> reconq.Controller:
        def reconcile(key: str) -> None:
            calls.append(key)
            if block and key == "block":
                reconq.context().wait_cancelled()

        sharding = reconq.Sharding(etcd.endpoint, "stored", partitions=PARTITIONS, ttl=2.0, identity=identity)
        store = reconq.SqliteStore(str(tmp_path / "store.db"))
        return reconq.Controller(reconcile, name="stored", workers=1, store=store, sharding=sharding)

    # A restarted process has another identity (the default has its pid).
    first = controller(block=True, identity="first")
    first.start()
    wait_for(lambda: len(first.owned_partitions()) == PARTITIONS, timeout=PATIENCE + 10, what="every partition")
    first.enqueue("block")
    wait_for(lambda: "block" in calls, what="the one worker busy")
    waiting = [f"w{i}" for i in range(8)]
    for key in waiting:
        first.enqueue(key)
    first.stop(drain=False)
    calls.clear()
    again = controller(block=False, identity="again")
    again.start()
    try:
        # (`block` returned once cancelled: done, not pending.)
        wait_for(lambda: set(calls) >= set(waiting), timeout=PATIENCE + 10,
                 what="every stored key reconciled after the restart")
    finally:
        again.stop()

"""reconq.Sharding on a real etcd (guarantees §11), replicas in this
process: H1 partition_of pinned to the same values as Rust's, H2 balance,
H3 keys kept only by their owner (the rest dropped and counted, gained
partitions resynced), status and stats fields, bad input. Whole processes
joining, leaving, crashing and pausing are in test_sharding_chaos.py."""

from __future__ import annotations

import logging
import threading
from typing import Any, Dict, List, Set, Tuple

import pytest

import reconq
from etcd_server import Etcd
from waiting import PATIENCE, wait_for

PARTITIONS = 8
KEYS = 64


def test_partition_of_is_pinned_and_the_same_as_rust() -> None:
    # The same values src/coordination/partition.rs pins for Rust keys of
    # the same shape.
    assert [reconq.partition_of(k, 64) for k in ["", "a", "default/web", "ns/name-17"]] == [44, 26, 3, 20]
    assert [reconq.partition_of(k, 64) for k in [0, 1, 42, -7]] == [37, 50, 55, 43]
    assert reconq.partition_of(("default", 3), 64) == 21
    with pytest.raises(ValueError):
        reconq.partition_of("a", 0)
    with pytest.raises(TypeError):
        reconq.partition_of(1.5, 8)  # type: ignore[arg-type]


def namespace(key: str) -> str:
    return key.split("/")[0]


def test_partition_by_is_pinned_and_the_same_as_rust() -> None:
    # C3: the same values src/coordination/partition.rs pins for Rust's
    # partition_of_by with the same keys and functions.
    keys = ["ns-a/web", "ns-a/db", "ns-b/web", "ns-b/cache"]
    assert [reconq.partition_of(k, 64, partition_by=namespace) for k in keys] == [57, 57, 32, 32]
    steps = [("etl", 1), ("etl", 2), ("report", 1)]
    assert [reconq.partition_of(k, 64, partition_by=lambda k: k[0]) for k in steps] == [48, 48, 36]
    assert reconq.partition_of(1234, 64, partition_by=lambda k: k // 100) == 49
    assert reconq.partition_of("ns-a/web", 64, partition_by=None) == reconq.partition_of("ns-a/web", 64)


def test_partition_of_lets_what_partition_by_raises_propagate() -> None:
    def lookup(key: str) -> str:
        raise KeyError(key)

    with pytest.raises(KeyError, match="web"):
        reconq.partition_of("web", 8, partition_by=lookup)
    with pytest.raises(TypeError):
        reconq.partition_of("web", 8, partition_by=lambda k: 1.5)
    with pytest.raises(TypeError, match="partition_by"):
        reconq.Sharding("http://127.0.0.1:1", "x", partition_by=5)  # type: ignore[arg-type]


def keys_across_partitions() -> Tuple[int, int, int]:
    """Two keys of different partitions (of PARTITIONS), and one in the first one's."""
    p = reconq.partition_of(0, PARTITIONS)
    other = next(k for k in range(1, 1000) if reconq.partition_of(k, PARTITIONS) != p)
    same = next(k for k in range(1, 1000) if reconq.partition_of(k, PARTITIONS) == p)
    return 0, other, same


def test_an_edge_across_partitions_is_a_value_error_and_changes_nothing(make: Any) -> None:
    # C4, before start: the partition count is known.
    key, other, same = keys_across_partitions()
    sh = reconq.Sharding("http://127.0.0.1:1", "c4", partitions=PARTITIONS)
    c = make(lambda key: None, name="c4", sharding=sh)
    with pytest.raises(ValueError) as refused:
        c.set_dependencies(key, [same, other])
    assert not isinstance(refused.value, reconq.CycleError)
    message = str(refused.value)
    assert f"{key} (partition {reconq.partition_of(key, PARTITIONS)})" in message, message
    assert f"{other} (partition {reconq.partition_of(other, PARTITIONS)})" in message, message
    assert c.dependencies(key) == [], "not even the parent in the same partition"
    c.set_dependencies(key, [same])
    assert c.dependencies(key) == [same]

    # One partition_by value, one partition: the edge holds.
    sh = reconq.Sharding("http://127.0.0.1:1", "c4-by", partitions=PARTITIONS, partition_by=lambda k: "pipeline")
    c = make(lambda key: None, name="c4-by", sharding=sh)
    c.set_dependencies(key, [other])
    assert c.dependencies(key) == [other]


def test_a_failing_partition_by_is_an_error_naming_the_key_partitioned_by_itself(
    make: Any, caplog: pytest.LogCaptureFixture
) -> None:
    # C3's error path, through C4's check, which asks the function the
    # sharding gate asks.
    def pipeline(key: str) -> Any:
        if key.startswith("bad"):
            raise LookupError(f"no pipeline for {key}")
        if key.startswith("odd"):
            return 1.5  # not a key
        return "p"

    sh = reconq.Sharding("http://127.0.0.1:1", "c3-err", partitions=64, partition_by=pipeline)
    c = make(lambda key: None, name="c3-err", sharding=sh)
    with caplog.at_level(logging.ERROR, logger="reconq"):
        for parent in ("bad-1", "odd-1"):
            with pytest.raises(ValueError) as refused:
                c.set_dependencies("ok", [parent])
            # Partitioned by itself.
            assert f"{parent} (partition {reconq.partition_of(parent, 64)})" in str(refused.value), refused.value
    failed = [r for r in caplog.records if "partition_by failed" in r.getMessage()]
    assert [r.levelno for r in failed] == [logging.ERROR, logging.ERROR], caplog.text
    assert "bad-1" in failed[0].getMessage() and "LookupError" in failed[0].getMessage(), failed[0].getMessage()
    assert "odd-1" in failed[1].getMessage() and "TypeError" in failed[1].getMessage(), failed[1].getMessage()


def test_keys_naming_one_partition_by_value_run_on_one_replica(etcd: Etcd, make: Any) -> None:
    # C3 across replicas: pipelines of 8 keys each, edges inside them.
    lock = threading.Lock()
    runs: List[Tuple[str, int]] = []

    def pipeline(key: int) -> int:
        return key // 8

    def replica(who: str) -> Any:
        def reconcile(key: int) -> None:
            with lock:
                runs.append((who, key))

        sh = reconq.Sharding(
            etcd.endpoint, "py-c3", partitions=PARTITIONS, ttl=2, identity=who, partition_by=pipeline
        )
        c = make(reconcile, name=f"py-c3-{who}", workers=2, sharding=sh, resync=lambda: range(KEYS))
        for key in range(KEYS):
            if key % 8:
                c.set_dependencies(key, [key - key % 8])
        c.start()
        return c

    a, b = replica("a"), replica("b")
    wait_for(lambda: balanced([a, b]), what="two-way balance")
    with lock:
        runs.clear()
    mine = enqueue_everywhere({"a": a, "b": b})
    ran_on: Dict[int, Set[str]] = {}
    for who, key in runs:
        partition = reconq.partition_of(key, PARTITIONS, partition_by=pipeline)
        assert partition in mine[who], f"C3: {who} reconciled {key} of partition {partition}"
        ran_on.setdefault(pipeline(key), set()).add(who)
    assert sorted(ran_on) == list(range(KEYS // 8)), "every pipeline ran"
    assert all(len(replicas) == 1 for replicas in ran_on.values()), ran_on


def enqueue_everywhere(replicas: Dict[str, Any]) -> Dict[str, Set[int]]:
    """Enqueues every key on every replica, waits until each is idle, and
    returns the partitions each owns then."""
    for c in replicas.values():
        for key in range(KEYS):
            c.enqueue(key)
    assert all(c.wait_idle(PATIENCE) for c in replicas.values())
    return {who: c.owned_partitions() for who, c in replicas.items()}


def balanced(controllers: List[Any]) -> bool:
    owned = [c.owned_partitions() for c in controllers]
    n = len(controllers)
    sizes_ok = all(PARTITIONS // n <= len(o) <= -(-PARTITIONS // n) for o in owned)
    return sizes_ok and sum(map(len, owned)) == PARTITIONS and set().union(*owned) == set(range(PARTITIONS))


def test_replicas_split_the_partitions_and_each_key_runs_on_its_owner(etcd: Etcd, make: Any) -> None:
    lock = threading.Lock()
    runs: List[Tuple[str, int, Any]] = []

    def replica(who: str) -> Any:
        def reconcile(key: int) -> None:
            with lock:
                runs.append((who, key, reconq.context().fencing_token))

        sh = reconq.Sharding(etcd.endpoint, "py-h2", partitions=PARTITIONS, ttl=2, identity=who)
        c = make(reconcile, name=f"py-h2-{who}", workers=2, sharding=sh, resync=lambda: range(KEYS))
        c.start()
        return c

    a = replica("a")
    wait_for(lambda: len(a.owned_partitions()) == PARTITIONS, what="a to own everything")
    wait_for(lambda: {k for _, k, _ in runs} == set(range(KEYS)), what="a's resync to enqueue every key")
    b = replica("b")
    wait_for(lambda: balanced([a, b]), what="two-way balance")
    owners = {p: v for p, v in ((int(k.rsplit("/", 1)[1]), v) for k, v in
                                etcd.keys("/reconq/shard/py-h2/partitions/").items())}
    assert sorted(owners) == list(range(PARTITIONS))
    assert {p for p, who in owners.items() if who == "b"} == b.owned_partitions()

    with lock:
        runs.clear()
    mine = enqueue_everywhere({"a": a, "b": b})
    for who, key, _ in runs:
        assert reconq.partition_of(key, PARTITIONS) in mine[who], f"H3: {who} reconciled {key}"
    assert {k for _, k, _ in runs} == set(range(KEYS))
    sa, sb = a.stats(), b.stats()
    assert sa["not_owned"] + sb["not_owned"] >= KEYS, "each key dropped by the replica that does not own it"
    assert (sa["owned_partitions"], sa["members"], sa["shard_error"]) == (len(mine["a"]), 2, None)
    entry: Any = next(e for e in reconq.status() if e["name"] == "py-h2-b")
    assert entry["owned_partitions"] == len(mine["b"]) and "not_owned" in entry
    assert 'reconq_shard_owned_partitions{name="py-h2"}' in reconq.metrics_text()

    b.stop()  # a clean leave: a takes every partition back
    wait_for(lambda: len(a.owned_partitions()) == PARTITIONS, what="a to own everything again")
    a.stop()


@pytest.mark.parametrize(
    "kw, error",
    [
        ({"endpoints": "127.0.0.1:2379"}, ValueError),
        ({"endpoints": 5}, TypeError),
        ({"partitions": 0}, ValueError),
        ({"partitions": 65_537}, ValueError),
        ({"ttl": 1}, ValueError),
        ({"name": "a/b"}, ValueError),
    ],
)
def test_bad_input_is_refused(kw: Any, error: type) -> None:
    args = {"endpoints": "http://127.0.0.1:2379", "name": "x", **kw}
    with pytest.raises(error):
        reconq.Sharding(**args)


def test_more_partitions_than_the_limit_name_the_argument_and_the_limit() -> None:
    with pytest.raises(ValueError, match="partitions must be between 1 and 65536"):
        reconq.Sharding("http://127.0.0.1:2379", "x", partitions=65_537)
    assert reconq.Sharding("http://127.0.0.1:2379", "x", partitions=65_536).partitions == 65_536


def test_sharding_and_leader_election_do_not_mix() -> None:
    sh = reconq.Sharding("http://127.0.0.1:1", "x")
    le = reconq.LeaderElection("http://127.0.0.1:1", "x")
    with pytest.raises(ValueError, match="leader_election or sharding, not both"):
        reconq.Controller(lambda key: None, sharding=sh, leader_election=le)
    with pytest.raises(TypeError):
        reconq.Controller(lambda key: None, sharding=sh, resync=5)  # type: ignore[arg-type]

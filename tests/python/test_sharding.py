"""reconq.Sharding on a real etcd (guarantees §11), replicas in this
process: H1 partition_of pinned to the same values as Rust's, H2 balance,
H3 keys kept only by their owner (the rest dropped and counted, gained
partitions resynced), status and stats fields, bad input. Whole processes
joining, leaving, crashing and pausing are in test_sharding_chaos.py."""

from __future__ import annotations

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
    for c in (a, b):
        for key in range(KEYS):
            c.enqueue(key)
    assert a.wait_idle(PATIENCE) and b.wait_idle(PATIENCE)
    mine: Dict[str, Set[int]] = {"a": a.owned_partitions(), "b": b.owned_partitions()}
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
    with pytest.raises(ValueError):
        reconq.Controller(lambda key: None, sharding=sh, leader_election=le)
    with pytest.raises(TypeError):
        reconq.Controller(lambda key: None, sharding=sh, resync=5)  # type: ignore[arg-type]

"""Priorities, fairness and per-group limits from Python (guarantees §8, P1–P5)."""

from __future__ import annotations

import logging
import threading
from typing import Any, Dict, List, Optional

import pytest

import reconq
from waiting import PATIENCE, wait_for


class Gated:
    """A one-worker reconcile that blocks on the key "gate" until released,
    recording every key and the priority it was handed out with, so keys
    enqueued while the gate runs show the hand-out order once it opens."""

    def __init__(self) -> None:
        self.running = threading.Event()
        self.release = threading.Event()
        self.order: List[Any] = []
        self.priorities: Dict[Any, List[int]] = {}

    def __call__(self, key: Any) -> None:
        if key == "gate":
            self.running.set()
            self.release.wait(PATIENCE)
            return
        self.order.append(key)
        self.priorities.setdefault(key, []).append(reconq.context().priority)


@pytest.fixture
def gated():
    """A started one-worker controller whose worker is held by "gate"."""
    made: List[reconq.Controller] = []

    def factory(**kw: Any) -> tuple[reconq.Controller, Gated]:
        rec = Gated()
        c = reconq.Controller(rec, workers=1, **kw)
        made.append(c)
        c.start()
        c.enqueue("gate", priority=1000)
        assert rec.running.wait(PATIENCE)
        return c, rec

    yield factory
    for c in made:
        c.stop(drain=False, timeout=5)


def test_p1_highest_priority_first_and_fifo_within_one(gated):
    c, rec = gated()
    for key, priority in [("a", 0), ("b", 5), ("c", 0), ("d", 5), ("e", -1), ("f", 2)]:
        c.enqueue(key, priority=priority)
    assert c.stats()["by_priority"] == {5: 2, 2: 1, 0: 2, -1: 1}
    rec.release.set()
    assert c.wait_idle(PATIENCE)
    assert rec.order == ["b", "d", "f", "a", "c", "e"]


def test_p2_an_enqueue_raises_a_waiting_key_and_never_lowers_it(gated):
    c, rec = gated()
    c.enqueue("x")
    c.enqueue("y", priority=1)
    c.enqueue("z", priority=9)
    c.enqueue("x", priority=3)  # raised above y
    c.enqueue("z", priority=-5)  # not lowered
    rec.release.set()
    assert c.wait_idle(PATIENCE)
    assert rec.order == ["z", "x", "y"]
    assert rec.priorities == {"z": [9], "x": [3], "y": [1]}


def test_p2_a_delayed_key_keeps_its_priority_when_it_becomes_ready(gated):
    c, rec = gated()
    c.enqueue("low")
    c.enqueue_after("late", 0.01, priority=4)
    wait_for(lambda: c.inspect("late")["state"] == "ready", what="the delayed key to become ready")
    rec.release.set()
    assert c.wait_idle(PATIENCE)
    assert rec.order == ["late", "low"]


def test_p2_a_key_enqueued_while_it_runs_comes_back_with_the_highest_priority(make):
    running = threading.Event()
    release = threading.Event()
    seen: List[int] = []

    def reconcile(key: Any) -> None:
        seen.append(reconq.context().priority)
        if len(seen) == 1:
            running.set()
            release.wait(PATIENCE)

    c = make(reconcile)
    c.start()
    c.enqueue("k", priority=1)
    assert running.wait(PATIENCE)
    c.enqueue("k", priority=7)
    c.enqueue("k", priority=2)
    release.set()
    assert c.wait_idle(PATIENCE)
    assert seen == [1, 7]


def test_p3_retries_and_requeues_keep_the_priority(make):
    seen: List[int] = []

    def reconcile(key: Any) -> Optional[reconq.Requeue]:
        seen.append(reconq.context().priority)
        if len(seen) == 1:
            raise RuntimeError("retry me")
        if len(seen) == 2:
            return reconq.Requeue()
        return None

    c = make(reconcile, rate_limiter=reconq.ExponentialBackoff(0.001, 0.01))
    c.start()
    c.enqueue("k", priority=6)
    assert c.wait_idle(PATIENCE)
    assert seen == [6, 6, 6]


def test_p4_a_big_group_cannot_starve_a_small_one(gated):
    c, rec = gated(group=lambda key: key[0] if isinstance(key, tuple) else None)
    for i in range(200):
        c.enqueue(("A", i))
    c.enqueue(("B", 0))
    rec.release.set()
    assert c.wait_idle(PATIENCE)
    # Round-robin across groups: at most one A key before the B key.
    assert rec.order.index(("B", 0)) <= 1
    # Within a group, first in first out.
    assert [k for k in rec.order if k[0] == "A"] == [("A", i) for i in range(200)]


def test_p5_a_full_group_waits_without_a_worker_and_others_go_ahead(make):
    release = threading.Event()
    lock = threading.Lock()
    in_flight: Dict[str, int] = {}
    most: Dict[str, int] = {}
    done_b = threading.Event()

    def reconcile(key: Any) -> None:
        group = key[0]
        with lock:
            in_flight[group] = in_flight.get(group, 0) + 1
            most[group] = max(most.get(group, 0), in_flight[group])
        try:
            if group == "A":
                release.wait(PATIENCE)
            else:
                done_b.set()
        finally:
            with lock:
                in_flight[group] -= 1

    c = make(reconcile, workers=4, group=lambda key: key[0], max_in_flight_per_group=2)
    c.start()
    for i in range(6):
        c.enqueue(("A", i))
    wait_for(lambda: in_flight.get("A") == 2, what="two A keys running")
    assert c.stats()["in_flight_by_group"] == {"A": 2}
    c.enqueue(("B", 0))
    # B runs on a free worker while four A keys wait for room in their group.
    assert done_b.wait(PATIENCE)
    assert c.stats()["depth"] == 4
    release.set()
    assert c.wait_idle(PATIENCE)
    assert most == {"A": 2, "B": 1}
    assert c.stats()["successes"] == 7


def test_a_raising_group_function_puts_the_key_in_group_none_logged_once(make, caplog):
    def group(key: Any) -> str:
        if key == "bad":
            raise KeyError("no tenant")
        return "t"

    c = make(lambda key: None, group=group)
    caplog.set_level(logging.WARNING, logger="reconq")
    c.enqueue("bad")
    c.enqueue("bad")
    c.enqueue("ok")
    c.start()
    assert c.wait_idle(PATIENCE)
    assert c.stats()["successes"] == 2
    logged = [r for r in caplog.records if "no tenant" in r.getMessage()]
    assert len(logged) == 1, [r.getMessage() for r in caplog.records]


def test_stats_report_groups_only_with_a_group_function(make):
    assert "in_flight_by_group" not in make(lambda key: None).stats()
    assert make(lambda key: None, group=lambda key: 1).stats()["in_flight_by_group"] == {}


# --- the queue --------------------------------------------------------------------


def test_the_work_queue_hands_out_by_priority(q):
    q.add("a")
    q.add("b", priority=2)
    q.add("c", priority=2)
    q.add("a", priority=1)  # raised
    q.add_after("d", 0, priority=3)
    assert [q.get(timeout=PATIENCE) for _ in range(4)] == ["d", "b", "c", "a"]


def test_a_bare_queue_retry_keeps_the_priority_it_was_handed_out_with():
    q = reconq.WorkQueue(rate_limiter=reconq.ExponentialBackoff(0.0, 0.0))
    q.add("hi", priority=5)
    assert q.get(timeout=PATIENCE) == "hi"
    q.add_rate_limited("hi")  # a failed attempt, retried before done
    q.add("lo", priority=1)
    q.done("hi")
    assert [q.get(timeout=PATIENCE) for _ in range(2)] == ["hi", "lo"]


# --- bad input --------------------------------------------------------------------


@pytest.mark.parametrize(
    "kw, error",
    [
        ({"max_in_flight_per_group": 0, "group": len}, ValueError),
        ({"max_in_flight_per_group": 2}, ValueError),  # needs group
        ({"group": "tenant"}, TypeError),
        ({"max_in_flight_per_group": "2", "group": len}, TypeError),
    ],
)
def test_bad_scheduling_options_are_refused(kw: Dict[str, Any], error: type):
    with pytest.raises(error):
        reconq.Controller(lambda key: None, **kw)


@pytest.mark.parametrize(
    "priority, error", [(2**31, OverflowError), (-(2**31) - 1, OverflowError), (10**300, OverflowError), ("1", TypeError)]
)
def test_bad_priorities_are_refused_and_change_nothing(make, q, priority: Any, error: type):
    c = make(lambda key: None)
    for call in (
        lambda: c.enqueue("k", priority=priority),
        lambda: c.enqueue_after("k", 1, priority=priority),
        lambda: c.enqueue_at("k", 0, priority=priority),
        lambda: q.add("k", priority=priority),
        lambda: q.add_after("k", 0, priority=priority),
    ):
        with pytest.raises(error, match="priority"):
            call()
    assert c.stats()["depth"] == 0 and len(q) == 0
    c.enqueue("k", priority=2**31 - 1)
    assert c.stats()["by_priority"] == {2**31 - 1: 1}


def test_an_out_of_range_priority_names_the_argument_and_the_range(q):
    with pytest.raises(OverflowError, match=r"^priority must be between -2147483648 and 2147483647, got 1099511627776"):
        q.add("k", priority=2**40)
    with pytest.raises(OverflowError, match=r"got an int of 302 digits"):
        q.add("k", priority=-(10**300))

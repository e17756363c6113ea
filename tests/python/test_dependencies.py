"""Dependencies between keys from Python (guarantees §14, D1–D4): ancestors first,
dependents follow, a change cancels running descendants, no cycles, and bad
input; and §15's U3, batches (scheduled through the same holds), and U1,
`supersede` (D3's cancellation of a key's own reconcile), and U2, `debounce`."""

from __future__ import annotations

import threading
from typing import Any, Dict, List, Tuple

import pytest

import reconq
from waiting import PATIENCE, wait_for


class Script:
    """A reconcile that logs ("start"|"end", key), blocks keys whose gate is
    closed until it opens or the reconcile is cancelled, and raises (an
    exception) or returns what `then` lists for a key, in turn."""

    def __init__(self) -> None:
        self.log: List[Tuple[str, Any]] = []
        self.lock = threading.Lock()
        self.gates: Dict[Any, threading.Event] = {}
        self.results: Dict[Any, List[Any]] = {}

    def close(self, key: Any) -> None:
        self.gates[key] = threading.Event()

    def open(self, key: Any) -> None:
        self.gates[key].set()

    def then(self, key: Any, result: Any) -> None:
        self.results.setdefault(key, []).append(result)

    def __call__(self, key: Any) -> Any:
        with self.lock:
            self.log.append(("start", key))
        gate = self.gates.get(key)
        ctx = reconq.context()
        while gate is not None and not gate.is_set() and not ctx.cancelled:
            ctx.wait_cancelled(0.005)
        with self.lock:
            self.log.append(("end", key))
            pending = self.results.get(key)
            result = pending.pop(0) if pending else None
        if isinstance(result, BaseException):
            raise result
        return result

    def starts(self, key: Any) -> int:
        with self.lock:
            return sum(1 for what, k in self.log if what == "start" and k == key)

    def running(self, key: Any) -> bool:
        with self.lock:
            starts = sum(1 for what, k in self.log if what == "start" and k == key)
            ends = sum(1 for what, k in self.log if what == "end" and k == key)
        return starts > ends

    def at(self, what: str, key: Any, n: int = 0) -> int:
        with self.lock:
            hits = [i for i, (w, k) in enumerate(self.log) if w == what and k == key]
        assert len(hits) > n, f"no {what} #{n} of {key!r} in {self.log}"
        return hits[n]


def run_blocked(c: reconq.Controller, script: Script, key: Any, priority: int = 0) -> None:
    """Enqueues `key` at `priority` with its gate closed, and waits until it
    runs."""
    script.close(key)
    c.enqueue(key, priority=priority)
    wait_for(lambda: script.running(key))


@pytest.fixture
def make():
    made: List[reconq.Controller] = []

    def factory(workers: int = 2, **kw: Any) -> Tuple[reconq.Controller, Script]:
        script = Script()
        limiter = reconq.ExponentialBackoff(0.001, 0.001)
        c = reconq.Controller(script, workers=workers, rate_limiter=limiter, **kw)
        made.append(c)
        return c, script

    yield factory
    for c in made:
        c.stop(drain=False)


def start_with_parent_running(c: reconq.Controller, script: Script) -> None:
    """Starts `c` with "child" under "parent", and "parent" running (held at
    its gate)."""
    c.set_dependencies("child", ["parent"])
    c.start()
    script.close("parent")
    c.enqueue("parent")
    wait_for(lambda: script.running("parent"), what="parent running")


def test_graph_calls_replace_clear_dedup_and_work_before_start(make):
    c, _ = make()
    c.set_dependencies("c", ["a", "b", "a"])
    assert c.dependencies("c") == ["a", "b"]
    assert c.dependents("a") == ["c"]
    c.set_dependencies("c", iter(["b"]))
    assert c.dependencies("c") == ["b"] and c.dependents("a") == []
    c.set_dependencies("c", [])
    assert c.dependencies("c") == [] and c.dependents("b") == []
    c.set_dependencies(("t", 1), [("t", 0)])
    c.start()
    assert c.dependencies(("t", 1)) == [("t", 0)]
    assert c.stats()["superseded"] == 0 and c.stats()["held"] == 0
    assert c.inspect("nothing")["waiting_for"] == []


def test_d4_a_cycle_raises_naming_every_key_and_changes_nothing(make):
    c, _ = make()
    c.set_dependencies("b", ["a"])
    c.set_dependencies("c", ["b"])
    with pytest.raises(reconq.CycleError) as err:
        c.set_dependencies("a", ["x", "c"])
    assert isinstance(err.value, ValueError)
    for key in ("a", "b", "c"):
        assert key in str(err.value)
    assert c.dependencies("a") == [] and c.dependents("x") == []
    with pytest.raises(reconq.CycleError, match="7"):
        c.set_dependencies(7, [7])


@pytest.mark.parametrize("parents", ["ab", b"ab", ("a", "b"), 3, None])
def test_bad_parents_raise_type_error_and_change_nothing(make, parents):
    c, _ = make()
    c.set_dependencies("k", ["old"])
    with pytest.raises(TypeError, match="parents"):
        c.set_dependencies("k", parents)
    assert c.dependencies("k") == ["old"]


def test_a_bad_key_among_parents_raises_naming_it_and_changes_nothing(make):
    c, _ = make()
    c.set_dependencies("k", ["old"])
    with pytest.raises(TypeError, match=r"^parents\[1\]: keys must be str, int, bytes or tuples of these, not float$"):
        c.set_dependencies("k", ["fine", 1.5])
    with pytest.raises(TypeError, match=r"^parents\[0\]: .* not list$"):
        c.set_dependencies("k", [[1]])
    with pytest.raises(OverflowError, match=r"^parents\[0\]: int keys"):
        c.set_dependencies("k", [2**70])
    with pytest.raises(TypeError):
        c.set_dependencies(1.5, ["fine"])
    assert c.dependencies("k") == ["old"] and c.dependents("fine") == []


def test_d1_a_child_waits_for_its_running_parent_without_a_worker(make):
    c, script = make(workers=2)
    start_with_parent_running(c, script)
    c.enqueue("child")
    c.enqueue("other")
    wait_for(lambda: script.starts("other") == 1, what="other on the free worker")
    stats = c.stats()
    assert (stats["held"], stats["depth"]) == (1, 1), stats
    assert c.inspect("child")["waiting_for"] == ["parent"]
    assert script.starts("child") == 0
    script.open("parent")
    assert c.wait_idle(PATIENCE)
    assert script.at("end", "parent") < script.at("start", "child")
    assert script.starts("child") == 1
    assert c.inspect("child")["waiting_for"] == []


def test_d1_across_priorities_and_groups(make):
    c, script = make(workers=2, group=lambda k: k.startswith("g"), max_in_flight_per_group=1)
    c.set_dependencies("g-child", ["parent"])
    c.start()
    script.close("parent")
    c.enqueue("parent", priority=-5)
    wait_for(lambda: script.running("parent"), what="parent running")
    c.enqueue("g-child", priority=100)
    c.enqueue("g-other")
    wait_for(lambda: script.starts("g-other") == 1, what="g-other: the held key fills no group")
    assert script.starts("g-child") == 0
    script.open("parent")
    assert c.wait_idle(PATIENCE)
    assert script.at("end", "parent") < script.at("start", "g-child")


def test_d1_a_delayed_parent_holds_nothing(make):
    c, script = make(workers=1)
    c.set_dependencies("child", ["parent"])
    c.start()
    c.enqueue_after("parent", 3600)
    c.enqueue("child")
    wait_for(lambda: script.starts("child") == 1, what="child ran")


@pytest.mark.parametrize(
    "first", [None, reconq.Requeue(after=3600), reconq.PermanentError("no")], ids=["success", "resync", "permanent"]
)
def test_d2_dependents_follow_the_end_of_a_run(make, first):
    c, script = make(workers=2)
    c.set_dependencies("child", ["parent"])
    if first is not None:
        script.then("parent", first)
    c.start()
    c.enqueue("parent")
    wait_for(lambda: script.starts("child") == 1, what="the child follows")
    assert script.at("end", "parent") < script.at("start", "child")


def test_d2_a_retried_failure_continues_the_run(make):
    c, script = make(workers=2)
    c.set_dependencies("child", ["parent"])
    script.then("parent", RuntimeError("once"))
    script.then("parent", reconq.Requeue())
    c.start()
    c.enqueue("parent")
    wait_for(lambda: script.starts("child") == 1, what="the child follows the run's end")
    assert script.starts("parent") == 3
    assert script.at("end", "parent", 2) < script.at("start", "child")


def test_d3_a_parent_becoming_ready_cancels_a_running_child(make):
    c, script = make(workers=3)
    c.set_dependencies("child", ["parent"])
    c.set_dependencies("grandchild", ["child"])
    c.start()
    script.close("child")
    script.then("child", RuntimeError("ignored: cancelled"))
    c.enqueue("child")
    wait_for(lambda: script.running("child"), what="child running")
    c.enqueue("parent")
    wait_for(lambda: ("end", "child") in script.log, what="the child's run cancelled")
    script.open("child")
    assert c.wait_idle(PATIENCE)
    assert script.at("end", "child") < script.at("start", "parent")
    assert script.at("end", "parent") < script.at("start", "child", 1)
    assert script.at("end", "child", 1) < script.at("start", "grandchild")
    stats = c.stats()
    assert (stats["superseded"], stats["failures"], stats["reconciles"]) == (1, 0, 4), stats
    assert stats["last_error"] is None
    assert c.inspect("child")["attempts"] == 0


def test_d1_a_released_key_keeps_its_place(make):
    c, script = make(workers=1)
    start_with_parent_running(c, script)
    c.enqueue("child")
    c.enqueue("x")
    c.enqueue("y", priority=-1)
    c.enqueue("z")
    script.open("parent")
    assert c.wait_idle(PATIENCE)
    assert [k for what, k in script.log if what == "start"] == ["parent", "child", "x", "z", "y"]


def test_a_drained_stop_with_held_keys_finishes(make):
    c, script = make(workers=1)
    start_with_parent_running(c, script)
    c.enqueue("child")
    stopping = threading.Thread(target=lambda: c.stop(drain=True, timeout=PATIENCE))
    stopping.start()
    script.open("parent")
    stopping.join(PATIENCE)
    assert not stopping.is_alive()
    assert c.stats()["held"] == 0


def test_u3_batch_holds_until_the_last_block_exits_and_runs_parents_first(make):
    c, script = make(workers=2)
    c.set_dependencies("child", ["parent"])
    c.start()
    opened, close = threading.Event(), threading.Event()

    def overlapping() -> None:
        with c.batch():
            opened.set()
            close.wait(PATIENCE)

    other = threading.Thread(target=overlapping)
    with c.batch():
        other.start()
        assert opened.wait(PATIENCE)
        with c.batch():
            c.enqueue("child")  # first: without the batch a worker could take it
            c.enqueue("parent")
        assert c.stats()["held"] == 2, "nested: still held"
    assert c.stats()["held"] == 2, "the other thread's batch is still open"
    assert script.starts("child") + script.starts("parent") == 0
    close.set()
    other.join(PATIENCE)
    assert c.wait_idle(PATIENCE)
    assert script.at("end", "parent") < script.at("start", "child")
    assert script.starts("child") == 1


def test_u3_keys_ready_before_the_batch_keep_running(make):
    c, script = make(workers=1)
    c.start()
    run_blocked(c, script, "busy")
    c.enqueue("before")
    with c.batch():
        c.enqueue("inside")
        script.open("busy")
        wait_for(lambda: script.starts("before") == 1 and not script.running("before"))
        assert c.stats()["held"] == 1
        assert script.starts("inside") == 0
    assert c.wait_idle(PATIENCE)
    assert script.starts("inside") == 1


def test_u3_an_exception_propagates_and_closes_the_batch_opened_before_start(make):
    c, script = make(workers=1)
    with pytest.raises(RuntimeError, match="the block failed"):
        with c.batch():
            c.enqueue("early")
            c.start()
            assert c.stats()["held"] == 1
            raise RuntimeError("the block failed")
    assert c.wait_idle(PATIENCE)
    assert script.starts("early") == 1


def test_u3_a_batch_object_cannot_be_entered_twice_at_once(make):
    c, _ = make()
    batch = c.batch()
    with batch:
        with pytest.raises(RuntimeError, match="already open"):
            batch.__enter__()
    with batch:  # reusable once closed
        pass


def test_u1_supersede_cancels_the_running_reconcile_and_reruns_it_at_the_higher_priority(make):
    c, script = make(workers=1, supersede=True)
    c.start()
    script.then("k", RuntimeError("ignored: superseded"))
    run_blocked(c, script, "k", priority=5)
    c.enqueue("other", priority=3)
    c.enqueue("k")
    wait_for(lambda: c.stats()["superseded"] == 1)  # cancelled, and it returned
    script.open("k")
    assert c.wait_idle(PATIENCE)
    assert script.at("start", "k", 1) < script.at("start", "other"), "k came back at 5, not 0"
    stats = c.stats()
    assert (stats["superseded"], stats["failures"], stats["reconciles"]) == (1, 0, 3), stats
    assert stats["last_error"] is None
    assert c.inspect("k")["attempts"] == 0


def test_u1_off_by_default_and_a_reconcile_enqueuing_its_own_key_is_not_cancelled(make):
    seen: List[bool] = []

    def reconcile(key: Any) -> None:
        if not seen:
            c.enqueue(key)
        seen.append(reconq.context().cancelled)

    c = reconq.Controller(reconcile, supersede=True)
    try:
        c.start()
        c.enqueue("k")
        assert c.wait_idle(PATIENCE)
        assert seen == [False, False]
        assert c.stats()["superseded"] == 0
    finally:
        c.stop(drain=False)

    plain, script = make(workers=1)
    plain.start()
    run_blocked(plain, script, "k")
    plain.enqueue("k")
    script.open("k")
    assert plain.wait_idle(PATIENCE)
    assert (plain.stats()["superseded"], plain.stats()["successes"]) == (0, 2)


def test_u1_supersede_must_be_a_bool(make):
    with pytest.raises(TypeError, match="supersede"):
        reconq.Controller(lambda key: None, supersede=1)  # type: ignore[arg-type]


def test_u2_debounce_is_a_trailing_edge_capped_at_ten_windows(make):
    clock = reconq.FakeClock()
    c, script = make(workers=1, clock=clock, debounce=1.0)
    c.start()
    c.enqueue("k")
    clock.advance(0.9)
    c.enqueue("k")
    clock.advance(0.9)
    assert c.stats()["waiting"] == 1, "due 1 s after the latest enqueue"
    for _ in range(9):
        c.enqueue("k")
        clock.advance(0.9)
    c.enqueue("k")  # at 9.9 s: due at 10.9 s without the cap
    assert (c.stats()["waiting"], script.starts("k")) == (1, 0)
    clock.advance(0.1)
    wait_for(lambda: script.starts("k") == 1)
    assert c.wait_idle(PATIENCE)
    assert script.starts("k") == 1
    c.enqueue_after("j", 0.5)
    c.enqueue("j")
    clock.advance(0.5)
    wait_for(lambda: script.starts("j") == 1)  # the earlier delay wins


@pytest.mark.parametrize("bad", [0, -1.0, float("nan")])
def test_u2_debounce_must_be_positive(bad: float):
    with pytest.raises(ValueError, match="debounce"):
        reconq.Controller(lambda key: None, debounce=bad)


def test_u2_debounce_must_be_a_number():
    with pytest.raises(TypeError, match="debounce"):
        reconq.Controller(lambda key: None, debounce="1")  # type: ignore[arg-type]

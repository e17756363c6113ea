"""Everything the Rust controller can do, from Python (guarantees §7.1): the fake
clock, seeded jitter, the parked capacity, the stop report and the Manager's
back-off cap. Nothing here sleeps: time moves only when a test advances it."""

from __future__ import annotations

import math
import threading
from typing import Any, List

import pytest

import reconq
from waiting import PATIENCE, wait_for

#: A step well below any delay under test, to show a key is not due early.
EPSILON = 1e-6


# --- FakeClock ----------------------------------------------------------------------


def test_a_fake_clock_starts_at_zero_and_moves_only_when_advanced():
    fc = reconq.FakeClock()
    assert fc.now() == 0.0
    fc.advance(1.5)
    fc.advance(0)
    assert fc.now() == pytest.approx(1.5)
    assert "now=1.5" in repr(fc)


@pytest.mark.parametrize("bad, error", [(-1, ValueError), (math.nan, ValueError), ("1", TypeError)])
def test_advancing_by_a_bad_amount_is_refused_and_changes_nothing(bad: Any, error: type):
    fc = reconq.FakeClock()
    with pytest.raises(error):
        fc.advance(bad)
    assert fc.now() == 0.0


def test_a_queue_on_a_fake_clock_makes_a_delayed_key_ready_exactly_when_advance_returns():
    fc = reconq.FakeClock()
    q = reconq.WorkQueue(clock=fc)
    q.add_after("k", 5)
    fc.advance(5 - EPSILON)
    assert len(q) == 0
    fc.advance(EPSILON)
    assert len(q) == 1  # no waiting: advance returned after the promotion
    assert q.get(timeout=0) == "k"
    q.shut_down()


def test_clock_must_be_a_fake_clock():
    with pytest.raises(TypeError, match="FakeClock"):
        reconq.WorkQueue(clock="system")
    with pytest.raises(TypeError, match="FakeClock"):
        reconq.Controller(lambda key: None, clock=1.0)


class Flaky:
    """Fails the first `failures` reconciles of every key, then succeeds."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls: List[Any] = []

    def __call__(self, key: Any) -> None:
        self.calls.append(key)
        if reconq.context().attempt < self.failures:
            raise RuntimeError("backend down")


def advance_until_retried(c: reconq.Controller, fc: reconq.FakeClock, rec: Flaky, step: float) -> int:
    """Advances `fc` by `step` until the key's next reconcile starts; returns
    how many steps that took (the key's back-off, in steps). The clock only
    moves when one snapshot of the queue shows the key waiting and nothing
    ready or running: on a fake clock nothing can change that but `advance`,
    so no step lands while the key is in flight."""
    before = len(rec.calls)
    steps = 0
    while True:
        s = c.stats()
        if (s["depth"], s["processing"], s["waiting"]) == (0, 0, 1):
            if len(rec.calls) > before:
                return steps
            assert steps < 100_000, "the key never came back"
            fc.advance(step)
            steps += 1
        elif len(rec.calls) > before:
            return steps


def test_the_back_off_on_a_fake_clock_equals_the_rate_limiters_sequence_exactly(make):
    reference = reconq.ExponentialBackoff(0.005, 1.0)
    expected = [reference.when("k") for _ in range(3)]
    assert expected == [0.005, 0.01, 0.02]
    fc = reconq.FakeClock()
    rec = Flaky(failures=3)
    c = make(rec, clock=fc, rate_limiter=reconq.ExponentialBackoff(0.005, 1.0))
    c.start()
    c.enqueue("k")
    for delay in expected:
        wait_for(lambda: c.inspect("k")["state"] == "waiting", what="the retry to be scheduled")
        n = len(rec.calls)
        fc.advance(delay - EPSILON)
        assert c.inspect("k")["state"] == "waiting" and len(rec.calls) == n, f"due before {delay} s"
        fc.advance(EPSILON)
        wait_for(lambda: len(rec.calls) == n + 1, what=f"the retry after {delay} s")
    assert c.wait_idle(PATIENCE)
    assert c.stats()["successes"] == 1 and c.stats()["failures"] == 3


def test_a_timeout_on_a_fake_clock_fires_when_the_clock_passes_it(make):
    fc = reconq.FakeClock()
    seen = threading.Event()
    results: List[bool] = []

    def reconcile(key: Any) -> None:
        ctx = reconq.context()
        seen.set()
        results.append(ctx.wait_cancelled(PATIENCE))

    c = make(reconcile, clock=fc, timeout=30, rate_limiter=reconq.ExponentialBackoff(3600, 3600))
    c.start()
    c.enqueue("k")
    assert seen.wait(PATIENCE)
    fc.advance(30)
    wait_for(lambda: results, what="the timeout's cancel")
    assert results == [True]


# --- jitter ------------------------------------------------------------------------


def jittered_delays(seed: int) -> List[int]:
    """The first three back-offs (in 0.1 ms steps) of a controller with
    `jitter=(0.5, seed)` over ExponentialBackoff(10 ms, 1 s)."""
    fc = reconq.FakeClock()
    rec = Flaky(failures=3)
    c = reconq.Controller(rec, clock=fc, jitter=(0.5, seed), rate_limiter=reconq.ExponentialBackoff(0.01, 1.0))
    try:
        c.start()
        c.enqueue("k")
        wait_for(lambda: rec.calls, what="the first reconcile")
        return [advance_until_retried(c, fc, rec, 0.0001) for _ in range(3)]
    finally:
        c.stop(drain=False, timeout=5)


def test_jitter_with_one_seed_gives_one_sequence_within_its_bounds():
    first = jittered_delays(42)
    assert jittered_delays(42) == first
    unjittered = [100, 200, 400]  # 10, 20, 40 ms in 0.1 ms steps
    for got, base in zip(first, unjittered):
        assert 0.5 * base <= got <= 1.5 * base + 1, (first, unjittered)
    assert first != unjittered


@pytest.mark.parametrize(
    "bad, error",
    [((1.5, 1), ValueError), ((-0.1, 1), ValueError), ((0.1, -1), OverflowError), ("0.1", TypeError), ((0.1,), TypeError)],
)
def test_bad_jitter_is_refused(bad: Any, error: type):
    with pytest.raises(error):
        reconq.Controller(lambda key: None, jitter=bad)


# --- parked capacity ------------------------------------------------------------------


def permanent(key: Any) -> None:
    raise reconq.PermanentError("gone")


def test_parked_capacity_keeps_the_newest_parked_keys(make):
    c = make(permanent, parked_capacity=2)
    c.start()
    for key in ("a", "b", "c"):
        c.enqueue(key)
        assert c.wait_idle(PATIENCE)
    assert c.parked() == ["b", "c"]


@pytest.mark.parametrize("bad, error", [(0, ValueError), (-3, ValueError), ("2", TypeError)])
def test_bad_parked_capacity_is_refused(bad: Any, error: type):
    with pytest.raises(error):
        reconq.Controller(permanent, parked_capacity=bad)


# --- stop_with_report -----------------------------------------------------------------


def test_stop_with_report_of_an_idle_controller(make):
    c = make(lambda key: None)
    c.start()
    assert c.stop_with_report(timeout=PATIENCE) == {"finished": True, "unfinished": [], "dropped": [], "unfinished_caches": []}


def test_stop_with_report_lists_unfinished_and_dropped_keys(make):
    release = threading.Event()
    running = threading.Event()

    def reconcile(key: Any) -> None:
        if key == "stuck":
            running.set()
            release.wait(PATIENCE)  # ignores its cancel until released
        elif key == "failing":
            raise RuntimeError("retry me much later")

    c = make(reconcile, workers=2, rate_limiter=reconq.ExponentialBackoff(3600, 3600))
    c.start()
    c.enqueue("failing")
    c.enqueue("stuck")
    c.enqueue_after("later", 3600)
    assert running.wait(PATIENCE)
    wait_for(lambda: c.stats()["waiting"] == 2, what="the retry and the delayed key")
    report = c.stop_with_report(timeout=0.05)
    release.set()
    assert report["finished"] is False
    assert report["unfinished"] == ["stuck"]
    assert sorted(report["dropped"]) == ["failing", "later"]


def test_stop_with_report_rejects_a_bad_timeout(make):
    c = make(lambda key: None)
    with pytest.raises(ValueError):
        c.stop_with_report(timeout=-1)
    assert c.stats()["state"] == "not started"


# --- Manager max_retry_interval -------------------------------------------------------


def test_max_retry_interval_caps_the_managers_linear_back_off():
    def failing() -> None:
        raise RuntimeError("down")

    m = reconq.Manager()
    try:
        m.update("capped", failing, error_retry_base=10, max_retry_interval=15)

        def settled(failures: int) -> Any:
            s = m.status()[0]
            return s if s["failures"] == failures and not s["running"] else None

        first = wait_for(lambda: settled(1), what="the first failure")
        assert 9 < first["next_run_in"] <= 10  # 1 x 10 s
        m.trigger("capped")
        second = wait_for(lambda: settled(2), what="the second failure")
        assert 14 < second["next_run_in"] <= 15  # 2 x 10 s, capped at 15 s
    finally:
        m.remove_all(wait=True)


def test_a_bad_max_retry_interval_is_refused_and_changes_nothing():
    m = reconq.Manager()
    with pytest.raises(ValueError):
        m.update("x", lambda: None, max_retry_interval=-1)
    assert len(m) == 0

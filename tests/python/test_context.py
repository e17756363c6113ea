"""reconq.context() and per-reconcile timeouts (guarantees §7)."""

from __future__ import annotations

import math
import threading
from typing import Any, Callable, List

import pytest

import reconq
from waiting import PATIENCE, wait_for


def test_context_outside_a_reconcile_raises():
    with pytest.raises(RuntimeError, match="outside a reconcile"):
        reconq.context()


def test_context_gives_key_attempt_priority_and_no_token(make):
    seen: List[Any] = []

    def reconcile(key: Any) -> None:
        ctx = reconq.context()
        seen.append((ctx.key, ctx.attempt, ctx.priority, ctx.fencing_token, ctx.cancelled))
        if ctx.attempt < 2:
            raise ValueError("not yet")

    c = make(reconcile, rate_limiter=reconq.ExponentialBackoff(0.001, 0.01))
    c.start()
    c.enqueue(("ns", "a"), priority=3)
    assert c.wait_idle(PATIENCE)
    assert seen == [(("ns", "a"), n, 3, None, False) for n in range(3)]
    with pytest.raises(RuntimeError):
        reconq.context()  # the scope ended with the reconcile


def test_cancel_is_seen_live_and_wait_cancelled_wakes_with_the_gil_released(make):
    waiting = threading.Event()
    results: List[Any] = []

    def reconcile(key: Any) -> None:
        ctx = reconq.context()
        assert ctx.wait_cancelled(timeout=0.001) is False
        waiting.set()
        # No timeout: only a cancel ends this. The main thread must get the
        # GIL meanwhile to call cancel(), so the wait must release it.
        results.append((ctx.wait_cancelled(), ctx.cancelled))

    c = make(reconcile)
    c.start()
    c.enqueue("k")
    assert waiting.wait(PATIENCE)
    assert c.cancel("k") is True
    assert c.wait_idle(PATIENCE)
    assert results == [(True, True)]


def test_a_context_kept_after_the_reconcile_still_answers(make):
    kept: List[reconq.Context] = []
    c = make(lambda key: kept.append(reconq.context()))
    c.start()
    c.enqueue(7)
    assert c.wait_idle(PATIENCE)
    (ctx,) = kept
    assert (ctx.key, ctx.attempt, ctx.cancelled) == (7, 0, False)
    assert "key=7" in repr(ctx)


def test_stop_without_drain_cancels_a_waiting_reconcile(make):
    waiting = threading.Event()
    c = make(lambda key: (waiting.set(), reconq.context().wait_cancelled()))
    c.start()
    c.enqueue("k")
    assert waiting.wait(PATIENCE)
    assert c.stop(drain=False, timeout=PATIENCE) is True


def test_wait_cancelled_rejects_bad_timeouts(make):
    errors: List[type] = []

    def reconcile(key: Any) -> None:
        ctx = reconq.context()
        for bad in (-1, math.nan, "soon"):
            try:
                ctx.wait_cancelled(timeout=bad)
            except Exception as e:  # noqa: BLE001 - recorded for the assert
                errors.append(type(e))

    c = make(reconcile)
    c.start()
    c.enqueue("k")
    assert c.wait_idle(PATIENCE)
    assert errors == [ValueError, ValueError, TypeError]


# --- timeouts --------------------------------------------------------------------


def timeouts_total(name: str) -> float:
    for line in reconq.metrics_text().splitlines():
        if line.startswith(f'controller_runtime_reconcile_timeouts_total{{controller="{name}"}}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_a_timeout_cancels_the_reconcile_and_counts_a_failure_then_retries(make):
    attempts: List[bool] = []

    def reconcile(key: Any) -> None:
        ctx = reconq.context()
        if ctx.attempt == 0:
            # Waits for the timeout's cancel (the patience is a safety net).
            attempts.append(ctx.wait_cancelled(PATIENCE))
        else:
            attempts.append(ctx.cancelled)

    c = make(
        reconcile,
        name="ctx-timeout",
        timeout=0.05,
        rate_limiter=reconq.ExponentialBackoff(0.001, 0.01),
    )
    c.start()
    c.enqueue("slow")
    assert c.wait_idle(PATIENCE)
    assert attempts == [True, False]
    s = c.stats()
    assert (s["failures"], s["successes"]) == (1, 1)
    assert timeouts_total("ctx-timeout") == 1


def test_a_reconcile_ignoring_its_timeout_still_fails_with_timeout_error(make):
    contexts: List[reconq.Context] = []
    release = threading.Event()

    def reconcile(key: Any) -> None:
        ctx = reconq.context()
        contexts.append(ctx)
        if ctx.attempt == 0:
            release.wait(PATIENCE)  # ignores its context, returns normally

    c = make(reconcile, timeout=0.02, rate_limiter=reconq.ExponentialBackoff(60, 60))
    c.start()
    c.enqueue("k")
    wait_for(lambda: contexts and contexts[0].cancelled, what="the timeout to cancel the reconcile")
    release.set()
    wait_for(lambda: c.stats()["failures"] == 1, what="the failure")
    info = c.inspect("k")
    assert info["state"] == "waiting"  # retried with the rate limiter's back-off
    assert info["last_error"].startswith("TimeoutError: reconcile timed out after 0.02")
    assert c.stats()["successes"] == 0
    assert len(contexts) == 1


@pytest.mark.parametrize("bad, error", [(0, ValueError), (-1, ValueError), (math.nan, ValueError), ("1", TypeError)])
def test_bad_timeouts_are_refused(bad: Any, error: type):
    with pytest.raises(error):
        reconq.Controller(lambda key: None, timeout=bad)


# --- Manager do ------------------------------------------------------------------


def manager_do_recording(log: List[Any], started: threading.Event) -> Callable[[], None]:
    def do() -> None:
        ctx = reconq.context()
        started.set()
        log.append((ctx.key, ctx.attempt, ctx.wait_cancelled(PATIENCE)))

    return do


def test_a_manager_do_sees_its_name_and_attempt_and_is_cancelled_by_remove():
    log: List[Any] = []
    started = threading.Event()
    m = reconq.Manager()
    m.update("sync", manager_do_recording(log, started))
    assert started.wait(PATIENCE)
    m.remove("sync", wait=True)
    assert log == [("sync", 0, True)]


def test_a_manager_do_is_cancelled_when_replaced_by_update():
    log: List[Any] = []
    started = threading.Event()
    m = reconq.Manager()
    try:
        m.update("sync", manager_do_recording(log, started))
        assert started.wait(PATIENCE)
        m.update("sync", lambda: None)
        wait_for(lambda: log, what="the replaced do to return")
        assert log == [("sync", 0, True)]
    finally:
        m.remove_all(wait=True)


def test_a_manager_do_is_cancelled_when_its_manager_stops():
    log: List[Any] = []
    started = threading.Event()
    with reconq.Manager() as m:
        m.update("sync", manager_do_recording(log, started))
        assert started.wait(PATIENCE)
    wait_for(lambda: log, what="the do to return")
    assert log == [("sync", 0, True)]


def test_a_manager_do_attempt_counts_consecutive_failures():
    attempts: List[int] = []

    def do() -> None:
        attempts.append(reconq.context().attempt)
        if len(attempts) < 3:
            raise RuntimeError("flaky")

    m = reconq.Manager()
    try:
        m.update("flaky", do, error_retry_base=0.001)
        wait_for(lambda: len(attempts) >= 3, what="three runs")
        assert attempts[:3] == [0, 1, 2]
    finally:
        m.remove_all(wait=True)

"""reconq.WorkQueue: every method, the guarantees of guarantees §1, bad input."""

import math
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import reconq


def run_in_thread(fn, *args):
    """Starts fn(*args) on a thread; returns (thread, result dict)."""
    result = {}

    def target():
        try:
            result["value"] = fn(*args)
        except BaseException as e:  # noqa: BLE001 - handed back to the test
            result["error"] = e

    t = threading.Thread(target=target, daemon=True)
    t.start()
    return t, result


def finish(t, result, timeout=10):
    t.join(timeout)
    assert not t.is_alive(), "thread did not finish"
    if "error" in result:
        raise result["error"]
    return result.get("value")


# --- basics -----------------------------------------------------------------


def test_add_get_done(q):
    q.add("a")
    assert len(q) == 1
    assert q.get() == "a"
    assert len(q) == 0
    q.done("a")
    assert "ready=0 processing=0 delayed=0" in repr(q)


def test_dedup_while_waiting(q):
    for _ in range(3):
        q.add("a")
    assert len(q) == 1
    assert q.get() == "a"
    with pytest.raises(TimeoutError):
        q.get(timeout=0)


def test_fifo_order(q):
    for k in ["c", "a", "b", 3, (1, 2)]:
        q.add(k)
    assert [q.get() for _ in range(5)] == ["c", "a", "b", 3, (1, 2)]


def test_key_added_while_processing_is_dirty_until_done(q):
    q.add("k")
    assert q.get() == "k"
    q.add("k")
    q.add("k")
    assert len(q) == 0  # not handed out again while processing (G2)
    with pytest.raises(TimeoutError):
        q.get(timeout=0)
    q.done("k")
    assert len(q) == 1  # ready again after done (G3), once
    assert q.get() == "k"
    q.done("k")
    assert len(q) == 0


def test_done_for_a_key_not_processing_does_nothing(q):
    q.done("never")
    q.add("ready")
    q.done("ready")  # ready, not processing
    assert len(q) == 1
    assert q.get() == "ready"
    q.done("ready")
    q.done("ready")
    with pytest.raises(TimeoutError):
        q.get(timeout=0)


def test_repr_shows_state(q):
    q.add("a")
    q.add("b")
    q.add_after("c", 60)
    q.get()
    assert repr(q) == "<reconq.WorkQueue ready=1 processing=1 delayed=1 shutting_down=False>"
    q.shut_down()
    assert repr(q) == "<reconq.WorkQueue ready=1 processing=1 delayed=0 shutting_down=True>"


def test_classes_live_in_reconq():
    for cls in [reconq.WorkQueue, reconq.ShutDown, reconq.ExponentialBackoff, reconq.RateLimiter,
                reconq.Requeue, reconq.RetryAfter, reconq.PermanentError]:
        assert cls.__module__ == "reconq", cls


def test_workqueue_is_not_subclassable_or_mutable(q):
    with pytest.raises(TypeError):
        class Sub(reconq.WorkQueue):  # noqa: F841
            pass
    with pytest.raises(AttributeError):
        q.shutting_down = True


# --- delays -----------------------------------------------------------------


@pytest.mark.parametrize("delay", [0, 0.0, -1, -0.5, -math.inf, -1e300])
def test_add_after_zero_or_negative_is_ready_before_return(q, delay):
    q.add_after("k", delay)
    assert len(q) == 1
    assert q.get(timeout=0) == "k"


def test_add_after_hands_out_no_earlier_than_the_delay(q):
    start = time.monotonic()
    q.add_after("k", 0.05)
    assert len(q) == 0
    assert q.get(timeout=10) == "k"
    assert time.monotonic() - start >= 0.05


def test_add_after_earlier_due_time_wins(q):
    q.add_after("k", 60)
    q.add_after("k", 0.01)
    q.add_after("k", 30)
    assert q.get(timeout=10) == "k"
    assert "delayed=0" in repr(q)


def test_add_after_does_not_delay_a_ready_key(q):
    q.add("k")
    q.add_after("k", 60)
    assert len(q) == 1
    assert "delayed=0" in repr(q)


def test_add_after_while_processing_and_dirty_changes_nothing(q):
    q.add("k")
    assert q.get() == "k"
    q.add("k")  # dirty
    q.add_after("k", 60)
    q.done("k")
    assert q.get(timeout=0) == "k"
    q.done("k")
    assert repr(q) == "<reconq.WorkQueue ready=0 processing=0 delayed=0 shutting_down=False>"


def test_add_cancels_a_pending_delay(q):
    q.add_after("k", 60)
    assert "delayed=1" in repr(q)
    q.add("k")
    assert len(q) == 1
    assert "delayed=0" in repr(q)


def test_delayed_key_becomes_ready_for_a_blocked_getter(q):
    t, r = run_in_thread(q.get, 10)
    q.add_after("late", 0.02)
    assert finish(t, r) == "late"


# --- rate limiting ----------------------------------------------------------


def test_add_rate_limited_asks_the_limiter_and_forget_resets():
    q = reconq.WorkQueue(reconq.FastSlow(0, 60, 2))
    q.add_rate_limited("k")  # fast = 0: ready now
    assert len(q) == 1
    assert q.num_requeues("k") == 1
    q.get()
    q.done("k")
    q.add_rate_limited("k")
    assert q.num_requeues("k") == 2
    assert q.get(timeout=0) == "k"
    q.done("k")
    q.add_rate_limited("k")  # slow: 60 s
    assert len(q) == 0
    assert "delayed=1" in repr(q)
    q.forget("k")
    assert q.num_requeues("k") == 0
    assert "delayed=1" in repr(q)  # forget does not touch the queue
    q.shut_down()


def test_default_rate_limiter_is_used_when_none():
    q = reconq.WorkQueue(rate_limiter=None)
    q.add_rate_limited("k")  # 5 ms
    assert q.get(timeout=10) == "k"
    assert q.num_requeues("k") == 1
    q.shut_down()


def test_one_limiter_shared_by_two_queues():
    lim = reconq.ExponentialBackoff(0, 1)
    q1, q2 = reconq.WorkQueue(lim), reconq.WorkQueue(rate_limiter=lim)
    q1.add_rate_limited("k")
    q2.add_rate_limited("k")
    assert q1.num_requeues("k") == q2.num_requeues("k") == lim.num_requeues("k") == 2
    q2.forget("k")
    assert q1.num_requeues("k") == 0


@pytest.mark.parametrize("bad", ["limiter", 1, object(), reconq.ExponentialBackoff])
def test_rate_limiter_must_be_a_limiter(bad):
    with pytest.raises(TypeError, match="rate limiter"):
        reconq.WorkQueue(bad)


# --- get and timeouts -------------------------------------------------------


def test_get_timeout_raises_timeout_error(q):
    start = time.monotonic()
    with pytest.raises(TimeoutError):
        q.get(timeout=0.05)
    assert time.monotonic() - start >= 0.05
    with pytest.raises(TimeoutError):
        q.get(timeout=0)


def test_get_timeout_returns_a_key_added_meanwhile(q):
    t, r = run_in_thread(q.get, 30)
    q.add("x")
    assert finish(t, r) == "x"


def test_get_without_timeout_blocks_until_a_key_arrives(q):
    t, r = run_in_thread(q.get)
    q.add(("a", 1))
    assert finish(t, r) == ("a", 1)


@pytest.mark.parametrize("timeout, exc", [(-1, ValueError), (-0.001, ValueError), (math.nan, ValueError),
                                          (math.inf, OverflowError), (1e300, OverflowError),
                                          (2**2000, OverflowError), ("1", TypeError), (True, TypeError)])
def test_bad_timeouts_are_refused_and_change_nothing(q, timeout, exc):
    q.add("k")
    with pytest.raises(exc):
        q.get(timeout=timeout)
    assert len(q) == 1
    with pytest.raises(exc):
        q.shut_down_with_drain(timeout=timeout)
    assert not q.shutting_down


@pytest.mark.parametrize("seconds, exc", [(math.nan, ValueError), (math.inf, OverflowError),
                                          (1e300, OverflowError), ("1", TypeError), (None, TypeError)])
def test_bad_delays_are_refused_and_change_nothing(q, seconds, exc):
    with pytest.raises(exc):
        q.add_after("k", seconds)
    assert repr(q) == "<reconq.WorkQueue ready=0 processing=0 delayed=0 shutting_down=False>"


def test_many_workers_never_share_a_key_and_lose_nothing():
    q = reconq.WorkQueue()
    n, workers = 5000, 4
    lock = threading.Lock()
    in_flight, handled = set(), []
    errors = []

    def worker():
        while True:
            try:
                key = q.get()
            except reconq.ShutDown:
                return
            with lock:
                if key in in_flight:
                    errors.append(key)
                in_flight.add(key)
            with lock:
                in_flight.discard(key)
                handled.append(key)
            q.done(key)

    threads = [threading.Thread(target=worker) for _ in range(workers)]
    for t in threads:
        t.start()
    for i in range(n):
        q.add(i % 1000)
    assert q.shut_down_with_drain(timeout=30)
    for t in threads:
        t.join(10)
    assert not errors
    # every key was handed out at least once after its last add (G3)
    assert set(handled) == set(range(1000))
    assert len(handled) <= n


# --- shutdown ---------------------------------------------------------------


def test_shut_down_hands_out_ready_keys_then_raises(q):
    q.add("a")
    q.add("b")
    q.add_after("delayed", 60)
    q.shut_down()
    assert q.shutting_down
    q.add("ignored")
    q.add_after("ignored", 0)
    q.add_rate_limited("ignored")
    assert len(q) == 2
    assert q.get() == "a"
    assert q.get(timeout=5) == "b"
    with pytest.raises(reconq.ShutDown):
        q.get()
    with pytest.raises(reconq.ShutDown):
        q.get(timeout=5)
    assert "delayed=0" in repr(q)


def test_shut_down_wakes_a_blocked_getter(q):
    t, r = run_in_thread(q.get)
    t2, r2 = run_in_thread(q.get, 60)
    q.shut_down()
    with pytest.raises(reconq.ShutDown):
        finish(t, r)
    with pytest.raises(reconq.ShutDown):
        finish(t2, r2)


def test_shut_down_is_an_exception():
    assert issubclass(reconq.ShutDown, Exception)


def test_drain_waits_for_keys_in_flight(q):
    q.add("k")
    assert q.get() == "k"
    assert q.shut_down_with_drain(timeout=0) is False
    assert q.shut_down_with_drain(timeout=0.02) is False
    assert q.shutting_down
    t, r = run_in_thread(q.shut_down_with_drain)
    q.done("k")
    assert finish(t, r) is True


def test_drain_of_an_idle_queue_returns_at_once(q):
    assert q.shut_down_with_drain() is True
    assert q.shutting_down
    with pytest.raises(reconq.ShutDown):
        q.get()


def test_drain_hands_out_dirty_keys_again_and_waits_for_them(q):
    q.add("k")
    assert q.get() == "k"
    q.add("k")  # dirty
    t, r = run_in_thread(q.shut_down_with_drain, 30)
    q.done("k")
    assert q.get(timeout=10) == "k"  # handed out again during the drain
    q.done("k")
    assert finish(t, r) is True
    with pytest.raises(reconq.ShutDown):
        q.get()


def test_shut_down_ends_a_pending_drain(q):
    q.add("k")
    q.get()
    t, r = run_in_thread(q.shut_down_with_drain)
    t2, r2 = run_in_thread(q.shut_down_with_drain, 60)
    # Whichever order the threads start in, the drain is pending until done
    # or shut_down; shut_down ends it.
    q.shut_down()
    assert finish(t, r) in (True, False)
    assert finish(t2, r2) in (True, False)
    # Neither waited for done("k"):
    assert "processing=1" in repr(q)


# --- Ctrl-C -----------------------------------------------------------------

CHILD = textwrap.dedent(
    """
    import sys, time, reconq
    q = reconq.WorkQueue()
    {setup}
    print("ready", flush=True)
    start = None
    try:
        {call}
    except KeyboardInterrupt:
        print("interrupted", flush=True)
        sys.exit(42)
    print("returned", flush=True)
    """
)


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
@pytest.mark.parametrize(
    "setup, call",
    [
        ("", "q.get()"),
        ("", "q.get(timeout=600)"),
        ("q.add('k'); q.get()", "q.shut_down_with_drain()"),
    ],
)
def test_ctrl_c_interrupts_a_blocked_call_promptly(setup, call):
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD.format(setup=setup, call=call)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline().strip() == "ready"
        # Give the child a moment to enter the blocking call; the outcome must
        # be the same if the signal lands earlier.
        time.sleep(0.2)
        sent = time.monotonic()
        os.kill(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=10)
        elapsed = time.monotonic() - sent
    finally:
        proc.kill()
    assert proc.returncode == 42, (out, err)
    assert "interrupted" in out
    assert elapsed < 2.0

"""The pure-Python benchmark baseline behaves like the queue it stands for."""

import os
import sys
import threading

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benches", "python"))

import pure_queue  # noqa: E402

import reconq  # noqa: E402


@pytest.fixture
def q():
    queue = pure_queue.RateLimitingQueue(pure_queue.ExponentialFailureRateLimiter(0.001, 1))
    yield queue
    queue.shut_down()


def test_dedup_dirty_and_done(q):
    q.add("a")
    q.add("a")
    assert len(q) == 1
    assert q.get() == "a"
    q.add("a")
    assert len(q) == 0
    q.done("a")
    assert q.get(timeout=0) == "a"


def test_add_after_and_rate_limit(q):
    q.add_after("k", 0.01)
    assert q.get(timeout=10) == "k"
    q.done("k")
    assert [q.rate_limiter.when("x") for _ in range(4)] == pytest.approx([0.001, 0.002, 0.004, 0.008])
    q.add_rate_limited("k")
    assert q.num_requeues("k") == 1
    assert q.get(timeout=10) == "k"
    q.done("k")
    assert q.wait_idle(10)


def test_shut_down_and_drain(q):
    q.add("a")
    assert q.get() == "a"
    q.add("b")
    t = threading.Thread(target=q.shut_down_with_drain)
    t.start()
    assert q.get(timeout=10) == "b"
    q.done("b")
    q.done("a")
    t.join(10)
    assert not t.is_alive()
    with pytest.raises(pure_queue.ShutDown):
        q.get()


def test_token_bucket_and_max_of():
    bucket = pure_queue.BucketRateLimiter(10, 2)
    got = [bucket.when(1) for _ in range(4)]
    assert got[:2] == [0, 0] and got[2] == pytest.approx(0.1, abs=0.01) and got[3] == pytest.approx(0.2, abs=0.01)
    m = pure_queue.MaxOfRateLimiter(pure_queue.FastSlowRateLimiter(0.5, 2, 1), pure_queue.ExponentialFailureRateLimiter(1, 10))
    assert [m.when("k") for _ in range(3)] == [1, 2, 4]


def test_controller_result_handling():
    tries = {}
    lock = threading.Lock()

    def reconcile(key):
        with lock:
            n = tries[key] = tries.get(key, 0) + 1
        if key == "ok":
            return None
        if key == "flaky" and n < 3:
            raise RuntimeError("not yet")
        if key == "retry" and n == 1:
            raise reconq.RetryAfter(0.01)
        if key == "requeue" and n == 1:
            return reconq.Requeue(after=0)
        if key == "permanent":
            raise reconq.PermanentError("no")
        if key == "bad":
            return 42 if n == 1 else None
        return None

    keys = ["ok", "flaky", "retry", "requeue", "permanent", "bad"]
    with pure_queue.PureController(reconcile, workers=3, rate_limiter=pure_queue.ExponentialFailureRateLimiter(0.001, 0.01)) as c:
        for k in keys:
            c.enqueue(k)
        assert c.wait_idle(30)
        s = c.stats()
    assert tries == {"ok": 1, "flaky": 3, "retry": 2, "requeue": 2, "permanent": 1, "bad": 2}
    assert s["reconciles"] == 11
    assert s["successes"] == 5 and s["requeues"] == 1 and s["failures"] == 5
    assert s["last_error"] is not None

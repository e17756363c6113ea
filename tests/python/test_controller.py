"""reconq.Controller (guarantees §4): the result table, bad input, stats, stopping."""

from __future__ import annotations

import logging
import math
import threading
import time
from typing import Any, Callable, Dict, List

import pytest

import reconq
from waiting import PATIENCE, wait_for


class Recorder:
    """A reconcile that records (key, time) and plays scripted results."""

    def __init__(self, script: Callable[[Any, int], Any] = lambda key, n: None) -> None:
        self.lock = threading.Lock()
        self.calls: List[Any] = []
        self.times: Dict[Any, List[float]] = {}
        self.script = script

    def __call__(self, key: Any) -> Any:
        with self.lock:
            self.calls.append(key)
            self.times.setdefault(key, []).append(time.monotonic())
            n = len(self.times[key]) - 1
        return self.script(key, n)

    def count(self, key: Any) -> int:
        with self.lock:
            return len(self.times.get(key, []))


def counts(c: reconq.Controller) -> Dict[str, int]:
    s = c.stats()
    return {k: s[k] for k in ("reconciles", "successes", "failures", "requeues")}


def run_until_idle(make, reconcile: Callable[[Any], Any], limiter: Any, key: Any = "k") -> reconq.Controller:
    """A started controller (with `limiter`) that has reconciled `key` until
    it went idle."""
    c = make(reconcile, rate_limiter=limiter)
    c.start()
    c.enqueue(key)
    assert c.wait_idle(PATIENCE)
    return c


# --- the result table ------------------------------------------------------------


def test_none_is_success_and_forgets(make):
    limiter = reconq.ExponentialBackoff(0.001, 0.01)
    rec = Recorder()
    c = run_until_idle(make, rec, limiter, "a")
    assert counts(c) == {"reconciles": 1, "successes": 1, "failures": 0, "requeues": 0}
    assert rec.calls == ["a"]
    assert limiter.num_requeues("a") == 0


def test_requeue_is_rate_limited(make):
    limiter = reconq.ExponentialBackoff(0.02, 0.02)
    seen: List[int] = []

    def script(key, n):
        seen.append(limiter.num_requeues(key))
        return reconq.Requeue() if n == 0 else None

    rec = Recorder(script)
    c = run_until_idle(make, rec, limiter)
    assert counts(c) == {"reconciles": 2, "successes": 1, "failures": 0, "requeues": 1}
    assert seen == [0, 1]  # the limiter was asked once
    t = rec.times["k"]
    assert t[1] - t[0] >= 0.015
    assert limiter.num_requeues("k") == 0  # forgotten at the success


def test_requeue_after_forgets_and_delays(make):
    limiter = reconq.ExponentialBackoff(0.001, 0.01)
    seen: List[int] = []

    def script(key, n):
        seen.append(limiter.num_requeues(key))
        if n == 0:
            raise ValueError("first")  # the limiter counts one failure
        if n == 1:
            return reconq.Requeue(after=0.05)
        return None

    rec = Recorder(script)
    c = run_until_idle(make, rec, limiter)
    assert counts(c) == {"reconciles": 3, "successes": 2, "failures": 1, "requeues": 0}  # a resync is a success
    assert seen == [0, 1, 0]  # Requeue(after=) forgot the failure
    t = rec.times["k"]
    assert t[2] - t[1] >= 0.045


def test_retry_after_delays_without_the_limiter(make):
    limiter = reconq.ExponentialBackoff(5.0, 5.0)  # would be far too slow

    def script(key, n):
        if n == 0:
            raise reconq.RetryAfter(0.05, "busy")
        return None

    rec = Recorder(script)
    c = run_until_idle(make, rec, limiter)
    assert counts(c) == {"reconciles": 2, "successes": 1, "failures": 1, "requeues": 0}
    t = rec.times["k"]
    assert t[1] - t[0] >= 0.045
    assert c.stats()["last_error"] == "RetryAfter: busy"


def test_permanent_error_parks_without_retry(make):
    rec = Recorder(lambda key, n: (_ for _ in ()).throw(reconq.PermanentError("gone")) if n == 0 else None)
    c = run_until_idle(make, rec, reconq.ExponentialBackoff(0.001, 0.001), "p")
    assert counts(c) == {"reconciles": 1, "successes": 0, "failures": 1, "requeues": 0}
    assert rec.count("p") == 1
    assert c.parked() == ["p"]
    info = c.inspect("p")
    assert info["state"] == "parked" and info["last_error"] == "PermanentError: gone"
    assert c.stats()["parked"] == 1
    assert c.requeue_parked("p") is True
    assert c.requeue_parked("p") is False
    assert c.wait_idle(PATIENCE)
    assert rec.count("p") == 2 and c.parked() == []


def test_other_exception_is_rate_limited_retry(make):
    limiter = reconq.ExponentialBackoff(0.01, 0.01)
    seen: List[int] = []

    def script(key, n):
        seen.append(limiter.num_requeues(key))
        if n < 2:
            raise RuntimeError(f"fail {n}")
        return None

    c = run_until_idle(make, Recorder(script), limiter)
    assert counts(c) == {"reconciles": 3, "successes": 1, "failures": 2, "requeues": 0}
    assert seen == [0, 1, 2]
    assert limiter.num_requeues("k") == 0


def test_returning_anything_else_is_a_type_error_failure(make):
    rec = Recorder(lambda key, n: 42 if n == 0 else None)
    c = run_until_idle(make, rec, reconq.ExponentialBackoff(0.001, 0.001))
    assert counts(c) == {"reconciles": 2, "successes": 1, "failures": 1, "requeues": 0}
    assert c.stats()["last_error"].startswith("TypeError: ")
    assert "int" in c.stats()["last_error"]


@pytest.mark.parametrize("exc", [KeyboardInterrupt, SystemExit])
def test_base_exceptions_are_failures_and_the_worker_survives(make, exc):
    def script(key, n):
        if key == "bad" and n == 0:
            raise exc("stop!")
        return None

    rec = Recorder(script)
    c = make(rec, rate_limiter=reconq.ExponentialBackoff(0.001, 0.001))
    c.start()
    c.enqueue("bad")
    c.enqueue("good")
    assert c.wait_idle(PATIENCE)
    assert counts(c) == {"reconciles": 3, "successes": 2, "failures": 1, "requeues": 0}
    assert c.stats()["last_error"] == f"{exc.__name__}: stop!"
    assert rec.count("good") == 1 and rec.count("bad") == 2


# --- bad input -------------------------------------------------------------------


def test_bad_constructor_arguments():
    with pytest.raises(TypeError, match="callable"):
        reconq.Controller(5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="workers"):
        reconq.Controller(print, workers=0)
    with pytest.raises(ValueError, match="workers"):
        reconq.Controller(print, workers=-3)
    # Past about a thousand, workers waiting for the GIL make work quadratic.
    with pytest.raises(ValueError, match="workers must be between 1 and 1024, got 1025"):
        reconq.Controller(print, workers=1025)
    assert reconq.Controller(print, workers=1024).workers == 1024
    with pytest.raises(ValueError, match="hanging_threshold"):
        reconq.Controller(print, hanging_threshold=-1)
    with pytest.raises(ValueError, match="NaN"):
        reconq.Controller(print, hanging_threshold=math.nan)
    with pytest.raises(TypeError, match="rate limiter"):
        reconq.Controller(print, rate_limiter="fast")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        reconq.Controller(print, workers=1.5)  # type: ignore[arg-type]


def test_bad_calls_change_nothing(make):
    c = make(print)
    with pytest.raises(TypeError):
        c.enqueue(1.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        c.enqueue(["a"])  # type: ignore[arg-type]
    with pytest.raises(OverflowError):
        c.enqueue(2**70)
    with pytest.raises(ValueError):
        c.enqueue_after("k", math.nan)
    with pytest.raises(TypeError):
        c.enqueue_after(1.5, 1)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        c.enqueue_at("k", math.nan)
    with pytest.raises(OverflowError):
        c.enqueue_at("k", math.inf)
    with pytest.raises(ValueError):
        c.wait_idle(-1)
    with pytest.raises(ValueError):
        c.wait_idle(math.nan)
    with pytest.raises(ValueError):
        c.stop(timeout=-1)
    with pytest.raises(ValueError):
        c.stop(timeout=math.nan)
    with pytest.raises(TypeError):
        c.add_trigger("k", 5)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        c.watch(5)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        c.watch([], transform=5)  # type: ignore[arg-type]
    s = c.stats()
    assert s["depth"] == 0 and s["waiting"] == 0 and s["state"] == "not started"
    assert c.wait_idle(0)


def test_negative_delay_means_now(make):
    rec = Recorder()
    c = make(rec)
    c.start()
    c.enqueue_after("k", -5)
    assert c.wait_idle(PATIENCE)
    assert rec.calls == ["k"]


def test_enqueue_at_uses_time_time(make):
    rec = Recorder()
    c = make(rec)
    c.start()
    at = time.time() + 0.1
    c.enqueue_at("later", at)
    c.enqueue_at("past", time.time() - 100)
    assert c.inspect("later")["state"] == "waiting"
    assert abs(c.inspect("later")["next_run"] - at) < 0.05
    wall = {}
    rec.script = lambda key, n: wall.setdefault(key, time.time()) and None
    assert c.wait_idle(PATIENCE)
    assert wall["later"] >= at - 0.01
    assert set(rec.calls) == {"later", "past"}


def test_enqueue_before_start_is_kept(make):
    rec = Recorder()
    c = make(rec)
    c.enqueue("a")
    c.enqueue_after("b", 0.01)
    assert c.stats()["depth"] >= 1
    assert not c.wait_idle(0.05)
    c.start()
    assert c.wait_idle(PATIENCE)
    assert sorted(rec.calls) == ["a", "b"]


# --- stats -----------------------------------------------------------------------


def test_stats_fields_and_finality(make):
    rec = Recorder(lambda key, n: None if key % 3 else (reconq.Requeue(after=0) if n == 0 else None))
    c = make(rec, workers=4, name="fin")
    c.start()
    for round_ in range(5):
        for k in range(200):
            c.enqueue(k)
        assert c.wait_idle(PATIENCE)
        s = c.stats()
        assert s["reconciles"] == s["successes"] + s["failures"] + s["requeues"]
        assert s["reconciles"] == rec_total(rec)
        assert s["depth"] == s["processing"] == s["waiting"] == 0
    s = c.stats()
    assert s["name"] == "fin" and s["workers"] == 4 and s["state"] == "running"
    assert s["last_error"] is None and s["last_error_time"] is None
    assert s["hanging"] == {} and s["parked"] == 0
    for field in ("reconciles", "successes", "failures", "requeues", "depth", "processing", "waiting"):
        assert isinstance(s[field], int)


def rec_total(rec: Recorder) -> int:
    with rec.lock:
        return len(rec.calls)


def test_last_error_format_and_time(make):
    def script(key, n):
        if n == 0:
            raise ValueError("boom")

    c = make(Recorder(script), rate_limiter=reconq.ExponentialBackoff(0.001, 0.001))
    c.start()
    before = time.time()
    c.enqueue("k")
    assert c.wait_idle(PATIENCE)
    s = c.stats()
    assert s["last_error"] == "ValueError: boom"
    assert before <= s["last_error_time"] <= time.time()
    assert c.inspect("k")["state"] == "unknown"


def test_hanging_report(make):
    release = threading.Event()
    started = threading.Event()

    def reconcile(key):
        started.set()
        release.wait(PATIENCE)

    c = make(reconcile, hanging_threshold=0.05)
    c.start()
    c.enqueue(("ns", "stuck"))
    assert started.wait(PATIENCE)
    hanging = wait_for(lambda: c.stats()["hanging"])
    assert list(hanging) == [("ns", "stuck")]
    assert hanging[("ns", "stuck")] > 0.05
    info = c.inspect(("ns", "stuck"))
    assert info["state"] == "running" and info["since"] <= time.time()
    assert c.cancel(("ns", "stuck")) is True
    assert c.cancel("other") is False
    release.set()
    assert c.wait_idle(PATIENCE)
    assert c.stats()["hanging"] == {}


def test_repr(make):
    c = make(print, workers=3, name="shown")
    r = repr(c)
    assert r.startswith("<reconq.Controller") and '"shown"' in r and "workers=3" in r and "state=not started" in r
    c.start()
    assert "state=running" in repr(c)
    c.stop()
    assert "state=stopped" in repr(c)
    assert c.name == "shown" and c.workers == 3


# --- stopping --------------------------------------------------------------------


class Blocker:
    """A reconcile whose first call blocks until released."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.started = threading.Event()
        self.rec = Recorder()

    def __call__(self, key: Any) -> None:
        self.rec(key)
        if key == "block":
            self.started.set()
            self.release.wait(PATIENCE)


def run_in_thread(fn: Callable[[], Any]) -> Dict[str, Any]:
    out: Dict[str, Any] = {}

    def target() -> None:
        out["value"] = fn()

    t = threading.Thread(target=target)
    t.start()
    out["thread"] = t
    return out


def blocked_controller(make, ready: int = 0, **options: Any) -> tuple:
    """A started controller (with `options`) whose worker is held in the
    reconcile of "block", with keys `0..ready-1` enqueued behind it; and its
    `Blocker`."""
    b = Blocker()
    c = make(b, **options)
    c.start()
    c.enqueue("block")
    assert b.started.wait(PATIENCE)
    for k in range(ready):
        c.enqueue(k)
    return b, c


def stop_in_thread(c: reconq.Controller, **stop_args: Any) -> Dict[str, Any]:
    """`c.stop(**stop_args)` in a thread (see `run_in_thread`), once the
    controller says it is stopping."""
    out = run_in_thread(lambda: c.stop(**stop_args))
    wait_for(lambda: c.stats()["state"] == "stopping")
    return out


def test_stop_with_drain_reconciles_ready_keys_and_drops_delayed(make):
    b, c = blocked_controller(make, ready=5, workers=1)
    c.enqueue_after("late", 30)
    out = stop_in_thread(c, drain=True)
    c.enqueue("after-stop")
    b.release.set()
    out["thread"].join(PATIENCE)
    assert out["value"] is True
    assert b.rec.calls == ["block", 0, 1, 2, 3, 4]
    assert c.stats()["state"] == "stopped"


def test_stop_without_drain_abandons_ready_keys(make):
    b, c = blocked_controller(make, ready=5, workers=1)
    out = stop_in_thread(c, drain=False)
    b.release.set()
    out["thread"].join(PATIENCE)
    assert out["value"] is True
    assert b.rec.calls == ["block"]


def test_stop_twice_and_before_start_and_no_second_start(make):
    c = make(print)
    assert c.stop() is True
    assert c.stop(drain=False) is True
    with pytest.raises(RuntimeError, match="was stopped and cannot start again"):
        c.start()
    with pytest.raises(RuntimeError, match="was stopped"):
        c.run()
    c.enqueue("k")
    assert c.stats()["depth"] == 0
    assert c.wait_idle(1)

    rec = Recorder()
    d = make(rec)
    d.start()
    with pytest.raises(RuntimeError, match="is already started"):
        d.start()
    stopper = threading.Thread(target=d.stop)
    stopper.start()
    d.run()  # after start(): only blocks until stopped (returns at once if it is)
    stopper.join()
    d = make(rec)
    d.start()
    d.enqueue(1)
    assert d.wait_idle(PATIENCE)
    assert d.stop() is True
    with pytest.raises(RuntimeError, match="was stopped and cannot start again"):
        d.start()
    assert d.stop() is True
    d.enqueue(2)
    d.enqueue_after(3, 0)
    assert d.stats()["depth"] == 0
    assert rec.calls == [1]


def test_stop_timeout_returns_when_a_reconcile_never_finishes(make):
    b, c = blocked_controller(make)
    t0 = time.monotonic()
    assert c.stop(timeout=0.2) is False
    assert time.monotonic() - t0 < 3
    b.release.set()
    wait_for(lambda: c.stats()["processing"] == 0)

    b2, c2 = blocked_controller(make)
    t0 = time.monotonic()
    assert c2.stop(drain=False, timeout=0.2) is False
    assert time.monotonic() - t0 < 3
    b2.release.set()
    assert c2.stop(drain=False, timeout=PATIENCE) is True


def test_context_manager(make):
    rec = Recorder()
    with reconq.Controller(rec, workers=4) as c:
        assert c.stats()["state"] == "running"
        for k in range(50):
            c.enqueue(k)
    assert c.stats()["state"] == "stopped"
    assert sorted(rec.calls) == list(range(50))


def test_context_manager_stops_on_exception():
    rec = Recorder()
    with pytest.raises(RuntimeError, match="inside"):
        with reconq.Controller(rec) as c:
            c.enqueue("k")
            raise RuntimeError("inside")
    assert c.stats()["state"] == "stopped"
    assert rec.calls == ["k"]


def test_run_returns_when_stopped_from_another_thread(make):
    rec = Recorder()
    c = make(rec)
    c.enqueue("k")
    timer = threading.Timer(0.05, lambda: (c.wait_idle(PATIENCE), c.stop()))
    timer.start()
    c.run()
    timer.join()
    assert rec.calls == ["k"]
    assert c.stats()["state"] == "stopped"


# --- concurrency -----------------------------------------------------------------


def test_reconcile_can_enqueue_into_its_own_controller(make):
    holder: Dict[str, reconq.Controller] = {}
    rec = Recorder(lambda key, n: holder["c"].enqueue(key + 1) if key < 200 else None)
    c = make(rec, workers=2)
    holder["c"] = c
    c.start()
    c.enqueue(0)
    assert c.wait_idle(PATIENCE)
    assert sorted(rec.calls) == list(range(201))


def test_threading_local_survives_across_calls(make):
    local = threading.local()
    per_thread: Dict[int, int] = {}
    lock = threading.Lock()

    def reconcile(key):
        local.n = getattr(local, "n", 0) + 1
        with lock:
            per_thread[threading.get_ident()] = local.n

    c = make(reconcile, workers=2)
    c.start()
    for k in range(300):
        c.enqueue(k)
    assert c.wait_idle(PATIENCE)
    # Each worker thread kept one thread state: its counter saw every call.
    assert sum(per_thread.values()) == 300
    assert 1 <= len(per_thread) <= 2


def test_never_two_reconciles_of_one_key_at_once(make):
    lock = threading.Lock()
    running: set = set()
    violations: List[Any] = []
    holder: Dict[str, reconq.Controller] = {}
    remaining = {k: 30 for k in range(10)}

    def reconcile(key):
        with lock:
            if key in running:
                violations.append(key)
            running.add(key)
        time.sleep(0.0005)
        c = holder["c"]
        c.enqueue(key)  # while processing: marked dirty, not handed out
        c.enqueue((key + 1) % 10)
        with lock:
            running.discard(key)
            remaining[key] -= 1
            if remaining[key] > 0:
                return reconq.Requeue(after=0)
        return None

    c = make(reconcile, workers=8)
    holder["c"] = c
    c.start()
    for k in range(10):
        c.enqueue(k)
    wait_for(lambda: all(v <= 0 for v in remaining.values()), timeout=30)
    c.stop(drain=False, timeout=PATIENCE)
    assert violations == []


def test_exceptions_are_logged(make, caplog):
    def script(key, n):
        if n == 0:
            raise ValueError("boom")

    c = make(Recorder(script), name="logged", rate_limiter=reconq.ExponentialBackoff(0.001, 0.001))
    with caplog.at_level(logging.WARNING, logger="reconq"):
        c.start()
        c.enqueue(("ns", 7))
        assert c.wait_idle(PATIENCE)
    records = [r for r in caplog.records if r.name == "reconq"]
    assert len(records) == 1
    r = records[0]
    assert r.levelno == logging.ERROR
    msg = r.getMessage()
    assert "'logged'" in msg and "('ns', 7)" in msg and "ValueError: boom" in msg
    assert r.exc_info is not None and r.exc_info[0] is ValueError
    assert r.exc_info[2] is not None  # with its traceback


def test_retry_after_is_logged_as_a_warning(make, caplog):
    c = make(Recorder(lambda key, n: (_ for _ in ()).throw(reconq.RetryAfter(0.001)) if n == 0 else None))
    with caplog.at_level(logging.WARNING, logger="reconq"):
        c.start()
        c.enqueue("k")
        assert c.wait_idle(PATIENCE)
    records = [r for r in caplog.records if r.name == "reconq"]
    assert [r.levelno for r in records] == [logging.WARNING]
    assert "RetryAfter: retry after 0.001 s" in records[0].getMessage()


def test_stopped_controller_releases_its_callback():
    import gc
    import weakref

    class Owner:
        def __init__(self) -> None:
            self.c = reconq.Controller(self.reconcile)

        def reconcile(self, key: Any) -> None:
            pass

    # A cycle owner -> controller -> bound method -> owner, never started:
    # the garbage collector can free it.
    o = Owner()
    ref = weakref.ref(o)
    del o
    gc.collect()
    assert ref() is None

    # Started then stopped: the callback is dropped at stop.
    o = Owner()
    o.c.start()
    o.c.enqueue(1)
    assert o.c.wait_idle(PATIENCE)
    assert o.c.stop() is True
    ref = weakref.ref(o)
    del o
    gc.collect()
    assert ref() is None


def test_stop_from_inside_a_reconcile_does_not_deadlock(make):
    holder: Dict[str, reconq.Controller] = {}
    results: List[bool] = []
    rec = Recorder(lambda key, n: results.append(holder["c"].stop()) if key == "stop" else None)
    c = make(rec, workers=2)
    holder["c"] = c
    c.start()
    c.enqueue("stop")
    wait_for(lambda: results)
    assert results == [False]
    wait_for(lambda: c.stats()["state"] == "stopped")
    assert c.stop(timeout=PATIENCE) is True


@pytest.mark.parametrize("call", ["wait_idle", "run"])
def test_waiting_for_itself_from_inside_a_reconcile_raises(make, call: str):
    holder: Dict[str, reconq.Controller] = {}
    raised: List[BaseException] = []

    def reconcile(key: Any) -> None:
        try:
            getattr(holder["c"], call)()
        except RuntimeError as e:
            raised.append(e)

    c = make(reconcile, name="self-waiter")
    holder["c"] = c
    c.start()
    c.enqueue("k")
    wait_for(lambda: raised, what=f"{call}() to raise")
    assert f"{call}() called from a reconcile" in str(raised[0])
    assert c.wait_idle(PATIENCE)
    assert c.stop() is True  # no timeout: the worker is not stuck


def test_the_default_limiter_retries_each_key_after_5_ms_without_an_overall_bucket():
    # client-go's default adds a 10-per-second bucket (burst 100): keys past
    # the 100th would wait up to 10 s for their first retry.
    clock = reconq.FakeClock()

    def reconcile(key: Any) -> None:
        if reconq.context().attempt == 0:
            raise ValueError("first try fails")

    c = reconq.Controller(reconcile, workers=2, clock=clock)
    with c:
        for k in range(200):
            c.enqueue(k)
        wait_for(lambda: c.stats()["failures"] == 200, what="every key failed once")
        clock.advance(0.005)
        assert c.wait_idle(PATIENCE), c.stats()
        assert c.stats()["successes"] == 200


def test_without_sharding_resync_runs_at_start_and_its_keys_are_reconciled(make):
    rec = Recorder()
    c = make(rec, resync=lambda: ["a", ("b", 1)])
    c.enqueue("a")  # enqueued before start too: still one reconcile
    c.start()
    assert c.wait_idle(PATIENCE)
    assert sorted(rec.calls, key=repr) == ["a", ("b", 1)]


def test_a_raising_resync_is_logged_and_the_controller_runs(make, caplog):
    def resync() -> List[Any]:
        raise OSError("listing failed")

    rec = Recorder()
    c = make(rec, resync=resync)
    with caplog.at_level(logging.ERROR, logger="reconq"):
        c.start()
    assert "listing failed" in caplog.text
    c.enqueue("k")
    assert c.wait_idle(PATIENCE)
    assert rec.calls == ["k"]


def test_out_of_range_durations_are_short_in_the_error(make, q):
    c = make(lambda key: None)
    for call, what in (
        (lambda: q.add_after("k", 1e300), "seconds"),
        (lambda: q.get(timeout=10**300), "timeout"),
        (lambda: c.enqueue_after("k", 1e300), "seconds"),
        (lambda: reconq.ExponentialBackoff(1e300, 1e301), "base"),
        (lambda: make(lambda key: None, hanging_threshold=1e300), "hanging_threshold"),
    ):
        with pytest.raises(OverflowError) as raised:
            call()
        message = str(raised.value)
        assert message.startswith(f"{what} is out of range: 1e300 seconds") and len(message) < 100, message
    with pytest.raises(OverflowError, match=r"^t is out of range: 1e300$"):
        c.enqueue_at("k", 1e300)


@pytest.mark.parametrize(
    "kw, problem",
    [
        ({"reconcile": lambda: None}, r"reconcile must accept one positional argument, but its signature is \(\)"),
        ({"reconcile": lambda key, extra: None}, r"reconcile must accept one .* \(key, extra\)"),
        ({"group": lambda: "g"}, r"group must accept one positional argument"),
        ({"resync": lambda key: []}, r"resync must accept no arguments, but its signature is \(key\)"),
        ({"reconcile": print}, None),  # a builtin: accepted, signature or not
        ({"reconcile": lambda key, *rest, option=1: None}, None),
    ],
)
def test_a_callable_with_the_wrong_signature_is_refused_at_construction(kw: Dict[str, Any], problem: Any):
    kw = {"reconcile": lambda key: None, **kw}
    if problem is None:
        reconq.Controller(**kw)
        return
    with pytest.raises(TypeError, match=problem):
        reconq.Controller(**kw)


def test_trigger_and_manager_callables_with_the_wrong_signature_are_refused(make):
    c = make(lambda key: None)
    with pytest.raises(TypeError, match="fn must accept one positional argument"):
        c.add_trigger("k", lambda: None)
    with pytest.raises(TypeError, match="transform must accept one positional argument"):
        c.watch([], transform=lambda: None)
    m = reconq.Manager()
    with pytest.raises(TypeError, match="do must accept no arguments"):
        m.update("x", lambda ctx: None)
    with pytest.raises(TypeError, match="stop must accept no arguments"):
        m.update("x", lambda: None, stop=lambda ctx: None)
    assert len(m) == 0


# --- callables that cannot work ------------------------------------------------------


async def async_reconcile(key: Any) -> None:
    pass


async def async_generator(key: Any) -> Any:
    yield key


def test_coroutine_functions_are_refused_where_no_loop_runs_them():
    # A reconcile or a do may be async def (tests/python/test_async.py);
    # the other callables are called on engine threads, with no loop.
    reconq.Controller(async_reconcile)
    with pytest.raises(TypeError, match="coroutine function"):
        reconq.Controller(lambda key: None, group=async_reconcile)
    with pytest.raises(TypeError, match="reconcile must be a function or an async def function, not an async gen"):
        reconq.Controller(async_generator)
    m = reconq.Manager()
    with pytest.raises(TypeError, match="coroutine function"):
        m.update("x", lambda: None, stop=async_reconcile)
    assert len(m) == 0


def test_the_package_has_a_version_and_a_key_alias():
    assert reconq.__version__.count(".") == 2
    assert reconq.Key is not None and "Key" in reconq.__all__


def test_help_documents_every_constructor_keyword():
    import inspect

    doc = reconq.Controller.__doc__ or ""
    keywords = [name for name in inspect.signature(reconq.Controller).parameters if name != "reconcile"]
    assert len(keywords) >= 14, keywords
    missing = [name for name in keywords if f"`{name}=" not in doc]
    assert not missing, f"help(reconq.Controller) does not document {missing}"

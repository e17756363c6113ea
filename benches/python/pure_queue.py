"""A pure-Python baseline: client-go's rate-limiting work queue and a
controller loop on `threading` threads, for side-by-side benchmarks with
reconq.

This is a faithful port of k8s.io/client-go/util/workqueue as a Go
controller uses it, written the way a Python user would write it by hand:

* ``Queue`` (queue.go): a FIFO list, a ``dirty`` set (needs processing) and
  a ``processing`` set, under one lock with a condition variable. ``add`` of
  a dirty key is a no-op; ``add`` of a key being processed only marks it
  dirty, and ``done`` re-queues it.
* ``DelayingQueue`` (delaying_queue.go): ``add_after`` hands the key to a
  *waiting loop* thread through a channel (``queue.Queue``, buffered like
  ``waitingForAddCh``); the loop keeps a heap of due times with a
  known-entries map (an earlier due time wins), adds due keys to the queue,
  and otherwise sleeps until the next due time, a new entry, or a 10 s
  heartbeat.
* ``RateLimitingQueue`` (rate_limiting_queue.go): ``add_rate_limited(k)`` is
  ``add_after(k, limiter.when(k))``.
* Limiters (default_rate_limiters.go): ``ExponentialFailureRateLimiter``,
  ``BucketRateLimiter`` (x/time/rate's reservation semantics: every ``when``
  takes a token), ``MaxOfRateLimiter``, and ``default_controller_rate_limiter``.

Like client-go (and unlike reconq), a plain ``add`` of a key that is waiting
in the heap does not cancel the heap entry, so the key runs again when it
comes due.

``PureController`` is a worker pool with reconq's result handling (guarantees §4):
None -> forget; Requeue() -> add_rate_limited; Requeue(after=s) -> forget +
add_after; RetryAfter(s) -> add_after; PermanentError -> forget; any other
exception -> add_rate_limited. Its surface mirrors ``reconq.Controller`` so
a benchmark can drive either.

Only the standard library is needed (the result classes come from reconq
when it is installed, else from local copies with the same names).
"""

from __future__ import annotations

import heapq
import itertools
import math
import queue as _stdqueue
import threading
import time
from typing import Any, Callable, Dict, Hashable, List, Optional, Tuple

try:  # the same classes, so one reconcile function serves both engines
    from reconq import PermanentError, Requeue, RetryAfter
except ImportError:  # pragma: no cover - standalone use

    class Requeue:  # type: ignore[no-redef]
        __slots__ = ("after",)

        def __init__(self, after: Optional[float] = None) -> None:
            self.after = after

    class RetryAfter(Exception):  # type: ignore[no-redef]
        def __init__(self, seconds: float, message: Optional[str] = None) -> None:
            super().__init__(message or f"retry after {seconds} s")
            self.after = seconds

    class PermanentError(Exception):  # type: ignore[no-redef]
        pass


class ShutDown(Exception):
    """Raised by ``get`` once the queue is shut down and nothing is ready."""


# --- rate limiters ------------------------------------------------------------


class _PerKeyFailures:
    """Counts each key's ``when`` calls since it was last forgotten."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._failures: Dict[Hashable, int] = {}

    def _record(self, key: Hashable) -> int:
        """Counts one more failure of ``key``; returns the count before it."""
        with self._lock:
            before = self._failures.get(key, 0)
            self._failures[key] = before + 1
            return before

    def forget(self, key: Hashable) -> None:
        with self._lock:
            self._failures.pop(key, None)

    def num_requeues(self, key: Hashable) -> int:
        with self._lock:
            return self._failures.get(key, 0)


class ExponentialFailureRateLimiter(_PerKeyFailures):
    """``base * 2**failures`` capped at ``max`` (ItemExponentialFailureRateLimiter)."""

    def __init__(self, base: float, max: float) -> None:
        super().__init__()
        self.base, self.max = base, max

    def when(self, key: Hashable) -> float:
        exp = self._record(key)
        if exp > 1000:  # 2**exp would overflow a float long before this
            return self.max
        backoff = self.base * 2.0**exp
        return self.max if backoff > self.max else backoff


class FastSlowRateLimiter(_PerKeyFailures):
    """``fast`` for the first ``max_fast_attempts`` tries, then ``slow``."""

    def __init__(self, fast: float, slow: float, max_fast_attempts: int) -> None:
        super().__init__()
        self.fast, self.slow, self.max_fast_attempts = fast, slow, max_fast_attempts

    def when(self, key: Hashable) -> float:
        return self.fast if self._record(key) < self.max_fast_attempts else self.slow


class BucketRateLimiter:
    """One token bucket for all keys; each ``when`` reserves a token."""

    def __init__(self, qps: float, burst: int) -> None:
        self._lock = threading.Lock()
        self.qps, self.burst = float(qps), burst
        self._tokens = float(burst)
        self._last = time.monotonic()

    def when(self, key: Hashable) -> float:
        with self._lock:
            now = time.monotonic()
            self._tokens = min(self.burst, self._tokens + (now - self._last) * self.qps)
            self._last = now
            self._tokens -= 1.0
            return 0.0 if self._tokens >= 0 else -self._tokens / self.qps

    def forget(self, key: Hashable) -> None:
        pass

    def num_requeues(self, key: Hashable) -> int:
        return 0


class MaxOfRateLimiter:
    def __init__(self, *limiters: Any) -> None:
        self.limiters = limiters

    def when(self, key: Hashable) -> float:
        return max(lim.when(key) for lim in self.limiters)

    def forget(self, key: Hashable) -> None:
        for lim in self.limiters:
            lim.forget(key)

    def num_requeues(self, key: Hashable) -> int:
        return max(lim.num_requeues(key) for lim in self.limiters)


def default_controller_rate_limiter() -> MaxOfRateLimiter:
    return MaxOfRateLimiter(ExponentialFailureRateLimiter(0.005, 1000.0), BucketRateLimiter(10, 100))


# --- the queue ----------------------------------------------------------------


class Queue:
    """client-go's ``Type``: FIFO + dirty set + processing set."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._queue: List[Hashable] = []
        self._head = 0  # amortised O(1) pops from the front
        self._dirty: set = set()
        self._processing: set = set()
        self._shutting_down = False
        self._drain = False
        # for wait_idle: notified whenever the queue may have become idle
        self._idle = threading.Condition(self._lock)
        self._pending_delayed = 0

    # client-go: Add
    def add(self, key: Hashable) -> None:
        with self._lock:
            self._add_locked(key)

    def _add_locked(self, key: Hashable) -> None:
        if self._shutting_down or key in self._dirty:
            return
        self._dirty.add(key)
        if key in self._processing:
            return
        self._queue.append(key)
        self._cond.notify()

    def __len__(self) -> int:
        with self._lock:
            return len(self._queue) - self._head

    # client-go: Get
    def get(self, timeout: Optional[float] = None) -> Hashable:
        with self._lock:
            deadline = None if timeout is None else time.monotonic() + timeout
            while len(self._queue) == self._head and not self._shutting_down:
                if deadline is None:
                    self._cond.wait()
                else:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise TimeoutError("no key became ready in time")
                    self._cond.wait(remaining)
            if len(self._queue) == self._head:
                raise ShutDown("the queue is shut down")
            key = self._queue[self._head]
            self._head += 1
            if self._head > 1024 and self._head * 2 > len(self._queue):
                del self._queue[: self._head]
                self._head = 0
            self._processing.add(key)
            self._dirty.discard(key)
            return key

    # client-go: Done
    def done(self, key: Hashable) -> None:
        with self._lock:
            self._processing.discard(key)
            if key in self._dirty:
                self._queue.append(key)
                self._cond.notify()
            elif not self._processing:
                self._cond.notify_all()  # a drain may be waiting
                self._notify_if_idle()

    def shut_down(self) -> None:
        with self._lock:
            self._drain = False
            self._shutting_down = True
            self._cond.notify_all()
            self._idle.notify_all()

    def shut_down_with_drain(self, timeout: Optional[float] = None) -> bool:
        with self._lock:
            self._drain = True
            self._shutting_down = True
            self._cond.notify_all()
            deadline = None if timeout is None else time.monotonic() + timeout
            while self._processing and self._drain:
                if deadline is None:
                    self._cond.wait()
                else:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return False
                    self._cond.wait(remaining)
            return not self._processing

    @property
    def shutting_down(self) -> bool:
        with self._lock:
            return self._shutting_down

    def _is_idle(self) -> bool:
        return len(self._queue) == self._head and not self._processing and self._pending_delayed == 0

    def _notify_if_idle(self) -> None:
        if self._is_idle():
            self._idle.notify_all()

    def wait_idle(self, timeout: Optional[float] = None) -> bool:
        with self._lock:
            return self._idle.wait_for(lambda: self._shutting_down or self._is_idle(), timeout) and self._is_idle()


_HEARTBEAT = 10.0  # client-go's maxWait


class DelayingQueue(Queue):
    """client-go's delaying queue: a waiting-loop thread owns a heap of due times."""

    def __init__(self) -> None:
        super().__init__()
        self._waiting_for_add: "_stdqueue.Queue[Optional[Tuple[float, Hashable]]]" = _stdqueue.Queue(maxsize=1000)
        self._loop = threading.Thread(target=self._waiting_loop, name="pure-queue-waiting-loop", daemon=True)
        self._loop.start()

    def add_after(self, key: Hashable, seconds: float) -> None:
        if math.isnan(seconds):
            raise ValueError("seconds must not be NaN")
        with self._lock:
            if self._shutting_down:
                return
            if seconds <= 0:
                self._add_locked(key)
                return
            self._pending_delayed += 1
        self._waiting_for_add.put((time.monotonic() + seconds, key))

    def _waiting_loop(self) -> None:
        heap: List[Tuple[float, int, Hashable]] = []
        known: Dict[Hashable, float] = {}  # key -> due time of its live heap entry
        seq = itertools.count()
        while True:
            if self.shutting_down:
                with self._lock:
                    self._pending_delayed = 0
                    self._notify_if_idle()
                return
            now = time.monotonic()
            # add everything that is due
            while heap and heap[0][0] <= now:
                due, _, key = heapq.heappop(heap)
                if known.get(key) != due:
                    continue  # superseded by an earlier due time
                del known[key]
                with self._lock:
                    self._pending_delayed -= 1
                    self._add_locked(key)
            timeout = _HEARTBEAT if not heap else min(_HEARTBEAT, heap[0][0] - now)
            try:
                entry = self._waiting_for_add.get(timeout=max(timeout, 0))
            except _stdqueue.Empty:
                continue
            while entry is not None:
                due, key = entry
                if due <= time.monotonic():
                    with self._lock:
                        self._pending_delayed -= 1
                        self._add_locked(key)
                elif key in known:
                    with self._lock:
                        self._pending_delayed -= 1  # merged into the existing entry
                    if due < known[key]:
                        known[key] = due
                        heapq.heappush(heap, (due, next(seq), key))
                else:
                    known[key] = due
                    heapq.heappush(heap, (due, next(seq), key))
                try:
                    entry = self._waiting_for_add.get_nowait()
                except _stdqueue.Empty:
                    entry = None

    def shut_down(self) -> None:
        super().shut_down()
        self._wake_loop()

    def shut_down_with_drain(self, timeout: Optional[float] = None) -> bool:
        with self._lock:
            self._shutting_down = True  # so the woken loop sees it
        self._wake_loop()
        return super().shut_down_with_drain(timeout)

    def _wake_loop(self) -> None:
        try:
            self._waiting_for_add.put_nowait(None)
        except _stdqueue.Full:
            pass


class RateLimitingQueue(DelayingQueue):
    """``add_rate_limited(k)`` is ``add_after(k, limiter.when(k))``."""

    def __init__(self, rate_limiter: Any = None) -> None:
        super().__init__()
        self.rate_limiter = rate_limiter if rate_limiter is not None else default_controller_rate_limiter()

    def add_rate_limited(self, key: Hashable) -> None:
        self.add_after(key, self.rate_limiter.when(key))

    def forget(self, key: Hashable) -> None:
        self.rate_limiter.forget(key)

    def num_requeues(self, key: Hashable) -> int:
        return self.rate_limiter.num_requeues(key)


# --- the controller -----------------------------------------------------------


class PureController:
    """Workers looping get -> reconcile -> done, with reconq's result handling."""

    def __init__(
        self,
        reconcile: Callable[[Hashable], Any],
        workers: int = 1,
        rate_limiter: Any = None,
        name: str = "controller",
    ) -> None:
        if not callable(reconcile):
            raise TypeError("reconcile must be callable")
        if workers < 1:
            raise ValueError("workers must be at least 1")
        self.name, self.workers = name, workers
        self._reconcile = reconcile
        self._queue = RateLimitingQueue(rate_limiter)
        self._threads: List[threading.Thread] = []
        self._stats_lock = threading.Lock()
        self._stats = dict(reconciles=0, successes=0, failures=0, requeues=0)
        self._last_error: Optional[str] = None
        self._last_error_time: Optional[float] = None
        self._stopped = False

    def enqueue(self, key: Hashable) -> None:
        self._queue.add(key)

    def enqueue_after(self, key: Hashable, seconds: float) -> None:
        self._queue.add_after(key, seconds)

    def start(self) -> None:
        if self._threads or self._stopped:
            return
        for i in range(self.workers):
            t = threading.Thread(target=self._worker, name=f"{self.name}-worker-{i}", daemon=True)
            t.start()
            self._threads.append(t)

    def _count(self, field: str, error: Optional[BaseException] = None) -> None:
        with self._stats_lock:
            self._stats["reconciles"] += 1
            self._stats[field] += 1
            if error is not None:
                self._last_error = f"{type(error).__name__}: {error}"
                self._last_error_time = time.time()

    def _worker(self) -> None:
        q = self._queue
        while True:
            try:
                key = q.get()
            except ShutDown:
                return
            try:
                try:
                    result = self._reconcile(key)
                except RetryAfter as e:
                    q.add_after(key, e.after)
                    self._count("failures", e)
                    continue
                except PermanentError as e:
                    q.forget(key)
                    self._count("failures", e)
                    continue
                except Exception as e:  # noqa: BLE001 - G9: the worker survives
                    q.add_rate_limited(key)
                    self._count("failures", e)
                    continue
                if result is None:
                    q.forget(key)
                    self._count("successes")
                elif isinstance(result, Requeue):
                    if result.after is None:
                        q.add_rate_limited(key)
                    else:
                        q.forget(key)
                        q.add_after(key, result.after)
                    self._count("requeues")
                else:
                    q.add_rate_limited(key)
                    self._count("failures", TypeError(f"reconcile returned {type(result).__name__}"))
            finally:
                q.done(key)

    def wait_idle(self, timeout: Optional[float] = None) -> bool:
        return self._queue.wait_idle(timeout)

    def stop(self, drain: bool = True, timeout: Optional[float] = None) -> bool:
        self._stopped = True
        if drain:
            self._queue.shut_down_with_drain(timeout)
        else:
            self._queue.shut_down()
        deadline = None if timeout is None else time.monotonic() + timeout
        for t in self._threads:
            t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in self._threads)

    def stats(self) -> Dict[str, Any]:
        with self._stats_lock:
            s: Dict[str, Any] = dict(self._stats)
            s.update(last_error=self._last_error, last_error_time=self._last_error_time)
        with self._queue._lock:
            q = self._queue
            s.update(
                name=self.name,
                workers=self.workers,
                depth=len(q._queue) - q._head,
                processing=len(q._processing),
                waiting=q._pending_delayed,
            )
        return s

    def __enter__(self) -> "PureController":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop(drain=True)

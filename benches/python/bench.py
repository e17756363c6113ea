"""Python benchmarks (guarantees §6): reconq against the pure-Python baseline.

    python benches/python/bench.py            # P1 (queue and controller), P2, P3
    python benches/python/bench.py w9 --w9-a-keys 20000   # W9 fairness (not in the default set)
    python benches/python/bench.py p1 --n 200000 --workers 1 2 4 8 --repeat 3
    python benches/python/bench.py w6 --n 200000 --workers 1 2 4   # P1 with a store (not in the default set)
    python benches/python/bench.py s1 --n 1000000 --repeat 3        # S1 after a Python burst (not in the default set)
    python benches/python/bench.py aio --n 100000 --workers 1 4     # P1 and P2 with async def (not in the default set)

Build the extension optimised first (`pip install .`, or
`RELEASE=1 bash scripts/python-dev.sh --co -q`): a debug build measures
nothing useful.

* P1: W1 with N keys and a Python no-op. One producer (the main thread)
  adds keys 0..N-1; W workers take, no-op, done; time from the first add
  until every key is done. Two levels:
  - queue level: W Python threads loop get -> no-op -> done on the queue
    (``reconq.WorkQueue`` vs the pure-Python client-go port);
  - controller level: ``reconq.Controller`` (Rust worker threads calling a
    Python no-op reconcile) vs ``PureController``; timed until
    ``wait_idle()`` returns.
* P2: 2,000 keys, reconcile = time.sleep(0.005), 16 workers; wall time
  against the ideal 0.625 s.
* P3: W5 through a controller: 10,000 keys each failing 3 times then
  succeeding, ExponentialBackoff(1 ms, 100 ms), 4 workers; wall time and
  calls (40,000). reconq logs every failed reconcile to the "reconq" logger;
  the pure baseline logs nothing, so that logger is silenced (level
  CRITICAL) for a like-for-like comparison.

* W6 (P1 with a store): P1 through ``reconq.Controller`` with
  ``store=`` a fresh temporary SQLite file against without, rounds
  alternating in one run (the store's cost, not reconq against the
  baseline: the ratio is with / without, 0.9 is the W6 target).

* W9 (guarantees, "Benchmarks of scheduling"): 100,000 ready keys of
  group A, then 100 of group B; 4 workers, reconcile = 100 µs of work (a
  busy loop, so it holds the GIL as real Python work does); time until
  every B key is done, with ``group=`` against without (reconq only: the
  baseline has no groups).

* aio: P1 and P2 with an ``async def`` reconcile (run on the controller's
  asyncio loop thread) beside the sync one, alternating in one run; ratios.
* S1 after a Python burst (docs/store.md): N ready keys enqueued from
  Python behind a blocked worker, ``flush_interval`` 1 s; the burst's time,
  the time after it until every key is written, and the largest lag of a
  key from its enqueue to its write (S1 allows 2 s).

Every line prints reconq, the pure-Python baseline and their ratio (> 1:
reconq is better).
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import json
import logging
import os
import statistics
import sys
import tempfile
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import pure_queue  # noqa: E402

import reconq  # noqa: E402

# --- P1: queue level ------------------------------------------------------------


def p1_once(make_queue: Callable[[], Any], shut_down_exc: type, n: int, workers: int) -> float:
    """Keys per second for one W1 run."""
    q = make_queue()
    counts = [0] * workers
    started = threading.Barrier(workers + 1)

    def worker(i: int) -> None:
        get, done = q.get, q.done
        c = 0
        started.wait()
        try:
            while True:
                key = get()
                done(key)
                c += 1
        except shut_down_exc:
            pass
        counts[i] = c

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(workers)]
    for t in threads:
        t.start()
    started.wait()
    add = q.add
    t0 = time.perf_counter()
    for k in range(n):
        add(k)
    q.shut_down()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    assert sum(counts) == n, (sum(counts), n)
    return n / elapsed


def p1(n: int, worker_counts: List[int], repeat: int) -> Dict[str, Dict[int, float]]:
    """Best keys/s per engine and worker count."""
    engines = {
        "reconq": (lambda: reconq.WorkQueue(), reconq.ShutDown),
        "pure": (lambda: pure_queue.RateLimitingQueue(), pure_queue.ShutDown),
    }
    print(f"P1: W1 with N={n:,} keys, Python no-op get/done loop (best of {repeat})")
    print(f"{'workers':>7} {'reconq keys/s':>15} {'pure keys/s':>13} {'ratio':>7}")
    results: Dict[str, Dict[int, float]] = {name: {} for name in engines}
    for w in worker_counts:
        for name, (make, exc) in engines.items():
            results[name][w] = max(p1_once(make, exc, n, w) for _ in range(repeat))
        print_rates(w, results)
    return results


def print_rates(workers: int, results: Dict[str, Dict[int, float]]) -> None:
    reconq_rate, pure_rate = results["reconq"][workers], results["pure"][workers]
    print(f"{workers:>7} {reconq_rate:>15,.0f} {pure_rate:>13,.0f} {reconq_rate / pure_rate:>6.2f}x", flush=True)


# --- P1 / P2 / P3: controller level ----------------------------------------------


def reconq_controller(reconcile: Callable[[Any], Any], workers: int, rate_limiter: Any = None) -> Any:
    return reconq.Controller(reconcile, workers=workers, rate_limiter=rate_limiter, name="bench")


def pure_controller(reconcile: Callable[[Any], Any], workers: int, rate_limiter: Any = None) -> Any:
    return pure_queue.PureController(reconcile, workers=workers, rate_limiter=rate_limiter, name="bench")


CONTROLLERS = [("reconq", reconq_controller), ("pure", pure_controller)]


def run_controller(c: Any, keys: int, timeout: float = 600) -> float:
    t0 = time.perf_counter()
    c.start()
    enqueue = c.enqueue
    for k in range(keys):
        enqueue(k)
    if not c.wait_idle(timeout):
        raise RuntimeError("controller did not go idle in time")
    elapsed = time.perf_counter() - t0
    c.stop(drain=True, timeout=60)
    return elapsed


def p1_controller(n: int, worker_counts: List[int], repeat: int) -> Dict[str, Dict[int, float]]:
    """Best keys/s per engine and worker count."""
    def reconcile(key: Any) -> None:
        pass

    print(f"\nP1 (controller): W1 with N={n:,} keys through Controller, Python no-op reconcile (best of {repeat})")
    print(f"{'workers':>7} {'reconq keys/s':>15} {'pure keys/s':>13} {'ratio':>7}")
    results: Dict[str, Dict[int, float]] = {name: {} for name, _ in CONTROLLERS}
    for w in worker_counts:
        for name, make in CONTROLLERS:
            rates = []
            for _ in range(repeat):
                c = make(reconcile, w)
                rates.append(n / run_controller(c, n))
                assert c.stats()["successes"] == n
            results[name][w] = max(rates)
        print_rates(w, results)
    return results


def p2(repeat: int) -> Dict[str, float]:
    """Best wall time per engine, and the ideal."""
    keys, workers = 2000, 16
    ideal = keys * 0.005 / workers

    def reconcile(key: Any) -> None:
        time.sleep(0.005)

    print(f"\nP2: {keys:,} keys, reconcile = sleep(5 ms), {workers} workers; ideal {ideal:.3f} s (best of {repeat})")
    best: Dict[str, float] = {}
    for name, make in CONTROLLERS:
        times = []
        for _ in range(repeat):
            c = make(reconcile, workers)
            times.append(run_controller(c, keys))
            assert c.stats()["successes"] == keys
        best[name] = min(times)
        print(f"{name:>7}: {best[name]:.3f} s (median {statistics.median(times):.3f} s), "
              f"{best[name] / ideal:.2f}x ideal", flush=True)
    print(f"  ratio (pure / reconq wall time): {best['pure'] / best['reconq']:.2f}x")
    return {**best, "ideal": ideal}


def aio(n: int, worker_counts: List[int], repeat: int) -> Dict[str, Any]:
    """P1 and P2 with an ``async def`` reconcile beside the sync one, in one
    run, alternating: P1 keys/s (a no-op either way) per worker count, and
    P2 wall time (``await asyncio.sleep(0.005)`` against ``time.sleep``)."""

    def sync_noop(key: Any) -> None:
        pass

    async def async_noop(key: Any) -> None:
        pass

    def sync_sleep(key: Any) -> None:
        time.sleep(0.005)

    async def async_sleep(key: Any) -> None:
        await asyncio.sleep(0.005)

    print(f"\nP1 async: N={n:,} keys through Controller, no-op reconcile, sync and async def (best of {repeat})")
    print(f"{'workers':>7} {'sync keys/s':>13} {'async keys/s':>14} {'async/sync':>11}")
    p1_rates: Dict[str, Dict[int, float]] = {"sync": {}, "async": {}}
    for w in worker_counts:
        rates: Dict[str, List[float]] = {"sync": [], "async": []}
        for _ in range(repeat):
            for kind, reconcile in (("sync", sync_noop), ("async", async_noop)):
                c = reconq_controller(reconcile, w)
                rates[kind].append(n / run_controller(c, n))
                assert c.stats()["successes"] == n
        for kind in rates:
            p1_rates[kind][w] = max(rates[kind])
        sync, async_ = p1_rates["sync"][w], p1_rates["async"][w]
        print(f"{w:>7} {sync:>13,.0f} {async_:>14,.0f} {async_ / sync:>10.2f}x", flush=True)

    keys, workers = 2000, 16
    ideal = keys * 0.005 / workers
    print(f"\nP2 async: {keys:,} keys, sleep 5 ms, {workers} workers, sync and async def; ideal {ideal:.3f} s "
          f"(best of {repeat})")
    times: Dict[str, List[float]] = {"sync": [], "async": []}
    for _ in range(repeat):
        for kind, reconcile in (("sync", sync_sleep), ("async", async_sleep)):
            c = reconq_controller(reconcile, workers)
            times[kind].append(run_controller(c, keys))
            assert c.stats()["successes"] == keys
    p2_best = {kind: min(t) for kind, t in times.items()}
    for kind, best in p2_best.items():
        print(f"{kind:>7}: {best:.3f} s (median {statistics.median(times[kind]):.3f} s), {best / ideal:.2f}x ideal")
    print(f"  ratio (async / sync wall time): {p2_best['async'] / p2_best['sync']:.2f}x", flush=True)
    return {"p1": p1_rates, "p2": {**p2_best, "ideal": ideal}}


def p3(repeat: int) -> Dict[str, float]:
    """Best wall time per engine."""
    keys, workers, fails = 10_000, 4, 3

    print(f"\nP3: W5 through a controller: {keys:,} keys fail {fails}x then succeed, "
          f"ExponentialBackoff(1 ms, 100 ms), {workers} workers (best of {repeat})")
    limiters = {
        "reconq": lambda: reconq.ExponentialBackoff(0.001, 0.1),
        "pure": lambda: pure_queue.ExponentialFailureRateLimiter(0.001, 0.1),
    }
    reconq_logger = logging.getLogger("reconq")
    saved_level = reconq_logger.level
    reconq_logger.setLevel(logging.CRITICAL)
    best: Dict[str, float] = {}
    try:
        for name, make in CONTROLLERS:
            times, calls_seen = [], []
            for _ in range(repeat):
                lock = threading.Lock()
                tries: Dict[Any, int] = {}

                def reconcile(key: Any) -> None:
                    with lock:
                        n = tries.get(key, 0)
                        tries[key] = n + 1
                    if n < fails:
                        raise RuntimeError("not yet")

                c = make(reconcile, workers, limiters[name]())
                times.append(run_controller(c, keys))
                calls_seen.append(sum(tries.values()))
                s = c.stats()
                assert s["successes"] == keys and s["failures"] == keys * fails, s
            best[name] = min(times)
            print(f"{name:>7}: {best[name]:.3f} s (median {statistics.median(times):.3f} s), "
                  f"calls {calls_seen[0]:,}", flush=True)
    finally:
        reconq_logger.setLevel(saved_level)
    print(f"  ratio (pure / reconq wall time): {best['pure'] / best['reconq']:.2f}x")
    return best


def w6(n: int, worker_counts: List[int], repeat: int) -> Dict[str, Dict[int, float]]:
    """Best keys/s with and without a store, per worker count."""
    def reconcile(key: Any) -> None:
        pass

    print(f"\nW6 (P1 with a store): N={n:,} keys through Controller, store= a temp file or none (best of {repeat})")
    print(f"{'workers':>7} {'store keys/s':>15} {'none keys/s':>13} {'ratio':>7}")
    results: Dict[str, Dict[int, float]] = {"store": {}, "none": {}}
    with tempfile.TemporaryDirectory(prefix="reconq-w6-") as tmp:
        for w in worker_counts:
            rates: Dict[str, List[float]] = {"store": [], "none": []}
            for r in range(repeat):
                # A fresh file per round: each starts from an empty store.
                db = os.path.join(tmp, f"w6-{w}-{r}.db")
                for name, store in (("none", None), ("store", db)):
                    c = reconq.Controller(reconcile, workers=w, name="bench", store=store)
                    rates[name].append(n / run_controller(c, n))
                    assert c.stats()["successes"] == n
            for name in rates:
                results[name][w] = max(rates[name])
            store_rate, none_rate = results["store"][w], results["none"][w]
            print(f"{w:>7} {store_rate:>15,.0f} {none_rate:>13,.0f} {store_rate / none_rate:>6.2f}x", flush=True)
    return results


def w9_once(grouped: bool, a_keys: int, b_keys: int = 100) -> float:
    """Seconds from the first B enqueue until every B key is done."""
    b_left = [b_keys]
    b_done = threading.Event()
    lock = threading.Lock()

    def reconcile(key: Any) -> None:
        end = time.perf_counter() + 100e-6
        while time.perf_counter() < end:
            pass
        if key[0] == "B":
            with lock:
                b_left[0] -= 1
                if b_left[0] == 0:
                    b_done.set()

    group = (lambda key: key[0]) if grouped else None
    c = reconq.Controller(reconcile, workers=4, group=group, name="w9")
    for i in range(a_keys):
        c.enqueue(("A", i))  # before start: all of A is ready at once
    c.start()
    t0 = time.perf_counter()
    for i in range(b_keys):
        c.enqueue(("B", i))
    if not b_done.wait(600):
        raise RuntimeError("B keys not done in time")
    elapsed = time.perf_counter() - t0
    # Dropping the A keys still waiting is the point: keep its warning quiet.
    logger = logging.getLogger("reconq.controller")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        c.stop(drain=False, timeout=60)
    finally:
        logger.setLevel(level)
    return elapsed


def w9(a_keys: int, repeat: int) -> Dict[str, float]:
    """Median seconds until every B key is done, with and without group."""
    print(f"\nW9: {a_keys:,} A keys then 100 B keys, 4 workers, 100 us of work each (median of {repeat})")
    times: Dict[str, List[float]] = {"group": [], "no group": []}
    for _ in range(repeat):
        times["group"].append(w9_once(True, a_keys))
        times["no group"].append(w9_once(False, a_keys))
    med = {name: statistics.median(ts) for name, ts in times.items()}
    print(f"  every B key done after {med['group'] * 1e3:.1f} ms with group, "
          f"{med['no group'] * 1e3:.0f} ms without ({med['no group'] / med['group']:.0f}x)")
    return med


def s1_once(n: int) -> Tuple[float, float, float]:
    """One S1 burst from Python: `n` ready keys enqueued behind a blocked
    worker, `flush_interval` 1 s. Returns the burst's time, the time after
    its last enqueue until every key was written (`store_pending` 0), and
    the largest lag of a key from its enqueue to its write. The lag reads
    the written count as enqueued minus pending, and takes the flusher to
    write in enqueue order (it takes marks in order, and int keys enqueued
    in order sort in that order within a take)."""
    gate = threading.Event()
    with tempfile.TemporaryDirectory(prefix="reconq-s1-") as tmp:
        store = reconq.SqliteStore(os.path.join(tmp, "s1.db"), flush_interval=1.0)
        def reconcile(key: Any) -> None:
            gate.wait()

        c = reconq.Controller(reconcile, workers=1, name="s1", store=store)
        c.start()
        c.enqueue(-1)  # holds the one worker: every key of the burst stays ready
        enqueued: List[Tuple[float, int]] = []
        pending: List[Tuple[float, int]] = []
        sampling = True

        def sample() -> None:
            while sampling:
                pending.append((time.perf_counter(), c.stats()["store_pending"]))
                time.sleep(0.005)

        sampler = threading.Thread(target=sample)
        sampler.start()
        t0 = time.perf_counter()
        for k in range(n):
            c.enqueue(k)
            if k % 5000 == 0:
                enqueued.append((time.perf_counter(), k))
        t1 = time.perf_counter()
        enqueued.append((t1, n))
        while c.stats()["store_pending"] > 0:
            time.sleep(0.005)
        t2 = time.perf_counter()
        sampling = False
        sampler.join()
        times = [t for t, _ in enqueued]

        def enqueued_by(t: float) -> int:
            i = bisect.bisect_right(times, t)
            return enqueued[i - 1][1] if i else 0

        written = [(t, enqueued_by(t) - p) for t, p in pending] + [(t2, n)]
        lag = max(next(tw for tw, w in written if w >= k and tw >= t) - t for t, k in enqueued)
        gate.set()
        logger = logging.getLogger("reconq")
        level = logger.level
        logger.setLevel(logging.ERROR)  # the dropped burst's warning
        try:
            c.stop(drain=False, timeout=60)
        finally:
            logger.setLevel(level)
    return t1 - t0, t2 - t1, lag


def s1(n: int, repeat: int) -> Dict[str, List[float]]:
    """S1 after a Python burst (docs/store.md): the largest lag must stay
    within flush_interval + 1 s = 2 s."""
    print(f"\nS1: {n:,} ready keys enqueued from Python behind a blocked worker, flush_interval 1 s")
    print(f"{'burst s':>8} {'written after s':>16} {'largest lag s':>14}")
    results: Dict[str, List[float]] = {"burst": [], "after": [], "lag": []}
    for _ in range(repeat):
        burst, after, lag = s1_once(n)
        for name, value in (("burst", burst), ("after", after), ("lag", lag)):
            results[name].append(value)
        print(f"{burst:>8.2f} {after:>16.2f} {lag:>14.2f}", flush=True)
    return results


def main(argv: Optional[List[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("which", nargs="*", help="p1, p2, p3, w6, w9, s1 and/or aio (default: p1 p2 p3)")
    ap.add_argument("--w9-a-keys", type=int, default=100_000, help="W9 group A keys (default 100,000)")
    ap.add_argument("--n", type=int, default=200_000, help="P1 keys (default 200,000)")
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4, 8], help="P1 worker counts")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON (for scripts/bench_report.py)")
    args = ap.parse_args(argv)
    args.which = args.which or ["p1", "p2", "p3"]
    if not set(args.which) <= {"p1", "p2", "p3", "w6", "w9", "s1", "aio"}:
        ap.error("choose from p1, p2, p3, w6, w9, s1, aio")
    print(f"Python {sys.version.split()[0]}, reconq from {os.path.dirname(reconq.__file__)}, {os.cpu_count()} CPUs")
    results: Dict[str, Any] = {"n": args.n}
    if "p1" in args.which:
        results["p1_queue"] = p1(args.n, args.workers, args.repeat)
        results["p1_controller"] = p1_controller(args.n, args.workers, args.repeat)
    if "p2" in args.which:
        results["p2"] = p2(args.repeat)
    if "p3" in args.which:
        results["p3"] = p3(args.repeat)
    if "w6" in args.which:
        results["w6"] = w6(args.n, args.workers, args.repeat)
    if "w9" in args.which:
        results["w9"] = w9(args.w9_a_keys, args.repeat)
    if "s1" in args.which:
        results["s1"] = s1(args.n, args.repeat)
    if "aio" in args.which:
        results["aio"] = aio(args.n, args.workers, args.repeat)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()

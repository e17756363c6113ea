"""Python benchmarks (spec §6): reconq against the pure-Python baseline.

    python benches/python/bench.py            # P1 (and P2/P3 when available)
    python benches/python/bench.py p1 --n 200000 --workers 1 2 4 8 --repeat 3

Build the extension optimised first (`pip install .`, or
`RELEASE=1 bash scripts/python-dev.sh --co -q`): a debug build measures
nothing useful.

* P1: W1 with N keys through a Python no-op loop. One producer (the main
  thread) adds keys 0..N-1; W worker threads loop get -> no-op -> done; time
  from the first add until every key is done (the producer shuts the queue
  down after its last add, and each worker exits once the queue is empty, so
  joining the workers means all N were done). Queue level: the Python loop
  calls the queue directly, for both engines.
* P2: 2,000 keys, reconcile = time.sleep(0.005), 16 workers; wall time
  against the ideal 0.625 s.
* P3: W5 through a controller: 10,000 keys each failing 3 times then
  succeeding, ExponentialBackoff(1 ms, 100 ms), 4 workers; wall time and
  calls (40,000).

P2 and P3 run the pure-Python controller now; their reconq side needs the
``reconq.Controller`` binding (see ``reconq_controller`` below) and is
reported as not run until it exists.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional

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


def p1(n: int, worker_counts: List[int], repeat: int) -> None:
    engines = {
        "reconq": (lambda: reconq.WorkQueue(), reconq.ShutDown),
        "pure": (lambda: pure_queue.RateLimitingQueue(), pure_queue.ShutDown),
    }
    print(f"P1: W1 with N={n:,} keys, Python no-op get/done loop (best of {repeat})")
    print(f"{'workers':>7} {'reconq keys/s':>15} {'pure keys/s':>13} {'ratio':>7}")
    for w in worker_counts:
        best: Dict[str, float] = {}
        for name, (make, exc) in engines.items():
            best[name] = max(p1_once(make, exc, n, w) for _ in range(repeat))
        ratio = best["reconq"] / best["pure"]
        print(f"{w:>7} {best['reconq']:>15,.0f} {best['pure']:>13,.0f} {ratio:>6.2f}x", flush=True)


# --- P2 / P3: controller level --------------------------------------------------


def reconq_controller(reconcile: Callable[[Any], Any], workers: int, rate_limiter: Any = None) -> Optional[Any]:
    """A reconq.Controller with the spec §4 signature, or None while the
    binding does not exist yet.

    TODO(controller binding): once ``reconq.Controller`` exists this returns
    it and P2/P3 report reconq figures with no other change.
    """
    controller = getattr(reconq, "Controller", None)
    if controller is None:
        return None
    return controller(reconcile, workers=workers, rate_limiter=rate_limiter, name="bench")


def pure_controller(reconcile: Callable[[Any], Any], workers: int, rate_limiter: Any = None) -> Any:
    return pure_queue.PureController(reconcile, workers=workers, rate_limiter=rate_limiter, name="bench")


def run_controller(c: Any, keys: int, timeout: float = 600) -> float:
    t0 = time.perf_counter()
    c.start()
    for k in range(keys):
        c.enqueue(k)
    if not c.wait_idle(timeout):
        raise RuntimeError("controller did not go idle in time")
    elapsed = time.perf_counter() - t0
    c.stop(drain=True, timeout=60)
    return elapsed


def p2(repeat: int) -> None:
    keys, workers = 2000, 16
    ideal = keys * 0.005 / workers

    def reconcile(key: Any) -> None:
        time.sleep(0.005)

    print(f"\nP2: {keys:,} keys, reconcile = sleep(5 ms), {workers} workers; ideal {ideal:.3f} s")
    for name, make in [("reconq", reconq_controller), ("pure", pure_controller)]:
        if make(reconcile, workers) is None:
            print(f"{name:>7}: not run (no reconq.Controller binding yet)")
            continue
        times = []
        for _ in range(repeat):
            c = make(reconcile, workers)
            times.append(run_controller(c, keys))
            assert c.stats()["successes"] == keys
        best = min(times)
        print(f"{name:>7}: {best:.3f} s (median {statistics.median(times):.3f} s), {best / ideal:.2f}x ideal")


def p3(repeat: int) -> None:
    keys, workers, fails = 10_000, 4, 3

    print(f"\nP3: W5 through a controller: {keys:,} keys fail {fails}x then succeed, "
          f"ExponentialBackoff(1 ms, 100 ms), {workers} workers")
    limiters = {
        "reconq": lambda: reconq.ExponentialBackoff(0.001, 0.1),
        "pure": lambda: pure_queue.ExponentialFailureRateLimiter(0.001, 0.1),
    }
    for name, make in [("reconq", reconq_controller), ("pure", pure_controller)]:
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
            if c is None:
                break
            times.append(run_controller(c, keys))
            calls_seen.append(sum(tries.values()))
        if not times:
            print(f"{name:>7}: not run (no reconq.Controller binding yet)")
            continue
        print(f"{name:>7}: {min(times):.3f} s (median {statistics.median(times):.3f} s), calls {calls_seen[0]:,}")


def main(argv: Optional[List[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("which", nargs="*", help="p1, p2 and/or p3 (default: all)")
    ap.add_argument("--n", type=int, default=200_000, help="P1 keys (default 200,000)")
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4, 8], help="P1 worker counts")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    args.which = args.which or ["p1", "p2", "p3"]
    if not set(args.which) <= {"p1", "p2", "p3"}:
        ap.error("choose from p1, p2, p3")
    print(f"Python {sys.version.split()[0]}, reconq from {os.path.dirname(reconq.__file__)}, {os.cpu_count()} CPUs")
    if "p1" in args.which:
        p1(args.n, args.workers, args.repeat)
    if "p2" in args.which:
        p2(args.repeat)
    if "p3" in args.which:
        p3(args.repeat)


if __name__ == "__main__":
    main()

"""Soak test for the Python bindings (not run in CI).

    python benches/python/soak.py [--seconds 60] [--workers 4] [--producers 2] [--window 20000]

Runs one `reconq.Controller` under continuous load for `--seconds`: producer
threads enqueue keys from a window of `--window` ids that keeps sliding
forward, so millions of distinct keys pass through in a long run. The
reconcile mixes successes (~70%), exceptions (retried by the rate limiter),
`Requeue()`, `Requeue(after=...)` and `RetryAfter`. Every few seconds it
prints ops/s (reconciles), RSS (from /proc/self/statm), the thread count
(/proc/self/task) and the queue depth. At the end it stops the producers,
waits until idle, and prints whether RSS came back to within 10% of its
level after warm-up, and whether any update was lost.

Lost updates: a producer bumps a key's version (under a lock) before
enqueueing it; each reconcile records the version it saw when it started.
Keys that fall out of the window are retired: checked (seen == version) and
forgotten, so the bookkeeping stays bounded; a retired key not yet up to
date (still delayed or retrying) is kept aside and checked again at the end,
after `wait_idle()`.

Build the extension first, ideally optimised:
`RELEASE=1 bash scripts/python-dev.sh --co -q` (then use .venv/bin/python).
Exit status 1 if an update was lost or RSS did not come back.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import itertools
import os
import random
import sys
import threading
import time

import reconq

PAGE = os.sysconf("SC_PAGE_SIZE")


def trim_malloc() -> None:
    """Asks glibc to return free memory to the OS (a no-op elsewhere)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE / 1e6


def threads() -> int:
    return len(os.listdir("/proc/self/task"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--producers", type=int, default=2)
    ap.add_argument("--window", type=int, default=20_000)
    ap.add_argument("--report-every", type=float, default=5.0)
    args = ap.parse_args()
    warmup = min(10.0, args.seconds / 6)

    lock = threading.Lock()
    versions: dict = {}  # id -> version bumped by producers
    seen: dict = {}  # id -> version seen at the start of the last reconcile
    late: dict = {}  # retired ids not up to date when retired
    low = [0]  # ids below this are retired
    counts = {"reconciles": 0, "enqueues": 0, "distinct": 0}

    def reconcile(key):
        _, ident = key
        with lock:
            if ident >= low[0] or ident in late:  # retired and done: nothing to record
                seen[ident] = versions.get(ident, late.get(ident, 0))
            counts["reconciles"] += 1
        r = random.random()
        if r < 0.70:
            return None
        if r < 0.80:
            raise RuntimeError("transient")  # retried by the rate limiter
        if r < 0.87:
            return reconq.Requeue()
        if r < 0.94:
            return reconq.Requeue(after=random.uniform(0.001, 0.05))
        raise reconq.RetryAfter(random.uniform(0.001, 0.02))

    import logging

    logging.getLogger("reconq").setLevel(logging.CRITICAL)  # failures are expected
    c = reconq.Controller(
        reconcile, workers=args.workers, rate_limiter=reconq.ExponentialBackoff(0.001, 0.05), name="soak"
    )
    c.start()

    stop = threading.Event()
    ticket = itertools.count()

    def produce(seed: int) -> None:
        rng = random.Random(seed)
        while not stop.is_set():
            for _ in range(200):
                n = next(ticket)
                ident = n // 2 + rng.randrange(args.window)  # the window slides with n
                with lock:
                    if ident < low[0]:
                        continue
                    v = versions.get(ident)
                    if v is None:
                        counts["distinct"] += 1
                        v = 0
                    versions[ident] = v + 1
                    counts["enqueues"] += 1
                c.enqueue(("k", ident))
            # Back-pressure: keep the backlog bounded.
            while c.stats()["depth"] > 4 * args.window and not stop.is_set():
                time.sleep(0.001)

    def retire(upto: int) -> None:
        with lock:
            for ident in range(low[0], upto):
                v = versions.pop(ident, None)
                s = seen.pop(ident, None)
                if v is not None and s != v:
                    late[ident] = v
            low[0] = max(low[0], upto)
            for ident in [i for i, v in late.items() if seen.get(i) == v]:
                del late[ident]
                seen.pop(ident, None)

    producers = [threading.Thread(target=produce, args=(i,), daemon=True) for i in range(args.producers)]
    t0 = time.monotonic()
    for t in producers:
        t.start()

    print(f"soak: {args.seconds:.0f} s, {args.workers} workers, {args.producers} producers, window {args.window}")
    print(f"{'t':>6} {'reconciles/s':>13} {'enqueues/s':>11} {'RSS MB':>8} {'threads':>7} {'depth':>7} {'distinct':>10}")
    last = (t0, 0, 0)
    rss_warm = None
    while True:
        time.sleep(args.report_every)
        now = time.monotonic()
        with lock:
            rec, enq, distinct = counts["reconciles"], counts["enqueues"], counts["distinct"]
        # Ids well behind the window's front are retired.
        retire(max(0, next(ticket) // 2 - 3 * args.window))
        dt = now - last[0]
        print(
            f"{now - t0:6.1f} {(rec - last[1]) / dt:13,.0f} {(enq - last[2]) / dt:11,.0f} {rss_mb():8.1f} "
            f"{threads():7d} {c.stats()['depth']:7d} {distinct:10,d} (tracked {len(versions) + len(seen)})",
            flush=True,
        )
        last = (now, rec, enq)
        if rss_warm is None and now - t0 >= warmup:
            trim_malloc()
            rss_warm = rss_mb()
        if now - t0 >= args.seconds:
            break

    stop.set()
    for t in producers:
        t.join()
    idle = c.wait_idle(timeout=60)
    retire(10**18 if not versions else max(versions) + 1)
    stats = c.stats()
    stopped = c.stop(timeout=30)
    elapsed = time.monotonic() - t0
    gc.collect()
    rss_untrimmed = rss_mb()
    # glibc keeps memory freed after the backlog's peak for reuse instead of
    # returning it to the OS; trim first, so what remains is what is held.
    trim_malloc()
    rss_end = rss_mb()
    rss_warm = rss_warm or rss_end
    lost = len(late)
    rss_ok = rss_end <= rss_warm * 1.10
    print("--- summary ---")
    print(
        f"elapsed {elapsed:.1f} s; enqueues {counts['enqueues']:,}; distinct keys {counts['distinct']:,}; "
        f"reconciles {stats['reconciles']:,} ({stats['reconciles'] / elapsed:,.0f}/s): "
        f"successes {stats['successes']:,}, failures {stats['failures']:,}, requeues {stats['requeues']:,}"
    )
    print(f"idle at end: {idle}; stopped cleanly: {stopped}; threads now {threads()}")
    print(
        f"RSS after warm-up {rss_warm:.1f} MB, at end {rss_untrimmed:.1f} MB, after malloc_trim {rss_end:.1f} MB "
        f"({(rss_end / rss_warm - 1) * 100:+.1f}%): {'OK (within 10%)' if rss_ok else 'NOT within 10%'}"
    )
    print(f"bookkeeping at end: versions {len(versions)}, seen {len(seen)}, late {len(late)}")
    print(f"lost updates: {lost}" + (f" (e.g. {sorted(late)[:5]})" if lost else ""))
    return 0 if (lost == 0 and rss_ok and idle and stopped) else 1


if __name__ == "__main__":
    sys.exit(main())

"""Soak test for the Python bindings (not run in CI).

    python benches/python/soak.py [--seconds 60] [--min-distinct 1000000] [--workers 4]
                                  [--producers 2] [--window 20000] [--glibc-defaults]

Runs one `reconq.Controller` under continuous load: producer threads enqueue
keys `("k", id)` from a window of `--window` ids that keeps sliding forward,
so millions of distinct keys pass through. The reconcile mixes successes
(~70%), exceptions (retried by the rate limiter), `Requeue()`,
`Requeue(after=...)` and `RetryAfter`. Every few seconds it prints ops/s
(reconciles and enqueues), RSS (/proc/self/statm), the thread count
(/proc/self/task), the queue depth and the distinct keys so far.

Phases: a warm-up (a sixth of `--seconds`, 10-30 s) of the same load, then a
pause: producers stop, the controller goes idle, `gc.collect()` and
`malloc_trim(0)`, and the baseline RSS is read. Then the main load runs for
`--seconds` and until at least `--min-distinct` more distinct keys were
enqueued; then the same pause and measurement. Comparing two idle, trimmed
states after the same warm-up keeps the backlog, the interpreter's and
allocator's warm-up and the engine's steady-state high-water marks out of the
comparison; what remains is what a million keys leave behind.

Checks (exit status 1 if any fails):
* RSS after the main load within 10% of the baseline;
* no lost update: a producer bumps a key's version (under a lock) before
  enqueueing it; each reconcile records the version it saw when it started;
  every key's last reconcile saw its last version;
* no reference leaks: `sys.getrefcount` of probe keys (a tuple, a str, a
  bytes and a big int) enqueued ~100,000 times each, and of the reconcile
  callable, are what they were before (the callable's once the controller
  is stopped and dropped); `gc.collect()` finds nothing uncollectable, and
  the number of gc-tracked objects is back to its baseline (within 1%).

Honest measurement: the script's own bookkeeping is preallocated: per-key
versions live in fixed `array`s indexed by `id % RING` (a ring slot is
reused only after its previous id retired), not in dicts that grow with the
keys; only ids still retrying when retired are kept aside (a handful). The
allocator: with glibc's default dynamic mmap threshold, memory freed after
the backlog's peak stays in per-thread arenas, which `malloc_trim` does not
release (see tests/soak.rs), so RSS ratchets up while nothing leaks; the
script therefore fixes the threshold at glibc's initial 128 KiB with
`mallopt` before any thread starts (as `MALLOC_MMAP_THRESHOLD_=131072`
would). `--glibc-defaults` keeps the defaults and reports RSS without
checking it.

Build the extension first, optimised:
`RELEASE=1 bash scripts/python-dev.sh --co -q` (then use .venv/bin/python).
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import itertools
import logging
import os
import random
import sys
import threading
import time
from array import array

PAGE = os.sysconf("SC_PAGE_SIZE")
M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number
RING = 1 << 18  # bookkeeping slots; must exceed the ids alive at once


def libc():
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def trim_malloc() -> None:
    """Asks glibc to return free memory to the OS (a no-op elsewhere)."""
    lib = libc()
    if lib is not None:
        lib.malloc_trim(0)


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE / 1e6


def threads() -> int:
    return len(os.listdir("/proc/self/task"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--min-distinct", type=int, default=1_000_000)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--producers", type=int, default=2)
    ap.add_argument("--window", type=int, default=20_000)
    ap.add_argument("--report-every", type=float, default=5.0)
    ap.add_argument("--glibc-defaults", action="store_true")
    args = ap.parse_args()
    if not args.glibc_defaults and libc() is not None:
        libc().mallopt(M_MMAP_THRESHOLD, 128 * 1024)
    import reconq  # after mallopt: nothing allocated by the extension yet

    logging.getLogger("reconq").setLevel(logging.CRITICAL)  # failures are expected
    warmup = min(30.0, max(10.0, args.seconds / 6))
    assert 8 * args.window < RING, "--window too large for the bookkeeping ring"

    # --- bookkeeping, all preallocated -----------------------------------
    lock = threading.Lock()
    version = array("I", bytes(4 * RING))  # bumped by producers
    seen = array("I", bytes(4 * RING))  # version the last reconcile saw
    owner = array("q", [-1]) * RING  # id using the slot, -1 for none
    late: dict = {}  # retired ids not up to date when retired: id -> version
    low = [0]  # ids below this are retired
    counts = {"reconciles": 0, "enqueues": 0, "distinct": 0, "ring_overflow": 0}
    probes = [("probe", -1), "probe-" + "s" * 20, b"probe-bytes", 2**62 + 12345]
    probe_refs_before = [sys.getrefcount(p) for p in probes]

    def reconcile(key):
        if key.__class__ is tuple and key[0] == "k":
            ident = key[1]
            slot = ident % RING
            with lock:
                if owner[slot] == ident:
                    seen[slot] = version[slot]
                elif ident in late:  # retired while still retrying: now seen
                    del late[ident]
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

    callback_refs_before = sys.getrefcount(reconcile)
    c = reconq.Controller(
        reconcile, workers=args.workers, rate_limiter=reconq.ExponentialBackoff(0.001, 0.05), name="soak"
    )
    c.start()
    ticket = itertools.count()

    def produce(seed: int, stop: threading.Event) -> None:
        rng = random.Random(seed)
        while not stop.is_set():
            for _ in range(200):
                n = next(ticket)
                ident = n // 2 + rng.randrange(args.window)  # the window slides with n
                slot = ident % RING
                with lock:
                    if ident < low[0]:
                        continue
                    if owner[slot] != ident:
                        if owner[slot] >= low[0]:  # still live: the ring is too small
                            counts["ring_overflow"] += 1
                            continue
                        owner[slot] = ident
                        version[slot] = 0
                        seen[slot] = 0
                        counts["distinct"] += 1
                    version[slot] += 1
                    counts["enqueues"] += 1
                c.enqueue(("k", ident))
            for p in probes:
                c.enqueue(p)
            # Back-pressure: keep the backlog bounded.
            while c.stats()["depth"] > 4 * args.window and not stop.is_set():
                time.sleep(0.001)

    def retire(upto: int) -> None:
        with lock:
            for ident in range(low[0], upto):
                slot = ident % RING
                if owner[slot] == ident:
                    if seen[slot] != version[slot]:
                        late[ident] = version[slot]
                    owner[slot] = -1
            low[0] = max(low[0], upto)

    t0 = time.monotonic()

    def run_load(seconds: float, min_distinct: int) -> None:
        stop = threading.Event()
        producers = [
            threading.Thread(target=produce, args=(i + int(t0), stop), daemon=True) for i in range(args.producers)
        ]
        first_distinct = counts["distinct"]
        start = time.monotonic()
        for t in producers:
            t.start()
        last = (start, counts["reconciles"], counts["enqueues"])
        while True:
            # Ids well behind the window's front are retired, often enough
            # that the ids alive at once stay far below RING.
            time.sleep(0.1)
            retire(max(0, next(ticket) // 2 - 3 * args.window))
            now = time.monotonic()
            if now - last[0] < args.report_every and now - start < seconds:
                continue
            with lock:
                rec, enq, distinct = counts["reconciles"], counts["enqueues"], counts["distinct"]
            dt = now - last[0]
            print(
                f"{now - t0:6.1f} {(rec - last[1]) / dt:13,.0f} {(enq - last[2]) / dt:11,.0f} {rss_mb():8.1f} "
                f"{threads():7d} {c.stats()['depth']:7d} {distinct:10,d} {len(late):5d}",
                flush=True,
            )
            last = (now, rec, enq)
            if now - start >= seconds and distinct - first_distinct >= min_distinct:
                break
        stop.set()
        for t in producers:
            t.join()

    def settle() -> tuple[float, int]:
        """Idle, collected and trimmed: RSS (MB) and gc-tracked objects."""
        if not c.wait_idle(timeout=60):
            raise SystemExit("the controller did not go idle")
        gc.collect()
        trim_malloc()
        return rss_mb(), len(gc.get_objects())

    print(
        f"soak: {args.seconds:.0f} s (+{warmup:.0f} s warm-up), {args.workers} workers, {args.producers} producers, "
        f"window {args.window}, >= {args.min_distinct:,} distinct keys after the baseline; "
        f"malloc: {'glibc defaults' if args.glibc_defaults else 'mmap threshold fixed at 128 KiB'}"
    )
    print(
        f"{'t':>6} {'reconciles/s':>13} {'enqueues/s':>11} {'RSS MB':>8} {'threads':>7} {'depth':>7} "
        f"{'distinct':>10} {'late':>5}"
    )
    run_load(warmup, 0)
    rss_before, objects_before = settle()
    distinct_before = counts["distinct"]
    print(
        f"--- baseline (idle, collected, trimmed): RSS {rss_before:.1f} MB, {objects_before:,} gc-tracked objects, "
        f"{distinct_before:,} distinct keys so far"
    )
    run_load(args.seconds, args.min_distinct)
    rss_after, objects_after = settle()
    elapsed = time.monotonic() - t0
    retire(next(ticket) // 2 + args.window + 1)  # everything issued
    stats = c.stats()
    stopped = c.stop(timeout=30)
    del c
    gc.collect()
    lost = len(late)
    uncollectable = len(gc.garbage)
    probe_refs_after = [sys.getrefcount(p) for p in probes]
    callback_refs_after = sys.getrefcount(reconcile)
    threads_end = threads()

    rss_change = rss_after / rss_before - 1
    objects_change = objects_after / objects_before - 1
    checks = {
        "RSS within 10%": args.glibc_defaults or rss_change <= 0.10,
        "no lost update": lost == 0 and counts["ring_overflow"] == 0,
        "probe keys' refcounts unchanged": probe_refs_after == probe_refs_before,
        "callback's refcount back": callback_refs_after == callback_refs_before,
        "nothing uncollectable": uncollectable == 0,
        "gc-tracked objects back (1%)": objects_change <= 0.01,
        "stopped cleanly": stopped,
    }
    print("--- summary ---")
    print(
        f"elapsed {elapsed:.1f} s; enqueues {counts['enqueues']:,}; distinct keys {counts['distinct']:,} "
        f"({counts['distinct'] - distinct_before:,} after the baseline); reconciles {stats['reconciles']:,} "
        f"({stats['reconciles'] / elapsed:,.0f}/s): successes {stats['successes']:,}, failures {stats['failures']:,}, "
        f"requeues {stats['requeues']:,}"
    )
    print(
        f"RSS (idle, trimmed) before {rss_before:.1f} MB, after {rss_after:.1f} MB ({rss_change * 100:+.1f}%); "
        f"bookkeeping preallocated {(len(version) * 8 + len(owner) * 8) / 1e6:.1f} MB, late ids at end {len(late)}"
    )
    print(
        f"gc-tracked objects {objects_before:,} -> {objects_after:,} ({objects_change * 100:+.2f}%); "
        f"uncollectable {uncollectable}; threads now {threads_end}"
    )
    print(
        f"refcounts: probe keys {probe_refs_before} -> {probe_refs_after}; "
        f"callback {callback_refs_before} -> {callback_refs_after}"
    )
    print(f"lost updates: {lost}" + (f" (e.g. {sorted(late)[:5]})" if lost else ""))
    for name, ok in checks.items():
        print(f"  {'ok  ' if ok else 'FAIL'} {name}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())

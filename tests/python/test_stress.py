"""Stress: 8 producer threads feeding one controller with 8 workers over
10,000 keys (reliability issue).

Checks zero lost updates (each producer bumps a key's version under a lock
*before* enqueueing it; each reconcile records the version it saw when it
started; once idle, every key's last seen version is its final version),
zero concurrent reconciles of one key, and no leaked references (a sentinel
key object and the callback are back at their baseline refcounts, no
`reconq.Controller` left reachable).

Size: `RECONQ_STRESS_OPS` enqueues in total (default 100,000; e.g.
`RECONQ_STRESS_OPS=1000000` for a long run).
"""

from __future__ import annotations

import gc
import os
import random
import sys
import threading
import time

import pytest

import reconq
from waiting import PATIENCE

OPS = int(os.environ.get("RECONQ_STRESS_OPS", "100000"))
PRODUCERS = 8
WORKERS = 8
KEYS = 10_000

pytestmark = pytest.mark.timeout(max(120, OPS // 1000))


def live_controllers() -> list:
    gc.collect()
    return [o for o in gc.get_objects() if isinstance(o, reconq.Controller)]


def test_producers_and_workers_lose_nothing_and_leak_nothing():
    controllers_before = len(live_controllers())
    sentinel = tuple(["sentinel", 424242])  # a fresh object, not a code constant
    sentinel_refs = sys.getrefcount(sentinel)

    version_lock = threading.Lock()
    versions = [0] * KEYS  # final version per key (producers)
    seen = [0] * KEYS  # version seen at the start of the last reconcile
    in_flight: set = set()
    flight_lock = threading.Lock()
    problems: list = []
    reconciles = [0]

    def reconcile(key):
        if key == sentinel:
            return None
        with flight_lock:
            if key in in_flight:
                problems.append(f"concurrent reconciles of {key}")
            in_flight.add(key)
            reconciles[0] += 1
        try:
            with version_lock:
                v = versions[key]
            # Versions only grow; a stale reconcile must not go backwards.
            if v < seen[key]:
                problems.append(f"key {key}: saw {v} after {seen[key]}")
            seen[key] = v
            if key % 97 == 0:
                time.sleep(0)  # a yield: widens the window for races
        finally:
            with flight_lock:
                in_flight.discard(key)
        return None

    callback_refs = sys.getrefcount(reconcile)
    c = reconq.Controller(reconcile, workers=WORKERS, name="stress")
    c.start()
    c.enqueue(sentinel)

    per_producer = OPS // PRODUCERS
    start_gate = threading.Barrier(PRODUCERS + 1)

    def produce(seed: int) -> None:
        rng = random.Random(seed)
        start_gate.wait()
        for _ in range(per_producer):
            key = rng.randrange(KEYS)
            with version_lock:
                versions[key] += 1
            c.enqueue(key)

    threads = [threading.Thread(target=produce, args=(i,)) for i in range(PRODUCERS)]
    for t in threads:
        t.start()
    t0 = time.monotonic()
    start_gate.wait()
    for t in threads:
        t.join(timeout=PATIENCE * 10)
        assert not t.is_alive()
    assert c.wait_idle(timeout=PATIENCE * 3)
    elapsed = time.monotonic() - t0

    stats = c.stats()
    assert not problems, problems[:10]
    lost = [k for k in range(KEYS) if seen[k] != versions[k]]
    assert not lost, f"{len(lost)} lost updates, e.g. key {lost[0]}: seen {seen[lost[0]]}, final {versions[lost[0]]}"
    assert sum(versions) == per_producer * PRODUCERS
    assert stats["failures"] == 0 and stats["depth"] == 0 and stats["processing"] == 0
    assert stats["reconciles"] == stats["successes"] == reconciles[0] + 1  # + the sentinel
    # Dedup: never more reconciles than enqueues.
    assert reconciles[0] <= per_producer * PRODUCERS
    print(
        f"\nstress: {per_producer * PRODUCERS} enqueues, {reconciles[0]} reconciles in {elapsed:.2f} s "
        f"({per_producer * PRODUCERS / elapsed:,.0f} enqueues/s)"
    )

    assert c.stop(timeout=PATIENCE) is True
    assert c.stats()["state"] == "stopped"
    del c, threads
    gc.collect()
    assert sys.getrefcount(sentinel) == sentinel_refs
    assert sys.getrefcount(reconcile) == callback_refs
    assert len(live_controllers()) == controllers_before

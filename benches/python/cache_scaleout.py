"""W13 replicas with a cache (the contract's section 18; docs/benchmarks.md,
"W13: replicas with a cache", shows the figures): 100,000 keys under an
etcd prefix (on loopback), then 1, 2 and 4 replica processes started at
once, sharded over 64 partitions, each watching the prefix through a
Cache, 4 workers each, reconcile = ``time.sleep(0.001)``.

- Scale-out: the time from starting the replicas until every key was
  reconciled once (it includes each replica's start, its list of the
  prefix and the claims of the partitions), and the ratio to one replica.
- Fail-over (4 replicas, once every key was reconciled): a burst of
  10,000 changes (puts of new values and deletes, 100 transactions of
  100), one replica SIGKILLed after the 50th transaction. The time from
  the burst's last transaction until every changed key was reconciled
  after its change, and the reconciles lost: changed keys no replica
  reconciled after their change within 60 s (goal 0), and the record
  checked for a key reconciled twice at once.

The replicas are the chaos tests' (tests/python/sharded_cache_child.py):
every reconcile appends what its cache held for its key to a record, one
``os.write`` per line; "reconciled after its change" means a reconcile
that returned saw the key's final state (values never repeat, a deleted
key never comes back).

usage: python benches/python/cache_scaleout.py [--keys 100000] [--changes 10000] [--ttl 5]
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional, Set, Tuple

TESTS = Path(__file__).resolve().parents[2] / "tests" / "python"
sys.path.insert(0, str(TESTS))

from cache_child import PREFIX  # noqa: E402
from cache_replicas import CacheReplicas, EtcdBatch  # noqa: E402
from etcd_server import Etcd  # noqa: E402
from replica_record import Record, fencing_violations, overlaps  # noqa: E402

PARTITIONS = 64
WORKERS = 4
WORK = 0.001
REPLICAS = (1, 2, 4)
#: How long a changed key may take to be reconciled before it counts as lost.
LOST_AFTER = 60.0


def wait_reconciled(r: CacheReplicas, state: Dict[str, str], keys: Set[str], timeout: float) -> Tuple[float, int]:
    """Polls the record every 50 ms until every key of `keys` was
    reconciled at its `state`; returns when it was first seen so, and how
    many were not (0, unless `timeout` passed)."""
    deadline = time.monotonic() + timeout
    while True:
        owed = r.owed(state, keys)
        now = time.monotonic()
        if not owed or now > deadline:
            return now, len(owed)
        time.sleep(0.05)


def scale_out(etcd: Etcd, state: Dict[str, str], replicas: int, ttl: float, tmp: str
              ) -> Tuple[float, float, int, int, CacheReplicas]:
    """Starts `replicas` replicas over the keys (`state`, as in etcd);
    returns the seconds until every replica's cache had synced and until
    every key was reconciled once, the keys that were not, the reconciles
    run, and the replicas (still running)."""
    record = Record(os.path.join(tmp, f"record-{replicas}"))
    r = CacheReplicas(etcd, record, ttl=ttl, partitions=PARTITIONS, workers=WORKERS, work=WORK)
    started = time.monotonic()
    r.spawn(replicas)  # returns once each printed "ready": its cache synced
    synced = time.monotonic()
    done, missing = wait_reconciled(r, state, set(state), timeout=180.0)
    reconciles = sum(1 for line in record.read() if line.phase == "end")
    return synced - started, done - started, missing, reconciles, r


def stop(r: CacheReplicas) -> None:
    """Stops every replica cleanly (SIGTERM: each gives up its partitions
    and membership), so the next run starts with no lease to wait out."""
    for pid in list(r.procs):
        r.kill(pid, signal.SIGTERM)
    r.close()


def burst(etcd: Etcd, state: Dict[str, str], r: CacheReplicas, changes: int, rng: random.Random
          ) -> Tuple[float, int, Set[str], int]:
    """The burst with a SIGKILL after half of it, applied to `state` too;
    returns the seconds from its end until every changed key was
    reconciled after its change, the keys lost, the keys changed, and the
    record's violations."""
    items = EtcdBatch(etcd, size=100)
    live = sorted(state)
    deleted: Set[str] = set()
    changed: Set[str] = set()
    victim: Optional[int] = None
    for n in range(changes):
        key = rng.choice(live)
        while key in deleted:
            key = rng.choice(live)
        if rng.random() < 0.2:
            items.delete(key)
            deleted.add(key)
            del state[key]
        else:
            items.put(key, f"b{n}")
            state[key] = f"b{n}"
        changed.add(key)
        if victim is None and items.sent >= changes // items.size // 2:
            victim = next(iter(r.procs))
            r.kill(victim, signal.SIGKILL)
    items.flush()
    ended = time.monotonic()
    done, lost = wait_reconciled(r, state, changed, timeout=LOST_AFTER)
    lines = r.cache_record.read()
    violations = len(fencing_violations(lines)) + len(overlaps(lines))
    return done - ended, lost, changed, violations


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--changes", type=int, default=10_000)
    parser.add_argument("--ttl", type=float, default=5.0)
    parser.add_argument("--seed", type=int, default=13)
    args = parser.parse_args()

    times: Dict[int, float] = {}
    rows: List[str] = []
    etcd = Etcd("--max-txn-ops", "1000")
    try:
        state = {f"k{i}": f"v{i}" for i in range(args.keys)}
        etcd.put_all({PREFIX + key: value for key, value in state.items()}, per_txn=1000)
        with tempfile.TemporaryDirectory() as tmp:
            for n in REPLICAS:
                synced, seconds, missing, reconciles, r = scale_out(etcd, state, n, args.ttl, tmp)
                times[n] = seconds
                rows.append(f"| {n} | {seconds:.2f} s | {times[1] / seconds:.2f} | {n} | {synced:.2f} s | {reconciles:,} "
                            f"| {missing} |")
                print(rows[-1], file=sys.stderr, flush=True)
                if n != REPLICAS[-1]:
                    stop(r)
            try:
                after, lost, changed, violations = burst(etcd, state, r, args.changes, random.Random(args.seed))
            finally:
                r.close()
    finally:
        etcd.close()

    print(f"\nW13 scale-out: {args.keys:,} keys of sleep(1 ms) under one etcd prefix, {WORKERS} workers per replica, "
          f"{PARTITIONS} partitions, ttl={args.ttl:g} s; from starting the replicas\n")
    print("| replicas | every key reconciled once | speed-up | ideal | every cache synced | reconciles run "
          "| keys never reconciled |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    print("\n".join(rows))
    print(f"\nW13 fail-over: 4 replicas, a burst of {args.changes:,} changes ({len(changed):,} keys), "
          "one replica SIGKILLed halfway\n")
    print("| figure | value |")
    print("|---|---:|")
    print(f"| burst's end to every changed key reconciled after its change | {after:.2f} s |")
    print(f"| reconciles lost (changed keys not reconciled within {LOST_AFTER:g} s; goal 0) | {lost} |")
    print(f"| reconciles of a key at once, or by an old owner after a new one | {violations} |")


if __name__ == "__main__":
    main()

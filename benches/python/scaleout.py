"""W8 scale-out (docs/guarantees.md, "Benchmarks of the second wave";
docs/replicas.md, "Sharding", shows the figures): 1, 2 and 4 replica
processes sharded over one etcd on loopback, 64 partitions, 4 workers
each, 20,000 keys whose reconcile is ``time.sleep(0.005)``. Every replica
enqueues every key (as every Kubernetes replica watches every object) and
keeps its own; keys/s from the "go" to the last replica idle, and the
ratio to one replica. Then the time until the partitions are balanced
again (⌊P/N⌋ or ⌈P/N⌉ each, read from etcd) after a join, a clean leave
(SIGTERM) and a SIGKILL, 10 rounds each, p50 / p99, at ttl=5.

The replicas are the chaos tests' (tests/python/chaos_child.py).

usage: python benches/python/scaleout.py [--keys 20000] [--rounds 10] [--ttl 5]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

TESTS = Path(__file__).resolve().parents[2] / "tests" / "python"
sys.path.insert(0, str(TESTS))

from etcd_server import Etcd  # noqa: E402
from fenced_record import FencedRecord  # noqa: E402
from replicas import Replicas, balanced  # noqa: E402
from figures import percentile  # noqa: E402

PARTITIONS = 64
WORKERS = 4


def wait_balanced(etcd: Etcd, live: int, timeout: float = 60.0) -> float:
    """Polls etcd every 10 ms; returns when it was first seen balanced."""
    deadline = time.monotonic() + timeout
    while not balanced(etcd, PARTITIONS, live):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{live} replicas did not balance")
        time.sleep(0.01)
    return time.monotonic()


def throughput(replica_count: int, keys: int, ttl: float) -> float:
    etcd = Etcd()
    with tempfile.TemporaryDirectory() as tmp:
        args = ["--partitions", str(PARTITIONS), "--work", "0.005", "--once", "--unrecorded",
                "--workers", str(WORKERS), "--wait-go"]
        r = Replicas(etcd, FencedRecord(os.path.join(tmp, "record")), ttl=ttl, keys=keys, args=args)
        try:
            r.spawn(replica_count)
            wait_balanced(etcd, replica_count)
            go = time.monotonic()
            for proc in r.procs.values():
                assert proc.stdin is not None
                proc.stdin.write("go\n")
                proc.stdin.flush()
            done = []
            for proc in r.procs.values():
                assert proc.stdout is not None
                line = proc.stdout.readline().split()
                assert line[0] == "done", line
                done.append(float(line[1]))
            return keys / (max(done) - go)
        finally:
            r.close()
            etcd.close()


def rebalancing(rounds: int, ttl: float) -> Dict[str, List[float]]:
    etcd = Etcd()
    times: Dict[str, List[float]] = {"join": [], "clean leave": [], "SIGKILL": []}
    with tempfile.TemporaryDirectory() as tmp:
        args = ["--partitions", str(PARTITIONS), "--work", "0.005", "--once", "--unrecorded"]
        r = Replicas(etcd, FencedRecord(os.path.join(tmp, "record")), ttl=ttl, keys=1000, args=args)
        try:
            r.spawn(2)
            wait_balanced(etcd, 2)
            for _ in range(rounds):
                r.spawn()  # returns once the replica has started
                joined = time.monotonic()
                times["join"].append(wait_balanced(etcd, 3) - joined)
                pid = next(iter(r.procs))
                left = time.monotonic()
                r.kill(pid, signal.SIGTERM)
                times["clean leave"].append(wait_balanced(etcd, 2) - left)
                r.spawn()
                wait_balanced(etcd, 3)
                pid = next(iter(r.procs))
                killed = time.monotonic()
                r.kill(pid, signal.SIGKILL)
                times["SIGKILL"].append(wait_balanced(etcd, 2) - killed)
                print(f"round: {[round(v[-1], 2) for v in times.values()]}", file=sys.stderr, flush=True)
        finally:
            r.close()
            etcd.close()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keys", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--ttl", type=float, default=5.0)
    args = parser.parse_args()

    rates = {n: throughput(n, args.keys, args.ttl) for n in (1, 2, 4)}
    print(f"\nW8 scale-out: {args.keys} keys of sleep(5 ms), {WORKERS} workers per replica, {PARTITIONS} partitions\n")
    print("| replicas | keys/s | ratio to one replica | ideal |")
    print("|---:|---:|---:|---:|")
    for n, rate in rates.items():
        print(f"| {n} | {rate:,.0f} | {rate / rates[1]:.2f} | {n} |")

    times = rebalancing(args.rounds, args.ttl)
    print(f"\nW8 rebalancing, 2 <-> 3 replicas, ttl={args.ttl:g} s, {args.rounds} rounds (until etcd shows balance)\n")
    print("| change | p50 | p99 |")
    print("|---|---:|---:|")
    for change, values in times.items():
        print(f"| {change} | {statistics.median(values):.2f} s | {percentile(values, 0.99):.2f} s |")


if __name__ == "__main__":
    main()

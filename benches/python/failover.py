"""W7 fail-over (docs/guarantees.md, "Benchmarks of the second wave";
docs/replicas.md, "Leader election", shows the figures):
two replica processes under one election on a loopback etcd, ttl=5. Each
round ends the leader, by SIGKILL (a crash) or SIGTERM (``run()`` stops:
reconciles return, then the lease is revoked), and times how long until
the standby's first reconcile as leader; a fresh replica then joins as the
next standby. Prints p50 / p99 per way, beside controller-runtime's
defaults (derived from its LeaseDuration 15 s, RenewDeadline 10 s and
RetryPeriod 2 s with client-go's jitter factor 1.2:
controller-runtime pkg/manager/internal.go, client-go
tools/leaderelection/leaderelection.go).

The replicas are the chaos tests' (tests/python/chaos_child.py): every
reconcile writes to a fenced record, and its first accepted write under a
new token is the moment measured (time.monotonic(), one clock for every
process on the machine).

usage: python benches/python/failover.py [--rounds 20] [--ttl 5]
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
from replicas import Replicas  # noqa: E402
from figures import percentile  # noqa: E402

#: controller-runtime with its defaults, for the same two events.
CONTROLLER_RUNTIME = {
    "SIGKILL": "13-24 s (LeaseDuration 15 s after the last observed renew, plus up to two polls of 2-4.4 s)",
    "stop": "<= ~4.4 s with ReleaseOnCancel (next jittered poll), 13-24 s without",
}


def first_write(record: FencedRecord, token: int) -> float:
    """When the first reconcile under `token` wrote."""
    return min(a.at for a in record.attempts() if a.accepted and a.token == token)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--ttl", type=float, default=5.0)
    args = parser.parse_args()

    etcd = Etcd()
    with tempfile.TemporaryDirectory() as tmp:
        replicas = Replicas(etcd, FencedRecord(os.path.join(tmp, "record")), ttl=args.ttl)
        times: Dict[str, List[float]] = {"SIGKILL": [], "stop": []}
        try:
            replicas.spawn(2)
            pid, token = replicas.leader_after(0)
            for way, sig in (("SIGKILL", signal.SIGKILL), ("stop", signal.SIGTERM)):
                for _ in range(args.rounds):
                    ended = time.monotonic()
                    replicas.kill(pid, sig)
                    pid, token = replicas.leader_after(token)
                    times[way].append(first_write(replicas.record, token) - ended)
                    replicas.spawn()
                    print(f"{way}: {times[way][-1]:.3f} s", file=sys.stderr, flush=True)
        finally:
            replicas.close()
            etcd.close()

    print(f"\nW7 fail-over, ttl={args.ttl:g} s, {args.rounds} rounds each (time to the standby's first reconcile)\n")
    print("| leader ended by | reconq p50 | reconq p99 | reconq max | target | controller-runtime defaults |")
    print("|---|---:|---:|---:|---|---|")
    targets = {"SIGKILL": f"p99 <= ttl + 1 s = {args.ttl + 1:g} s", "stop": "p99 <= 1 s"}
    for way, values in times.items():
        print(
            f"| {way} | {statistics.median(values):.2f} s | {percentile(values, 0.99):.2f} s | {max(values):.2f} s "
            f"| {targets[way]} | {CONTROLLER_RUNTIME[way]} |"
        )


if __name__ == "__main__":
    main()

"""One replica for the chaos tests and the W7/W8 benchmarks: a Controller
under a LeaderElection, or with ``--partitions`` under Sharding, whose
reconcile writes to a fenced record at its start and end (fenced per
partition under sharding) and, by default, requeues its key, so an owner
always has work. Runs until SIGTERM (a clean stop: reconciles return, then
leadership or partitions are given up).

usage: chaos_child.py ENDPOINT RECORD TTL IDENTITY KEYS
           [--partitions P] [--work SECONDS] [--once] [--workers N] [--wait-go] [--unrecorded]
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Optional

import reconq
from fenced_record import FencedRecord


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("endpoint", "record", "ttl", "identity", "keys"):
        parser.add_argument(name)
    parser.add_argument("--partitions", type=int, default=None)
    parser.add_argument("--work", type=float, default=0.02)
    parser.add_argument("--once", action="store_true", help="reconcile each key once (no requeue)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--wait-go", action="store_true", help="enqueue the keys after reading 'go' on stdin")
    parser.add_argument("--unrecorded", action="store_true", help="reconcile = sleep(work), no record (benchmarks)")
    args = parser.parse_args()
    record = FencedRecord(args.record)
    keys = range(int(args.keys))
    partitions: Optional[int] = args.partitions

    def reconcile(key: int) -> Optional[reconq.Requeue]:
        ctx = reconq.context()
        token = ctx.fencing_token
        assert token is not None
        fence = reconq.partition_of(key, partitions) if partitions else 0
        if args.unrecorded:
            time.sleep(args.work)
            return None
        record.write(token, key, "begin", fence=fence)
        ctx.wait_cancelled(args.work)
        record.write(token, key, "end", cancelled=ctx.cancelled, fence=fence)
        return None if args.once else reconq.Requeue(after=0.05)

    if partitions:
        sharding = reconq.Sharding(args.endpoint, "chaos", partitions=partitions, ttl=float(args.ttl),
                                   identity=args.identity)
        controller = reconq.Controller(reconcile, workers=args.workers, name="chaos", sharding=sharding,
                                       resync=lambda: keys)
    else:
        election = reconq.LeaderElection(args.endpoint, "chaos", ttl=float(args.ttl), identity=args.identity)
        controller = reconq.Controller(reconcile, workers=args.workers, name="chaos", leader_election=election)
    controller.start()
    print("ready", flush=True)
    if args.wait_go:
        sys.stdin.readline()
    for key in keys:
        controller.enqueue(key)
    if args.once:
        # Its keys done (the others were dropped at enqueue): say when.
        controller.wait_idle()
        print(f"done {time.monotonic()}", flush=True)
    controller.run(stop_timeout=5.0)


if __name__ == "__main__":
    main()

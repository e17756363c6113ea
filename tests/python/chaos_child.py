"""One replica for the leader election chaos tests and the W7 benchmark:
a Controller under a LeaderElection whose reconcile writes to a fenced
record at its start and end, and requeues its key, so a leader always has
work. Runs until SIGTERM (a clean stop: reconciles return, then leadership
is given up).

usage: chaos_child.py ENDPOINT RECORD TTL IDENTITY KEYS [RECONCILE_SECONDS]
"""

from __future__ import annotations

import sys

import reconq
from fenced_record import FencedRecord


def main() -> None:
    endpoint, record_path, ttl, identity, keys = sys.argv[1:6]
    work = float(sys.argv[6]) if len(sys.argv) > 6 else 0.02
    record = FencedRecord(record_path)

    def reconcile(key: int) -> reconq.Requeue:
        ctx = reconq.context()
        token = ctx.fencing_token
        assert token is not None
        record.write(token, key, "begin")
        ctx.wait_cancelled(work)
        record.write(token, key, "end", cancelled=ctx.cancelled)
        return reconq.Requeue(after=0.05)

    election = reconq.LeaderElection(endpoint, "chaos", ttl=float(ttl), identity=identity)
    controller = reconq.Controller(reconcile, workers=2, name="chaos", leader_election=election)
    for key in range(int(keys)):
        controller.enqueue(key)
    print("ready", flush=True)
    controller.run(stop_timeout=5.0)


if __name__ == "__main__":
    main()

"""One replica for the sharded cache chaos tests and the W13 benchmark
(guarantees §17, C1/C2): a Controller under Sharding (group ``chaos``)
watching a Cache of the keys under ``/items/`` of a real etcd, as a user
scaling out writes it. Each reconcile reads its key's value from the
cache, appends a ``begin`` line to the record (replica_record.py), works
``--work`` seconds, and appends an ``end`` line. A value starting with
``hold`` keeps its reconcile running while the file RECORD.hold exists (a
test SIGKILLs the owner inside it). Prints ``ready`` once the cache has
applied its first list, then runs until SIGTERM (a clean stop: reconciles
return, then the partitions are given up).

usage: sharded_cache_child.py ENDPOINT RECORD TTL IDENTITY
           [--partitions P] [--work SECONDS] [--workers N]
"""

from __future__ import annotations

import argparse
import os
import time

import reconq
from cache_child import PREFIX
from replica_record import ABSENT, append, open_for_append

HOLD = "hold"


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("endpoint", "record", "ttl", "identity"):
        parser.add_argument(name)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--work", type=float, default=0.001)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    record = open_for_append(args.record)
    held = f"{args.record}.hold"
    cache = reconq.Cache(reconq.EtcdSource(args.endpoint, PREFIX, decode=bytes.decode), name="items")

    def reconcile(key: str) -> None:
        token = reconq.context().fencing_token
        assert token is not None
        partition = reconq.partition_of(key, args.partitions)
        value = cache.get(key)
        seen = ABSENT if value is None else value
        append(record, "begin", partition, token, key, seen)
        while seen.startswith(HOLD) and os.path.exists(held):
            time.sleep(0.01)
        time.sleep(args.work)
        append(record, "end", partition, token, key, seen)

    sharding = reconq.Sharding(args.endpoint, "chaos", partitions=args.partitions, ttl=float(args.ttl),
                               identity=args.identity)
    controller = reconq.Controller(reconcile, workers=args.workers, name="chaos", sharding=sharding)
    # A Python map, the default's answer: changes then reach the watch a
    # run at a time under one hold of the GIL, the path Python handlers
    # take, with the tombstones of sharding (C1) beside it.
    controller.watch_cache(cache, map=lambda key, obj: [key])
    controller.start()
    controller.wait_synced()
    print("ready", flush=True)
    controller.run(stop_timeout=5.0)


if __name__ == "__main__":
    main()

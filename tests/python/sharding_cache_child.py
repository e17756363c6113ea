"""One replica for tests/python/test_sharding_cache.py (issue 34's user
report): a Controller sharded on a real etcd (``Sharding(partitions=4,
ttl=3)``) watching ``Cache(EtcdSource(ENDPOINT, "/objects/"))``. Each
reconcile appends one line to RECORD in one unbuffered ``os.write`` (a
SIGKILL loses no line written):

    PID KEY SEEN begin TIME

SEEN is the value the cache holds (``-`` when absent), TIME is
``time.monotonic()`` (one clock for every process on the machine). A
reconcile of ``--hang KEY`` then blocks until the process dies (the test
SIGKILLs the owner inside it). Prints ``ready`` once started; runs until
SIGTERM.

usage: sharding_cache_child.py ENDPOINT RECORD IDENTITY [--hang KEY]
"""

from __future__ import annotations

import argparse
import os
import threading
import time

import reconq

PREFIX = "/objects/"
GROUP = "objects"
PARTITIONS = 4


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("endpoint", "record", "identity"):
        parser.add_argument(name)
    parser.add_argument("--hang", default=None)
    args = parser.parse_args()
    record = os.open(args.record, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    cache = reconq.Cache(reconq.EtcdSource(args.endpoint, PREFIX, decode=bytes.decode), name="objects")
    never = threading.Event()

    def reconcile(key: str) -> None:
        obj = cache.get(key)
        os.write(record, f"{os.getpid()} {key} {'-' if obj is None else obj} begin {time.monotonic()}\n".encode())
        if key == args.hang:
            never.wait()

    sharding = reconq.Sharding(args.endpoint, GROUP, partitions=PARTITIONS, ttl=3.0, identity=args.identity)
    controller = reconq.Controller(reconcile, name=GROUP, workers=2, sharding=sharding)
    controller.watch_cache(cache)
    controller.start()
    print("ready", flush=True)
    controller.run(stop_timeout=5.0)


if __name__ == "__main__":
    main()

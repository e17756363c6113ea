"""Python calls in batches (docs/benchmarks.md, "Python calls in
batches"): how long a cache of an etcd prefix takes to sync, idle and
beside one busy Python thread, when the cache's thread calls Python for
each key: a `decode`, a watch's `map`, an index function.

    python benches/python/gil_batches.py                 # 5,000 keys, every mode
    python benches/python/gil_batches.py --keys 20000 --modes map

A thread that takes the GIL waits for a running Python thread to hand it
over (up to the switch interval, 5 ms): calls that each took the GIL on
their own made each key wait that long; calls in batches wait once a
batch. Compare builds by running this with each installed in turn.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any, Dict

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "python"))

import reconq  # noqa: E402
from etcd_server import Etcd  # noqa: E402

PREFIX = "/gil/"


def synced_in(etcd: Etcd, mode: str, busy: bool) -> float:
    """Seconds from start() to synced for a cache of `mode`, with one
    Python thread spinning beside it if `busy`."""
    stop = threading.Event()

    def spin() -> None:
        x = 0
        while not stop.is_set():
            x += 1

    spinner = threading.Thread(target=spin)
    if busy:
        spinner.start()
    try:
        decode: Dict[str, Any] = {"decode": json.loads} if mode == "decode" else {}
        indexes: Dict[str, Any] = {"indexes": {"i": lambda key, obj: [str(obj)]}} if mode == "index" else {}
        cache = reconq.Cache(reconq.EtcdSource([etcd.endpoint], PREFIX, **decode), name=mode, **indexes)
        controller = reconq.Controller(lambda key: None, name=mode)
        controller.watch_cache(cache, **({"map": lambda key, obj: [key]} if mode == "map" else {}))
        started = time.perf_counter()
        controller.start()
        assert controller.wait_synced(timeout=600)
        took = time.perf_counter() - started
        controller.stop()
        return took
    finally:
        stop.set()
        if busy:
            spinner.join()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keys", type=int, default=5000)
    parser.add_argument("--modes", nargs="+", default=["decode", "map", "index"], choices=["decode", "map", "index"])
    args = parser.parse_args()
    etcd = Etcd()
    try:
        etcd.put_all({f"{PREFIX}k{i:07d}": json.dumps(i) for i in range(args.keys)}, per_txn=100)
        for mode in args.modes:
            idle, busy = synced_in(etcd, mode, False), synced_in(etcd, mode, True)
            print(f"{mode:>6}: {args.keys} keys synced in {idle:.2f} s idle, {busy:.2f} s beside a busy Python thread")
    finally:
        etcd.close()


if __name__ == "__main__":
    main()

"""One run of W14's restart row (benches/python/w14_input.py): a
controller watching ``Cache(EtcdSource(ENDPOINT, PREFIX), store=STORE)``
with a store on the same file (2 workers, a Python reconcile that reads
its key from the cache and counts it). It runs on whichever interpreter
starts it, so the harness can run the build before a change the same way.

Prints, each on its own line (times are ``time.monotonic()``, one clock
for every process on the machine, so the harness measures from the
moment it started this process):

    synced T                 the cache is synced (wait_synced returned)
    done T CPU               the EXPECT-th reconcile ended (CPU: this
                             process's CPU seconds then)
    idle COUNT               every reconcile ran (wait_idle, then
                             cache.flush() so the deletes a restart finds
                             are enqueued too, then wait_idle again):
                             COUNT reconciles in all; with --record, their
                             keys are in that file, one a line

then waits for SIGTERM (a clean stop: the controller drains and flushes)
or SIGKILL.

usage: w14_restart_child.py STORE ENDPOINT PREFIX EXPECT [--record PATH]
"""

from __future__ import annotations

import argparse
import os
import resource
import signal
import threading
import time
from typing import List

import reconq


def say(line: str) -> None:
    """One line to stdout in one write: lines from the reconcile's thread
    and the main thread never interleave."""
    os.write(1, f"{line}\n".encode())


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("store", "endpoint", "prefix"):
        parser.add_argument(name)
    parser.add_argument("expect", type=int)
    parser.add_argument("--record")
    args = parser.parse_args()
    # SIGTERM stays pending until the end's sigwait (blocked before any
    # thread starts, so in all of them): an Event set from a handler can
    # deadlock with the main thread's own wait on it.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})

    store = reconq.SqliteStore(args.store)
    cache = reconq.Cache(reconq.EtcdSource(args.endpoint, args.prefix), name="w14", store=store)
    reconciled: List[str] = []
    lock = threading.Lock()

    def reconcile(key: str) -> None:
        cache.get(key)
        with lock:
            reconciled.append(key)
            if len(reconciled) == args.expect:
                usage = resource.getrusage(resource.RUSAGE_SELF)
                say(f"done {time.monotonic()} {usage.ru_utime + usage.ru_stime}")

    controller = reconq.Controller(reconcile, name="w14", workers=2, store=store)
    controller.watch_cache(cache)
    controller.start()
    assert controller.wait_synced(timeout=3600)
    say(f"synced {time.monotonic()}")
    assert controller.wait_idle(timeout=3600)
    cache.flush()
    assert controller.wait_idle(timeout=3600)
    with lock:
        if args.record is not None:
            with open(args.record, "w") as f:
                f.writelines(f"{key}\n" for key in reconciled)
        say(f"idle {len(reconciled)}")
    signal.sigwait({signal.SIGTERM})
    controller.stop()
    cache.stop()


if __name__ == "__main__":
    main()

"""One run of a controller watching a cache with ``store=`` (guarantees §13
E9), for the restart tests: the cache follows the keys under ``/items/`` of
a real etcd, or a ``table_source.Table``; the controller (2 workers) and
the cache share one ``SqliteStore``. Each reconcile reads the key's state
from the cache, works ``--work`` seconds, then appends one line to the
record, in one unbuffered ``write`` (a SIGKILL loses no line written):

    RUN KEY SEEN STARTED ENDED

SEEN is the value the cache held (``-`` for absent); STARTED and ENDED are
``time.monotonic()`` (one clock for every process on the machine). Prints
``synced`` once the first list is applied, then runs until SIGTERM (a
clean stop: the queue drains, the store is flushed).

With ``--flush-on-stdin``, prints ``idle`` once the first list's keys are
reconciled, then each line read from stdin is a position: once the cache
has applied it, the line ``RUN !flush - T T`` goes to the record,
then ``cache.flush()`` runs, then ``flushed`` is printed. With
``--settle``, each of those first waits until the controller is idle and
writes its own marks after ``cache.flush()`` (``controller.flush()``):
nothing is pending at a kill that follows.

With ``--maps PATH``, the controller watches the cache through a ``map``
that appends ``RUN KEY OBJ`` to PATH for each call (OBJ ``-`` for None;
one ``write`` a line, as the record). With ``--dump PATH``, a clean stop
writes ``{"stats": cache.stats(), "contents": {key: object}}`` to PATH as
JSON once the controller stopped (the cache's own view, to compare with
the system's).

usage: cache_child.py STORE RECORD RUN (etcd ENDPOINT | table PATH)
           [--flush-interval SECONDS] [--work SECONDS] [--flush-on-stdin]
           [--settle] [--maps PATH] [--dump PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from typing import Any

import reconq
from table_source import Table

PREFIX = "/items/"
ABSENT = "-"
FLUSH_MARK = "!flush"
#: The run's kind of source.
KIND = ""


#: What ``decode`` makes of an etcd value (kind ``etcd-decoded``).
DECODED = "decoded:"


def decoded(value: bytes) -> str:
    return DECODED + value.decode()


def source(kind: str, where: str) -> Any:
    # etcd's bytes are what a store keeps, decoded or not, so a restart
    # resumes (a decoded value is decoded again from them).
    if kind == "etcd":
        return reconq.EtcdSource(where, PREFIX, name="items")
    if kind == "etcd-decoded":
        return reconq.EtcdSource(where, PREFIX, name="items", decode=decoded)
    assert kind == "table", kind
    return Table(where).source("items")


def text(obj: Any) -> str:
    """How the record writes an object: etcd's bytes as text, what
    `decoded` made as that text, None as absent; anything else marked, so
    it matches no state."""
    if obj is None:
        return ABSENT
    if isinstance(obj, bytes):
        return obj.decode() if KIND != "etcd-decoded" else f"undecoded:{obj!r}"
    if isinstance(obj, str) and obj.startswith(DECODED):
        return obj[len(DECODED):]
    return str(obj)


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("store", "record", "run", "kind", "where"):
        parser.add_argument(name)
    parser.add_argument("--flush-interval", type=float, default=0.1)
    parser.add_argument("--work", type=float, default=0.005)
    parser.add_argument("--flush-on-stdin", action="store_true")
    parser.add_argument("--settle", action="store_true")
    parser.add_argument("--maps")
    parser.add_argument("--dump")
    args = parser.parse_args()
    global KIND
    KIND = args.kind
    # SIGTERM is a clean stop from the start, before "synced" is printed:
    # it stays pending until the sigwait at the end (blocked before any
    # thread starts, so in all of them). An Event set from a handler
    # instead can deadlock with the main thread's own wait on it.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    store = reconq.SqliteStore(args.store, flush_interval=args.flush_interval)
    cache = reconq.Cache(source(args.kind, args.where), name="items", store=store)
    record = os.open(args.record, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def line(key: str, seen: str, started: float, ended: float) -> None:
        os.write(record, f"{args.run} {key} {seen} {started} {ended}\n".encode())

    def reconcile(key: str) -> None:
        started = time.monotonic()
        obj = cache.get(key)
        time.sleep(args.work)
        line(key, text(obj), started, time.monotonic())

    controller = reconq.Controller(reconcile, name="sync", workers=2, store=store)
    if args.maps is None:
        controller.watch_cache(cache)
    else:
        maps = os.open(args.maps, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

        def mapped(key: str, obj: Any) -> "list[str]":
            os.write(maps, f"{args.run} {key} {text(obj)}\n".encode())
            return [key]

        controller.watch_cache(cache, map=mapped)
    controller.start()
    controller.wait_synced()
    print("synced", flush=True)
    if args.flush_on_stdin:
        # The list's creates are enqueued once their trace is written (and
        # a restart's deletes once found): cache.flush() returns after both.
        cache.flush()
        controller.wait_idle()
        print("idle", flush=True)
        settle = controller if args.settle else None
        threading.Thread(target=flush_on_stdin, args=(cache, line, settle), daemon=True).start()
    signal.sigwait({signal.SIGTERM})
    controller.stop()
    if args.dump is not None:
        with open(args.dump, "w") as f:
            json.dump({"stats": cache.stats(), "contents": {key: text(cache.get(key)) for key in cache.keys()}}, f)


def flush_on_stdin(cache: reconq.Cache, line: Any, settle: "reconq.Controller | None") -> None:
    for position in sys.stdin:
        while cache.stats()["position"] < int(position):
            time.sleep(0.005)
        if settle is not None:
            settle.wait_idle()
        now = time.monotonic()
        line(FLUSH_MARK, ABSENT, now, now)
        cache.flush()
        if settle is not None:
            settle.flush()
        print("flushed", flush=True)


if __name__ == "__main__":
    main()

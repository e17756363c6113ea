"""W14, the input side at a million keys (docs/benchmarks.md): the time from
start to every key reconciled once, and the CPU etcd spends serving it,
for three readers of one etcd prefix, side by side in one round, the order
alternated round by round:

* reconq: ``Cache(EtcdSource)`` watched by a ``Controller`` (2 workers, a
  Python reconcile that reads its key from the cache); start to
  ``wait_synced()`` (the list applied) and to ``wait_idle()`` (every key
  reconciled once).
* plain Python: the reflector a user would write instead, ``etcd3gw``
  (PyPI; the gateway, one range call) into a dict, then the same
  reconcile on a ``ThreadPoolExecutor`` of 2 threads.
* ``etcdctl get --prefix`` (gRPC, output to /dev/null): etcd's own floor.

etcd is started here (loopback, a temporary data directory, removed at the
end) with N keys ``/w14/key-0000000`` = ``value-0`` ...; they are loaded
through the gateway in transactions of 10,000 puts. etcd's CPU is its
utime + stime from /proc around each reader; the reader's ("client CPU":
this process, or etcdctl's) from getrusage.

The restart row (``--rows restart``): a process of
``w14_restart_child.py`` (a controller watching the cache, both with a
store) runs until every key is reconciled and ``cache.flush()`` returned,
is stopped (SIGKILL, or a clean stop: SIGTERM), then 200 changes are made
one request each (100 puts to keys it holds, 100 deletes), then a new
process starts on the same store: the time from its start to synced and
to the 200th reconcile, the reconciles it made in all (they must be
exactly those 200 keys), etcd's CPU from its start to the 200th
reconcile, and the process's own CPU then. After a SIGKILL's restart,
the same process is stopped cleanly for the clean stop's, so one full
sync serves both. ``--before PYTHON``: the same with a Python whose
``reconq`` is the build before the change (a wheel of it installed in
its own venv), side by side, the order alternated round by round; the
deleted keys are put back between contenders. ``--before`` adds that
build to the sync and memory rows too (a contender named ``before``).

The p99 row (``--rows p99``): put -> Python reconcile at 1,000 puts/s for
10 s, to 100 of the N keys (spread over the prefix) in turn, with
``tail_latency.py``'s contenders watching the whole prefix: reconq
(``Cache(EtcdSource)``, a ``Controller`` of 4 workers, synced and each key
reconciled once before the puts start) and the plain reflector
(``etcd3gw``'s ``get_prefix`` into a dict, ``watch_prefix``, a
``ThreadPoolExecutor`` of 4), each in a fresh process, order alternated;
p50 / p99 / max from a put's send to its reconcile's entry. The keys put
get their loaded values back after each run.

The bytes-per-key row (``--rows memory``): ``key_memory.py``'s children
hold the N keys, a fresh process each, order alternated: reconq's
``Cache(EtcdSource)`` (no ``decode``) and a dict filled by ``etcd3gw``'s
``get_prefix``; resident memory grown per key, the same less the mean
bytes of a value, and malloc's bytes in use grown per key.

usage: python benches/python/w14_input.py [--keys 10000 100000 1000000] [--rounds 2]
           [--rows sync restart p99 memory] [--before PYTHON]

Build the extension optimised first (``RELEASE=1 bash scripts/python-dev.sh
--co -q``) and ``pip install etcd3gw`` (a benchmark-only dependency).
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import os
import random
import resource
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple, TypeVar

HERE = Path(__file__).resolve().parent
TESTS = HERE.parents[1] / "tests" / "python"
sys.path.insert(0, str(TESTS))

from etcd_server import Etcd  # noqa: E402

import key_memory  # noqa: E402
import reconq  # noqa: E402
import tail_latency  # noqa: E402

PREFIX = "/w14/"
#: Puts per transaction while loading (etcd started with this --max-txn-ops).
BATCH = 10_000
WORKERS = 2
#: The restart row's changes while down: this many puts, as many deletes.
CHANGES = 100
#: The p99 row: puts a second, for how long, and to how many of the keys.
RATE, SECONDS, PUT_KEYS = 1000.0, 10.0, 100
#: The p99 row's contenders (tail_latency's).
CONTENDERS = ["reconq", "plain"]

T = TypeVar("T")


def start_etcd() -> Etcd:
    return Etcd(
        "--max-txn-ops", str(BATCH),
        "--max-request-bytes", str(64 << 20),
        "--quota-backend-bytes", str(8 << 30),
    )


def post(etcd: Etcd, path: str, body: Dict[str, object]) -> bytes:
    host, port = etcd.endpoint[len("http://"):].rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=600)
    try:
        connection.request("POST", f"/v3/{path}", json.dumps(body), {"Content-Type": "application/json"})
        response = connection.getresponse()
        data = response.read()
        assert response.status == 200, data[:300]
        return data
    finally:
        connection.close()


def load(etcd: Etcd, n: int) -> None:
    b64 = lambda b: base64.b64encode(b).decode()  # noqa: E731
    for start in range(0, n, BATCH):
        puts = [
            {"request_put": {"key": b64(key(i).encode()), "value": b64(value(i).encode())}}
            for i in range(start, min(n, start + BATCH))
        ]
        post(etcd, "kv/txn", {"success": puts})


def cpu_seconds(pid: int) -> float:
    """utime + stime of process `pid`."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def client_cpu() -> float:
    """CPU seconds of this process and its children waited for (etcdctl)."""
    us, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return us.ru_utime + us.ru_stime + children.ru_utime + children.ru_stime


def reconq_reader(etcd: Etcd, n: int) -> Dict[str, float]:
    return reconq_sync(etcd.endpoint, n)


def reconq_sync(endpoint: str, n: int) -> Dict[str, float]:
    cache = reconq.Cache(reconq.EtcdSource(endpoint, PREFIX), name="w14")
    seen = []

    def reconcile(key: str) -> None:
        seen.append(cache.get(key))

    c = reconq.Controller(reconcile, name="w14", workers=WORKERS)
    c.watch_cache(cache)
    start = time.perf_counter()
    c.start()
    assert c.wait_synced(timeout=600)
    synced = time.perf_counter() - start
    assert c.wait_idle(timeout=600)
    done = time.perf_counter() - start
    c.stop()
    assert len(seen) == n and len(cache) == n, (len(seen), len(cache))
    return {"synced": synced, "done": done}


def python_reader(etcd: Etcd, n: int) -> Dict[str, float]:
    import etcd3gw

    host, port = etcd.endpoint[len("http://"):].rsplit(":", 1)
    client = etcd3gw.client(host=host, port=int(port), timeout=600)
    seen = []
    start = time.perf_counter()
    objects = {meta["key"].decode()[len(PREFIX):]: value for value, meta in client.get_prefix(PREFIX)}
    synced = time.perf_counter() - start

    def reconcile(key: str) -> None:
        seen.append(objects.get(key))

    with ThreadPoolExecutor(WORKERS) as pool:
        for _ in pool.map(reconcile, objects, chunksize=1):
            pass
    done = time.perf_counter() - start
    assert len(seen) == n, len(seen)
    return {"synced": synced, "done": done}


def etcdctl_reader(etcd: Etcd, n: int) -> Dict[str, float]:
    start = time.perf_counter()
    subprocess.run(
        ["etcdctl", "--endpoints", etcd.endpoint, "--command-timeout=600s", "get", "--prefix", PREFIX],
        stdout=subprocess.DEVNULL, check=True, env={**os.environ, "ETCDCTL_API": "3"},
    )
    done = time.perf_counter() - start
    return {"synced": done, "done": done}


def reconq_reader_of(python: str) -> Callable[[Etcd, int], Dict[str, float]]:
    """`reconq_reader` in a child process run by `python` (its CPU is
    counted as etcdctl's is: a child waited for)."""

    def read(etcd: Etcd, n: int) -> Dict[str, float]:
        command = [python, __file__, "--sync-child", etcd.endpoint, str(n)]
        out = subprocess.run(command, check=True, capture_output=True, text=True)
        times: Dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
        return times

    return read


READERS: List[Tuple[str, Callable[[Etcd, int], Dict[str, float]]]] = [
    ("reconq", reconq_reader),
    ("plain Python", python_reader),
    ("etcdctl", etcdctl_reader),
]


def key(i: int) -> str:
    return "%skey-%07d" % (PREFIX, i)


def value(i: int) -> str:
    """Key `i`'s value as loaded."""
    return "value-%d" % i


class Restarter:
    """The runs of w14_restart_child.py on one interpreter and one store."""

    def __init__(self, python: str, etcd: Etcd, directory: str) -> None:
        self.python, self.etcd = python, etcd
        self.store = os.path.join(directory, "state.db")
        self.record = os.path.join(directory, "reconciled")
        self.proc: Optional["subprocess.Popen[str]"] = None

    def start(self, expect: int) -> Dict[str, float]:
        """Starts a run and waits until it is idle: times from its start
        (s), etcd's CPU and the run's own to its EXPECT-th reconcile, and
        how many reconciles it made."""
        before = cpu_seconds(self.etcd.proc.pid)
        started = time.monotonic()
        self.proc = subprocess.Popen(
            [self.python, str(HERE / "w14_restart_child.py"), self.store, self.etcd.endpoint, PREFIX, str(expect),
             "--record", self.record],
            stdout=subprocess.PIPE, text=True, cwd=str(HERE),
        )
        got: Dict[str, float] = {}
        # "done" may come before "synced" (a reconcile can run before
        # wait_synced returns to the child's main thread); "idle" is last.
        while "count" not in got:
            assert self.proc.stdout is not None
            line = self.proc.stdout.readline().split()
            assert line, f"the run ended (exit {self.proc.poll()})"
            word = line[0]
            if word == "synced":
                got["synced"] = float(line[1]) - started
            elif word == "done":
                got["done"] = float(line[1]) - started
                got["etcd_cpu"] = cpu_seconds(self.etcd.proc.pid) - before
                got["client_cpu"] = float(line[2])
            else:
                assert word == "idle", line
                got["count"] = int(line[1])
        assert "done" in got, f"idle after {got['count']} reconciles, fewer than {expect}"
        return got

    def reconciled(self) -> List[str]:
        with open(self.record) as f:
            return f.read().split()

    def stop(self, how: str) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL if how == "kill" else signal.SIGTERM)
        code = self.proc.wait(timeout=600)
        assert how == "kill" or code == 0, f"the clean stop failed: {code}"
        self.proc = None


def change_while_down(etcd: Etcd, n: int, gone: List[int], rng: random.Random) -> Tuple[List[int], List[int]]:
    """CHANGES puts and CHANGES deletes of keys among the first `n` but
    those `gone`, one request each; returns the keys put and deleted."""
    chosen = [i for i in rng.sample(range(n), 2 * CHANGES + len(gone)) if i not in gone][: 2 * CHANGES]
    put, deleted = chosen[:CHANGES], chosen[CHANGES:]
    for i in put:
        etcd.put(key(i), f"changed-{rng.random()}")
    for i in deleted:
        etcd.delete(key(i))
    return put, deleted


def restarts(etcd: Etcd, n: int, name: str, python: str, rng: random.Random, round_: int) -> None:
    """One full sync, then a restart after a SIGKILL and one after a clean
    stop, 200 changes before each; prints a line for each restart. The
    deleted keys are put back at the end."""
    with tempfile.TemporaryDirectory(prefix="w14-restart-") as directory:
        runs = Restarter(python, etcd, directory)
        first = runs.start(n)
        assert first["count"] == n, first
        gone: List[int] = []
        for how in ("kill", "clean"):
            runs.stop(how)
            put, deleted = change_while_down(etcd, n, gone, rng)
            gone += deleted
            times = runs.start(2 * CHANGES)
            wanted = sorted(key(i)[len(PREFIX):] for i in put + deleted)
            got = sorted(runs.reconciled())
            print(
                f"{n:>9,} keys  round {round_ + 1}  {name:8s} restart after a {how:5s} stop: "
                f"synced {times['synced']:6.2f} s  200 reconciled {times['done']:6.2f} s  "
                f"reconciles {times['count']} ({'exactly the 200' if got == wanted else 'WRONG'})  "
                f"etcd CPU {times['etcd_cpu']:5.2f} s  client CPU {times['client_cpu']:5.2f} s  "
                f"(load {os.getloadavg()[0]:.1f})",
                flush=True,
            )
            assert got == wanted, f"reconciled {len(got)} keys, {len(set(got) ^ set(wanted))} not the 200 changed"
        runs.stop("clean")
    etcd.put_all({key(i): value(i) for i in gone})


def sync_rows(etcd: Etcd, n: int, rounds: int, before: Optional[str]) -> None:
    readers = READERS
    if before:
        # Both builds in child processes, alike.
        readers = [("reconq", reconq_reader_of(sys.executable)), ("before", reconq_reader_of(before)), *READERS[1:]]
    for round_ in range(rounds):
        for name, reader in alternated(readers, round_):
            etcd_start, ours_start = cpu_seconds(etcd.proc.pid), client_cpu()
            times = reader(etcd, n)
            etcd_cpu, ours = cpu_seconds(etcd.proc.pid) - etcd_start, client_cpu() - ours_start
            print(
                f"{n:>9,} keys  round {round_ + 1}  {name:13s} synced {times['synced']:7.2f} s"
                f"  reconciled {times['done']:7.2f} s  etcd CPU {etcd_cpu:6.2f} s  client CPU {ours:6.2f} s"
                f"  (load {os.getloadavg()[0]:.1f})",
                flush=True,
            )


def restart_rows(etcd: Etcd, n: int, rounds: int, before: Optional[str]) -> None:
    contenders = [("reconq", sys.executable)] + ([("before", before)] if before else [])
    rng = random.Random(14)
    for round_ in range(rounds):
        for name, python in alternated(contenders, round_):
            restarts(etcd, n, name, python, rng, round_)


def alternated(contenders: Sequence[T], round_: int) -> Sequence[T]:
    """`contenders` in round `round_`'s order: reversed every other round."""
    return contenders if round_ % 2 == 0 else contenders[::-1]


def p99_rows(etcd: Etcd, n: int, rounds: int) -> None:
    put = range(0, n, max(1, n // PUT_KEYS))[:PUT_KEYS]
    for round_ in range(rounds):
        for contender in alternated(CONTENDERS, round_):
            r = tail_latency.one_run(contender, etcd.endpoint, PREFIX, [key(i) for i in put], RATE, SECONDS)
            print(
                f"{n:>9,} keys  round {round_ + 1}  {contender:7s} put -> reconcile at {RATE:,.0f} puts/s:"
                f"  p50 {r['p50']:6.2f} ms  p99 {r['p99']:6.2f} ms  max {r['max']:7.2f} ms"
                f"  ({r['reconciles']} reconciles of {r['sent']} puts, load {os.getloadavg()[0]:.1f})",
                flush=True,
            )
            etcd.put_all({key(i): value(i) for i in put})


def memory_rows(etcd: Etcd, n: int, rounds: int, before: Optional[str]) -> None:
    # (name, the child's contender, the Python running it)
    contenders = [("reconq", "reconq", sys.executable), ("plain", "plain", sys.executable)]
    if before:
        contenders.insert(1, ("before", "reconq", before))
    for round_ in range(rounds):
        for name, contender, python in alternated(contenders, round_):
            rss, heap, value_bytes = key_memory.measure(contender, etcd.endpoint, PREFIX, n, python)
            print(
                f"{n:>9,} keys  round {round_ + 1}  {name:7s} resident {rss:6.0f} B a key,"
                f" {rss - value_bytes:6.0f} B beyond the value ({value_bytes:.1f} B);"
                f" malloc in use {heap:6.0f} B a key  (load {os.getloadavg()[0]:.1f})",
                flush=True,
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--rounds", type=int, default=2)
    rows = ["sync", "restart", "p99", "memory"]
    parser.add_argument("--rows", nargs="+", choices=rows, default=rows)
    parser.add_argument("--before", metavar="PYTHON", help="a Python whose reconq is the build before")
    parser.add_argument("--sync-child", nargs=2, metavar=("ENDPOINT", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.sync_child:
        endpoint, n = args.sync_child
        print(json.dumps(reconq_sync(endpoint, int(n))), flush=True)
        return
    for n in args.keys:
        etcd = start_etcd()
        try:
            started = time.perf_counter()
            load(etcd, n)
            print(f"{n:,} keys loaded in {time.perf_counter() - started:.1f} s", flush=True)
            if "sync" in args.rows:
                sync_rows(etcd, n, args.rounds, args.before)
            if "restart" in args.rows:
                restart_rows(etcd, n, args.rounds, args.before)
            if "p99" in args.rows:
                p99_rows(etcd, n, args.rounds)
            if "memory" in args.rows:
                memory_rows(etcd, n, args.rounds, args.before)
        finally:
            etcd.close()


if __name__ == "__main__":
    main()

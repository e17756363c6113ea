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

usage: python benches/python/w14_input.py [--keys 10000 100000 1000000] [--rounds 2]

Build the extension optimised first (``RELEASE=1 bash scripts/python-dev.sh
--co -q``) and ``pip install etcd3gw`` (a benchmark-only dependency).
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import os
import resource
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Dict, List, Tuple

TESTS = Path(__file__).resolve().parents[2] / "tests" / "python"
sys.path.insert(0, str(TESTS))

from etcd_server import Etcd  # noqa: E402

import reconq  # noqa: E402

PREFIX = "/w14/"
#: Puts per transaction while loading (etcd started with this --max-txn-ops).
BATCH = 10_000
WORKERS = 2


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
            {"request_put": {"key": b64(b"%skey-%07d" % (PREFIX.encode(), i)), "value": b64(b"value-%d" % i)}}
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
    cache = reconq.Cache(reconq.EtcdSource(etcd.endpoint, PREFIX), name="w14")
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


READERS: List[Tuple[str, Callable[[Etcd, int], Dict[str, float]]]] = [
    ("reconq", reconq_reader),
    ("plain Python", python_reader),
    ("etcdctl", etcdctl_reader),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    for n in args.keys:
        etcd = start_etcd()
        try:
            started = time.perf_counter()
            load(etcd, n)
            print(f"{n:,} keys loaded in {time.perf_counter() - started:.1f} s", flush=True)
            for round_ in range(args.rounds):
                order = READERS if round_ % 2 == 0 else READERS[::-1]
                for name, reader in order:
                    before, ours = cpu_seconds(etcd.proc.pid), client_cpu()
                    times = reader(etcd, n)
                    etcd_cpu, ours = cpu_seconds(etcd.proc.pid) - before, client_cpu() - ours
                    print(
                        f"{n:>9,} keys  round {round_ + 1}  {name:13s} synced {times['synced']:7.2f} s"
                        f"  reconciled {times['done']:7.2f} s  etcd CPU {etcd_cpu:6.2f} s  client CPU {ours:6.2f} s"
                        f"  (load {os.getloadavg()[0]:.1f})",
                        flush=True,
                    )
        finally:
            etcd.close()


if __name__ == "__main__":
    main()

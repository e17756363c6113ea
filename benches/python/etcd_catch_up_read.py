"""What the read that tells a resumed EtcdSource when it caught up costs
etcd (docs/sources.md, "How EtcdSource resumes after a restart";
src/etcd/catch_up.rs): one transaction at the store's revision, the count
of keys under the prefix and the key changed last since the kept revision
(``min_mod_revision``, sorted by mod revision, one key, keys only), against
the count alone (what a fingerprint check reads).

etcd is started here (loopback, a temporary data directory, removed at the
end) with N keys under ``/p/`` (transactions of 10,000 puts); then 100 keys
are changed and 100 deleted after the "kept" revision. etcd's CPU is its
utime + stime from /proc around each read.

usage: python benches/python/etcd_catch_up_read.py [--keys 1000000] [--reads 3]

Needs no extension build.
"""

from __future__ import annotations

import argparse
import base64
import sys
import time
from pathlib import Path
from typing import Dict

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "python"))

from etcd_server import Etcd  # noqa: E402
from w14_input import cpu_seconds, post  # noqa: E402 (the same gateway calls as W14)

BATCH = 10_000


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def timed(etcd: Etcd, name: str, path: str, body: Dict[str, object]) -> None:
    cpu, start = cpu_seconds(etcd.proc.pid), time.perf_counter()
    post(etcd, path, body)
    wall, cpu = time.perf_counter() - start, cpu_seconds(etcd.proc.pid) - cpu
    print(f"{name}: {wall:.2f} s, etcd CPU {cpu:.2f} s", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--reads", type=int, default=3)
    args = parser.parse_args()
    etcd = Etcd("--max-txn-ops", str(BATCH), "--max-request-bytes", str(64 << 20), "--quota-backend-bytes", str(8 << 30))
    try:
        for start in range(0, args.keys, BATCH):
            puts = [
                {"request_put": {"key": b64(b"/p/k%07d" % i), "value": b64(b"v%d" % i)}}
                for i in range(start, min(args.keys, start + BATCH))
            ]
            post(etcd, "kv/txn", {"success": puts})
        kept = etcd.revision()
        for i in range(100):
            post(etcd, "kv/put", {"key": b64(b"/p/k%07d" % (i * 7)), "value": b64(b"changed")})
            post(etcd, "kv/deleterange", {"key": b64(b"/p/k%07d" % (i * 7 + 3))})
        prefix, end = b64(b"/p/"), b64(b"/p0")
        count = {"request_range": {"key": prefix, "range_end": end, "count_only": True}}
        changed = {"request_range": {
            "key": prefix, "range_end": end, "keys_only": True, "limit": "1",
            "min_mod_revision": str(kept + 1), "sort_target": "MOD", "sort_order": "DESCEND",
        }}
        print(f"{args.keys} keys, 100 changed and 100 deleted since the kept revision")
        for _ in range(args.reads):
            timed(etcd, "catch-up read (count + key changed last)", "kv/txn", {"success": [count, changed]})
            timed(etcd, "count alone", "kv/txn", {"success": [count]})
    finally:
        etcd.close()


if __name__ == "__main__":
    main()

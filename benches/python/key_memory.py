"""Memory per cached key (issue 36 item 4): the resident memory a process
grows by while it lists N short keys of etcd, divided by N; reconq's
`Cache(EtcdSource)` against a plain dict filled by `etcd3gw`'s
`get_prefix`.

    python benches/python/key_memory.py                   # 200,000 keys, 2 rounds
    python benches/python/key_memory.py --keys 1000000 --rounds 3

Build the extension optimised first (`pip install .`); the plain reflector
needs `etcd3gw` from PyPI (a benchmark-only dependency).

One etcd on loopback (a temporary data directory) is filled with keys
`k0`.. holding values `v0`.. (short: 2-8 bytes each), through the JSON
gateway's transactions. Each contender runs in a fresh child process:
resident memory (`/proc/self/statm`) after its imports, then after the
list is held (the cache synced; the dict filled and the reply dropped),
with a `gc.collect()` before each reading; and the bytes glibc's malloc
has handed out (`mallinfo2`), whose growth leaves out the memory freed
but kept in its heaps (Python's small objects live in arenas Python maps
itself, which it does not see: that figure is for reconq's Rust side). The value's own bytes are
about 7 of them; each child also reports their mean, counted from what it
holds once measured.

W14's bytes-per-key row runs the same children on W14's prefix
(`w14_input.py --rows memory`, which calls `measure`).
"""

from __future__ import annotations

import argparse
import base64
import gc
import http.client
import json
import os
import subprocess
import sys

from typing import List, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "python"))

from malloc import malloc_in_use  # noqa: E402

PREFIX = "/memory/"
TXN_OPS = 128  # etcd's default --max-txn-ops


def resident() -> Tuple[int, int]:
    """Resident bytes, and the bytes glibc's malloc has handed out and not
    had back (`mallinfo2`: in use in its heaps plus its mmapped blocks):
    the difference is freed memory not given back to the system."""
    gc.collect()
    with open("/proc/self/statm") as f:
        rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    in_use = malloc_in_use()
    assert in_use is not None, "mallinfo2 needs glibc 2.33 or later"
    return rss, in_use


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def fill(endpoint: str, keys: int) -> None:
    host, port = endpoint.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    for start in range(0, keys, TXN_OPS):
        ops = [
            {"request_put": {"key": b64(f"{PREFIX}k{i}"), "value": b64(f"v{i}")}}
            for i in range(start, min(start + TXN_OPS, keys))
        ]
        conn.request("POST", "/v3/kv/txn", body=json.dumps({"success": ops}))
        response = conn.getresponse()
        assert response.status == 200, response.read()
        response.read()
    conn.close()


def child(contender: str, endpoint: str, prefix: str, keys: int) -> None:
    if contender == "reconq":
        import reconq

        before = resident()
        cache = reconq.Cache(reconq.EtcdSource(endpoint, prefix))
        cache.start()
        assert cache.wait_synced(600)
        assert len(cache) == keys, len(cache)
        after = resident()
        value_bytes = sum(len(cache.get(key)) for key in cache.keys())
        cache.stop()
    else:
        from etcd3gw.client import Etcd3Client

        host, port = endpoint.removeprefix("http://").split(":")
        client = Etcd3Client(host=host, port=int(port), timeout=600)
        before = resident()
        held = {kv[1]["key"]: kv[0] for kv in client.get_prefix(prefix)}
        assert len(held) == keys, len(held)
        after = resident()
        value_bytes = sum(len(value) for value in held.values())
    print(json.dumps([(a - b) / keys for a, b in zip(after, before)] + [value_bytes / keys]), flush=True)


def measure(contender: str, endpoint: str, prefix: str, keys: int, python: str = sys.executable) -> List[float]:
    """A fresh process of `contender` (run by `python`) holding the `keys`
    keys of `prefix`: its resident memory grown, malloc's bytes in use
    grown (both per key), and the mean bytes of a value."""
    command = [python, __file__, "--child", contender, "--endpoint", endpoint, "--prefix", prefix]
    out = subprocess.run([*command, "--keys", str(keys)], check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keys", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--only", choices=["reconq", "plain"])
    parser.add_argument("--child", choices=["reconq", "plain"], help=argparse.SUPPRESS)
    parser.add_argument("--endpoint", help=argparse.SUPPRESS)
    parser.add_argument("--prefix", default=PREFIX, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.child, args.endpoint, args.prefix, args.keys)

    from etcd_server import Etcd

    etcd = Etcd("--quota-backend-bytes", str(8 << 30))
    try:
        fill(etcd.endpoint, args.keys)
        contenders = [args.only] if args.only else ["reconq", "plain"]
        for round_ in range(args.rounds):
            for contender in contenders if round_ % 2 == 0 else contenders[::-1]:
                rss, heap, _ = measure(contender, etcd.endpoint, PREFIX, args.keys)
                print(
                    f"round {round_} {contender:7} {args.keys} keys: {rss:6.0f} B a key resident, "
                    f"{heap:6.0f} B of malloc's in use",
                    flush=True,
                )
    finally:
        etcd.close()


if __name__ == "__main__":
    main()

"""Put -> Python reconcile latency (issue 36 item 3): reconq against a plain
Python reflector, side by side, order alternated.

    python benches/python/tail_latency.py                 # 3 rounds, 1,000 puts/s for 10 s
    python benches/python/tail_latency.py --rounds 5 --rate 1000 --seconds 10 --keys 100
    python benches/python/tail_latency.py --only reconq   # one contender (for perf / strace)

Build the extension optimised first (`pip install .`, or
`RELEASE=1 bash scripts/python-dev.sh --co -q`); the plain reflector needs
`etcd3gw` from PyPI (a benchmark-only dependency).

One etcd on loopback (a temporary data directory). Each round runs each
contender in a fresh child process on a prefix of its own, while another
child puts to that prefix through etcd's JSON gateway at `--rate` puts/s
(`--keys` keys in turn, so most puts change a key already held). A put's
value is `time.monotonic_ns()` when it was sent (CLOCK_MONOTONIC: the same
clock in every process); the reconcile records `time.monotonic_ns()` at its
entry, reads the key's value (the newest put it can see) and keeps the
difference. Level-triggered: puts to one key that arrive together collapse
into one reconcile, which measures the newest of them (the one it serves).

* reconq: `Cache(EtcdSource)` + `Controller(reconcile, workers=4)` with
  `watch_cache`; the reconcile reads `cache.get(key)`.
* plain: what a user writes without reconq: `etcd3gw`'s `watch_prefix` in
  a thread, a dict, and a `ThreadPoolExecutor(4)` the watch thread submits
  each changed key to (reading the dict).

Each line: the contender, puts sent, reconciles measured, p50 / p99 / max
in ms. The first second of each run is left out (connections warming up).

W14's p99 row runs the same contenders on a prefix already holding up to a
million keys (`w14_input.py --rows p99`, which calls `one_run` with keys of
its own): each contender holds them all before the puts start (reconq has
reconciled each once and is idle), and only reconciles that begin after
that are measured.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import threading
import time

from base64 import b64encode
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, List, Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "python"))

WORKERS = 4
WARMUP_NS = 1_000_000_000
#: How long a contender may take to hold the prefix (a million keys listed,
#: and reconciled once by reconq, on a loaded 2-core machine).
SYNC_TIMEOUT = 900


def b64(data: bytes) -> str:
    return b64encode(data).decode()


def put_at_rate(endpoint: str, keys: Sequence[str], rate: float, seconds: float) -> int:
    """Puts `rate` keys a second for `seconds` through the JSON gateway, on
    one kept-alive connection, paced from the start (a late put is sent at
    once, never skipped), `keys` in turn. The value: monotonic_ns at
    sending."""
    host, port = endpoint.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    start = time.monotonic()
    n = int(rate * seconds)
    for i in range(n):
        due = start + i / rate
        wait = due - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        body = json.dumps({"key": b64(keys[i % len(keys)].encode()), "value": b64(str(time.monotonic_ns()).encode())})
        conn.request("POST", "/v3/kv/put", body=body, headers={"Content-Type": "application/json"})
        conn.getresponse().read()
    conn.close()
    return n


class Latencies:
    """The reconciles' delays, from the first one that begins once `ready`
    is set (before it, a reconcile may read a value that is no send time:
    the prefix's own, or an earlier run's)."""

    def __init__(self, ready: threading.Event) -> None:
        self.ready = ready
        self.lock = threading.Lock()
        self.values: List[int] = []

    def record(self, entered: int, value: bytes) -> None:
        if not self.ready.is_set():
            return
        sent = int(value)
        with self.lock:
            self.values.append(entered - sent)


def run_reconq(endpoint: str, prefix: str, ready: threading.Event, done: threading.Event) -> Latencies:
    import reconq

    latencies = Latencies(ready)
    cache = reconq.Cache(reconq.EtcdSource(endpoint, prefix))

    def reconcile(key: str) -> None:
        entered = time.monotonic_ns()
        value = cache.get(key)
        if value is not None:
            latencies.record(entered, value)

    controller = reconq.Controller(reconcile, workers=WORKERS, name="tail")
    controller.watch_cache(cache)
    controller.start()
    assert controller.wait_synced(SYNC_TIMEOUT)
    assert controller.wait_idle(SYNC_TIMEOUT)  # the prefix's keys reconciled once
    ready.set()
    done.wait()
    controller.stop(drain=True, timeout=30)
    cache.stop()
    return latencies


def run_plain(endpoint: str, prefix: str, ready: threading.Event, done: threading.Event) -> Latencies:
    from etcd3gw.client import Etcd3Client

    host, port = endpoint.removeprefix("http://").split(":")
    client = Etcd3Client(host=host, port=int(port), timeout=SYNC_TIMEOUT)
    latencies = Latencies(ready)
    held: Dict[bytes, bytes] = {}
    pool = ThreadPoolExecutor(WORKERS)

    def reconcile(key: bytes) -> None:
        entered = time.monotonic_ns()
        value = held.get(key)
        if value is not None:
            latencies.record(entered, value)

    for kv in client.get_prefix(prefix):
        held[kv[1]["key"]] = kv[0]
    events, cancel = client.watch_prefix(prefix)

    def reflect() -> None:
        for event in events:
            kv = event["kv"]
            key = kv["key"]
            if event.get("type") == "DELETE":
                held.pop(key, None)
            else:
                held[key] = kv["value"]
            pool.submit(reconcile, key)

    thread = threading.Thread(target=reflect, daemon=True)
    thread.start()
    time.sleep(0.5)  # the watch is open (etcd3gw gives no signal)
    ready.set()
    done.wait()
    cancel()
    pool.shutdown(wait=True)
    return latencies


def child(args: argparse.Namespace) -> None:
    """One contender: reads the puts' count from stdin's end, prints JSON."""
    ready, done = threading.Event(), threading.Event()
    runner = run_reconq if args.child == "reconq" else run_plain
    result: List[Latencies] = []
    thread = threading.Thread(target=lambda: result.append(runner(args.endpoint, args.prefix, ready, done)))
    thread.start()
    assert ready.wait(SYNC_TIMEOUT), f"{args.child} did not hold the prefix in {SYNC_TIMEOUT} s"
    print("ready", flush=True)
    sys.stdin.readline()  # the putter finished
    time.sleep(1.0)  # the last puts arrive
    done.set()
    thread.join()
    print(json.dumps(result[0].values), flush=True)


def one_run(contender: str, endpoint: str, prefix: str, keys: Sequence[str], rate: float, seconds: float) -> Dict[str, float]:
    """One contender watching `prefix` while `keys` (under it) are put in
    turn at `rate` puts/s for `seconds`."""
    command = [sys.executable, __file__, "--child", contender, "--endpoint", endpoint, "--prefix", prefix]
    proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdin is not None
    assert proc.stdout.readline().strip() == "ready", f"{contender} ended before it was ready"
    sent = put_at_rate(endpoint, keys, rate, seconds)
    proc.stdin.write("done\n")
    proc.stdin.flush()
    values = json.loads(proc.stdout.readline())
    proc.wait()
    # Left out: the first second's reconciles (in the order measured).
    measured = sorted(values[len(values) // int(seconds) :]) if values else [0]
    q = statistics.quantiles(measured, n=100) if len(measured) > 1 else measured * 99
    return {
        "sent": sent,
        "reconciles": len(values),
        "p50": q[49] / 1e6,
        "p99": q[98] / 1e6,
        "max": measured[-1] / 1e6,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--keys", type=int, default=100)
    parser.add_argument("--only", choices=["reconq", "plain"])
    parser.add_argument("--child", choices=["reconq", "plain"], help=argparse.SUPPRESS)
    parser.add_argument("--endpoint", help=argparse.SUPPRESS)
    parser.add_argument("--prefix", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)

    from etcd_server import Etcd

    etcd = Etcd()
    try:
        contenders = [args.only] if args.only else ["reconq", "plain"]
        for round_ in range(args.rounds):
            order = contenders if round_ % 2 == 0 else contenders[::-1]
            for contender in order:
                prefix = f"/tail/{round_}/{contender}/"
                keys = [f"{prefix}k{i}" for i in range(args.keys)]
                r = one_run(contender, etcd.endpoint, prefix, keys, args.rate, args.seconds)
                load = os.getloadavg()[0]
                print(
                    f"round {round_} {contender:7} sent {r['sent']:6} reconciles {r['reconciles']:6}"
                    f"  p50 {r['p50']:6.2f} ms  p99 {r['p99']:6.2f} ms  max {r['max']:7.2f} ms  load {load:.1f}",
                    flush=True,
                )
    finally:
        etcd.close()


if __name__ == "__main__":
    main()

"""A real etcd for tests: on free loopback ports with a temporary data
directory, stopped and removed afterwards. A missing ``etcd`` binary fails
the test (``.ci/run`` installs Debian's ``etcd-server``); it never skips."""

from __future__ import annotations

import base64
import json
import shutil
import signal
import socket
import subprocess
import tempfile
import urllib.request

from typing import Dict, Iterable

from waiting import wait_for


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Etcd:
    def __init__(self, *options: str) -> None:
        """`options`: more command-line options for etcd."""
        binary = shutil.which("etcd")
        assert binary, "etcd is not installed (Debian's etcd-server; .ci/run installs it)"
        client, peer = free_port(), free_port()
        self.dir = tempfile.mkdtemp(prefix="reconq-etcd-")
        self.endpoint = f"http://127.0.0.1:{client}"
        peer_url = f"http://127.0.0.1:{peer}"
        self.command = [
            binary, "--name", "test", "--data-dir", self.dir,
            "--listen-client-urls", self.endpoint, "--advertise-client-urls", self.endpoint,
            "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
            "--initial-cluster", f"test={peer_url}", *options,
        ]
        self._run()

    def _run(self) -> None:
        self.proc = subprocess.Popen(self.command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(self.healthy, timeout=30, what="etcd to become healthy")

    def keys(self, prefix: str) -> Dict[str, str]:
        """Every key under `prefix` and its value, read from etcd itself."""
        end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
        body = json.dumps({"key": b64(prefix), "range_end": b64(end)}).encode()
        request = urllib.request.Request(f"{self.endpoint}/v3/kv/range", data=body, method="POST")
        with urllib.request.urlopen(request, timeout=5) as response:
            kvs = json.loads(response.read()).get("kvs", [])
        return {base64.b64decode(kv["key"]).decode(): base64.b64decode(kv.get("value", "")).decode() for kv in kvs}

    def pause(self) -> None:
        """Freezes etcd (SIGSTOP): calls to it hang until they time out."""
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.proc.send_signal(signal.SIGCONT)

    def restart(self) -> None:
        """Kills etcd and starts it again on the same ports and data (its
        keys and leases survive, as after a crash of a real member)."""
        self.proc.kill()
        self.proc.wait()
        self._run()

    def _metric(self, name: str, label: str = "") -> int:
        """The sum of etcd's own counter `name` over its lines that hold
        `label` (since etcd last started)."""
        with urllib.request.urlopen(f"{self.endpoint}/metrics", timeout=5) as response:
            text = response.read().decode()
        return sum(
            int(float(line.rsplit(" ", 1)[1]))
            for line in text.splitlines()
            if line.split("{", 1)[0].split(" ", 1)[0] == name and label in line
        )

    def grants(self) -> int:
        """Leases granted since etcd last started (its own counter)."""
        return self._metric("grpc_server_msg_received_total", 'grpc_method="LeaseGrant"')

    def sent_bytes(self) -> int:
        """The bytes etcd has sent its gRPC clients since it last started:
        the JSON gateway is one, so every reply a client of the gateway
        was given counts (a list of a prefix: at least its keys and
        values)."""
        return self._metric("etcd_network_client_grpc_sent_bytes_total")

    def put(self, key: str, value: str) -> None:
        body = json.dumps({"key": b64(key), "value": b64(value)}).encode()
        request = urllib.request.Request(f"{self.endpoint}/v3/kv/put", data=body, method="POST")
        with urllib.request.urlopen(request, timeout=5) as response:
            response.read()

    def _call(self, path: str, body: Dict[str, object]) -> Dict[str, object]:
        request = urllib.request.Request(f"{self.endpoint}/v3/{path}", data=json.dumps(body).encode(), method="POST")
        with urllib.request.urlopen(request, timeout=5) as response:
            reply: Dict[str, object] = json.loads(response.read())
            return reply

    def put_all(self, items: Dict[str, str], per_txn: int = 100) -> None:
        """Puts every item, `per_txn` to a transaction (one revision each;
        etcd refuses more than 128 operations in one)."""
        pairs = list(items.items())
        for start in range(0, len(pairs), per_txn):
            self.txn(dict(pairs[start : start + per_txn]))

    def txn(self, puts: Dict[str, str], deletes: Iterable[str] = ()) -> None:
        """Puts and deletes in one transaction: one revision (no key twice;
        etcd refuses more than 128 operations unless started with
        ``--max-txn-ops``)."""
        ops = [{"request_put": {"key": b64(k), "value": b64(v)}} for k, v in puts.items()]
        ops += [{"request_delete_range": {"key": b64(k)}} for k in deletes]
        self._call("kv/txn", {"success": ops})

    def put_bytes(self, key: bytes, value: bytes) -> None:
        """A put of raw bytes (keys that are not UTF-8)."""
        self._call("kv/put", {"key": base64.b64encode(key).decode(), "value": base64.b64encode(value).decode()})

    def delete(self, key: str) -> None:
        self._call("kv/deleterange", {"key": b64(key)})

    def revision(self) -> int:
        """The store's revision now."""
        header = self._call("kv/range", {"key": b64("/")})["header"]
        assert isinstance(header, dict)
        return int(header["revision"])

    def compact(self) -> None:
        """Compacts the history up to the revision now."""
        self._call("kv/compaction", {"revision": str(self.revision()), "physical": True})

    def bump(self, times: int) -> None:
        """Puts a filler key `times` times: the store's revision grows by as many."""
        for _ in range(times):
            self.put("/filler", "x")

    def wipe(self) -> None:
        """Resets etcd's history: kills it, deletes its data directory and
        starts it again on the same ports (same member and cluster ids,
        revisions starting over)."""
        self.proc.kill()
        self.proc.wait()
        shutil.rmtree(self.dir)
        self._run()

    def backup(self) -> str:
        """A cold copy of the data directory (etcd killed, copied, started
        again on the same data): a snapshot to `restore` later."""
        self.proc.kill()
        self.proc.wait()
        copy = tempfile.mkdtemp(prefix="reconq-etcd-backup-")
        shutil.copytree(self.dir, copy, dirs_exist_ok=True)
        self._run()
        return copy

    def restore(self, backup: str) -> None:
        """Puts etcd back to `backup`: its history goes back to then."""
        self.proc.kill()
        self.proc.wait()
        shutil.rmtree(self.dir)
        shutil.copytree(backup, self.dir)
        shutil.rmtree(backup)
        self._run()

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.endpoint}/health", timeout=1) as response:
                return b"true" in response.read()
        except OSError:
            return False

    def close(self) -> None:
        self.resume()
        self.proc.kill()
        self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)

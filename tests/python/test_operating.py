"""Operating a running process from outside (issue 27 item 4): `/status`,
`/healthz` and `/readyz` on the metrics server, over real HTTP, and the
`python -m reconq status URL` command run against a real child process.

The child is a process of its own so that its registry holds only its own
controllers (readiness asks every controller of the process)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import urllib.error
import urllib.request
from typing import Dict, Iterator, Optional, Tuple

import pytest

from etcd_server import free_port
from test_controller_lifecycle import finish

CHILD = """
import sys, reconq
def reconcile(key):
    if key == "db":
        raise ConnectionError("db-0 refused the connection")
import logging
logging.getLogger("reconq").addHandler(logging.NullHandler())
logging.getLogger("reconq").propagate = False
c = reconq.Controller(reconcile, name="ops-probe", rate_limiter=reconq.ExponentialBackoff(0.01, 0.05))
server = reconq.start_http_server(port=0)
print(server.port, flush=True)
for line in sys.stdin:            # the parent's commands, one per line
    if line.strip() == "start":
        c.start()
        c.enqueue("web")
        c.enqueue("db")
        c.wait_idle(0.5)          # db keeps failing: never idle
        print("started", flush=True)
c.stop(drain=False, timeout=10)
server.close()
"""


class Child:
    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(CHILD)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        self.port = int(self.proc.stdout.readline())
        self.url = f"http://127.0.0.1:{self.port}"

    def command(self, line: str, answer: str) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline().strip() == answer

    def close(self) -> None:
        code, _, err = finish(self.proc)  # closes stdin: the child's loop ends
        assert code == 0, err


@pytest.fixture
def child() -> Iterator[Child]:
    c = Child()
    try:
        yield c
    finally:
        c.close()


def get(url: str, headers: Optional[Dict[str, str]] = None) -> Tuple[int, str, str]:
    """(status, content type, body) of a real GET."""
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return r.status, r.headers["Content-Type"], r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers["Content-Type"], e.read().decode()


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "reconq", *args], capture_output=True, text=True, timeout=30, check=False
    )


def test_probes_and_status_follow_the_controller(child: Child) -> None:
    # Built, not started: alive, not ready, listed.
    assert get(child.url + "/healthz") == (200, "text/plain; charset=utf-8", "ok\n")
    code, _, body = get(child.url + "/readyz")
    assert (code, body) == (503, 'controller "ops-probe": not started\n')
    code, kind, table = get(child.url + "/status")
    assert (code, kind) == (200, "text/plain; charset=utf-8")
    assert table.startswith("reconq status: 1 controller, 0 periodic")
    assert "ops-probe" in table and "not started" in table

    child.command("start", "started")
    assert get(child.url + "/readyz")[:3:2] == (200, "ok\n")
    assert get(child.url + "/healthz")[:3:2] == (200, "ok\n")
    code, _, table = get(child.url + "/status")
    assert "running" in table and "ConnectionError: db-0 refused the connection" in table

    for url, headers in [(child.url + "/status?format=json", {}), (child.url + "/status", {"Accept": "application/json"})]:
        code, kind, body = get(url, headers)
        assert (code, kind) == (200, "application/json")
        (entry,) = json.loads(body)
        assert (entry["kind"], entry["name"], entry["state"]) == ("controller", "ops-probe", "running")
        assert entry["successes"] >= 1 and entry["failures"] >= 1
        assert entry["last_error"] == "ConnectionError: db-0 refused the connection"
        assert isinstance(entry["last_error_time"], float)

    assert get(child.url + "/nothing-here")[0] == 404


def test_the_cli_prints_a_running_process_s_table(child: Child) -> None:
    child.command("start", "started")
    for url in (child.url, f"127.0.0.1:{child.port}", child.url + "/status"):
        done = cli("status", url)
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith("reconq status: 1 controller"), done.stdout
        assert "ops-probe" in done.stdout and "db-0 refused" in done.stdout
    done = cli("status", child.url, "--json")
    assert done.returncode == 0, done.stderr
    assert [e["name"] for e in json.loads(done.stdout)] == ["ops-probe"]


def test_the_cli_says_when_nothing_answers() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    done = cli("status", url)
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr.startswith(f"reconq status: cannot reach {url}/status: "), done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("url", ["not a url", "http://[::1", "127.0.0.1:port", "ftp://127.0.0.1:9100"])
def test_the_cli_refuses_what_is_not_a_url_in_one_line(url: str) -> None:
    done = cli("status", url)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.startswith(f"reconq status: URL {url!r} is not a URL"), done.stderr
    assert done.stderr.count("\n") == 1, done.stderr


def test_the_cli_needs_a_command() -> None:
    done = cli()
    assert done.returncode == 2
    assert "status" in done.stderr

"""A real PostgreSQL for tests: `initdb` in a temporary directory, the
server on a free loopback port (its unix socket in that directory too), and
everything stopped and removed afterwards, also when the test fails. A
missing PostgreSQL fails the test (``.ci/run`` installs Debian's
``postgresql``); it never skips.

The server refuses to run as root, so as root (CI) it runs as the
``postgres`` user Debian's package creates (``nobody`` where there is none).
"""

from __future__ import annotations

import atexit
import glob
import os
import pathlib
import pwd
import shutil
import signal
import subprocess
import tempfile
from typing import Iterator, List, Optional

import psycopg
import pytest

from etcd_server import free_port
from waiting import wait_for

#: The role the tests connect as: initdb's superuser, trusted on loopback.
SUPERUSER = "reconq"


def bin_dir() -> pathlib.Path:
    """Where initdb and postgres are: on PATH, or Debian's
    /usr/lib/postgresql/<version>/bin (the newest version installed)."""
    on_path = shutil.which("initdb")
    if on_path:
        return pathlib.Path(on_path).parent
    installed = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    assert installed, "PostgreSQL is not installed (Debian's postgresql; .ci/run installs it)"
    return pathlib.Path(installed[-1]).parent


def unprivileged_user() -> Optional[pwd.struct_passwd]:
    """The user to run the server as: None (ourselves) unless we are root."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    raise AssertionError("running as root with neither a postgres nor a nobody user to run PostgreSQL as")


class Postgres:
    """One server and its data directory. `stop()` / `start()` keep the
    data (a restart, clean or as after a crash); `close()` removes all."""

    def __init__(self) -> None:
        self.bin = bin_dir()
        self.user = unprivileged_user()
        self.dir = tempfile.mkdtemp(prefix="reconq-postgres-")
        if self.user is not None:
            os.chown(self.dir, self.user.pw_uid, self.user.pw_gid)
        self.data = os.path.join(self.dir, "data")
        self.log = os.path.join(self.dir, "server.log")
        self.port = free_port()
        self.dsn = self.dsn_as(SUPERUSER)
        self.proc: Optional[subprocess.Popen[bytes]] = None
        atexit.register(self.close)  # if a test run ends without the fixture's teardown
        try:
            self._run([str(self.bin / "initdb"), "-D", self.data, "-U", SUPERUSER, "--auth=trust", "-E", "UTF8", "--no-sync"])
            self.start()
        except BaseException:
            self.close()
            raise

    def dsn_as(self, user: str) -> str:
        """The connection string for `user` (any role may log in without a
        password: initdb's trust authentication)."""
        return f"host=127.0.0.1 port={self.port} user={user} dbname=postgres"

    def _run(self, command: List[str]) -> None:
        result = subprocess.run(command, cwd=self.dir, user=self._uid(), group=self._gid(), capture_output=True)
        assert result.returncode == 0, f"{command[0]} failed: {result.stderr.decode(errors='replace')}"

    def _uid(self) -> Optional[int]:
        return None if self.user is None else self.user.pw_uid

    def _gid(self) -> Optional[int]:
        return None if self.user is None else self.user.pw_gid

    def start(self) -> None:
        """Starts the server on its port and data, and waits until it
        accepts connections."""
        assert self.proc is None, "already running"
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [
                    # The server quits (as after a crash) when the test
                    # process dies, even by SIGKILL: none outlives a run.
                    "setpriv", "--pdeathsig", "QUIT", "--",
                    str(self.bin / "postgres"), "-D", self.data, "-p", str(self.port),
                    "-c", "listen_addresses=127.0.0.1", "-c", f"unix_socket_directories={self.dir}",
                    # Tests survive the server's crash, not the machine's.
                    "-c", "fsync=off",
                ],
                cwd=self.dir, user=self._uid(), group=self._gid(), stdout=log, stderr=subprocess.STDOUT,
            )
        wait_for(self.accepts, timeout=30, what=f"PostgreSQL to accept connections (its log: {self.log})")

    def accepts(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            pytest.fail(f"PostgreSQL exited with {self.proc.returncode}: {self.log_text()}")
        try:
            with psycopg.connect(self.dsn, connect_timeout=2):
                return True
        except psycopg.OperationalError:
            return False

    def log_text(self) -> str:
        return pathlib.Path(self.log).read_text(errors="replace")

    def stop(self, crash: bool = False) -> None:
        """Stops the server and waits until it has exited: a fast shutdown
        (every session terminated, a checkpoint), or with `crash` an
        immediate one (no checkpoint: the next start recovers from the WAL,
        as after a kill)."""
        if self.proc is None:
            return
        self.proc.send_signal(signal.SIGQUIT if crash else signal.SIGINT)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def restart(self, crash: bool = False) -> None:
        self.stop(crash)
        self.start()

    def close(self) -> None:
        self.stop(crash=True)
        shutil.rmtree(self.dir, ignore_errors=True)
        atexit.unregister(self.close)


@pytest.fixture
def postgres() -> Iterator[Postgres]:
    """A fresh server for one test, stopped and removed even if it fails."""
    server = Postgres()
    try:
        yield server
    finally:
        server.close()

"""Leader election under faults, with real processes (guarantees §10):
replicas (``chaos_child.py``) reconcile under one election on a real etcd
and write every reconcile's start and end to a fenced record. The leader
is SIGKILLed, SIGSTOPped past its lease and woken, stopped with SIGTERM,
and etcd itself is restarted; three candidates race. Afterwards the record
must show what may never happen:

- one token used by two processes (L1, L2);
- a process that was not paused starting a reconcile after a newer leader
  wrote (two processes reconciling at once), or finishing one after that
  without having been cancelled (L3);
- a paused leader, once woken, starting reconciles with its old token
  (at most one per worker may have begun, unseen, right before the pause);
- a key lost: the last leader reconciles every key.

How fast a standby took over is the W7 benchmark's business, not a test's.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, Iterator, List, Tuple

import pytest

from etcd_server import Etcd
from fenced_record import Attempt, FencedRecord
from waiting import PATIENCE, wait_for

TTL = 2.0
KEYS = 6
WORKERS = 2  # chaos_child.py's
HERE = Path(__file__).parent


class Replicas:
    """The child processes and what the test did to them."""

    def __init__(self, etcd: Etcd, record: FencedRecord) -> None:
        self.etcd = etcd
        self.record = record
        self.procs: Dict[int, "subprocess.Popen[str]"] = {}
        self.spawned = 0
        #: (pid, the token it led with when paused, when it was woken)
        self.paused: List[Tuple[int, int, float]] = []

    def spawn(self, n: int = 1) -> None:
        started = []
        for _ in range(n):
            proc = subprocess.Popen(
                [sys.executable, str(HERE / "chaos_child.py"), self.etcd.endpoint, self.record.path,
                 str(TTL), f"replica-{self.spawned}", str(KEYS)],
                stdout=subprocess.PIPE, text=True, cwd=str(HERE),
            )
            self.spawned += 1
            started.append(proc)
        for proc in started:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
            self.procs[proc.pid] = proc

    def leader_after(self, token: int, since: float = 0.0) -> Tuple[int, int]:
        """Waits for an accepted write with a token above `token` (or, with
        `since`, any accepted write after that time); returns (pid, token)."""

        def newer() -> Tuple[int, int] | None:
            for a in reversed(self.record.attempts()):
                if a.accepted and (a.token > token or (since and a.at > since)):
                    return a.pid, a.token
            return None

        found: Tuple[int, int] = wait_for(newer, timeout=PATIENCE + 3 * TTL, what=f"a leader after token {token}")
        return found

    def kill(self, pid: int, sig: int) -> None:
        os.kill(pid, sig)
        if sig in (signal.SIGKILL, signal.SIGTERM):
            proc = self.procs.pop(pid)
            code = proc.wait(PATIENCE)
            assert sig == signal.SIGKILL or code == 0, f"a SIGTERMed replica exits cleanly, not {code}"

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
            proc.wait()


@pytest.fixture
def replicas(tmp_path: Path) -> Iterator[Replicas]:
    etcd = Etcd()
    r = Replicas(etcd, FencedRecord(str(tmp_path / "record")))
    try:
        yield r
    finally:
        r.close()
        etcd.close()


def check(r: Replicas, last_token: int) -> None:
    attempts: List[Attempt] = r.record.attempts()
    assert attempts, "nothing ran"
    owner: Dict[int, int] = {}
    for a in attempts:
        assert owner.setdefault(a.token, a.pid) == a.pid, f"token {a.token} used by two processes"
    paused_tokens = {(pid, token) for pid, token, _ in r.paused}
    for a in attempts:
        if a.accepted or (a.pid, a.token) in paused_tokens:
            continue
        assert a.phase != "begin", f"began a reconcile after a newer leader wrote: {a}"
        assert a.cancelled, f"finished a reconcile after a newer leader wrote, uncancelled: {a}"
    for pid, token, woken in r.paused:
        late = [a for a in attempts if a.pid == pid and a.token == token and a.phase == "begin" and a.at > woken]
        assert len(late) <= WORKERS, f"a paused leader began {len(late)} reconciles with its old token after waking"
        assert not any(a.accepted for a in attempts if a.pid == pid and a.token == token and a.at > woken)

    def every_key_done() -> bool:
        done = {a.key for a in r.record.attempts() if a.accepted and a.phase == "end" and a.token >= last_token}
        return done == set(range(KEYS))

    wait_for(every_key_done, what="the last leader to reconcile every key (none lost)")


def test_sigkill_and_sigterm_of_the_leader(replicas: Replicas) -> None:
    r = replicas
    r.spawn(2)
    pid, token = r.leader_after(0)
    for round in range(12):
        # Every third round a clean stop: leadership passes on once the
        # leader's reconciles returned.
        r.kill(pid, signal.SIGTERM if round % 3 == 2 else signal.SIGKILL)
        r.spawn()
        pid, token = r.leader_after(token)
    check(r, token)


def test_a_leader_paused_past_its_lease_never_reconciles_with_its_old_token(replicas: Replicas) -> None:
    r = replicas
    r.spawn(2)
    pid, token = r.leader_after(0)
    for _ in range(5):
        os.kill(pid, signal.SIGSTOP)
        new_pid, new_token = r.leader_after(token)
        assert new_pid != pid
        os.kill(pid, signal.SIGCONT)
        r.paused.append((pid, token, time.monotonic()))
        pid, token = new_pid, new_token
    check(r, token)


def test_etcd_restarts_under_a_running_election(replicas: Replicas) -> None:
    r = replicas
    r.spawn(2)
    _, token = r.leader_after(0)
    for _ in range(3):
        restarted = time.monotonic()
        r.etcd.restart()
        _, token = r.leader_after(token, since=restarted)
    check(r, token)


def test_three_candidates_racing(replicas: Replicas) -> None:
    r = replicas
    r.spawn(3)
    pid, token = r.leader_after(0)
    for _ in range(4):
        r.kill(pid, signal.SIGKILL)
        r.spawn()
        pid, token = r.leader_after(token)
    check(r, token)

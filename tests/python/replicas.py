"""The chaos tests' harness: replica processes (``chaos_child.py``) under
leader election or sharding on a real etcd, writing every reconcile to a
fenced record, and the check of what may never happen in that record."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from collections import Counter
from typing import Dict, List, Sequence, Tuple

from etcd_server import Etcd
from fenced_record import Attempt, FencedRecord
from waiting import PATIENCE, wait_for

WORKERS = 2  # chaos_child.py's default
#: chaos_child.py's sharding group, as etcd holds it
MEMBERS = "/reconq/shard/chaos/members/"
PARTITIONS = "/reconq/shard/chaos/partitions/"


def balanced(etcd: Etcd, partitions: int, live: int) -> bool:
    """Whether etcd shows every partition held, by `live` replicas only,
    ⌊P/N⌋ or ⌈P/N⌉ each (guarantees §11, H2)."""
    holders = Counter(etcd.keys(PARTITIONS).values())
    members = set(etcd.keys(MEMBERS).values())
    low, high = partitions // live, -(-partitions // live)
    return (
        len(members) == live
        and set(holders) <= members
        and sum(holders.values()) == partitions
        and all(low <= holders.get(m, 0) <= high for m in members)
    )
HERE = Path(__file__).parent


class Replicas:
    """The child processes and what the test did to them."""

    def __init__(self, etcd: Etcd, record: FencedRecord, ttl: float = 2.0, keys: int = 6, args: Sequence[str] = ()) -> None:
        self.etcd = etcd
        self.record = record
        self.ttl = ttl
        self.keys = keys
        #: more chaos_child.py arguments (--partitions P for sharding)
        self.args = list(args)
        self.procs: Dict[int, "subprocess.Popen[str]"] = {}
        self.spawned = 0
        #: pid -> identity, of the replicas alive
        self.identities: Dict[int, str] = {}
        #: (pid, the token it led with when paused, when it was woken)
        self.paused: List[Tuple[int, int, float]] = []

    def command(self, identity: str) -> List[str]:
        """The command line of the replica named `identity` (a child that
        prints ``ready`` once started; cache_replicas.py runs another)."""
        return [sys.executable, str(HERE / "chaos_child.py"), self.etcd.endpoint, self.record.path,
                str(self.ttl), identity, str(self.keys), *self.args]

    def spawn(self, n: int = 1) -> None:
        """Starts `n` replicas and waits until each has asked etcd for a
        lease (campaigned, or joined): from then on it has seen etcd's
        history, and notices if it is reset."""
        granted = self.etcd.grants()
        started = []
        for _ in range(n):
            identity = f"replica-{self.spawned}"
            proc = subprocess.Popen(
                self.command(identity), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=str(HERE)
            )
            self.spawned += 1
            started.append((proc, identity))
        for proc, identity in started:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
            self.procs[proc.pid] = proc
            self.identities[proc.pid] = identity
        wait_for(lambda: self.etcd.grants() >= granted + n, what=f"{n} new replicas to ask for a lease")

    def leader_after(self, token: int, since: float = 0.0) -> Tuple[int, int]:
        """Waits for an accepted write with a token above `token` (or, with
        `since`, any accepted write after that time); returns (pid, token)."""

        def newer() -> Tuple[int, int] | None:
            for a in reversed(self.record.attempts()):
                if a.accepted and (a.token > token or (since and a.at > since)):
                    return a.pid, a.token
            return None

        # Generous: on a loaded 2-core machine a fail-over (lease expiry,
        # campaign, the first reconcile of a Python child) once took over
        # PATIENCE + 3 TTLs; what must never happen is checked elsewhere.
        found: Tuple[int, int] = wait_for(
            newer, timeout=2 * PATIENCE + 3 * self.ttl, what=f"a leader after token {token}"
        )
        return found

    def elect(self, n: int) -> Tuple[int, int]:
        """Starts `n` replicas and returns the first leader's (pid, token)."""
        self.spawn(n)
        return self.leader_after(0)

    def replace_leader(self, pid: int, token: int, sig: int = signal.SIGKILL) -> Tuple[int, int]:
        """Stops leader `pid` (which leads with `token`) with `sig`, starts a
        replica in its place and returns the next leader's (pid, token)."""
        self.kill(pid, sig)
        self.spawn()
        return self.leader_after(token)

    def pause(self, pid: int) -> None:
        """SIGSTOPs replica `pid`, never while it holds the record's lock.

        A replica stopped inside `FencedRecord.write` would keep every
        other replica's reconciles waiting for the lock until it is woken:
        no new leader could write, a partition being handed over could not
        be let go, and the test would time out on the record, not on the
        engine (about 2% of pauses of a busy replica landed there). So the
        test holds the lock until every thread of the replica has stopped."""
        with self.record.locked():
            os.kill(pid, signal.SIGSTOP)
            wait_for(lambda: stopped(pid), what=f"replica {pid} to stop")

    def kill(self, pid: int, sig: int) -> None:
        os.kill(pid, sig)
        if sig in (signal.SIGKILL, signal.SIGTERM):
            self.identities.pop(pid)
            proc = self.procs.pop(pid)
            code = proc.wait(PATIENCE)
            assert sig == signal.SIGKILL or code == 0, f"a SIGTERMed replica exits cleanly, not {code}"

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
            proc.wait()


def stopped(pid: int) -> bool:
    """Whether every thread of process `pid` is stopped (by a signal)."""
    tasks = Path(f"/proc/{pid}/task")
    states = []
    for task in tasks.iterdir():
        try:
            # The state follows the command's closing parenthesis.
            states.append((task / "stat").read_text().rsplit(")", 1)[1].split()[0])
        except (FileNotFoundError, ProcessLookupError):
            continue  # a thread that just exited
    return bool(states) and all(state in ("T", "t") for state in states)


def check(r: Replicas, settled: float) -> None:
    """What may never happen, per fence (the election, or each partition):
    see the test modules' docs. `settled`: a time after the last change,
    from which every key must be reconciled again (none lost)."""
    attempts: List[Attempt] = r.record.attempts()
    assert attempts, "nothing ran"
    owner: Dict[Tuple[int, int], int] = {}
    for a in attempts:
        assert owner.setdefault((a.fence, a.token), a.pid) == a.pid, f"token {a.token} used by two processes"
    paused_tokens = {(pid, token) for pid, token, _ in r.paused}
    for a in attempts:
        if a.accepted or (a.pid, a.token) in paused_tokens:
            continue
        assert a.phase != "begin", f"began a reconcile after a newer owner wrote: {a}"
        assert a.cancelled, f"finished a reconcile after a newer owner wrote, uncancelled: {a}"
    for pid, token, woken in r.paused:
        late = [a for a in attempts if a.pid == pid and a.token == token and a.phase == "begin" and a.at > woken]
        # (A reconcile it was in when paused may still finish; the fence
        # refuses its writes once the new owner has written.)
        assert len(late) <= WORKERS, f"a paused owner began {len(late)} reconciles with its old token after waking"

    def every_key_done() -> bool:
        done = {a.key for a in r.record.attempts() if a.accepted and a.phase == "end" and a.at > settled}
        return done == set(range(r.keys))

    wait_for(every_key_done, timeout=PATIENCE + 3 * r.ttl, what="every key reconciled again (none lost)")

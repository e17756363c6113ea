"""The harness of the cache restart tests (guarantees §13 E9, issue 25):
a system of items (a real etcd's ``/items/`` prefix, or a
``table_source.Table``), a writer that puts, changes and deletes them from
the test's process, runs of ``cache_child.py`` one after another on one
store and one record, and the checks of what may never happen in that
record."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Protocol, Set, Tuple

from appended import AppendedLines
from cache_child import ABSENT, FLUSH_MARK, PREFIX
from etcd_server import Etcd
from waiting import PATIENCE

HERE = Path(__file__).parent
#: The store's flush interval in the runs (cache_child.py's default).
FLUSH_INTERVAL = 0.1
#: E9: keys reconciled longer than this before a kill are not reconciled again.
SETTLED_AFTER = FLUSH_INTERVAL + 1.0


class Items(Protocol):
    def put(self, key: str, value: str) -> object: ...
    def delete(self, key: str) -> object: ...
    def state(self) -> Dict[str, str]: ...
    def revision(self) -> int: ...


class EtcdItems:
    """The keys under cache_child.py's prefix of a real etcd."""

    def __init__(self, etcd: Etcd) -> None:
        self.etcd = etcd

    def put(self, key: str, value: str) -> None:
        self.etcd.put(PREFIX + key, value)

    def delete(self, key: str) -> None:
        self.etcd.delete(PREFIX + key)

    def state(self) -> Dict[str, str]:
        return {key[len(PREFIX) :]: value for key, value in self.etcd.keys(PREFIX).items()}

    def revision(self) -> int:
        return self.etcd.revision()


@dataclass(frozen=True)
class System:
    """What cache_child.py follows (``kind``, ``where``) and the test writes."""

    kind: str
    where: str
    items: Items


def seeded(items: Items, seed: int) -> "Tuple[random.Random, Writer]":
    """A test's random moments and sizes, and a writer with its own random
    changes (it runs on a thread of its own), from `seed` (printed, to
    run a failure again)."""
    print(f"RECONQ_CHAOS_SEED={seed}")
    return random.Random(seed), Writer(items, random.Random(seed + 1))


class Writer:
    """Creates, changes and deletes items: called directly, or from a thread
    (``start``) until ``pause``. Each value written is new (``v1``, ``v2``,
    ...), so the value a reconcile saw names the state it saw; a deleted key
    is never created again (unless a test asks), so a reconcile that saw it
    absent saw its one delete. Keys numbered a multiple of ``HOT`` take 70%
    of the changes, so most keys stay unchanged for seconds."""

    HOT = 8
    #: Between two changes made by the thread.
    GAP = 0.01

    def __init__(self, items: Items, rng: random.Random) -> None:
        self.items = items
        self.rng = rng
        self.live: List[str] = []
        #: Every key ever written.
        self.written: Set[str] = set()
        self.serial = 0
        self.changes = 0
        self._cond = threading.Condition()
        self._paused = True
        self._closed = False
        self._error: Optional[BaseException] = None
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _value(self) -> str:
        self.serial += 1
        return f"v{self.serial}"

    def create(self, key: Optional[str] = None) -> str:
        key = key or f"k{len(self.written)}"
        assert key not in self.live
        self.written.add(key)
        self.live.append(key)
        self.items.put(key, self._value())
        self.changes += 1
        return key

    def change(self, key: str) -> None:
        assert key in self.live
        self.items.put(key, self._value())
        self.changes += 1

    def delete(self, key: str) -> None:
        self.live.remove(key)
        self.items.delete(key)
        self.changes += 1

    def step(self, low: int, high: int) -> None:
        """One change at random, keeping between `low` and `high` keys."""
        roll = self.rng.random()
        if len(self.live) < low or roll < 0.25 and len(self.live) < high:
            self.create()
        elif roll < 0.5:
            self.delete(self.rng.choice(self.live))
        else:
            hot = [key for key in self.live if int(key[1:]) % self.HOT == 0]
            self.change(self.rng.choice(hot if hot and self.rng.random() < 0.7 else self.live))

    # --- the thread ---

    def start(self, low: int, high: int) -> None:
        """Starts the thread, paused."""
        self._range = (low, high)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while self._paused and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                try:
                    self.step(*self._range)
                except BaseException as e:  # the test fails at its next pause
                    self._error = e
                    return
            time.sleep(self.GAP)

    def resume(self) -> None:
        with self._cond:
            self._paused = False
            self._cond.notify_all()

    def pause(self) -> None:
        """Returns once no change is in flight, and none follows until resumed."""
        with self._cond:
            self._paused = True
        if self._error is not None:
            raise self._error

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join()


def change_while_down(writer: Writer, rng: random.Random, creates: int, changes: int, deletes: int) -> "Counter[str]":
    """While a run is down: `creates` creates, `changes` changes of keys
    held (some twice, some a delete and a create again) and `deletes`
    deletes; two keys created and deleted (none of the cache's business).
    Returns the keys a restart must reconcile, each with how many changes
    it had: a relist finds each once, a resumed stream replays every
    change (a reconcile that started before the next one was applied does
    not absorb it)."""
    created = [writer.create() for _ in range(creates)]
    old = [key for key in writer.live if key not in created]
    changed = rng.sample(old, changes)
    twice: List[str] = []
    for key in changed:
        roll = rng.random()
        if roll < 0.2:
            writer.delete(key)
            writer.create(key)
            twice.append(key)
        else:
            writer.change(key)
            if roll < 0.4:
                writer.change(key)
                twice.append(key)
    deleted = rng.sample([key for key in old if key not in changed], deletes)
    for key in deleted:
        writer.delete(key)
    for key in [writer.create() for _ in range(2)]:
        writer.delete(key)
    return Counter(created + changed + deleted + twice)


def reconciled_only(got: "Counter[str]", changed: "Counter[str]", at_most: "Counter[str]", what: str) -> None:
    """`got` (reconciles by key) holds every key in `changed` and no other,
    each at most `at_most[key]` times."""
    extra, missing = set(got) - set(changed), set(changed) - set(got)
    repeated = {key: n for key, n in got.items() if key in changed and n > at_most[key]}
    assert not extra and not missing and not repeated, (
        f"{what}: {len(changed)} keys changed while down; reconciled but unchanged ({len(extra)}): "
        f"{sorted(extra)[:20]}, missing ({len(missing)}): {sorted(missing)[:20]}, "
        f"reconciled more often than they changed: {repeated}"
    )


@dataclass(frozen=True)
class Reconcile:
    run: int
    key: str
    seen: str
    started: float
    ended: float


class Record:
    """The lines cache_child.py's runs appended, read as they come."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lines: List[Reconcile] = []
        self._appended = AppendedLines(path)

    def read(self) -> List[Reconcile]:
        for line in self._appended.new():
            run, key, seen, started, ended = line.split()
            self.lines.append(Reconcile(int(run), key, seen, float(started), float(ended)))
        return self.lines

    def of_run(self, run: int) -> List[Reconcile]:
        return [r for r in self.read() if r.run == run]


class Runs:
    """cache_child.py's runs on one store and one record, one at a time,
    and when each was killed."""

    def __init__(self, system: System, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.system = system
        self.store = directory / "state.db"
        self.record = Record(directory / "record")
        self.started = 0
        #: run -> time.monotonic() right before its SIGKILL
        self.kills: Dict[int, float] = {}
        self.proc: Optional["subprocess.Popen[str]"] = None

    def start(self, *args: str) -> "subprocess.Popen[str]":
        """Starts the next run (``wait_line("synced")`` waits for its first list)."""
        assert self.proc is None
        proc = subprocess.Popen(
            [sys.executable, str(HERE / "cache_child.py"), str(self.store), str(self.record.path), str(self.started),
             self.system.kind, self.system.where, *args],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=str(HERE),
        )
        self.started += 1
        self.proc = proc
        return proc

    @property
    def run(self) -> int:
        """The number of the current (or last) run."""
        return self.started - 1

    def wait_line(self, word: str) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        assert line == word, f"run {self.run}: expected {word!r}, got {line!r} (exit {self.proc.poll()})"

    def kill(self) -> None:
        assert self.proc is not None
        self.kills[self.run] = time.monotonic()
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self.proc = None

    def stop(self) -> None:
        """A clean stop (SIGTERM): the run drains its queue and flushes."""
        assert self.proc is not None
        proc, self.proc = self.proc, None
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=PATIENCE * 3) == 0, f"run {self.run} failed at its stop"

    def close(self) -> None:
        if self.proc is not None:
            self.kill()

    # --- what the record must show ---

    def unreconciled(self, state: Dict[str, str], written: Set[str]) -> Dict[str, Tuple[str, Optional[str]]]:
        """The keys whose last reconcile did not see their state in the
        system (a key never reconciled and absent owes nothing), as
        key -> (state, what its last reconcile saw). No window is left out:
        a key reconciled only just before a kill, then deleted while down,
        owes its delete too (the create's trace is written before its
        reconcile, issue 32)."""
        last: Dict[str, Reconcile] = {}
        for r in self.record.read():
            last[r.key] = r
        owed = {}
        for key in written:
            want = state.get(key, ABSENT)
            got = last.get(key)
            if got is None and want == ABSENT or got is not None and got.seen == want:
                continue
            owed[key] = (want, None if got is None else got.seen)
        return owed

    def wait_reconciled(self, items: Items, written: Set[str], what: str) -> None:
        """Waits until every key's last reconcile saw its state in `items`
        (which must not change meanwhile)."""
        self.wait_state_reconciled(items.state(), written, what)

    def wait_state_reconciled(self, state: Dict[str, str], written: Set[str], what: str) -> None:
        """Waits until every key's last reconcile saw its value in `state`
        (read from the system before: this reads nothing from it)."""
        deadline = time.monotonic() + PATIENCE * 3
        while (owed := self.unreconciled(state, written)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not owed, f"{what}: keys whose state was never reconciled (key: (state, last seen)): {owed}"

    def reconciled_again(self) -> Tuple[List[str], int]:
        """E9's "never": a key reconciled (its last reconcile in a run) more
        than ``flush_interval`` + 1 s before that run was killed, then
        reconciled by a later run seeing the same state (values are never
        written twice, so unchanged). Returns the violations and how many
        (key, kill) pairs were settled so."""
        settled: Dict[str, Tuple[str, int]] = {}
        violations = []
        count = 0
        lines = self.record.read()
        for run in range(self.started):
            mine = [r for r in lines if r.run == run and r.key != FLUSH_MARK]
            for r in mine:
                before = settled.pop(r.key, None)
                if before is not None and before[0] == r.seen:
                    violations.append(
                        f"run {run} reconciled {r.key} ({r.seen}) again: run {before[1]} had reconciled it, unchanged, "
                        f"more than flush_interval + 1 s before it was killed"
                    )
            if run in self.kills:
                last = {r.key: r for r in mine}
                for key, r in last.items():
                    if r.ended <= self.kills[run] - SETTLED_AFTER:
                        settled[key] = (r.seen, run)
                        count += 1
        return violations, count

"""The record that sharded replicas watching a cache append to
(``sharded_cache_child.py``), and what may never happen in it (guarantees
§11 H4, §13 E2, §17 C1/C2). Shared by the chaos tests
(test_sharding_cache_chaos.py) and the W13 benchmark.

Each line is written with one ``os.write`` on a file opened ``O_APPEND``,
so lines of different processes never interleave, a SIGKILL loses no line
written, and the file's order is the order the writes happened in:

    begin PID PARTITION TOKEN KEY SEEN TIME   a reconcile started
    end   PID PARTITION TOKEN KEY SEEN TIME   it returned
    kill  PID - - - - TIME                    the test SIGKILLs PID next

SEEN is the value the reconcile read from its cache at its start (``-``:
absent), TOKEN its fencing token (its partition's, H4), TIME
``time.monotonic()`` (for reading a failure; the checks use the order).
The record is "fenced" by that order: a storage system that checks fencing
tokens would refuse a write whose token is below the highest it accepted
on that partition, and none may come (no replica here is paused: an old
owner's reconciles returned, or it died, before its partition moved).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Set, Tuple

from appended import AppendedLines

ABSENT = "-"


@dataclass(frozen=True)
class Line:
    phase: str  # "begin", "end" or "kill"
    pid: int
    partition: int
    token: int
    key: str
    seen: str
    at: float


def append(fd: int, phase: str, partition: int = -1, token: int = -1, key: str = "-", seen: str = ABSENT,
           pid: Optional[int] = None) -> None:
    """Appends one line in one write (`fd` opened with ``O_APPEND``)."""
    pid = os.getpid() if pid is None else pid
    os.write(fd, f"{phase} {pid} {partition} {token} {key} {seen} {time.monotonic()}\n".encode())


def open_for_append(path: str) -> int:
    return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)


class Record:
    """The record's lines, read as they come (each call reads only what was
    appended since the last)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.lines: List[Line] = []
        #: (key, value seen) of every reconcile that returned
        self.reconciled: Set[Tuple[str, str]] = set()
        self._appended = AppendedLines(path)

    def read(self) -> List[Line]:
        for text in self._appended.new():
            phase, pid, partition, token, key, seen, at = text.split()
            self.lines.append(Line(phase, int(pid), int(partition), int(token), key, seen, float(at)))
            if phase == "end":
                self.reconciled.add((key, seen))
        return self.lines


def fencing_violations(lines: Iterable[Line]) -> List[str]:
    """Lines a fenced system would have refused: a token below the highest
    already written on the same partition (a reconcile by an owner the
    partition had left, H4)."""
    highest: Dict[int, Tuple[int, int]] = {}
    found = []
    for line in lines:
        if line.phase == "kill":
            continue
        top = highest.get(line.partition)
        if top is not None and line.token < top[0]:
            found.append(f"{line} written after pid {top[1]} wrote token {top[0]} on partition {line.partition}")
        elif top is None or line.token > top[0]:
            highest[line.partition] = (line.token, line.pid)
    return found


def overlaps(lines: Iterable[Line]) -> List[str]:
    """Reconciles of one key running at once (H4: never, on two replicas;
    nor on two workers of one): a ``begin`` while another reconcile of that
    key has begun and not ended, unless its process was killed before (a
    ``kill`` line: its reconciles ended when it died)."""
    running: Dict[str, Dict[int, Line]] = {}  # key -> pid -> its open begin
    killed: Set[int] = set()
    found = []
    for line in lines:
        if line.phase == "kill":
            killed.add(line.pid)
            continue
        if line.pid in killed:
            continue  # written in the instant between its kill line and the signal
        open_here = running.setdefault(line.key, {})
        if line.phase == "begin":
            for other in open_here.values():
                if other.pid not in killed:
                    found.append(f"{line} began while {other} had not ended")
            open_here[line.pid] = line
        else:
            open_here.pop(line.pid, None)
    return found


def unreconciled(record: Record, state: Dict[str, str], written: Iterable[str]) -> Dict[str, str]:
    """E2 across replicas: the keys of `written` (every key ever changed)
    for which no reconcile that returned saw their final `state` (absent
    from `state`: deleted). Values are never written twice and a deleted
    key is never created again, so seeing the final value (or the absence)
    means the reconcile started after the last change reached its cache.
    Returns key -> its final state."""
    record.read()
    owed = {}
    for key in written:
        want = state.get(key, ABSENT)
        if (key, want) not in record.reconciled:
            owed[key] = want
    return owed

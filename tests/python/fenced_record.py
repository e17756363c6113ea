"""A fenced record shared by processes: the external system that fencing
tokens protect (guarantees §10 L2, §11 H4). Each write carries the
writer's token and a fence (the partition, under sharding; 0 for leader
election); a write with a lower token than the highest accepted so far on
its fence is rejected, as a storage system that checks fencing tokens
would. Every attempt,
accepted or not, is logged with the writer's pid and the time
(``time.monotonic()``, one clock for every process on the machine), so a
test can check afterwards what ran when.

One line per attempt: ``accepted pid fence token key phase cancelled time``.
"""

from __future__ import annotations

import fcntl
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, List, TextIO


@dataclass(frozen=True)
class Attempt:
    accepted: bool
    pid: int
    fence: int
    token: int
    key: int
    phase: str  # "begin" or "end"
    cancelled: bool
    at: float


class FencedRecord:
    def __init__(self, path: str) -> None:
        self.path = path

    @contextmanager
    def locked(self) -> Iterator[TextIO]:
        """Holds the record's lock (every write takes it); the record, open
        for appending. While a process holds it no other can write: a test
        that pauses a writer takes it first (`Replicas.pause`), so that
        the paused process is never the one holding it."""
        with open(self.path, "a+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield f
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def write(self, token: int, key: int, phase: str, cancelled: bool = False, fence: int = 0) -> bool:
        """Appends one attempt; returns whether the token was accepted."""
        with self.locked() as f:
            highest = self._highest(fence)
            accepted = token >= highest
            if accepted and token > highest:
                with open(f"{self.path}.highest.{fence}", "w") as h:
                    h.write(str(token))
            f.write(f"{int(accepted)} {os.getpid()} {fence} {token} {key} {phase} {int(cancelled)} {time.monotonic()}\n")
            f.flush()
            return accepted

    def _highest(self, fence: int) -> int:
        try:
            with open(f"{self.path}.highest.{fence}") as h:
                return int(h.read() or 0)
        except FileNotFoundError:
            return 0

    def attempts(self) -> List[Attempt]:
        try:
            with open(self.path) as f:
                text = f.read()
        except FileNotFoundError:
            return []
        # Read without the lock, while replicas append: a last line not
        # ended yet is a write in progress, not a record.
        lines = text.split("\n")[:-1]
        out = []
        for line in lines:
            accepted, pid, fence, token, key, phase, cancelled, at = line.split()
            out.append(
                Attempt(accepted == "1", int(pid), int(fence), int(token), int(key), phase, cancelled == "1", float(at))
            )
        return out

"""A fenced record shared by processes: the external system that fencing
tokens protect (guarantees §10, L2). Each write carries the writer's token;
a write with a lower token than the highest accepted so far is rejected,
as a storage system that checks fencing tokens would. Every attempt,
accepted or not, is logged with the writer's pid and the time
(``time.monotonic()``, one clock for every process on the machine), so a
test can check afterwards what ran when.

One line per attempt: ``accepted pid token key phase cancelled time``.
"""

from __future__ import annotations

import fcntl
import os
import time
from dataclasses import dataclass
from typing import List


@dataclass(frozen=True)
class Attempt:
    accepted: bool
    pid: int
    token: int
    key: int
    phase: str  # "begin" or "end"
    cancelled: bool
    at: float


class FencedRecord:
    def __init__(self, path: str) -> None:
        self.path = path

    def write(self, token: int, key: int, phase: str, cancelled: bool = False) -> bool:
        """Appends one attempt; returns whether the token was accepted."""
        with open(self.path, "a+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                highest = self._highest()
                accepted = token >= highest
                if accepted and token > highest:
                    with open(self.path + ".highest", "w") as h:
                        h.write(str(token))
                f.write(f"{int(accepted)} {os.getpid()} {token} {key} {phase} {int(cancelled)} {time.monotonic()}\n")
                f.flush()
                return accepted
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def _highest(self) -> int:
        try:
            with open(self.path + ".highest") as h:
                return int(h.read() or 0)
        except FileNotFoundError:
            return 0

    def attempts(self) -> List[Attempt]:
        try:
            with open(self.path) as f:
                lines = f.read().splitlines()
        except FileNotFoundError:
            return []
        out = []
        for line in lines:
            accepted, pid, token, key, phase, cancelled, at = line.split()
            out.append(Attempt(accepted == "1", int(pid), int(token), int(key), phase, cancelled == "1", float(at)))
        return out

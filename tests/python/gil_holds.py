"""How often a thread other than a busy Python one held the GIL while
the code under test called Python: calls into Python that the engine
makes a batch at a time under one hold of the GIL see few holds; calls
that each attached on their own see many, and each of those waited for a
running Python thread to hand the GIL over (up to the switch interval)."""

from __future__ import annotations

import sys
import threading
import time
from typing import List


class GilHolds:
    """Counts the holds of the GIL the calls that `note()` saw: the busy
    thread hands the GIL over only at its `time.sleep(0)`, once a round
    (the switch interval is set beyond the test), so calls that see one
    round ran under one hold."""

    def __init__(self) -> None:
        self.rounds = 0
        self.seen: List[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._busy)
        self._switch = sys.getswitchinterval()

    def decode(self, raw: bytes) -> str:
        """A `decode` that notes the hold it ran under."""
        self.note()
        return raw.decode()

    def note(self) -> None:
        """Called by the code under test: notes the hold it runs under."""
        self.seen.append(self.rounds)

    def _busy(self) -> None:
        while not self._stop.is_set():
            self.rounds += 1
            time.sleep(0)

    def __enter__(self) -> "GilHolds":
        sys.setswitchinterval(60.0)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        sys.setswitchinterval(self._switch)

    def holds(self) -> int:
        return len(set(self.seen))

"""A system with positions, in memory, as a `reconq.Source` sees one: its
state, a history of changes by revision, compaction, and faults a test
injects into the change stream (raise, end, expire). The stream blocks on a
condition (no polling), so an idle cache over it uses no CPU."""

from __future__ import annotations

import threading
import time
from typing import Any, Dict, Iterator, List, Optional, Tuple, Union

import reconq

Event = Union[reconq.Put, reconq.Delete, reconq.Bookmark]
_DELETED = object()


class StreamBroke(Exception):
    """What a stream raises for the "raise" fault."""


class System:
    def __init__(self, items: Optional[Dict[Any, Any]] = None, positions: bool = True) -> None:
        self.cond = threading.Condition()
        self.state: Dict[Any, Any] = dict(items or {})
        self.revision = 0
        self.history: List[Tuple[int, Any, Any]] = []
        self.compacted = 0
        self.positions = positions
        #: What the next streams do, in order: "raise", "end" or "expire".
        self.faults: List[str] = []
        #: Raised by the next `list()` calls, in order.
        self.list_faults: List[BaseException] = []
        self.lists = 0
        #: The revision of the last list: where a stream without positions starts.
        self.listed_at = 0
        #: (monotonic time, position asked for) of each `changes()` call.
        self.changes_calls: List[Tuple[float, Any]] = []
        #: (monotonic time, what) of each stream that ended: "raise", "end", "expire", "stopped".
        self.ends: List[Tuple[float, str]] = []
        self.streams_open = 0

    # --- changing the system ---

    def put(self, key: Any, obj: Any) -> None:
        with self.cond:
            self.revision += 1
            self.state[key] = obj
            self.history.append((self.revision, key, obj))
            self.cond.notify_all()

    def delete(self, key: Any) -> None:
        with self.cond:
            self.revision += 1
            del self.state[key]
            self.history.append((self.revision, key, _DELETED))
            self.cond.notify_all()

    def compact(self) -> None:
        with self.cond:
            self.compacted = self.revision

    def fault(self, *faults: str) -> None:
        """The open stream (and then the next ones) end with `faults`."""
        with self.cond:
            self.faults.extend(faults)
            self.cond.notify_all()

    def snapshot(self) -> Dict[Any, Any]:
        with self.cond:
            return dict(self.state)

    # --- the Source functions ---

    def source(self, name: str = "system") -> reconq.Source:
        return reconq.Source(self.list, self.changes, name=name)

    def list(self) -> Tuple[Dict[Any, Any], Optional[int]]:
        with self.cond:
            self.lists += 1
            if self.list_faults:
                raise self.list_faults.pop(0)
            self.listed_at = self.revision
            return dict(self.state), (self.revision if self.positions else None)

    def changes(self, position: Optional[int], stop: threading.Event) -> Iterator[Event]:
        with self.cond:
            self.changes_calls.append((time.monotonic(), position))
            if position is not None and position < self.compacted:
                raise reconq.PositionExpired(f"revision {position} is compacted (at {self.compacted})")
            start = self.listed_at if position is None else position
        return self._stream(start, stop)

    def _stream(self, position: int, stop: threading.Event) -> Iterator[Event]:
        # The stop event is the contract: a thread turns it into a wake-up
        # of the condition this stream waits on.
        def wake_at_stop() -> None:
            stop.wait()
            with self.cond:
                self.cond.notify_all()

        threading.Thread(target=wake_at_stop, daemon=True).start()
        with self.cond:
            self.streams_open += 1
        end = "stopped"
        try:
            while True:
                with self.cond:
                    while not (stop.is_set() or self.faults or self.history and self.history[-1][0] > position):
                        self.cond.wait()
                    if stop.is_set():
                        return
                    if self.faults:
                        end = self.faults.pop(0)
                        if end == "raise":
                            raise StreamBroke("the stream broke")
                        if end == "expire":
                            raise reconq.PositionExpired("the history is gone")
                        return
                    pending = [h for h in self.history if h[0] > position]
                for revision, key, obj in pending:
                    at = revision if self.positions else None
                    yield reconq.Delete(key, position=at) if obj is _DELETED else reconq.Put(key, obj, position=at)
                    position = revision
        finally:
            with self.cond:
                self.streams_open -= 1
                self.ends.append((time.monotonic(), end))

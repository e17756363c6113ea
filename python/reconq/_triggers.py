"""The stop event a trigger gets (guarantees §5)."""

from __future__ import annotations

import threading
from typing import Optional, Protocol


class _Signal(Protocol):
    """The engine's stop signal of one trigger (``_native.TriggerSignal``)."""

    def is_set(self) -> bool: ...
    def set(self) -> None: ...
    def clear(self) -> None: ...
    def wait(self, timeout: Optional[float] = None) -> bool: ...


class StopEvent(threading.Event):
    """A trigger's stop event: a ``threading.Event`` whose flag is the
    controller's own stop signal for that trigger. ``remove_trigger(key)``,
    a trigger that replaces it and ``stop()`` set it; a trigger that returns
    with it set (it may set it itself) enqueues nothing. ``wait()`` releases
    the GIL and returns whether it is set."""

    def __init__(self, signal: _Signal) -> None:
        # No `threading.Event.__init__`: the flag is the engine's, and every
        # method below reads or writes that one.
        self._signal = signal

    def is_set(self) -> bool:
        return self._signal.is_set()

    def set(self) -> None:
        self._signal.set()

    def clear(self) -> None:
        self._signal.clear()

    def wait(self, timeout: Optional[float] = None) -> bool:
        return self._signal.wait(timeout)

    def __repr__(self) -> str:
        return f"<reconq.StopEvent: {'set' if self.is_set() else 'unset'}>"

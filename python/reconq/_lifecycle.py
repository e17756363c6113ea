"""Keeps started controllers alive until stopped, and stops the ones still
running when the interpreter exits.

A started ``reconq.Controller`` is referenced from here until ``stop()``
(like a running ``threading.Thread``), so dropping the last user reference
does not leave its worker threads orphaned. At exit, an ``atexit`` hook
stops every controller still running with drain, giving them together at
most ``EXIT_TIMEOUT`` seconds: the hook runs before the interpreter starts
finalizing, so reconciles in progress finish normally and the process exits
cleanly.

After ``os.fork()`` the child forgets the parent's controllers: their
threads exist only in the parent, so stopping them from the child would wait
for threads that are not there. The child must not use controllers started
before the fork (calls may block on locks held at fork time); it can create
and run new ones.
"""

from __future__ import annotations

import atexit

# Imported before the hook below is registered, so that logging's own exit
# hook (logging.shutdown, registered at its first import) runs after ours:
# stopping controllers may still log.
import logging  # noqa: F401
import os
import threading
import time
from typing import Any, Set

#: Seconds the exit hook waits for running controllers to drain, in total.
EXIT_TIMEOUT = 5.0

#: Seconds leaving a ``with Controller(...)`` block drains before it stops
#: the rest at once (running reconciles are cancelled and left to return).
WITH_EXIT_TIMEOUT = 30.0

_lock = threading.Lock()
_running: Set[Any] = set()


def track(controller: Any) -> None:
    with _lock:
        _running.add(controller)


def untrack(controller: Any) -> None:
    with _lock:
        _running.discard(controller)


def running() -> list:
    with _lock:
        return list(_running)


def _stop_all_at_exit() -> None:
    deadline = time.monotonic() + EXIT_TIMEOUT
    for controller in running():
        try:
            controller.stop(drain=True, timeout=max(0.0, deadline - time.monotonic()))
        except BaseException:  # noqa: BLE001 - never block or fail the exit
            pass
    # Then give up leaderships at once, so a standby takes over (not after
    # the lease's TTL).
    try:
        from . import _native

        _native._stop_elections()
    except BaseException:  # noqa: BLE001 - never block or fail the exit
        pass


def _forget_after_fork() -> None:
    global _lock, _running
    # A lock held by another thread at fork time stays held in the child.
    _lock = threading.Lock()
    _running = set()


atexit.register(_stop_all_at_exit)
os.register_at_fork(after_in_child=_forget_after_fork)

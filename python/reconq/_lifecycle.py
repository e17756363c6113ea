"""The one registry of everything in this process that runs engine threads:
controllers, managers, leader elections and caches. It has one ``atexit`` hook with
one deadline and one at-fork hook, so process exit and ``os.fork()`` are
handled in one place.

What is held, and how:

* A started ``reconq.Controller`` is held strongly until ``stop()`` (like a
  running ``threading.Thread``), so dropping the last user reference does not
  leave its worker threads orphaned.
* Managers are held weakly: dropping a manager stops its controllers.
* Caches are held weakly, from their start: dropping a started cache stops
  it, and a cache a running controller watches is held by that controller.
* Elections are held from their first use (a controller or manager made
  with one, or ``start()``) until exit, whose hook gives leadership up: a
  controller's stop returns once its workers are gone, and the lease they
  release may still be on its way to etcd when the process ends.

Every entry belongs to the process that registered it: after ``os.fork()``
the child forgets them all, since their threads exist only in the parent
(stopping one from the child would wait for threads that are not there, and
a parent's leadership is not the child's to give up). The child must not use
objects made before the fork (calls may block on locks held at fork time);
it can make and run new ones.

At exit, in this order, within ``EXIT_TIMEOUT`` seconds in all:

1. controllers still running stop with drain, so reconciles in progress
   finish while the interpreter is whole;
2. managers remove their controllers (their ``stop`` functions run);
3. elections give leadership up at once, so a standby takes over without
   waiting for the lease to expire. After the controllers and managers,
   because a leadership must not pass on while a reconcile or a ``do`` of
   ours may still run;
4. caches stop (their source's stop event is set, their thread joined
   within what is left of the deadline). Last, because reconciles and
   ``do`` functions draining in steps 1 and 2 read them, and a ``Source``
   iterator slow to heed its stop event must not delay the hand-over of
   step 3.
"""

from __future__ import annotations

import atexit

# Imported before the hook below is registered, so that logging's own exit
# hook (logging.shutdown, registered at its first import) runs after ours:
# stopping may still log.
import logging  # noqa: F401
import os
import threading
import time
import weakref
from typing import Any, List, Set

from . import _native

#: Seconds the exit hook waits, in total, for controllers to drain and
#: managers' controllers to stop.
EXIT_TIMEOUT = 5.0

#: Seconds leaving a ``with Controller(...)`` block drains before it stops
#: the rest at once (running reconciles are cancelled and left to return).
WITH_EXIT_TIMEOUT = 30.0


class _Registry:
    """What this process registered; replaced whole in a forked child."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.controllers: Set[Any] = set()
        self.managers: "weakref.WeakSet[Any]" = weakref.WeakSet()
        self.elections: Set[Any] = set()
        self.caches: "weakref.WeakSet[Any]" = weakref.WeakSet()

    def add(self, entries: str, entry: Any) -> None:
        with self.lock:
            getattr(self, entries).add(entry)


_registry = _Registry()


def track(controller: Any) -> None:
    """A controller started: hold it until it stops."""
    _registry.add("controllers", controller)


def untrack(controller: Any) -> None:
    """A controller stopped."""
    with _registry.lock:
        _registry.controllers.discard(controller)


def running() -> List[Any]:
    """The controllers of this process that are started and not stopped."""
    with _registry.lock:
        return list(_registry.controllers)


def add_manager(manager: Any) -> None:
    """A manager got its first controller: stop it at exit."""
    _registry.add("managers", manager)


def add_election(election: Any) -> None:
    """An election is in use: give it up at exit."""
    _registry.add("elections", election)


def add_cache(cache: Any) -> None:
    """A cache started: stop it at exit."""
    _registry.add("caches", cache)


def _stop_all_at_exit() -> None:
    deadline = time.monotonic() + EXIT_TIMEOUT

    def left() -> float:
        return max(0.0, deadline - time.monotonic())

    with _registry.lock:
        controllers = list(_registry.controllers)
        managers = list(_registry.managers)
        elections = list(_registry.elections)
        caches = list(_registry.caches)
    for controller in controllers:
        try:
            controller.stop(drain=True, timeout=left())
        except BaseException:  # noqa: BLE001 - never block or fail the exit
            pass
    for manager in managers:
        try:
            manager._stop_at_exit(left())
        except BaseException:  # noqa: BLE001
            pass
    for election in elections:
        try:
            election.stop()
        except BaseException:  # noqa: BLE001
            pass
    for cache in caches:
        try:
            cache._stop_at_exit(left())
        except BaseException:  # noqa: BLE001
            pass


def _forget_after_fork() -> None:
    global _registry
    # A new registry, new lock included: a lock held by another thread at
    # fork time stays held in the child.
    _registry = _Registry()
    _native._after_fork_in_child()


atexit.register(_stop_all_at_exit)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)

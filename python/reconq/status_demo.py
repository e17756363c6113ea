"""The global status table, shown for a small demo.

    python -m reconq.status_demo

``reconq.status()`` lists every live ``Controller`` and every named
controller of every live ``Manager`` in the process (counts, consecutive
failures, last error, hanging keys); ``reconq.format_status()`` prints them
as a table, like ``cilium status --all-controllers``. A status only sees
its own process, so this command starts a demo to have something to show
(for another running process, ``reconq status URL`` reads its metrics
server's ``/status``; the demo has a module name of its own so that it is
not mistaken for that command):

* a ``Controller`` named ``status-demo`` whose keys ``web``, ``api`` and
  ``cache`` succeed, ``db`` always fails (retried with backoff) and
  ``stuck`` never returns until the demo ends (reported as hanging after
  0.2 s);
* a ``Manager`` named ``status-demo`` with a ``resync`` job that succeeds
  and a ``gc`` job that keeps failing.

It waits until each of those shows up in ``reconq.status()``, prints
``reconq.format_status()``, stops everything and exits 0 (1 if the demo did
not reach that state within 20 seconds).
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional, cast

from . import _native

NAME = "status-demo"
HANGING_THRESHOLD = 0.2
PATIENCE = 20.0


def _wait_until(cond: Callable[[], bool], deadline: float) -> bool:
    """Polls `cond` every 10 ms until it holds (True) or `deadline` passes."""
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def _entry(kind: str, name: str, manager: Optional[str] = None) -> Optional[Dict[str, Any]]:
    for entry in _native.status():
        e = cast(Dict[str, Any], entry)
        if e["kind"] == kind and e["name"] == name and e.get("manager") == manager:
            return e
    return None


def _demo_ready() -> bool:
    controller = _entry("controller", NAME)
    resync = _entry("periodic", "resync", NAME)
    gc = _entry("periodic", "gc", NAME)
    return (
        controller is not None
        and controller["successes"] >= 3
        and controller["consecutive_failures"] >= 2
        and "stuck" in controller["hanging"]
        and resync is not None
        and resync["successes"] >= 1
        and gc is not None
        and gc["consecutive_failures"] >= 2
    )


def main(argv: Optional[List[str]] = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv:
        print(f"usage: python -m reconq.status_demo (no arguments; got {' '.join(argv)})", file=sys.stderr)
        return 2
    # The demo's failures are on purpose: keep their tracebacks off the
    # output (without this, logging's last-resort handler prints them).
    logging.getLogger("reconq").addHandler(logging.NullHandler())
    logging.getLogger("reconq").propagate = False

    release = threading.Event()

    def reconcile(key: Any) -> None:
        if key == "db":
            raise ConnectionError("db-0 refused the connection")
        if key == "stuck":
            release.wait(PATIENCE)

    def gc() -> None:
        raise OSError("disk /var is full")

    controller = _native.Controller(
        reconcile,
        workers=3,
        name=NAME,
        hanging_threshold=HANGING_THRESHOLD,
        rate_limiter=_native.ExponentialBackoff(0.02, 0.2),
    )
    manager = _native.Manager(name=NAME)
    try:
        controller.start()
        for key in ("web", "api", "cache", "db", "stuck"):
            controller.enqueue(key)
        manager.update("resync", do=lambda: None, interval=1.0)
        manager.update("gc", do=gc, error_retry_base=0.05)
        ready = _wait_until(_demo_ready, time.monotonic() + PATIENCE)
        print(_native.format_status(), end="")
        if not ready:
            print(f"the demo did not reach its state within {PATIENCE} s", file=sys.stderr)
            return 1
        return 0
    finally:
        release.set()
        controller.stop(drain=False, timeout=PATIENCE)
        manager.remove_all(wait=True)


if __name__ == "__main__":
    sys.exit(main())

"""os.fork() while a controller and a manager run (in a subprocess): the
child forgets the parent's controllers, runs its own, and exits cleanly."""

from __future__ import annotations

import subprocess
import sys
import textwrap

CHILD_SCRIPT = textwrap.dedent(
    """
    import os, sys, threading, reconq

    release = threading.Event()
    busy = threading.Event()

    def slow(key):
        busy.set()
        release.wait(30)

    parent = reconq.Controller(slow, workers=2, name="parent")
    parent.start()
    parent.enqueue("busy")
    manager = reconq.Manager()
    manager.update("tick", do=lambda: None, interval=0.05)
    assert busy.wait(10), "the parent's reconcile never started"

    pid = os.fork()
    if pid == 0:
        # The parent's controller has no threads here: forgotten, so the
        # exit hooks do not wait for it.
        assert reconq._lifecycle.running() == [], reconq._lifecycle.running()
        seen = []
        with reconq.Controller(seen.append, name="child") as child:
            child.enqueue("child-key")
            assert child.wait_idle(10)
        assert seen == ["child-key"], seen
        sys.exit(0)  # runs the exit hooks in the child

    _, status = os.waitpid(pid, 0)
    print("child exit code", os.waitstatus_to_exitcode(status))
    release.set()
    assert parent.stop(drain=True, timeout=10)
    manager.remove_all(wait=True)
    """
)


def test_fork_while_a_controller_runs_child_exits_cleanly() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", CHILD_SCRIPT], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert "child exit code 0" in proc.stdout, (proc.stdout, proc.stderr)

"""Stopping a running controller from outside (issue 16): SIGTERM drains as
Ctrl-C does, a second signal stops at once, `run(stop_timeout=)` and the
`with` block are bounded. Real signals to real child processes; every
check is on what the child printed, in order, never on elapsed time."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from test_controller_lifecycle import finish, spawn

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")

#: The child logs to stdout, one line per record, so the parent can follow.
PRELUDE = """
import logging, sys, threading, reconq
logging.basicConfig(stream=sys.stdout, level=logging.WARNING, format="LOG %(message)s")
def say(*args):
    print(*args, flush=True)
"""


def wait_for_line(proc: subprocess.Popen, text: str) -> list[str]:
    """Reads the child's stdout until a line containing `text`; returns the
    lines read. Fails if the child exits first."""
    assert proc.stdout is not None
    lines = []
    while True:
        line = proc.stdout.readline()
        if not line:
            _, err = proc.communicate()
            pytest.fail(f"child exited before printing {text!r}: {lines}\n{err}")
        lines.append(line.rstrip("\n"))
        if text in line:
            return lines


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_during_a_reconcile_drains_the_ready_keys_and_run_returns_normally(sig):
    proc = spawn(
        PRELUDE
        + """
done = []
gate = threading.Event()
def reconcile(key):
    if key == "first":
        say("ready")
        gate.wait(30)   # released once the drain has begun
    done.append(key)
c = reconq.Controller(reconcile, workers=1)
c.enqueue("first")
for k in range(3):
    c.enqueue(k)
logging.getLogger("reconq").addFilter(lambda r: gate.set() or True)  # the drain's first log line
c.run()
say("returned", c.stats()["state"], done)
"""
    )
    wait_for_line(proc, "ready")
    proc.send_signal(sig)
    code, out, err = finish(proc)
    assert code == 0, err
    assert "stopping on a signal" in out
    assert "returned stopped ['first', 0, 1, 2]" in out, out
    assert "Traceback" not in err


def test_a_second_signal_stops_at_once_and_run_still_returns():
    proc = spawn(
        PRELUDE
        + """
def reconcile(key):
    say("ready")
    ctx = reconq.context()
    say("reconcile cancelled:", ctx.wait_cancelled(60))
c = reconq.Controller(reconcile, workers=1)
c.enqueue("stuck")
c.run()
say("returned")
"""
    )
    wait_for_line(proc, "ready")
    proc.send_signal(signal.SIGTERM)
    wait_for_line(proc, "stopping on a signal")
    proc.send_signal(signal.SIGINT)
    code, out, err = finish(proc)
    assert code == 0, err
    assert "second signal; stopped at once" in out, out
    lines = out.splitlines()
    # The cancelled reconcile returned before run() did.
    assert lines.index("reconcile cancelled: True") < lines.index("returned"), out
    assert "Traceback" not in err


def test_run_stop_timeout_bounds_the_drain():
    proc = spawn(
        PRELUDE
        + """
ended = threading.Event()
printed = threading.Event()
def reconcile(key):
    say("ready")
    ended.wait(60)        # ignores its cancel until main says so
    say("reconcile ended")
    printed.set()
c = reconq.Controller(reconcile, workers=1)
c.enqueue("stuck")
c.run(stop_timeout=0.2)
say("returned")
ended.set()
printed.wait(30)
"""
    )
    wait_for_line(proc, "ready")
    proc.send_signal(signal.SIGTERM)
    code, out, err = finish(proc)
    assert code == 0, err
    lines = out.splitlines()
    assert lines.index("returned") < lines.index("reconcile ended"), out
    assert "stop_timeout passed; left running: ['stuck']" in out, out


def test_leaving_a_with_block_is_bounded():
    proc = spawn(
        PRELUDE
        + """
import reconq._lifecycle
reconq._lifecycle.WITH_EXIT_TIMEOUT = 0.2
ended = threading.Event()
running = threading.Event()
printed = threading.Event()
def reconcile(key):
    running.set()
    ended.wait(60)
    say("reconcile ended")
    printed.set()
with reconq.Controller(reconcile, workers=1) as c:
    c.enqueue("stuck")
    running.wait(30)
say("left the block")
ended.set()
printed.wait(30)
"""
    )
    code, out, err = finish(proc)
    assert code == 0, err
    lines = out.splitlines()
    assert lines.index("left the block") < lines.index("reconcile ended"), out


def test_a_program_s_own_sigterm_handler_is_left_alone():
    proc = spawn(
        PRELUDE
        + """
import signal
c = reconq.Controller(lambda key: None)
signal.signal(signal.SIGTERM, lambda *a: (say("own handler"), c.stop(drain=False)))
c.add_trigger("k", lambda ev: say("ready"))
c.run()
say("returned", signal.getsignal(signal.SIGTERM) is not signal.default_int_handler)
"""
    )
    wait_for_line(proc, "ready")
    proc.send_signal(signal.SIGTERM)
    code, out, err = finish(proc)
    assert code == 0, err
    assert "own handler" in out and "returned True" in out, out

"""Ctrl-C and interpreter exit with running controllers (in subprocesses)."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time

import pytest

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")


def spawn(code: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen, timeout: float = 20):
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"subprocess hung\nstdout:\n{out}\nstderr:\n{err}")
    return proc.returncode, out, err


def exits_cleanly(proc: subprocess.Popen, within: float = 10) -> str:
    """Asserts that `proc` exits with code 0 within `within` seconds from
    now, and returns its stdout."""
    t0 = time.monotonic()
    code, out, err = finish(proc)
    assert code == 0, err
    assert time.monotonic() - t0 < within
    return out


def test_ctrl_c_stops_run_with_drain_and_returns_normally():
    proc = spawn(
        """
        import sys, threading, time, reconq
        done = []
        def reconcile(key):
            if key == "hello":
                print("ready", flush=True)
            else:
                time.sleep(0.05)
                done.append(key)
        c = reconq.Controller(reconcile, workers=1)
        c.enqueue("hello")
        c.run()
        print("returned", c.stats()["state"], flush=True)
        """
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.strip() == "ready", (line, proc.stderr.read() if proc.stderr else "")
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    code, out, err = finish(proc)
    assert code == 0, err
    assert "returned stopped" in out
    assert time.monotonic() - t0 < 5
    assert "Traceback" not in err


def test_exit_with_a_running_idle_controller():
    proc = spawn(
        """
        import reconq
        c = reconq.Controller(lambda key: None, workers=4)
        c.start()
        c.enqueue(1)
        assert c.wait_idle(5)
        print("bye", flush=True)
        """
    )
    assert exits_cleanly(proc).strip() == "bye"


def test_exit_with_a_reconcile_in_progress_drains_it():
    proc = spawn(
        """
        import threading, time, reconq
        started = threading.Event()
        out_lock = threading.Lock()
        def reconcile(key):
            started.set()
            time.sleep(0.3)
            with out_lock:  # two workers: keep lines whole
                print("finished", key, flush=True)
        c = reconq.Controller(reconcile, workers=2)
        c.start()
        c.enqueue("a")
        c.enqueue("b")
        started.wait(5)
        print("exiting", flush=True)
        """
    )
    code, out, err = finish(proc)
    assert code == 0, err
    assert out.splitlines()[0] == "exiting"
    assert sorted(out.splitlines()[1:]) == ["finished a", "finished b"]


def test_exit_with_a_reconcile_that_never_returns():
    proc = spawn(
        """
        import threading, reconq, reconq._lifecycle
        reconq._lifecycle.EXIT_TIMEOUT = 0.5
        started = threading.Event()
        def reconcile(key):
            started.set()
            threading.Event().wait()   # forever
        c = reconq.Controller(reconcile)
        c.start()
        c.enqueue("stuck")
        started.wait(5)
        print("exiting", flush=True)
        """
    )
    assert exits_cleanly(proc).strip() == "exiting"


@pytest.mark.parametrize("run", range(3))
def test_exit_with_reconciles_returning_while_the_interpreter_finalizes(run):
    # The exit hook gives up on the reconciles at once; they return to
    # Python while a slow finalization frees `junk`, and CPython kills their
    # threads with pthread_exit. Unguarded, the unwind aborted the process
    # (Fatal Python error: PyGILState_Release) in 10 runs out of 10.
    proc = spawn(
        """
        import threading, time, reconq, reconq._lifecycle
        junk = [[i] for i in range(3_000_000)]   # makes finalization slow
        reconq._lifecycle.EXIT_TIMEOUT = 0.05
        started = threading.Event()
        def reconcile(key):
            started.set()
            time.sleep(0.1)
        c = reconq.Controller(reconcile, workers=2, name="finalizing")
        c.start()
        c.enqueue(1)
        c.enqueue(2)
        started.wait(5)
        print("exiting", flush=True)
        """
    )
    code, out, err = finish(proc, timeout=60)
    assert code == 0, err
    assert out.strip() == "exiting"


def test_exit_with_an_unreferenced_running_controller():
    proc = spawn(
        """
        import reconq
        def reconcile(key):
            print("ran", key, flush=True)
        c = reconq.Controller(reconcile)
        c.start()
        c.enqueue_after("later", 30)  # dropped at exit
        del c
        import gc; gc.collect()
        """
    )
    code, out, err = finish(proc)
    assert code == 0, err
    assert out == ""


def test_exit_with_a_trigger_and_watch_running():
    proc = spawn(
        """
        import queue, reconq
        c = reconq.Controller(lambda key: None)
        c.start()
        c.add_trigger("t", lambda ev: ev.wait())
        src = queue.Queue()
        def events():
            while True:
                item = src.get()
                if item is None:
                    return
                yield item
        c.watch(events())
        src.put("x")
        print("bye", flush=True)
        """
    )
    code, out, err = finish(proc)
    assert code == 0, err
    assert out.strip() == "bye"

"""reconq.status() and reconq.format_status(): the global status of every
live Controller and Manager controller, with exact values after known
sequences; `python -m reconq.status_demo`; fork and re-entrancy safety.

The status is process-wide: every test uses names of its own and looks only
at its entries. Waits are on conditions (tests/python/waiting.py).
"""

from __future__ import annotations

import gc
import itertools
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import reconq
from waiting import PATIENCE, wait_for

_ids = itertools.count()


def unique(prefix: str) -> str:
    return f"{prefix}-{next(_ids)}-{time.monotonic_ns()}"


def entries(name, kind=None):
    return [e for e in reconq.status() if e["name"] == name and (kind is None or e["kind"] == kind)]


def entry(name):
    (e,) = entries(name, "controller")
    return e


def periodic(manager):
    return [e for e in reconq.status() if e["kind"] == "periodic" and e["manager"] == manager]


def entry_when(name, what, cond):
    """Waits until `name`'s entry satisfies `cond`, then returns a fresh one.
    Conditions on `processing` / `waiting` make the counters final: an entry
    reads the queue before the counters, and a worker counts a reconcile
    before it marks the key done."""
    wait_for(lambda: cond(entry(name)), what=what)
    return entry(name)


CONTROLLER_KEYS = {
    "kind", "name", "state", "workers", "reconciles", "successes", "failures", "requeues", "panics",
    "consecutive_failures", "last_error", "last_error_time", "last_success_time", "depth", "processing",
    "waiting", "parked", "held", "superseded", "hanging_threshold", "hanging",
}
PERIODIC_KEYS = {
    "kind", "name", "manager", "state", "successes", "failures", "consecutive_failures", "last_error",
    "last_error_time", "last_success_time", "running", "last_duration", "next_run_in",
}


def test_controller_entry_after_a_known_sequence():
    name = unique("status-seq")
    calls = {}
    started = threading.Event()
    release = threading.Event()

    def reconcile(key):
        calls[key] = calls.get(key, 0) + 1
        if key == "flaky" and calls[key] <= 2:
            raise ValueError("boom")
        if key in ("perm", "perm2"):
            raise reconq.PermanentError("bad spec")
        if key == "later":
            return reconq.Requeue(after=3600)
        if key == ("stuck", 1):
            started.set()
            assert release.wait(PATIENCE)
        return None

    c = reconq.Controller(
        reconcile,
        workers=2,
        name=name,
        hanging_threshold=0.05,
        rate_limiter=reconq.ExponentialBackoff(0.001, 0.01),
    )
    c.enqueue("ok")
    e = entry(name)
    assert set(e) == CONTROLLER_KEYS
    assert e["kind"] == "controller" and e["state"] == "not started"
    assert (e["workers"], e["depth"], e["reconciles"], e["successes"], e["failures"]) == (2, 1, 0, 0, 0)
    assert (e["last_error"], e["last_error_time"], e["last_success_time"]) == (None, None, None)
    assert e["hanging_threshold"] == pytest.approx(0.05) and e["hanging"] == {}

    before = time.time()
    c.start()
    assert c.wait_idle(PATIENCE)
    after = time.time()
    e = entry(name)
    assert e["state"] == "running"
    assert (e["reconciles"], e["successes"], e["failures"], e["consecutive_failures"]) == (1, 1, 0, 0)
    assert before <= e["last_success_time"] <= after

    # Two failures, retried with backoff, then a success.
    c.enqueue("flaky")
    assert c.wait_idle(PATIENCE)
    e = entry(name)
    assert (e["reconciles"], e["successes"], e["failures"], e["consecutive_failures"]) == (4, 2, 2, 0)
    assert e["last_error"] == "ValueError: boom", "kept after the success, as stats()"
    assert e["last_success_time"] >= e["last_error_time"] >= before

    # Permanent failures in a row; a requeue is neither success nor failure.
    c.enqueue("perm")
    assert c.wait_idle(PATIENCE)
    c.enqueue("perm2")
    assert c.wait_idle(PATIENCE)
    e = entry(name)
    assert (e["reconciles"], e["successes"], e["failures"], e["consecutive_failures"]) == (6, 2, 4, 2)
    assert (e["parked"], e["last_error"]) == (2, "PermanentError: bad spec")
    c.enqueue("later")
    e = entry_when(name, "the resync", lambda e: e["reconciles"] == 7 and e["processing"] == 0 and e["waiting"] == 1)
    # Requeue(after=) did its work: a success, which ends the failure streak.
    assert (e["successes"], e["failures"], e["consecutive_failures"], e["requeues"]) == (3, 4, 0, 0)

    # A hanging reconcile, reported with its original key.
    c.enqueue(("stuck", 1))
    assert started.wait(PATIENCE)
    e = entry_when(name, "the hang", lambda e: e["hanging"])
    assert list(e["hanging"]) == [("stuck", 1)]
    assert e["hanging"][("stuck", 1)] > 0.05
    assert (e["processing"], e["waiting"], e["depth"]) == (1, 1, 0)
    release.set()
    e = entry_when(name, "the hang's end", lambda e: e["reconciles"] == 8 and e["processing"] == 0)
    assert (e["successes"], e["failures"], e["consecutive_failures"], e["panics"]) == (4, 4, 0, 0)
    assert e["hanging"] == {}

    assert c.stop(timeout=PATIENCE)
    e = entry(name)
    assert (e["state"], e["waiting"], e["reconciles"]) == ("stopped", 0, 8)


def test_periodic_entries_after_a_known_sequence():
    manager_name = unique("status-mgr")
    m = reconq.Manager(name=manager_name)
    assert m.name == manager_name and manager_name in repr(m)
    assert reconq.Manager().name == "manager"

    def broken():
        raise RuntimeError("nope")

    try:
        before = time.time()
        m.update("sync", do=lambda: None)
        m.update("broken", do=broken, error_retry_base=3600)

        def ran(name):
            (s,) = [s for s in m.status() if s["name"] == name]
            return s["successes"] + s["failures"] == 1 and not s["running"]

        wait_for(lambda: ran("sync") and ran("broken"), what="both first runs")
        after = time.time()
        broken_entry, sync_entry = periodic(manager_name)
        assert set(broken_entry) == PERIODIC_KEYS
        assert (broken_entry["kind"], broken_entry["name"], broken_entry["manager"]) == (
            "periodic",
            "broken",
            manager_name,
        )
        assert (broken_entry["successes"], broken_entry["failures"], broken_entry["consecutive_failures"]) == (0, 1, 1)
        assert broken_entry["last_error"] == "RuntimeError: nope"
        assert before <= broken_entry["last_error_time"] <= after
        assert broken_entry["last_success_time"] is None
        assert (broken_entry["state"], broken_entry["running"]) == ("scheduled", False)
        assert 3500 < broken_entry["next_run_in"] <= 3600

        assert sync_entry["name"] == "sync"
        assert (sync_entry["successes"], sync_entry["failures"], sync_entry["consecutive_failures"]) == (1, 0, 0)
        assert (sync_entry["last_error"], sync_entry["last_error_time"]) == (None, None)
        assert before <= sync_entry["last_success_time"] <= after
        assert (sync_entry["state"], sync_entry["next_run_in"]) == ("idle", None)
        assert sync_entry["last_duration"] >= 0
    finally:
        m.remove_all(wait=True)
    assert periodic(manager_name) == []


def test_format_status_lists_controllers_and_manager_jobs():
    name = unique("status-table")
    manager_name = unique("status-table-mgr")
    with reconq.Controller(lambda key: None, name=name) as c, reconq.Manager(name=manager_name) as m:
        c.enqueue(1)
        assert c.wait_idle(PATIENCE)
        m.update("job", do=lambda: None)
        wait_for(lambda: periodic(manager_name) and periodic(manager_name)[0]["successes"] == 1)
        table = reconq.format_status()
    lines = table.splitlines()
    assert lines[0].startswith("reconq status: ")
    header = lines[1]
    assert header.startswith("NAME") and "CONSEC" in header and "HANGING" in header
    (row,) = [line for line in lines if line.startswith(name + " ")]
    assert row[header.index("KIND"):].startswith("controller")
    assert row[header.index("SUCCESS"):].startswith("1 ")
    (job,) = [line for line in lines if line.startswith(f"{manager_name}/job ")]
    assert job[header.index("KIND"):].startswith("periodic")


def test_stats_and_the_status_entry_share_their_counters():
    """One walk renders both: the counters both show agree, under one name."""
    name = unique("status-shared")

    def reconcile(key):
        if key == "bad":
            raise ValueError("nope")

    with reconq.Controller(reconcile, name=name, workers=2, hanging_threshold=3600) as c:
        c.enqueue("ok")
        c.enqueue("bad")
        wait_for(lambda: c.stats()["failures"] >= 1 and c.stats()["successes"] == 1, what="both keys to run")
        assert c.stats()["background_threads"] == 1, "the watchdog"
        c.stop(drain=False)
        wait_for(lambda: c.stats()["background_threads"] == 0, what="the watchdog to exit")
        stats, e = c.stats(), entry(name)
    shared = set(stats) & set(e)
    assert shared >= {"name", "workers", "state", "reconciles", "successes", "failures", "requeues", "panics",
                      "depth", "processing", "waiting", "parked", "held", "superseded", "hanging", "last_error",
                      "last_error_time"}
    assert {k: stats[k] for k in shared} == {k: e[k] for k in shared}
    assert stats["panics"] == 0 and stats["state"] == "stopped"


def test_a_dropped_controller_leaves_the_status():
    name = unique("status-drop")
    c = reconq.Controller(lambda key: None, name=name)
    assert len(entries(name)) == 1
    del c
    gc.collect()
    wait_for(lambda: not entries(name), what="the controller to leave")

    with reconq.Controller(lambda key: None, name=name) as c:
        c.enqueue("k")
        assert c.wait_idle(PATIENCE)
    assert entry(name)["state"] == "stopped"
    del c
    gc.collect()
    wait_for(lambda: not entries(name), what="the stopped controller to leave")


def test_status_from_inside_callbacks_does_not_deadlock():
    """A reconcile and a `do` (engine threads, attached to the interpreter)
    take the status, while the main thread takes it too."""
    name = unique("status-reentrant")
    manager_name = unique("status-reentrant-mgr")
    seen = []

    def reconcile(key):
        seen.append(len(entries(name)))
        reconq.format_status()

    def job():
        seen.append(len(periodic(manager_name)))

    with reconq.Controller(reconcile, workers=4, name=name) as c, reconq.Manager(name=manager_name) as m:
        m.update("job", do=job, interval=0.001)
        for i in range(200):
            c.enqueue(i)
            if i % 20 == 0:
                reconq.status()
        assert c.wait_idle(PATIENCE)
        assert entry(name)["successes"] == 200
        wait_for(lambda: len(seen) > 210, what="the job to run a few times")
        # Taken before the manager stops: its entries leave the status
        # first, and a run of the job during that stop finds none.
        while_running = list(seen)
    assert set(while_running) == {1}


def run_python(source: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args] if not source else [sys.executable, "-c", source],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_python_m_reconq_status_demo_prints_the_table():
    proc = run_python("", "-m", "reconq.status_demo")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "reconq status: 1 controller, 2 periodic; 2 failing, 1 hanging", proc.stdout
    assert lines[1].startswith("NAME ") and "HANGING" in lines[1]
    (row,) = [line for line in lines if line.startswith("status-demo ")]
    assert "ConnectionError: db-0 refused the connection" in row and '"stuck"' in row, row
    assert any(line.startswith("status-demo/gc ") and "OSError: disk /var is full" in line for line in lines)
    assert any(line.startswith("status-demo/resync ") for line in lines)
    assert "Traceback" not in proc.stderr, proc.stderr


def test_importing_the_status_demo_keeps_status_callable():
    proc = run_python(
        textwrap.dedent(
            """
            import reconq
            import reconq.status_demo
            from reconq.status_demo import main
            import importlib.util
            assert callable(main)
            # No `reconq.status` module to shadow the function (or to run
            # a demo that `reconq status URL` could be mistaken for).
            assert importlib.util.find_spec("reconq.status") is None
            assert reconq.status() == [], reconq.status()
            assert reconq.format_status().startswith("reconq status: 0 controllers")
            """
        )
    )
    assert proc.returncode == 0, proc.stderr


FORK_SCRIPT = textwrap.dedent(
    """
    import os, sys, threading, reconq

    release = threading.Event()
    busy = threading.Event()

    def slow(key):
        busy.set()
        release.wait(30)

    parent = reconq.Controller(slow, workers=2, name="parent", hanging_threshold=0.01)
    parent.start()
    parent.enqueue("busy")
    manager = reconq.Manager(name="parent-manager")
    manager.update("tick", do=lambda: None, interval=0.001)
    assert busy.wait(10), "the parent's reconcile never started"
    # Another thread takes the status in a loop while the fork happens.
    stop = threading.Event()
    def poll():
        while not stop.is_set():
            reconq.status()
    poller = threading.Thread(target=poll)
    poller.start()

    pid = os.fork()
    if pid == 0:
        names = [e["name"] for e in reconq.status()]
        assert names == [], names  # the parent's objects are not the child's
        with reconq.Controller(lambda key: None, name="child") as child:
            child.enqueue("k")
            assert child.wait_idle(10)
            (e,) = reconq.status()
            assert (e["name"], e["successes"]) == ("child", 1), e
        print(reconq.format_status(), end="")
        sys.stdout.flush()
        os._exit(0)

    _, status = os.waitpid(pid, 0)
    print("child exit code", os.waitstatus_to_exitcode(status))
    stop.set()
    poller.join()
    assert sorted(e["name"] for e in reconq.status()) == ["parent", "tick"]
    release.set()
    assert parent.stop(drain=True, timeout=10)
    manager.remove_all(wait=True)
    """
)


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs os.fork")
def test_status_in_a_forked_child_sees_only_its_own_controllers():
    proc = run_python(FORK_SCRIPT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "child exit code 0" in proc.stdout, (proc.stdout, proc.stderr)
    assert "reconq status: 1 controller, 0 periodic" in proc.stdout, proc.stdout


FORK_LOOP_SCRIPT = textwrap.dedent(
    """
    import os, signal, sys, threading, reconq

    controllers = [reconq.Controller(lambda key: None, name=f"c{i}") for i in range(50)]
    stop = threading.Event()

    def poll():
        while not stop.is_set():
            reconq.status()

    pollers = [threading.Thread(target=poll) for _ in range(2)]
    for t in pollers:
        t.start()
    stuck = 0
    for _ in range(int(sys.argv[1])):
        pid = os.fork()
        if pid == 0:
            signal.alarm(10)  # a deadlocked child dies of SIGALRM
            os._exit(0 if reconq.status() == [] else 3)
        _, status = os.waitpid(pid, 0)
        stuck += os.waitstatus_to_exitcode(status) != 0
    stop.set()
    for t in pollers:
        t.join()
    print("failed children:", stuck)
    """
)


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs os.fork")
def test_forks_while_other_threads_take_the_status_never_deadlock_the_child():
    """Threads polling the status hold the registry's lock now and then; a
    fork caught in that moment must not leave the child's status stuck
    (without the at-fork reset, a few percent of children were)."""
    proc = subprocess.run(
        [sys.executable, "-c", FORK_LOOP_SCRIPT, "150"], capture_output=True, text=True, timeout=240
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "failed children: 0" in proc.stdout, proc.stdout + proc.stderr

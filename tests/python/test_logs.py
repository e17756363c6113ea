"""Logs in Python: reconcile failures (logged by the bindings, with
tracebacks) and the engine's own events (forwarded from Rust through
pyo3-log) reach `logging` under the "reconq" logger, with the controller
name and key in the message (and as record attributes), and never deadlock a thread holding the GIL."""

from __future__ import annotations

import logging
import re
import subprocess
import sys
import textwrap
import threading
from typing import Iterator, List

import pytest

import reconq
from waiting import PATIENCE, wait_for


class ListHandler(logging.Handler):
    """Keeps every record it is given (thread-safe: `Handler.handle` locks)."""

    def __init__(self) -> None:
        super().__init__(level=logging.NOTSET)
        self.records: List[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def about(self, controller: str) -> List[logging.LogRecord]:
        """The records that name `controller` in their message."""
        return [
            r
            for r in self.records
            if f"'{controller}'" in r.getMessage() or f"controller={controller} " in r.getMessage() + " "
        ]


@pytest.fixture
def logs() -> Iterator[ListHandler]:
    """A handler on the "reconq" logger at DEBUG, for one test."""
    logger = logging.getLogger("reconq")
    handler = ListHandler()
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)


def fast() -> reconq.ExponentialBackoff:
    return reconq.ExponentialBackoff(0.001, 0.001)


def test_a_raising_reconcile_logs_errors_naming_controller_key_and_attempt(logs):
    def reconcile(key):
        if calls.setdefault(key, 0) < 2:
            calls[key] += 1
            raise RuntimeError("backend down")

    calls: dict = {}
    with reconq.Controller(reconcile, name="logs-raise", rate_limiter=fast()) as c:
        c.enqueue(("ns", 1))
        assert c.wait_idle(PATIENCE)
    records = logs.about("logs-raise")
    assert [(r.name, r.levelno, r.getMessage()) for r in records] == [
        (
            "reconq",
            logging.ERROR,
            "controller 'logs-raise': reconcile of ('ns', 1) failed (attempt 0): RuntimeError: backend down",
        ),
        (
            "reconq",
            logging.WARNING,
            "controller 'logs-raise': reconcile of ('ns', 1) failed again (attempt 1): RuntimeError: backend down",
        ),
    ]
    # The first with the traceback, the repeat without; and no second record
    # from the engine for the same failure.
    assert records[0].exc_info is not None and records[0].exc_info[0] is RuntimeError
    assert records[1].exc_info is None


def test_failure_records_carry_controller_key_and_attempt_as_attributes(logs):
    """For a JSON formatter or a handler: `record.controller`, `record.key`
    (the key as enqueued) and `record.attempt`, beside the unchanged message."""

    def reconcile(key):
        if reconq.context().attempt < 2:
            raise RuntimeError("backend down")

    with reconq.Controller(reconcile, name="logs-fields", rate_limiter=fast()) as c:
        c.enqueue(("ns", 1))
        assert c.wait_idle(PATIENCE)
    records = logs.about("logs-fields")
    assert [(r.controller, r.key, r.attempt) for r in records] == [  # type: ignore[attr-defined]
        ("logs-fields", ("ns", 1), 0),
        ("logs-fields", ("ns", 1), 1),
    ]
    assert records[0].getMessage().startswith("controller 'logs-fields': reconcile of ('ns', 1) failed (attempt 0)")


def test_trigger_and_manager_records_carry_their_controller(logs):
    def failing_trigger(stop_event):
        raise OSError("no watch")

    def failing_do():
        raise OSError("job down")

    with reconq.Controller(lambda key: None, name="logs-fields-trigger") as c:
        c.add_trigger(("ns", 2), failing_trigger)
        (trigger,) = wait_for(lambda: logs.about("logs-fields-trigger"))
    assert (trigger.controller, trigger.key) == ("logs-fields-trigger", ("ns", 2))  # type: ignore[attr-defined]
    assert not hasattr(trigger, "attempt")
    with reconq.Manager() as m:
        m.update("logs-fields-job", failing_do, interval=60, error_retry_base=60)
        job = wait_for(lambda: logs.about("logs-fields-job"))[0]
    assert job.controller == "logs-fields-job"  # type: ignore[attr-defined]


def test_a_key_failing_the_same_way_logs_one_traceback_then_quieter_lines(logs):
    def reconcile(key):
        attempt = reconq.context().attempt
        if attempt < 9:
            raise RuntimeError("backend down")
        if attempt == 9:
            raise RuntimeError("backend refused")

    with reconq.Controller(reconcile, name="logs-repeats", rate_limiter=fast()) as c:
        c.enqueue("k")
        assert c.wait_idle(PATIENCE)
        assert c.stats()["failures"] == 10  # the counters count every failure
    records = logs.about("logs-repeats")
    expected = [(logging.ERROR, True)]
    expected += [(logging.WARNING if a & (a - 1) == 0 else logging.DEBUG, False) for a in range(1, 9)]
    expected += [(logging.ERROR, True)]  # a new error is logged in full again
    assert [(r.levelno, r.exc_info is not None) for r in records] == expected


def test_huge_trigger_keys_and_watch_events_make_short_log_lines(logs):
    huge = "k" * (1 << 20)

    def failing_trigger(stop_event):
        raise OSError("no watch")

    def transform(event):
        raise ValueError("bad event")

    with reconq.Controller(lambda key: None, name="logs-huge-watch") as c:
        c.add_trigger(huge, failing_trigger)
        c.watch([[huge] * 3, {"blob": huge}], transform=transform)
        records = wait_for(lambda: len(logs.about("logs-huge-watch")) >= 3 and logs.about("logs-huge-watch"))
    messages = [r.getMessage() for r in records]
    assert any("trigger for" in m for m in messages) and sum("raised for event" in m for m in messages) == 2
    assert all(len(m) < 1000 for m in messages), [m[:200] for m in messages]


def test_a_huge_key_makes_a_short_log_line(logs):
    huge = "k" * (1 << 20)
    with reconq.Controller(lambda key: 1 / 0, name="logs-huge", rate_limiter=reconq.ExponentialBackoff(3600, 3600)) as c:
        c.enqueue(huge)
        records = wait_for(lambda: logs.about("logs-huge"), what="the failure")
    message = records[0].getMessage()
    assert len(message) < 500 and "…[truncated]" in message, message[:1000]


def test_retry_after_is_a_warning_and_system_exit_an_error(logs):
    def reconcile(key):
        if key == "later" and not seen.get(key):
            seen[key] = True
            raise reconq.RetryAfter(0.001, "busy")
        if key == "exit" and not seen.get(key):
            seen[key] = True
            raise SystemExit(3)

    seen: dict = {}
    with reconq.Controller(reconcile, name="logs-kinds", rate_limiter=fast()) as c:
        c.enqueue("later")
        assert c.wait_idle(PATIENCE)
        c.enqueue("exit")
        assert c.wait_idle(PATIENCE)
    assert [(r.name, r.levelname, r.getMessage()) for r in logs.about("logs-kinds")] == [
        ("reconq", "WARNING", "controller 'logs-kinds': reconcile of 'later' failed (attempt 0): RetryAfter: busy"),
        ("reconq", "ERROR", "controller 'logs-kinds': reconcile of 'exit' failed (attempt 0): SystemExit: 3"),
    ]


def test_a_hanging_reconcile_is_a_warning_from_the_engine(logs):
    release = threading.Event()
    with reconq.Controller(lambda key: release.wait(PATIENCE) and None, name="logs-hang", hanging_threshold=0.02) as c:
        c.enqueue(("stuck", 1))
        records = wait_for(lambda: logs.about("logs-hang"), what="the hang warning")
        release.set()
    (r,) = records
    assert (r.name, r.levelno) == ("reconq.controller", logging.WARNING)
    assert re.fullmatch(
        r'reconcile has been running for \d+\.\d s controller=logs-hang key=\("stuck", 1\) seconds=[0-9.e-]+',
        r.getMessage(),
    ), r.getMessage()


def blocked_controller(name: str, release: threading.Event) -> reconq.Controller:
    started = threading.Event()

    def reconcile(key):
        started.set()
        release.wait(PATIENCE)

    c = reconq.Controller(reconcile, name=name)
    c.start()
    c.enqueue("k")
    assert started.wait(PATIENCE)
    return c


def test_a_drain_deadline_is_a_warning_from_the_engine(logs):
    release = threading.Event()
    c = blocked_controller("logs-drain", release)
    try:
        # The helper thread that drains logs before stop() returns.
        assert c.stop(drain=True, timeout=0.05) is False
    finally:
        release.set()
        assert c.stop(drain=True, timeout=PATIENCE)  # joins the worker
    assert [(r.name, r.levelname, r.getMessage()) for r in logs.about("logs-drain")] == [
        (
            "reconq.controller",
            "WARNING",
            'drain deadline passed; cancelled and detached the workers still running controller=logs-drain unfinished=["k"]',
        )
    ]


LEVELS_SCRIPT = textwrap.dedent(
    """
    import logging, threading
    import reconq

    class Keep(logging.Handler):
        def __init__(self):
            super().__init__()
            self.messages = []
        def emit(self, record):
            self.messages.append((record.name, record.levelname, record.getMessage()))

    keep = Keep()
    logger = logging.getLogger("reconq")
    logger.addHandler(keep)
    release = threading.Event()

    controllers = []

    def drain_deadline(name):
        # A drain that times out: the engine logs a WARNING before stop()
        # returns.
        started = threading.Event()
        c = reconq.Controller(lambda key: started.set() or release.wait(30), name=name)
        c.start()
        c.enqueue("k")
        assert started.wait(30)
        assert c.stop(drain=True, timeout=0.05) is False
        controllers.append(c)
        return [m for m in keep.messages if f"controller={name} " in m[2]]

    # The first engine record of the process arrives while "reconq" is at
    # ERROR: dropped.
    logger.setLevel(logging.ERROR)
    assert drain_deadline("first") == [], keep.messages
    # Raised afterwards, the level applies to the next record.
    logger.setLevel(logging.WARNING)
    assert [m[:2] for m in drain_deadline("second")] == [("reconq.controller", "WARNING")], keep.messages
    # And lowered again, on the child logger.
    logging.getLogger("reconq.controller").setLevel(logging.CRITICAL)
    assert drain_deadline("third") == [], keep.messages
    release.set()
    # Join the workers left behind: one still exiting while the interpreter
    # finalizes would abort it (a known issue, not about logging).
    for c in controllers:
        assert c.stop(drain=True, timeout=30)
    print("ok")
    """
)


def test_levels_set_after_import_take_effect_at_once():
    """The bridge does not cache Python log levels: a level set at any time
    applies to the next record (with pyo3-log's level cache, the level seen
    by the first record of a target would stay in force). In a fresh
    process, so that this is the first record."""
    proc = subprocess.run([sys.executable, "-c", LEVELS_SCRIPT], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok", (proc.stdout, proc.stderr)


def test_reconciles_make_no_span_records(caplog):
    """Successes and requeues log nothing at any level: no per-reconcile
    span records ("reconcile;..." or tracing's "++"/"--" lines)."""

    def reconcile(key):
        if key not in seen:
            seen.add(key)
            return reconq.Requeue(after=0) if key % 2 else reconq.Requeue()

    seen: set = set()
    with caplog.at_level(1):  # everything, on the root logger
        with reconq.Controller(reconcile, name="logs-spans", workers=2, rate_limiter=fast()) as c:
            for k in range(50):
                c.enqueue(k)
            assert c.wait_idle(PATIENCE)
            assert c.stats()["reconciles"] == 100
    # (Span records of this controller would name it; tracing's lifecycle
    # records name nothing.)
    assert [r for r in caplog.records if r.name.startswith("tracing") or "logs-spans" in r.getMessage()] == []


GIL_SCRIPT = textwrap.dedent(
    """
    import logging, threading
    import reconq

    class Count(logging.Handler):
        def __init__(self):
            super().__init__()
            self.hangs = 0
        def emit(self, record):
            self.hangs += record.getMessage().startswith("reconcile has been running")

    count = Count()
    logging.getLogger("reconq").addHandler(count)
    logging.getLogger("reconq").setLevel(logging.WARNING)
    stop = threading.Event()

    def reconcile(key):
        stop.wait(0.003)
        return None if stop.is_set() else reconq.Requeue(after=0)

    c = reconq.Controller(reconcile, name="gil", workers=2, hanging_threshold=0.001)
    c.start()
    c.enqueue("a")
    c.enqueue("b")
    n = 0
    while count.hangs < 50:
        n += 1
        c.cancel("a")
        c.enqueue("b")
        c.parked()
        repr(c)
        assert n < 10_000_000, "no hang warnings came"
    stop.set()
    assert c.stop(drain=True, timeout=30)
    print("ok", flush=True)
    """
)


def test_engine_logging_never_deadlocks_a_thread_holding_the_gil():
    """The watchdog logs a hang for nearly every reconcile (taking the GIL)
    while the main thread, holding the GIL, keeps taking the engine locks
    those hangs are found under (cancel: the worker slots; enqueue: the
    queue; parked; repr: stats). Logging under one of them deadlocks, with
    the main thread stuck in Rust where no Python timeout can reach it: so
    in a subprocess, killed at the timeout."""
    try:
        proc = subprocess.run([sys.executable, "-c", GIL_SCRIPT], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail("deadlock: logging while an engine lock is held")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok", (proc.stdout, proc.stderr)


FORK_AND_EXIT_SCRIPT = textwrap.dedent(
    """
    import logging, os, sys, threading, time
    import reconq

    class Keep(logging.Handler):
        def __init__(self):
            super().__init__()
            self.records = []
        def emit(self, record):
            self.records.append(record)

    keep = Keep()
    logging.getLogger("reconq").addHandler(keep)
    logging.getLogger("reconq").setLevel(logging.DEBUG)

    def churn(key):
        # Every reconcile hangs past the threshold (a WARNING from the
        # engine's watchdog thread) and every other one raises (an ERROR
        # from the worker), forever.
        time.sleep(0.003)
        if key == "fail":
            raise RuntimeError("still failing")
        return reconq.Requeue(after=0)

    def controller(name):
        c = reconq.Controller(churn, name=name, workers=2, hanging_threshold=0.001,
                              rate_limiter=reconq.ExponentialBackoff(0.001, 0.001))
        c.start()
        c.enqueue("hang")
        c.enqueue("fail")
        return c

    def wait_records(name, n):
        deadline = time.monotonic() + 20
        while sum(name in r.getMessage() for r in list(keep.records)) < n:
            assert time.monotonic() < deadline, "no records"
            time.sleep(0.005)

    parent = controller("parent")
    wait_records("parent", 20)
    # Stopped before forking: its watchdog wakes every millisecond, and a
    # fork that catches an engine thread inside parking_lot's parking table
    # can leave the child's copy locked (see docs/lifecycle.md, "fork").
    # test_fork.py forks with engine threads running at a gentler pace.
    assert parent.stop(drain=True, timeout=30)

    for _ in range(3):
        # Forks with the logging machinery warm (records from engine
        # threads and the watchdog went through pyo3-log already).
        pid = os.fork()
        if pid == 0:
            keep.records.clear()
            child = controller("child")
            wait_records("child", 10)
            # Exit with the child's controller still logging: the exit hook
            # stops it.
            sys.exit(0)
        _, status = os.waitpid(pid, 0)
        print("child exit code", os.waitstatus_to_exitcode(status), flush=True)

    # A reconcile that never returns, found hanging, and given up on by the
    # exit hook.
    reconq._lifecycle.EXIT_TIMEOUT = 0.5
    stuck = reconq.Controller(lambda key: threading.Event().wait(), name="stuck", hanging_threshold=0.1)
    stuck.start()
    stuck.enqueue("forever")
    wait_records("stuck", 1)
    print("parent exiting", flush=True)
    """
)


def test_logging_threads_survive_fork_and_interpreter_exit():
    proc = subprocess.run(
        [sys.executable, "-c", FORK_AND_EXIT_SCRIPT], capture_output=True, text=True, timeout=45
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("child exit code 0") == 3, (proc.stdout, proc.stderr)
    assert "parent exiting" in proc.stdout
    assert "Fatal Python error" not in proc.stderr and "panicked" not in proc.stderr, proc.stderr

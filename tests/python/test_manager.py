"""reconq.Manager: named periodic controllers (guarantees §5).

Deterministic: every test waits on a condition with a generous timeout and
never sleeps-then-asserts.
"""

import logging
import math
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import reconq
from waiting import PATIENCE, wait_for


def status_of(m, name):
    (s,) = [s for s in m.status() if s["name"] == name]
    return s


@pytest.fixture
def m():
    manager = reconq.Manager()
    yield manager
    manager.remove_all(wait=True)


class Recorder:
    """A `do` that records call times and fails the first `fail` calls."""

    def __init__(self, fail=0, exc=RuntimeError("boom")):
        self.times = []
        self.fail = fail
        self.exc = exc
        self.lock = threading.Lock()

    def __call__(self):
        with self.lock:
            self.times.append(time.monotonic())
            n = len(self.times)
        if n <= self.fail:
            raise self.exc

    @property
    def calls(self):
        with self.lock:
            return len(self.times)


def test_do_runs_at_once(m):
    ran = threading.Event()
    m.update("a", ran.set)
    assert ran.wait(PATIENCE)
    wait_for(lambda: status_of(m, "a")["successes"] == 1)
    s = status_of(m, "a")
    assert s["failures"] == 0 and s["last_error"] is None
    assert abs(s["last_success_time"] - time.time()) < 60


def test_no_interval_runs_once(m):
    rec = Recorder()
    m.update("a", rec)
    wait_for(lambda: status_of(m, "a")["successes"] == 1)
    s = status_of(m, "a")
    assert s["next_run_in"] is None and rec.calls == 1


def test_interval_reruns(m):
    rec = Recorder()
    m.update("a", rec, interval=0.02)
    wait_for(lambda: rec.calls >= 4)
    gaps = [b - a for a, b in zip(rec.times, rec.times[1:])]
    assert all(g >= 0.015 for g in gaps), gaps


def test_linear_backoff_after_failures(m):
    rec = Recorder(fail=4)
    m.update("a", rec, error_retry_base=0.05)
    wait_for(lambda: status_of(m, "a")["successes"] == 1)
    assert rec.calls == 5
    gaps = [b - a for a, b in zip(rec.times, rec.times[1:])]
    # After the n-th failure the retry waits n * 0.05 s.
    for n, gap in enumerate(gaps, start=1):
        assert gap >= n * 0.05 * 0.9, gaps
    # Growing, not constant: the 4th wait is clearly longer than the 1st.
    assert gaps[3] > gaps[0] + 0.1, gaps
    s = status_of(m, "a")
    assert (s["failures"], s["successes"], s["consecutive_failures"]) == (4, 1, 0)


def test_failure_status_and_success_clears_error(m):
    rec = Recorder(fail=2, exc=ValueError("bad value"))
    m.update("a", rec, error_retry_base=0.2)
    wait_for(lambda: status_of(m, "a")["failures"] >= 1)
    s = status_of(m, "a")
    assert s["consecutive_failures"] >= 1
    assert s["last_error"] == "ValueError: bad value"
    assert isinstance(s["last_error_time"], float) and abs(s["last_error_time"] - time.time()) < 60
    assert s["last_success_time"] is None
    wait_for(lambda: status_of(m, "a")["successes"] == 1)
    s = status_of(m, "a")
    assert s["last_error"] is None and s["last_error_time"] is None
    assert s["consecutive_failures"] == 0 and s["failures"] == 2
    assert isinstance(s["last_success_time"], float)


def test_base_exceptions_are_failures_and_never_kill_the_thread(m):
    excs = [KeyboardInterrupt("ki"), SystemExit(3), GeneratorExit()]
    rec = Recorder(fail=0)

    def do():
        rec()
        if rec.calls <= len(excs):
            raise excs[rec.calls - 1]

    m.update("a", do, error_retry_base=0.01)
    wait_for(lambda: status_of(m, "a")["successes"] == 1)
    s = status_of(m, "a")
    assert s["failures"] == 3 and rec.calls == 4


def test_no_error_retry_waits_interval(m):
    rec = Recorder(fail=100)
    m.update("a", rec, interval=0.3, error_retry_base=0.01, no_error_retry=True)
    wait_for(lambda: rec.calls >= 3)
    gaps = [b - a for a, b in zip(rec.times, rec.times[1:])]
    assert all(g >= 0.25 for g in gaps), gaps


def test_no_error_retry_without_interval_waits_for_update(m):
    rec = Recorder(fail=100)
    m.update("a", rec, no_error_retry=True, error_retry_base=0.01)
    wait_for(lambda: status_of(m, "a")["failures"] == 1)
    assert status_of(m, "a")["next_run_in"] is None
    m.trigger("a")
    wait_for(lambda: status_of(m, "a")["failures"] == 2)


def test_update_replaces_and_runs_at_once(m):
    first, second = Recorder(), Recorder()
    m.update("a", first, interval=60)
    wait_for(lambda: first.calls == 1)
    m.update("a", second, interval=60)
    wait_for(lambda: second.calls == 1)
    # Counts carry over from the replaced parameters.
    wait_for(lambda: status_of(m, "a")["successes"] == 2)
    assert first.calls == 1
    assert len(m) == 1


def test_trigger(m):
    rec = Recorder()
    m.update("a", rec)
    wait_for(lambda: rec.calls == 1)
    m.trigger("a")
    wait_for(lambda: rec.calls == 2)
    with pytest.raises(KeyError):
        m.trigger("nope")


def test_stop_once_after_do_only_latest(m):
    events = []
    lock = threading.Lock()

    def rec(what):
        def f():
            with lock:
                events.append(what)
        return f

    m.update("a", rec("do1"), stop=rec("stop1"))
    wait_for(lambda: "do1" in events)
    m.update("a", rec("do2"), stop=rec("stop2"))
    wait_for(lambda: "do2" in events)
    m.remove("a", wait=True)
    assert events == ["do1", "do2", "stop2"]
    assert "a" not in m


def test_stop_runs_after_do_even_if_removed_at_once(m):
    events = []
    gate = threading.Event()

    def do():
        gate.wait(PATIENCE)
        events.append("do")

    m.update("a", do, stop=lambda: events.append("stop"))
    m.remove("a")
    gate.set()
    wait_for(lambda: events == ["do", "stop"])


def test_remove_wait_waits_for_stop(m):
    stopped = threading.Event()

    def stop():
        time.sleep(0.2)
        stopped.set()

    m.update("a", lambda: None, stop=stop)
    wait_for(lambda: status_of(m, "a")["successes"] == 1)
    m.remove("a", wait=True)
    assert stopped.is_set()


def test_remove_without_wait_returns_before_stop(m):
    release = threading.Event()
    stopped = threading.Event()

    def stop():
        release.wait(PATIENCE)
        stopped.set()

    m.update("a", lambda: None, stop=stop)
    wait_for(lambda: status_of(m, "a")["successes"] == 1)
    m.remove("a")
    assert "a" not in m and not stopped.is_set()
    release.set()
    assert stopped.wait(PATIENCE)


def test_remove_unknown_is_key_error(m):
    with pytest.raises(KeyError):
        m.remove("nope")
    with pytest.raises(KeyError):
        m.remove("nope", wait=True)


def test_remove_all(m):
    stops = []
    for name in "abc":
        m.update(name, lambda: None, stop=lambda name=name: stops.append(name))
    wait_for(lambda: all(s["successes"] == 1 for s in m.status()) and len(m) == 3)
    m.remove_all(wait=True)
    assert sorted(stops) == ["a", "b", "c"]
    assert len(m) == 0 and m.status() == [] and m.names() == []


def test_remove_all_without_wait(m):
    stopped = threading.Event()
    m.update("a", lambda: None, stop=stopped.set)
    m.remove_all()
    assert len(m) == 0
    assert stopped.wait(PATIENCE)


def test_status_sorted_with_fields(m):
    for name in ["zeta", "alpha", "mid"]:
        m.update(name, lambda: None)
    wait_for(lambda: len(m.status()) == 3 and all(s["successes"] == 1 for s in m.status()))
    st = m.status()
    assert [s["name"] for s in st] == ["alpha", "mid", "zeta"]
    assert m.names() == ["alpha", "mid", "zeta"]
    for s in st:
        assert {
            "name",
            "successes",
            "failures",
            "consecutive_failures",
            "last_error",
            "last_error_time",
            "last_success_time",
        } <= set(s)


def test_len_contains_repr(m):
    assert len(m) == 0 and "a" not in m and 1 not in m
    m.update("a", lambda: None)
    assert len(m) == 1 and "a" in m
    assert "'a'" in repr(m) or '"a"' in repr(m)
    assert repr(m).startswith("<reconq.Manager")


def test_context_manager_removes_all_and_waits():
    stopped = []
    with reconq.Manager() as m:
        m.update("a", lambda: None, stop=lambda: stopped.append(1))
        wait_for(lambda: status_of(m, "a")["successes"] == 1)
    assert stopped == [1] and len(m) == 0


def test_do_can_update_and_remove_its_own_manager(m):
    done = threading.Event()

    def do():
        m.update("child", done.set)
        m.remove("parent", wait=True)  # its own: must not deadlock

    m.update("parent", do)
    assert done.wait(PATIENCE)
    wait_for(lambda: m.names() == ["child"])


@pytest.mark.parametrize(
    "kwargs, exc",
    [
        (dict(name=1, do=lambda: None), TypeError),
        (dict(name=None, do=lambda: None), TypeError),
        (dict(name="x", do=42), TypeError),
        (dict(name="x", do=lambda: None, stop="nope"), TypeError),
        (dict(name="x", do=lambda: None, interval=-1), ValueError),
        (dict(name="x", do=lambda: None, interval=math.nan), ValueError),
        (dict(name="x", do=lambda: None, interval="1"), TypeError),
        (dict(name="x", do=lambda: None, error_retry_base=-0.5), ValueError),
        (dict(name="x", do=lambda: None, error_retry_base=math.nan), ValueError),
    ],
)
def test_bad_input_changes_nothing(m, kwargs, exc):
    rec = Recorder()
    m.update("x", rec, interval=60)
    wait_for(lambda: status_of(m, "x")["successes"] == 1)
    with pytest.raises(exc):
        m.update(kwargs.pop("name"), kwargs.pop("do"), **kwargs)
    assert m.names() == ["x"]
    assert status_of(m, "x")["successes"] == 1
    # The old parameters are untouched: the old `do` still runs on trigger.
    m.trigger("x")
    wait_for(lambda: rec.calls == 2)


def test_bad_name_types(m):
    for call in (m.remove, m.trigger):
        with pytest.raises(TypeError):
            call(1)


def test_failures_are_logged(m, caplog):
    def do():
        raise ValueError("logged failure")

    def stop():
        raise RuntimeError("stop failure")

    with caplog.at_level(logging.WARNING, logger="reconq"):
        m.update("a", do, stop=stop, error_retry_base=60)
        wait_for(lambda: status_of(m, "a")["failures"] == 1)
        m.remove("a", wait=True)
    messages = [r.getMessage() for r in caplog.records if r.name == "reconq"]
    assert any("'a'" in msg and "ValueError: logged failure" in msg for msg in messages), messages
    assert any("RuntimeError: stop failure" in msg for msg in messages), messages
    assert any(r.exc_info for r in caplog.records if r.name == "reconq")


def run_script(source, timeout=30):
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(source)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return proc, time.monotonic() - start


def test_exit_with_running_manager_runs_stop_and_exits_promptly():
    proc, elapsed = run_script(
        """
        import reconq, threading
        ran = threading.Event()
        m = reconq.Manager()
        m.update("tick", ran.set, interval=0.01, stop=lambda: print("stopped", flush=True))
        m.update("failing", lambda: 1 / 0, error_retry_base=0.01)
        ran.wait(10)
        print("exiting", flush=True)
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["exiting", "stopped"], proc.stdout + proc.stderr
    assert elapsed < 15


def test_exit_with_hung_do_does_not_hang():
    proc, elapsed = run_script(
        """
        import reconq, threading, time
        started = threading.Event()
        def do():
            started.set()
            time.sleep(3600)
        m = reconq.Manager()
        m.update("hung", do)
        started.wait(10)
        print("exiting", flush=True)
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert "exiting" in proc.stdout
    assert elapsed < 25


def test_exit_after_manager_dropped():
    proc, _ = run_script(
        """
        import reconq, threading
        ran = threading.Event()
        m = reconq.Manager()
        m.update("tick", ran.set, interval=0.01)
        ran.wait(10)
        del m
        """
    )
    assert proc.returncode == 0, proc.stderr

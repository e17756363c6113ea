"""A source blocked where it does not look at its stop event (a `list()`
given none, an iterator that ignores `stop`) holds neither a stop with a
deadline, nor the interpreter's exit, nor the leadership (guarantees §4,
§10 L4, §13 Lifecycle; docs/lifecycle.md): the stop returns by its
deadline and names the cache it left behind. And `list(stop)`: a `list`
that takes a parameter is given the stop event."""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator, List, Tuple

import pytest

import reconq
from etcd_server import Etcd
from waiting import PATIENCE, wait_for

HERE = Path(__file__).parent

#: How long past its deadline a stop may return on a loaded machine.
SLACK = 15.0
#: How long a child process may take to exit once asked: the exit hook's
#: 5 s (reconq._lifecycle.EXIT_TIMEOUT), an interpreter start, and slack.
EXIT_BOUND = 45.0


class Blocked:
    """A `reconq.Source` whose `list` or `changes` blocks until `release`,
    ignoring its stop event."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.entered = threading.Event()
        self.released = threading.Event()

    def list(self) -> Tuple[Any, int]:
        if self.where == "list":
            self.entered.set()
            self.released.wait()
        return {"a": 1}, 1

    def changes(self, position: Any, stop: threading.Event) -> Iterator[reconq.Put]:
        self.entered.set()
        self.released.wait()
        yield reconq.Put("a", 2, position=2)

    def source(self) -> reconq.Source:
        return reconq.Source(self.list, self.changes)

    def release(self) -> None:
        self.released.set()


@pytest.fixture
def blocked() -> Iterator[List[Blocked]]:
    """Blocked sources a test made, released at its end (their threads
    then exit)."""
    made: List[Blocked] = []
    yield made
    for source in made:
        source.release()


@pytest.mark.parametrize("where", ["list", "changes"])
def test_stop_returns_by_its_deadline_and_names_the_cache_left_behind(
    where: str, blocked: List[Blocked], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="reconq")
    source = Blocked(where)
    blocked.append(source)
    name = f"blocked-{where}"
    cache = reconq.Cache(source.source(), name=name)
    c = reconq.Controller(lambda key: None, name=name)
    c.watch_cache(cache)
    c.start()
    assert source.entered.wait(PATIENCE)

    reports: List[Any] = []
    stopper = threading.Thread(target=lambda: reports.append(c.stop_with_report(timeout=2)), daemon=True)
    started = time.monotonic()
    stopper.start()
    stopper.join(2 + SLACK)
    assert reports, f"stop(timeout=2) had not returned after {time.monotonic() - started:.1f} s"
    assert reports[0]["finished"] is True
    assert reports[0]["unfinished_caches"] == [name]
    assert c.stats()["state"] == "stopped"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("gave up waiting for caches" in line and name in line for line in warnings), warnings

    # Once the source returns, the thread left behind exits, applying nothing.
    source.release()
    assert cache.stop(timeout=PATIENCE) is True
    assert cache.get("a") in (None, 1)


def test_a_stop_reports_no_cache_when_the_source_heeds_its_stop() -> None:
    def changes(position: Any, stop: threading.Event) -> Iterator[reconq.Put]:
        stop.wait()
        return iter(())

    cache = reconq.Cache(reconq.Source(lambda: ({"a": 1}, 1), changes), name="heeds")
    c = reconq.Controller(lambda key: None, name="heeds")
    c.watch_cache(cache)
    c.start()
    assert c.wait_synced(PATIENCE)
    report = c.stop_with_report(timeout=PATIENCE)
    assert report["unfinished_caches"] == [] and report["finished"] is True


def test_cache_stop_with_a_timeout_leaves_a_blocked_source_behind(blocked: List[Blocked]) -> None:
    source = Blocked("list")
    blocked.append(source)
    cache = reconq.Cache(source.source(), name="left-behind")
    cache.start()
    assert source.entered.wait(PATIENCE)
    assert cache.stop(timeout=0.2) is False
    assert not cache.synced
    source.release()
    assert cache.stop(timeout=PATIENCE) is True
    assert not cache.synced and len(cache) == 0, "a cache stopped applies nothing more"


def test_a_list_that_takes_a_parameter_is_given_the_stop_event() -> None:
    given: List[threading.Event] = []

    def list_items(stop: threading.Event) -> Tuple[Any, int]:
        given.append(stop)
        stop.wait()  # heeds it: the stop below needs no deadline
        return {}, 0

    cache = reconq.Cache(reconq.Source(list_items, lambda position, stop: iter(())), name="list-stop")
    cache.start()
    wait_for(lambda: given, what="list(stop) to be called")
    assert isinstance(given[0], threading.Event) and not given[0].is_set()
    stopper = threading.Thread(target=cache.stop, daemon=True)
    stopper.start()
    stopper.join(PATIENCE)
    assert not stopper.is_alive(), "stop() returned: list heeded the event"
    assert given[0].is_set()


def test_a_list_callable_with_no_argument_is_called_with_none(caches: List[reconq.Cache]) -> None:
    calls: List[Tuple[Any, ...]] = []

    def list_items(*args: Any, limit: int = 5) -> Tuple[Any, int]:
        calls.append(args)
        return {"a": 1}, 1

    def with_default(page: int = 10) -> Tuple[Any, int]:
        calls.append((page,))
        return {"b": 2}, 1

    for fn in (list_items, with_default):
        cache = reconq.Cache(reconq.Source(fn, lambda position, stop: iter(())), name=fn.__name__)
        caches.append(cache)
        cache.start()
        assert cache.wait_synced(PATIENCE)
    assert calls[:2] == [(), (10,)]


def test_a_list_that_takes_two_arguments_is_refused() -> None:
    with pytest.raises(TypeError, match="list must accept no arguments or one positional argument"):
        reconq.Source(lambda a, b: ({}, 0), lambda position, stop: iter(()))


def child(how: str, where: str, *args: str) -> "subprocess.Popen[str]":
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "blocked_source_child.py"), how, where, *args],
        stdout=subprocess.PIPE, text=True, cwd=str(HERE),
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    return proc


def exits_within(proc: "subprocess.Popen[str]", bound: float) -> int:
    """The child's exit status; fails (and kills it) if it is still
    running after `bound` seconds."""
    try:
        return proc.wait(bound)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        pytest.fail(f"the child had not exited {bound} s later: killed")


@pytest.mark.parametrize("where", ["list", "changes"])
def test_interpreter_exit_is_bounded_with_a_blocked_source(where: str) -> None:
    proc = child("exit", where)
    assert exits_within(proc, EXIT_BOUND) == 0


@pytest.mark.parametrize("where", ["list", "changes"])
def test_sigterm_during_run_ends_the_process_with_a_blocked_source(where: str) -> None:
    proc = child("run", where)
    proc.send_signal(signal.SIGTERM)
    assert exits_within(proc, EXIT_BOUND) == 0
    assert proc.stdout is not None and proc.stdout.read().strip() == "ran"


@pytest.mark.parametrize("where", ["list", "changes"])
def test_a_standby_takes_over_within_the_ttl_from_a_leader_whose_source_is_blocked(where: str, etcd: Etcd) -> None:
    proc = child("run", where, etcd.endpoint)  # leads, its lease 30 s
    standby = reconq.LeaderElection(etcd.endpoint, "blocked", ttl=30, identity="standby")
    standby.start()
    try:
        wait_for(lambda: standby.leader == "child", what="the standby to see the child lead")
        proc.send_signal(signal.SIGTERM)
        # Well within the 30 s lease: the leader gave it up (L4) although its
        # cache's thread is still blocked; not the lease running out.
        wait_for(lambda: standby.is_leader, timeout=20, what="the standby to lead")
        assert exits_within(proc, EXIT_BOUND) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        standby.stop()

"""Triggers and watches (guarantees §5)."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, List

import pytest

import reconq
from waiting import PATIENCE, wait_for


class Seen:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.keys: List[Any] = []

    def __call__(self, key: Any) -> None:
        with self.lock:
            self.keys.append(key)

    def snapshot(self) -> List[Any]:
        with self.lock:
            return list(self.keys)


class Ctl:
    """A started controller plus what its reconcile saw."""

    def __init__(self) -> None:
        self.seen = Seen()
        self.c = reconq.Controller(self.seen, workers=2)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.c, name)


@pytest.fixture
def ctl():
    w = Ctl()
    w.c.start()
    yield w
    w.c.stop(drain=False, timeout=5)


def settle(c: Any) -> None:
    """Waits until every trigger/watch thread has exited and the queue is idle."""
    wait_for(lambda: c.stats()["background_threads"] == 0)
    assert c.wait_idle(PATIENCE)


def test_trigger_fires_with_a_threading_event(ctl):
    got: List[Any] = []

    def trigger(stop_event):
        got.append(stop_event)

    ctl.add_trigger("t", trigger)
    settle(ctl)
    assert ctl.seen.snapshot() == ["t"]
    assert isinstance(got[0], threading.Event) and not got[0].is_set()


def test_trigger_runs_on_its_own_thread(ctl):
    where: List[int] = []
    ctl.add_trigger("t", lambda ev: where.append(threading.get_ident()))
    settle(ctl)
    assert where and where[0] != threading.get_ident()


def test_second_trigger_replaces_the_first(ctl):
    first_started = threading.Event()
    outcome: List[bool] = []

    def first(ev):
        first_started.set()
        outcome.append(ev.wait(PATIENCE))  # True: stopped by the replacement

    release = threading.Event()

    def second(ev):
        release.wait(PATIENCE)

    ctl.add_trigger("k", first)
    assert first_started.wait(PATIENCE)
    ctl.add_trigger("k", second)
    wait_for(lambda: outcome)
    assert outcome == [True]
    assert ctl.seen.snapshot() == []  # the replaced trigger did not enqueue
    release.set()
    settle(ctl)
    assert ctl.seen.snapshot() == ["k"]


def test_remove_trigger_sets_its_event_and_nothing_is_enqueued(ctl):
    started = threading.Event()
    outcome: List[bool] = []

    def trigger(ev):
        started.set()
        outcome.append(ev.wait(PATIENCE))

    ctl.add_trigger(("a", 1), trigger)
    assert started.wait(PATIENCE)
    assert ctl.remove_trigger(("a", 1)) is True
    settle(ctl)
    assert outcome == [True]
    assert ctl.seen.snapshot() == []
    assert ctl.remove_trigger(("a", 1)) is False
    assert ctl.remove_trigger("never") is False


def test_stop_sets_every_trigger_event():
    seen = Seen()
    c = reconq.Controller(seen)
    c.start()
    started = [threading.Event() for _ in range(3)]
    outcome: List[bool] = []

    def make(i):
        def trigger(ev):
            started[i].set()
            outcome.append(ev.wait(PATIENCE))

        return trigger

    for i in range(3):
        c.add_trigger(i, make(i))
    for s in started:
        assert s.wait(PATIENCE)
    t0 = time.monotonic()
    assert c.stop() is True
    assert time.monotonic() - t0 < PATIENCE / 2
    assert outcome == [True, True, True]
    assert seen.snapshot() == []
    assert c.stats()["background_threads"] == 0
    # Triggers after stop are ignored.
    ran: List[int] = []
    c.add_trigger("late", lambda ev: ran.append(1))
    assert ran == []


def test_raising_trigger_enqueues_nothing_and_is_logged(ctl, caplog):
    def trigger(ev):
        raise RuntimeError("trigger broke")

    with caplog.at_level(logging.ERROR, logger="reconq"):
        ctl.add_trigger("boom", trigger)
        settle(ctl)
    assert ctl.seen.snapshot() == []
    assert any("RuntimeError: trigger broke" in r.getMessage() for r in caplog.records)


def test_trigger_that_sets_its_own_event_does_not_enqueue(ctl):
    ctl.add_trigger("self", lambda ev: ev.set())
    settle(ctl)
    assert ctl.seen.snapshot() == []


def test_watch_enqueues_events_lists_and_tuples(ctl):
    ctl.watch(["a", ["b", "c"], ("ns", "d"), 7])
    settle(ctl)
    assert sorted(ctl.seen.snapshot(), key=repr) == sorted(["a", "b", "c", ("ns", "d"), 7], key=repr)


def test_watch_with_transform(ctl):
    ctl.watch(range(5), transform=lambda e: [e, e + 100] if e % 2 else ("ev", e))
    settle(ctl)
    expected = [("ev", 0), 1, 101, ("ev", 2), 3, 103, ("ev", 4)]
    assert sorted(ctl.seen.snapshot(), key=repr) == sorted(expected, key=repr)


def test_watch_from_a_generator_on_another_thread(ctl):
    where: List[int] = []

    def events():
        where.append(threading.get_ident())
        for i in range(20):
            yield i

    ctl.watch(events())
    settle(ctl)
    assert sorted(ctl.seen.snapshot()) == list(range(20))
    assert where[0] != threading.get_ident()


def test_watch_bad_keys_are_logged_not_fatal(ctl, caplog):
    with caplog.at_level(logging.ERROR, logger="reconq"):
        ctl.watch(["ok1", 1.5, ["ok2", None, "ok3"], "ok4"])
        settle(ctl)
    assert sorted(ctl.seen.snapshot()) == ["ok1", "ok2", "ok3", "ok4"]
    messages = [r.getMessage() for r in caplog.records if r.name == "reconq"]
    assert len(messages) == 2 and all("bad key" in m for m in messages)


def test_watch_transform_errors_skip_the_event(ctl, caplog):
    def transform(e):
        if e == 2:
            raise ValueError("bad event")
        return e

    with caplog.at_level(logging.ERROR, logger="reconq"):
        ctl.watch([1, 2, 3], transform)
        settle(ctl)
    assert sorted(ctl.seen.snapshot()) == [1, 3]
    assert any("ValueError: bad event" in r.getMessage() for r in caplog.records)


def test_watch_ends_on_an_exception_from_the_iterable(ctl, caplog):
    def events():
        yield "x"
        raise OSError("stream lost")

    with caplog.at_level(logging.ERROR, logger="reconq"):
        ctl.watch(events())
        settle(ctl)
    assert ctl.seen.snapshot() == ["x"]
    assert any("OSError: stream lost" in r.getMessage() for r in caplog.records)


def test_stop_ends_a_watch_at_its_next_event():
    seen = Seen()
    c = reconq.Controller(seen)
    c.start()
    gate = threading.Event()
    pulled: List[int] = []

    def events():
        yield "first"
        gate.wait(PATIENCE)
        pulled.append(1)
        yield "after-stop"
        pulled.append(2)
        yield "never"

    c.watch(events())
    wait_for(lambda: seen.snapshot() == ["first"])
    threading.Timer(0.1, gate.set).start()
    assert c.stop() is True
    assert seen.snapshot() == ["first"]
    assert pulled == [1]

"""A trigger's stop event (guarantees §5): a `reconq.StopEvent`, the
`threading.Event` over the trigger's own stop signal in the engine, which
keeps the one trigger registry."""

from __future__ import annotations

import textwrap
import threading
from typing import Any, List

import pytest

import reconq
from test_stubs import strict_type_errors
from waiting import PATIENCE, wait_for


class Started:
    """A started controller and the keys its reconcile saw."""

    def __init__(self) -> None:
        self.seen: List[Any] = []
        self.c = reconq.Controller(self.seen.append)
        self.c.start()


@pytest.fixture
def ctl():
    started = Started()
    yield started
    started.c.stop(drain=False, timeout=PATIENCE)


def test_the_event_is_a_stop_event_and_waits_like_a_threading_event(ctl):
    c = ctl.c
    got: List[Any] = []
    waited: List[bool] = []
    started = threading.Event()

    def trigger(ev):
        got.append(ev)
        # A timeout that passes, and one that is not positive: no wait.
        waited.extend([ev.wait(0.01), ev.wait(-1), ev.wait(timeout=0)])
        started.set()
        waited.append(ev.wait(PATIENCE))  # set by remove_trigger

    c.add_trigger("k", trigger)
    assert started.wait(PATIENCE)
    ev = got[0]
    assert isinstance(ev, reconq.StopEvent) and isinstance(ev, threading.Event)
    assert not ev.is_set() and repr(ev) == "<reconq.StopEvent: unset>"
    assert c.remove_trigger("k") is True
    wait_for(lambda: len(waited) == 4)
    assert waited == [False, False, False, True]
    assert ev.is_set() and repr(ev) == "<reconq.StopEvent: set>"
    wait_for(lambda: c.stats()["background_threads"] == 0)
    assert c.wait_idle(PATIENCE) and ctl.seen == []


def test_a_trigger_that_clears_its_event_again_enqueues(ctl):
    def trigger(ev):
        ev.set()
        ev.clear()

    ctl.c.add_trigger("k", trigger)
    wait_for(lambda: ctl.seen == ["k"])


def test_stop_sets_the_event_of_a_trigger_that_waits_on_it():
    c = reconq.Controller(lambda key: None)
    c.start()
    started = threading.Event()
    events: List[Any] = []

    def trigger(ev):
        events.append(ev)
        started.set()
        ev.wait()

    c.add_trigger("k", trigger)
    assert started.wait(PATIENCE)
    assert c.stop(timeout=PATIENCE) is True
    assert events[0].is_set()


def test_the_stubs_name_the_stop_event(tmp_path):
    source = textwrap.dedent(
        """
        import threading
        import reconq
        def precise(ev: reconq.StopEvent) -> None:
            ev.wait(1.0)
        def plain(ev: threading.Event) -> bool:
            return ev.is_set()
        c = reconq.Controller(lambda key: None)
        c.add_trigger('a', precise)
        c.add_trigger('b', plain)
        def wrong(ev: int) -> None: ...
        c.add_trigger('c', wrong)  # E: not an event
        """
    ).lstrip("\n")
    (marked,) = [n for n, line in enumerate(source.splitlines(), 1) if "# E:" in line]
    errors = strict_type_errors(tmp_path, source)
    assert len(errors) == 1 and f"prog.py:{marked}:" in errors[0], errors

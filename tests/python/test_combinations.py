"""Spec §17, C6, from Python: pairs of features whose Python side has its
own code (a Python `map`, `group`, `clock`, store path), each checking a
guarantee of both sides at once. The whole matrix is in Rust
(tests/combinations.rs) and docs/guarantees.md ("Combinations (C6)")."""

from __future__ import annotations

from typing import Any, Dict, Iterator, List

import pytest

import reconq
from test_dependencies import Script, run_blocked
from waiting import wait_for

Made = List[reconq.Controller]


@pytest.fixture
def made() -> Iterator[Made]:
    controllers: Made = []
    yield controllers
    for c in controllers:
        c.stop(drain=False)


def controller(made: Made, script: Script, **kw: Any) -> reconq.Controller:
    c = reconq.Controller(script, rate_limiter=reconq.ExponentialBackoff(1.0, 1.0), **kw)
    made.append(c)
    return c


def test_pair_cache_fake_clock(made: Made) -> None:
    """E2 + E7 on a FakeClock: a change is reconciled on a still clock, and
    the watch's resync period follows the fake clock."""
    system: Dict[str, int] = {"listed": 1}
    script, fc = Script(), reconq.FakeClock()
    c = controller(made, script, clock=fc)
    c.watch_cache(reconq.Cache(reconq.PollingSource(lambda: dict(system), 0.01)), resync=60.0)
    c.start()
    wait_for(lambda: script.starts("listed") == 1, what="the listed key")
    system["k"] = 2
    wait_for(lambda: script.starts("k") == 1, what="the change on a still clock")
    fc.advance(66.0)  # 60 s ± 10%
    wait_for(lambda: script.starts("listed") == 2 and script.starts("k") == 2, what="the resync on the fake clock")


def test_pair_cache_dependencies(made: Made) -> None:
    """E6 + D1: the key a Python `map` gives waits for its running parent."""
    system: Dict[str, int] = {}
    script = Script()
    c = controller(made, script, workers=2)
    c.watch_cache(reconq.Cache(reconq.PollingSource(lambda: dict(system), 0.01)), map=lambda key, obj: [f"{key}-child"])
    c.set_dependencies("k-child", ["parent"])
    c.start()
    assert c.wait_synced(10.0)
    run_blocked(c, script, "parent")
    system["k"] = 1
    wait_for(lambda: c.stats()["held"] == 1, what="the mapped child held")
    assert script.starts("k-child") == 0
    script.open("parent")
    wait_for(lambda: script.starts("k-child") == 1)
    assert script.at("end", "parent") < script.at("start", "k-child")


def test_pair_groups_timeout(made: Made) -> None:
    """P5 + §7: a Python-grouped run that times out frees its slot."""
    script, fc = Script(), reconq.FakeClock()
    group = lambda key: "g" if key.startswith("g") else key  # noqa: E731
    c = controller(made, script, workers=2, clock=fc, timeout=5.0, group=group, max_in_flight_per_group=1)
    c.start()
    run_blocked(c, script, "g1")
    c.enqueue("g2")
    c.enqueue("x", priority=-1)
    wait_for(lambda: script.starts("x") == 1, what="x ahead of the full group's key")
    assert script.starts("g2") == 0
    fc.advance(5.0)
    wait_for(lambda: script.starts("g2") == 1, what="g2 in the slot the timed-out run freed")
    assert "timed out" in c.stats()["last_error"]


def test_pair_store_debounce(made: Made, tmp_path: Any) -> None:
    """U2 + S2: a debounced key is stored with what is left of its window
    on the controller's clock."""
    db = str(tmp_path / "state.db")
    first, fc = Script(), reconq.FakeClock()
    c = controller(made, first, name="sync", store=db, clock=fc, debounce=60.0)
    c.start()
    c.enqueue("k")
    fc.advance(30.0)
    c.stop()
    second, fc = Script(), reconq.FakeClock()
    again = controller(made, second, name="sync", store=db, clock=fc, debounce=60.0)
    again.start()
    assert again.inspect("k")["state"] == "waiting"
    fc.advance(20.0)
    assert again.inspect("k")["state"] == "waiting" and second.starts("k") == 0
    fc.advance(15.0)
    wait_for(lambda: second.starts("k") == 1, what="due at the end of its window")


def test_pair_dependencies_supersede(made: Made) -> None:
    """U1 + D1: a superseded parent still holds its child until its rerun
    returned."""
    script = Script()
    c = controller(made, script, workers=2, supersede=True)
    c.set_dependencies("child", ["parent"])
    c.start()
    run_blocked(c, script, "parent")
    c.enqueue("child")
    wait_for(lambda: c.stats()["held"] == 1)
    c.enqueue("parent")
    wait_for(lambda: script.starts("parent") == 2 and script.running("parent"), what="the parent's rerun")
    assert script.starts("child") == 0
    script.open("parent")
    wait_for(lambda: script.starts("child") == 1)
    assert script.at("end", "parent", 1) < script.at("start", "child")
    assert c.stats()["superseded"] == 1

"""Controllers watching caches from Python (guarantees §13, E2, E5–E7):
every change reconciled with the cache holding it, the synced gate and
`sync_timeout`, `map` and `predicate` (and their failures), priorities and
resync, the caches' lifecycle under controllers, and bad input."""

from __future__ import annotations

import logging
import math
import threading
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import pytest

import reconq
from fake_system import System
from gil_holds import GilHolds
from waiting import PATIENCE, wait_for


class Seen:
    """What a reconcile saw: (key, the cache's object for it, priority)."""

    def __init__(self, cache: Optional[reconq.Cache] = None) -> None:
        self.lock = threading.Lock()
        self.cache = cache
        self.calls: List[Tuple[Any, Any, int]] = []

    def __call__(self, key: Any) -> None:
        obj = self.cache.get(key) if self.cache is not None and not isinstance(key, tuple) else None
        with self.lock:
            self.calls.append((key, obj, reconq.context().priority))

    def keys(self) -> List[Any]:
        with self.lock:
            return [key for key, _, _ in self.calls]

    def last(self) -> Dict[Any, Any]:
        with self.lock:
            return {key: obj for key, obj, _ in self.calls}


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    with caplog.at_level(logging.DEBUG, logger="reconq"):
        yield caplog


@pytest.fixture
def stopped() -> Iterator[List[Any]]:
    """Controllers and caches a test made, stopped at its end."""
    made: List[Any] = []
    yield made
    for thing in reversed(made):
        thing.stop()


Watching = Callable[..., Tuple[reconq.Cache, Seen, reconq.Controller]]


@pytest.fixture
def watching(stopped: List[Any]) -> Watching:
    """Starts a controller that records what it saw (`Seen`), watching a
    new cache of `source` under `name` with the `watch_cache` options
    given; `controller` holds the controller's own options. The controller
    (and with it the cache) is stopped at the test's end."""

    def start(
        source: Any, name: str, controller: Optional[Dict[str, Any]] = None, **watch: Any
    ) -> Tuple[reconq.Cache, Seen, reconq.Controller]:
        cache = reconq.Cache(source, name=name)
        seen = Seen(cache)
        c = reconq.Controller(seen, name=name, **(controller or {}))
        stopped.append(c)
        c.watch_cache(cache, **watch)
        c.start()
        return cache, seen, c

    return start


def test_every_change_is_reconciled_with_the_cache_holding_it_or_newer(watching: Watching) -> None:
    system = System({"a": 1, "b": 2})
    cache, seen, c = watching(system.source(), "e2", controller={"workers": 2})
    assert c.wait_synced(PATIENCE) and cache.synced, "the controller's start started the cache"
    wait_for(lambda: seen.last() == {"a": 1, "b": 2})
    for value in range(3, 30):
        system.put("a", value)
    system.put("c", 3)
    system.delete("b")
    wait_for(lambda: seen.last() == {"a": 29, "b": None, "c": 3}, what="every change reconciled")
    assert c.wait_idle(PATIENCE) and c.stats()["handler_errors"] == 0


def test_no_key_is_handed_out_before_every_cache_watched_at_start_has_synced(stopped: List[Any]) -> None:
    system = System({"a": 1})
    may_list = threading.Event()

    def slow_list() -> Any:
        may_list.wait()
        return system.list()

    cache = reconq.Cache(reconq.Source(slow_list, system.changes), name="gate")
    seen = Seen(cache)
    c = reconq.Controller(seen, name="gate")
    stopped.append(c)
    c.watch_cache(cache)
    c.enqueue("early")
    c.start()
    assert not c.wait_synced(0.3) and seen.keys() == [], "E5: held until the first list"
    may_list.set()
    assert c.wait_synced(PATIENCE)
    wait_for(lambda: sorted(seen.keys()) == ["a", "early"], what="the key enqueued before sync kept")
    # A cache watched after start does not hold the controller.
    never = threading.Event()
    late = reconq.Cache(reconq.Source(lambda: (never.wait(), ({}, 0))[1], system.changes), name="late")
    c.watch_cache(late)
    c.enqueue("after")
    wait_for(lambda: "after" in seen.keys())
    assert not late.synced
    never.set()


def test_a_stop_before_sync_reconciles_nothing_the_gate_held() -> None:
    release = threading.Event()
    cache = reconq.Cache(reconq.Source(lambda: (release.wait(), ({"a": 1}, 0))[1], lambda p, s: iter(())), name="held")
    seen = Seen()
    c = reconq.Controller(seen, name="held")
    c.watch_cache(cache)
    c.enqueue("k")
    c.start()
    stopping = threading.Thread(target=lambda: c.stop(drain=True, timeout=PATIENCE))
    stopping.start()
    try:
        # With no worker busy the state may pass "stopping" at once; the
        # stop() call itself returns only once the cache's thread ended.
        wait_for(lambda: c.stats()["state"] in ("stopping", "stopped") or not stopping.is_alive())
    finally:
        release.set()  # the cache's list returns so its thread can end
    stopping.join(PATIENCE)
    assert not stopping.is_alive()
    assert seen.keys() == [], "E5: a stop before sync drains nothing the gate holds"


def test_a_cache_that_cannot_sync_is_named_with_its_last_error_every_sync_timeout(
    stopped: List[Any], logs: pytest.LogCaptureFixture
) -> None:
    def refused() -> Any:
        raise ConnectionError("connection refused")

    cache = reconq.Cache(reconq.Source(refused, lambda p, s: iter(())), name="unsyncable")
    c = reconq.Controller(Seen(), name="waits", sync_timeout=0.3)
    stopped.append(c)
    c.watch_cache(cache)
    c.start()

    def reported() -> bool:
        return any(
            r.levelno == logging.ERROR and "unsyncable" in r.getMessage() and "connection refused" in r.getMessage()
            for r in logs.records
        )

    wait_for(reported, what="an ERROR naming the cache and its last error")
    assert not c.wait_synced(0)


def test_map_and_predicate_choose_the_keys_and_a_failing_one_enqueues_the_changed_key(
    watching: Watching, logs: pytest.LogCaptureFixture
) -> None:
    system = System({"a": {"owner": "ann"}})
    predicates: List[Tuple[Any, Any]] = []

    def owners(key: Any, obj: Any) -> Any:
        if key == "boom":
            raise ValueError("map broke")
        if key == "badkey":
            return [1.5]
        if key == "pair":
            return ("owner", obj["owner"])  # a tuple is one key
        if key == "one":
            return obj["owner"]  # a str is one key
        return ["owner:" + (obj or {}).get("owner", "?")] if obj else ["gone:" + key]

    def predicate(old: Any, new: Any) -> bool:
        predicates.append((old, new))
        if new is not None and new.get("raise"):
            raise RuntimeError("predicate broke")
        return new is None or new.get("skip") is not True

    cache, seen, c = watching(system.source(), "mapped", map=owners, predicate=predicate)
    wait_for(lambda: "owner:ann" in seen.keys())
    system.put("pair", {"owner": "bob"})
    system.put("one", {"owner": "cy"})
    system.put("skipped", {"owner": "dee", "skip": True})
    system.put("boom", {"owner": "eve"})
    system.put("badkey", {"owner": "fay"})
    system.put("raising", {"owner": "gus", "raise": True})
    system.delete("a")
    wait_for(lambda: {("owner", "bob"), "cy", "boom", "badkey", "raising"} <= set(seen.keys()))
    wait_for(lambda: "owner:ann" in seen.keys() and seen.keys().count("owner:ann") >= 2, what="the delete mapped")
    assert "owner:dee" not in seen.keys() and "skipped" not in seen.keys(), "the predicate refused it"
    assert ({"owner": "ann"}, None) in predicates, "a delete: old is the last state held, new None"
    assert (None, {"owner": "bob"}) in predicates, "a create: old None"
    assert c.stats()["handler_errors"] == 3
    assert cache.get("boom") == {"owner": "eve"} and cache.get("raising") is not None, "the change is still applied"
    errors = [r.getMessage() for r in logs.records if r.levelno == logging.ERROR]
    assert any("map broke" in line and "mapped" in line for line in errors), errors
    assert any("predicate broke" in line for line in errors), errors
    assert any("badkey" in line and "TypeError" in line for line in errors), errors


def test_the_default_predicate_enqueues_nothing_for_a_relist_that_finds_keys_unchanged(watching: Watching) -> None:
    system = System({"a": {"v": 1}, "b": {"v": 2}})
    cache, seen, c = watching(system.source(), "unchanged")
    wait_for(lambda: sorted(seen.keys()) == ["a", "b"])
    assert c.wait_idle(PATIENCE)
    system.fault("expire")  # relist: the same objects (equal, not the same Python objects)
    wait_for(lambda: cache.stats()["relists"] == 1)
    system.put("c", {"v": 3})  # a marker reconciled after the relist's changes
    wait_for(lambda: "c" in seen.keys())
    assert c.wait_idle(PATIENCE)
    assert sorted(seen.keys()) == ["a", "b", "c"], "E6: unchanged keys of a relist enqueue nothing"


def test_lists_use_list_priority_live_changes_priority_and_resync_enqueues_every_key(watching: Watching) -> None:
    system = System({"a": 1, "b": 2})
    _, seen, _ = watching(system.source(), "priorities", priority=7, list_priority=-5)
    wait_for(lambda: len(seen.calls) == 2)
    system.put("c", 3)
    wait_for(lambda: "c" in seen.keys())
    priorities = {key: priority for key, _, priority in seen.calls}
    assert priorities == {"a": -5, "b": -5, "c": 7}, priorities
    # A PollingSource's first poll is its list; later polls are live changes.
    polled_items = {"p": 1}
    polled = reconq.PollingSource(lambda: dict(polled_items), 0.05)
    _, seen_polled, _ = watching(polled, "polled-priorities", priority=7, list_priority=-5)
    wait_for(lambda: seen_polled.keys() == ["p"])
    polled_items["q"] = 2
    wait_for(lambda: "q" in seen_polled.keys())
    assert {key: priority for key, _, priority in seen_polled.calls} == {"p": -5, "q": 7}
    _, seen_again, _ = watching(system.source(), "resynced", resync=0.2, list_priority=-3)
    wait_for(lambda: all(seen_again.keys().count(k) >= 3 for k in "abc"), what="every key resynced, twice")
    assert {priority for _, _, priority in seen_again.calls} == {-3}


def test_a_controller_starts_the_caches_it_watches_and_its_stop_stops_those_no_one_else_needs() -> None:
    system = System({"a": 1})
    shared = reconq.Cache(system.source(), name="shared")
    kept = reconq.Cache(system.source(), name="kept")
    kept.start()
    first = reconq.Controller(Seen(), name="first")
    second = reconq.Controller(Seen(), name="second")
    for c in (first, second):
        c.watch_cache(shared)
        c.watch_cache(kept)
    assert not shared.synced and [r["state"] for r in reconq.status() if r["name"] == "shared"] == ["not started"]
    first.start()
    second.start()
    assert first.wait_synced(PATIENCE) and second.wait_synced(PATIENCE)
    first.stop()
    state = lambda name: [r["state"] for r in reconq.status() if r["kind"] == "cache" and r["name"] == name]  # noqa: E731
    assert state("shared") == ["running"], "the other controller still watches it"
    second.stop()
    assert state("shared") == ["stopped"] and state("kept") == ["running"], "a cache started by hand stays"
    with pytest.raises(RuntimeError, match="stopped"):
        shared.start()
    kept.stop()


def test_bad_input_to_watch_cache_and_sync_timeout_raises_and_changes_nothing() -> None:
    system = System({"a": 1})
    cache = reconq.Cache(system.source(), name="bad-watch")
    c = reconq.Controller(Seen(), name="bad-watch")
    with pytest.raises(TypeError, match="cache"):
        c.watch_cache(system.source())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="map"):
        c.watch_cache(cache, map=3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="predicate"):
        c.watch_cache(cache, predicate=lambda new: True)
    for resync in (0, -1, math.nan):
        with pytest.raises(ValueError, match="resync"):
            c.watch_cache(cache, resync=resync)
    with pytest.raises(OverflowError):
        c.watch_cache(cache, priority=2**31)
    with pytest.raises(OverflowError):
        c.watch_cache(cache, list_priority=-(2**31) - 1)
    for timeout in (0, -1, math.nan):
        with pytest.raises(ValueError, match="sync_timeout"):
            reconq.Controller(Seen(), sync_timeout=timeout)
    assert c.wait_synced(0), "nothing was watched: True at once"
    c.start()
    assert c.wait_synced(0)
    assert system.lists == 0, "the cache was never started"
    stopped_cache = reconq.Cache(system.source(), name="already-stopped")
    stopped_cache.stop()
    with pytest.raises(RuntimeError, match="stopped"):
        c.watch_cache(stopped_cache)
    c.stop()
    with pytest.raises(RuntimeError, match="stopped"):
        c.watch_cache(cache)
    cache.stop()


class SlowMap:
    """A `map` that records (key, obj, thread) of each call and, on its
    first call off the thread that made it, waits until `release` is set
    (on that thread it never waits: the test fails instead of hanging)."""

    def __init__(self) -> None:
        self.caller = threading.get_ident()
        self.release = threading.Event()
        self.calls: List[Tuple[Any, Any, int]] = []
        self.finished: List[Any] = []

    def __call__(self, key: Any, obj: Any) -> List[Any]:
        self.calls.append((key, obj, threading.get_ident()))
        if len(self.calls) == 1 and threading.get_ident() != self.caller:
            self.release.wait(PATIENCE)
        self.finished.append(key)
        return [key]

    def first_ran_on_the_caller(self) -> bool:
        wait_for(lambda: self.calls, what="the catch-up's first map")
        return self.calls[0][2] == self.caller


def test_start_on_a_synced_cache_returns_at_once_and_the_gate_waits_for_the_catch_up(stopped: List[Any]) -> None:
    """The catch-up of a cache that synced before start() (every key held,
    through `map`) runs on a thread of the cache, not start()'s, and the
    synced gate holds every key until it is delivered (E5)."""
    system = System({"a": 1, "b": 2, "c": 3})
    cache = reconq.Cache(system.source(), name="catch-up-start")
    stopped.append(cache)
    cache.start()
    assert cache.wait_synced(PATIENCE)
    slow_map = SlowMap()
    seen = Seen(cache)
    c = reconq.Controller(seen, name="catch-up-start")
    stopped.append(c)
    c.watch_cache(cache, map=slow_map)
    c.enqueue("early")
    c.start()
    assert slow_map.finished == [], "start() waited for map"
    assert not slow_map.first_ran_on_the_caller(), "map ran on the thread that called start()"
    assert not c.wait_synced(0), "synced before the catch-up was delivered"
    assert seen.keys() == [], "a key handed out before the catch-up was delivered"
    slow_map.release.set()
    assert c.wait_synced(PATIENCE)
    wait_for(lambda: sorted(seen.keys()) == ["a", "b", "c", "early"], what="every key once")


def test_watch_cache_returns_at_once_and_a_slow_catch_up_holds_up_no_other_watcher(
    watching: Watching, stopped: List[Any]
) -> None:
    """`watch_cache()` on a running controller returns before its catch-up;
    while that is slow the cache's changes keep reaching its other watcher,
    then reach the new one in order (its last map of a key sees the last
    state)."""
    system = System({"held": 1})
    cache, seen, first = watching(system.source(), "catch-up-first")
    assert first.wait_synced(PATIENCE)
    seen_late = Seen(cache)
    late = reconq.Controller(seen_late, name="catch-up-late")
    stopped.append(late)
    late.start()
    slow_map = SlowMap()
    late.watch_cache(cache, map=slow_map)
    assert slow_map.finished == [], "watch_cache() waited for map"
    assert not slow_map.first_ran_on_the_caller(), "map ran on the thread that called watch_cache()"
    system.put("live", 1)
    system.put("held", 2)
    wait_for(lambda: seen.last().get("live") == 1 and seen.last().get("held") == 2, what="the other watcher fed")
    assert slow_map.finished == [], "the slow catch-up is still on its first key"
    slow_map.release.set()
    wait_for(lambda: seen_late.last().get("live") == 1 and seen_late.last().get("held") == 2, what="the late one")
    held = [obj for key, obj, _ in slow_map.calls if key == "held"]
    assert held == [1, 1, 2], "the catch-up, then the change: its old object, then its new one"


def test_a_re_parented_child_reaches_its_old_owner_and_its_new_one(watching: Watching) -> None:
    """E6: an update maps the old object and the new one, and enqueues
    both results (controller-runtime's mapped handlers)."""
    system = System({"child": {"owner": "ann"}})
    _, seen, c = watching(system.source(), "re-parent", map=lambda key, obj: "owner:" + obj["owner"])
    wait_for(lambda: "owner:ann" in seen.keys())
    system.put("child", {"owner": "bob"})
    wait_for(lambda: "owner:bob" in seen.keys())
    assert c.wait_idle(PATIENCE)
    assert seen.keys().count("owner:ann") == 2, seen.keys()


def test_a_delete_of_a_key_never_held_reaches_map_with_none_and_is_reconciled(watching: Watching) -> None:
    """E6: the default predicate takes every delete, also of a key the
    cache never held (client-go's informer calls OnDelete too)."""

    watched = threading.Event()

    def changes(position: Any, stop: threading.Event) -> Iterator[Any]:
        while not (watched.is_set() or stop.is_set()):
            watched.wait(0.05)
        yield reconq.Delete("ghost", position=position + 1)
        stop.wait()

    mapped: List[Tuple[Any, Any]] = []

    def recorded_map(key: Any, obj: Any) -> List[Any]:
        mapped.append((key, obj))
        return [key]

    source = reconq.Source(lambda: ({}, 0), changes, name="never-held")
    cache, seen, c = watching(source, "never-held", map=recorded_map)
    assert c.wait_synced(PATIENCE)
    watched.set()
    wait_for(lambda: "ghost" in seen.keys(), what="the delete reconciled")
    assert mapped == [("ghost", None)] and "ghost" not in cache


def test_map_and_predicate_answer_a_run_of_changes_under_one_hold_of_the_gil(watching: Watching) -> None:
    """A list's changes reach a Python `map` and `predicate` a run (up to
    256) at a time under one hold of the GIL, not one hold per call: each
    hold waits for a running Python thread to hand the GIL over. (Beside
    one busy Python thread, a controller with a Python `map` synced a list
    of 5,000 keys in 13.7 s with a hold per call, 0.2 s with runs.)"""
    keys = 2_000
    items = {f"k{i:05d}": i for i in range(keys)}
    with GilHolds() as gil:

        def map_(key: str, obj: Any) -> List[str]:
            gil.note()
            return [key]

        def predicate(old: Any, new: Any) -> bool:
            gil.note()
            return True

        _, seen, c = watching(reconq.PollingSource(lambda: items, 3600), "runs", map=map_, predicate=predicate)
        assert c.wait_synced(PATIENCE)
    assert len(gil.seen) == 2 * keys
    wait_for(lambda: len(set(seen.keys())) == keys, what="every key reconciled")
    runs = math.ceil(keys / 256)
    assert gil.holds() <= runs + 1, f"{gil.holds()} holds of the GIL for {keys} changes in {runs} runs"


def test_a_resync_maps_a_run_of_keys_under_one_hold_of_the_gil(watching: Watching) -> None:
    """A resync passes the cache's keys to a Python `map` a run (up to
    256) at a time under one hold of the GIL, as a list does."""
    keys = 600
    items = {f"k{i:05d}": i for i in range(keys)}
    runs_per_walk = math.ceil(keys / 256)
    with GilHolds() as gil:

        def map_(key: str, obj: Any) -> List[str]:
            gil.note()
            return [key]

        _, _, c = watching(reconq.PollingSource(lambda: items, 3600), "resync-runs", map=map_, resync=0.05)
        # The list, then two resyncs at least.
        wait_for(lambda: len(gil.seen) >= 3 * keys, what="two resyncs")
        c.stop()
    walks = math.ceil(len(gil.seen) / keys)
    assert gil.holds() <= walks * runs_per_walk + 1, f"{gil.holds()} holds of the GIL for {len(gil.seen)} calls"

"""reconq's Python conventions (issue 35): keyword-only options, one base
class for reconq's own exceptions, and context managers that release what
they hold."""

from __future__ import annotations

import threading
from contextlib import nullcontext

import pytest

import reconq
from waiting import wait_for

# --- keyword-only parameters after the obvious first arguments ---

POSITIONAL_MISUSES = {
    "Controller": lambda: reconq.Controller(lambda key: None, 2),
    "Controller.watch_cache": lambda: reconq.Controller(lambda key: None).watch_cache(
        reconq.Cache(reconq.PollingSource(dict, 1)), lambda key, obj: key
    ),
    "WorkQueue": lambda: reconq.WorkQueue(None, "q"),
    "Cache": lambda: reconq.Cache(reconq.PollingSource(dict, 1), "name"),
    "PollingSource": lambda: reconq.PollingSource(dict, 1, "name"),
    "Source": lambda: reconq.Source(lambda: ({}, None), lambda position, stop: iter(()), "name"),
    "EtcdSource": lambda: reconq.EtcdSource("http://127.0.0.1:1", "/p/", None),
    "LeaderElection": lambda: reconq.LeaderElection("http://127.0.0.1:1", "name", 5),
    "Sharding": lambda: reconq.Sharding("http://127.0.0.1:1", "name", 8),
    "Manager.update": lambda: reconq.Manager().update("job", lambda: None, None),
}


@pytest.mark.parametrize("name", sorted(POSITIONAL_MISUSES))
def test_options_are_keyword_only_and_a_positional_one_is_a_type_error_naming_the_function(name):
    with pytest.raises(TypeError, match="positional argument") as raised:
        POSITIONAL_MISUSES[name]()
    # `Controller.__new__() takes 1 positional arguments but 2 were given`
    function = name.split(".")[-1] if "." in name else f"{name}.__new__"
    assert f"{function}()" in str(raised.value)


def test_the_first_arguments_stay_positional():
    queue = reconq.WorkQueue(reconq.ExponentialBackoff(0.01, 1))
    queue.add("k", priority=3)
    queue.add_after("later", 60, priority=1)
    assert queue.get(1) == "k"
    ctl = reconq.Controller(lambda key: None, workers=2, name="kw")
    ctl.enqueue("k", priority=1)
    ctl.enqueue_after("k", 0.0, priority=1)
    assert ctl.stop(drain=False, timeout=5)


def test_what_the_contract_writes_as_plain_parameters_stays_positional():
    """The public contract writes these as ordinary parameters (guarantees §4, §8, §9, §11):
    a caller may pass them by position."""
    queue = reconq.WorkQueue()
    queue.add("k", 3)
    queue.add_after("later", 60, 1)
    assert queue.get(1) == "k"
    ctl = reconq.Controller(lambda key: None)
    ctl.enqueue("k", 1)
    ctl.enqueue_after("k", 0.0, 1)
    ctl.enqueue_at("k", 0.0, 1)
    assert ctl.stop(False, 5)
    assert reconq.Manager("m", None).name == "m"
    assert reconq.partition_of("k", 8, lambda key: "pipeline") == reconq.partition_of("pipeline", 8)


# --- one base class for reconq's own exceptions ---


def test_reconq_error_is_the_base_of_reconqs_own_exceptions():
    for cls in (reconq.ShutDown, reconq.CycleError, reconq.StoreLocked):
        assert issubclass(cls, reconq.ReconqError), cls
        assert cls.__module__ == "reconq", cls
    assert issubclass(reconq.ReconqError, Exception)
    assert "ReconqError" in reconq.__all__


def test_cycle_error_is_still_a_value_error():
    ctl = reconq.Controller(lambda key: None)
    ctl.set_dependencies("a", ["b"])
    with pytest.raises(ValueError) as raised:
        ctl.set_dependencies("b", ["a"])
    assert isinstance(raised.value, reconq.CycleError)
    assert isinstance(raised.value, reconq.ReconqError)


def test_a_shut_down_queue_raises_a_reconq_error():
    queue = reconq.WorkQueue()
    queue.shut_down()
    with pytest.raises(reconq.ReconqError) as raised:
        queue.get(timeout=1)
    assert type(raised.value) is reconq.ShutDown


def test_what_users_raise_to_reconq_is_not_a_reconq_error():
    """RetryAfter, PermanentError and PositionExpired are signals reconq
    catches: an `except ReconqError` in a reconcile must not swallow them."""
    for cls in (reconq.RetryAfter, reconq.PermanentError, reconq.PositionExpired):
        assert not issubclass(cls, reconq.ReconqError), cls


# --- context managers ---


def test_a_work_queue_block_gives_the_queue_and_shuts_it_down_on_exit():
    with reconq.WorkQueue() as queue:
        assert isinstance(queue, reconq.WorkQueue)
        queue.add("k")
        assert not queue.shutting_down
    assert queue.shutting_down
    assert queue.get(timeout=1) == "k"  # ready keys are still handed out
    with pytest.raises(reconq.ShutDown):
        queue.get(timeout=1)


def test_a_work_queue_is_shut_down_when_the_block_raises():
    with pytest.raises(KeyError):
        with reconq.WorkQueue() as queue:
            raise KeyError("boom")
    assert queue.shutting_down


def blocking_source(exited: threading.Event) -> reconq.Source:
    """A source whose change stream runs until its stop event is set."""

    def changes(position, stop):
        stop.wait()
        exited.set()
        return iter(())

    return reconq.Source(lambda: ({"a": 1}, 0), changes, name="held")


@pytest.mark.parametrize("raises", [False, True])
def test_a_cache_block_gives_the_cache_and_stops_it_on_exit(raises):
    exited = threading.Event()
    with pytest.raises(KeyError) if raises else nullcontext():
        with reconq.Cache(blocking_source(exited)) as cache:
            assert isinstance(cache, reconq.Cache)
            cache.start()
            assert cache.wait_synced(timeout=30)
            assert cache.get("a") == 1
            if raises:
                raise KeyError("boom")
    wait_for(exited.is_set, what="the source's stop event")
    assert cache.stop(timeout=30)  # its thread exited
    with pytest.raises(RuntimeError):
        cache.start()  # stopped for good


@pytest.mark.parametrize("raises", [False, True])
def test_a_leader_election_block_gives_leadership_up_on_exit(etcd, raises):
    with pytest.raises(KeyError) if raises else nullcontext():
        with reconq.LeaderElection(etcd.endpoint, "with", ttl=30, identity="a") as election:
            assert isinstance(election, reconq.LeaderElection)
            election.start()
            wait_for(lambda: election.is_leader, timeout=30, what="leadership")
            if raises:
                raise KeyError("boom")
    assert not election.is_leader
    # Given up at once (not after the 30 s ttl): another campaign leads.
    with reconq.LeaderElection(etcd.endpoint, "with", ttl=30, identity="b") as other:
        other.start()
        wait_for(lambda: other.is_leader, timeout=30, what="the other's leadership")


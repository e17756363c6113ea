"""Fixtures shared by the Python tests."""

from typing import Any, Callable, Iterator, List

import pytest

import reconq
from etcd_server import Etcd


@pytest.fixture
def q():
    queue = reconq.WorkQueue()
    yield queue
    queue.shut_down()


@pytest.fixture
def make():
    """Builds controllers and stops them at the end of the test."""
    made: List[reconq.Controller] = []

    def factory(reconcile: Callable[[Any], Any], **kw: Any) -> reconq.Controller:
        c = reconq.Controller(reconcile, **kw)
        made.append(c)
        return c

    yield factory
    for c in made:
        c.stop(drain=False, timeout=5)


@pytest.fixture
def caches():
    """Caches a test made (append them), stopped at its end."""
    made: List[reconq.Cache] = []
    yield made
    for cache in made:
        cache.stop()


@pytest.fixture
def etcd() -> Iterator[Etcd]:
    """A fresh etcd on a loopback port for one test, stopped and removed
    even if the test fails."""
    server = Etcd()
    try:
        yield server
    finally:
        server.close()

"""A stream that stays open and carries nothing (a stuck proxy or
middlebox) is noticed within `EtcdSource(progress_timeout=)` and resumed,
and the cache converges (docs/sources.md, "A silent stream"; E1)."""

from __future__ import annotations

import math
from typing import Any

import pytest

import reconq
from etcd_server import Etcd
from proxy import Proxy
from waiting import PATIENCE, wait_for


def test_a_stalled_watch_is_resumed_within_the_progress_timeout_and_the_cache_converges() -> None:
    # etcd notifies progress every 0.5 s: a healthy idle watch is never
    # silent for the 2 s progress timeout, a stalled one is.
    etcd = Etcd("--experimental-watch-progress-notify-interval=500ms")
    proxy = Proxy(etcd.endpoint)
    source = reconq.EtcdSource(proxy.endpoint, "/stall/", progress_timeout=2)
    cache = reconq.Cache(source, name="stalled")
    try:
        assert source.progress_timeout == 2.0
        etcd.put("/stall/a", "1")
        etcd.put("/stall/gone", "1")
        cache.start()
        assert cache.wait_synced(PATIENCE)
        etcd.put("/stall/a", "2")
        wait_for(lambda: cache.get("a") == b"2", what="the live stream")

        proxy.stall()  # the watch's connection stays open, forwarding nothing
        etcd.put("/stall/a", "3")
        etcd.put("/stall/b", "1")
        etcd.delete("/stall/gone")
        wanted = {"a": b"3", "b": b"1"}
        wait_for(
            lambda: {key: cache.get(key) for key in cache.keys()} == wanted,
            timeout=60,
            what="the cache to converge past the stalled watch",
        )
        stats = cache.stats()
        assert stats["errors"] >= 1 and "no event and no progress notification" in (stats["last_error"] or "")
        assert stats["relists"] == 0, "resumed from its position, not relisted (E3)"
    finally:
        cache.stop()
        proxy.close()
        etcd.close()


@pytest.mark.parametrize("bad, error", [(0, ValueError), (-1, ValueError), (math.nan, ValueError), ("5", TypeError), (True, TypeError)])
def test_a_progress_timeout_that_is_not_a_positive_number_is_refused(bad: Any, error: type) -> None:
    with pytest.raises(error, match="progress_timeout"):
        reconq.EtcdSource("http://127.0.0.1:2379", "/p/", progress_timeout=bad)


def test_the_progress_timeout_defaults_to_none() -> None:
    assert reconq.EtcdSource("http://127.0.0.1:2379", "/p/").progress_timeout is None

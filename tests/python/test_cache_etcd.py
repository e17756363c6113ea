"""`reconq.EtcdSource` caches against a real etcd (guarantees §13, E1–E4):
keys and values as Python sees them, etcd restarted with its data,
wiped or restored from a backup (also when the new history is past the
cache's revision before the cache looks), deletes made while the stream was down, a compaction past the
cache's revision, a cache started before etcd is reachable, and a
controller started before etcd is up. Convergence is checked against
etcd's own listing, never by sleeping."""

from __future__ import annotations

import gc
import logging
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, List

import pytest

import reconq
from cpu import thread_cpu_seconds
from etcd_server import Etcd
from gil_holds import GilHolds
from malloc import malloc_in_use
from proxy import Proxy
from waiting import PATIENCE, wait_for

PREFIX = "/items/"


def text_cache(caches: List[reconq.Cache], endpoint: str, name: str) -> reconq.Cache:
    cache = reconq.Cache(reconq.EtcdSource(endpoint, PREFIX, decode=bytes.decode), name=name)
    caches.append(cache)
    cache.start()
    return cache


def contents(cache: reconq.Cache) -> Dict[Any, Any]:
    return {key: cache.get(key) for key in cache.keys()}


def etcd_items(etcd: Etcd) -> Dict[str, str]:
    return {key[len(PREFIX) :]: value for key, value in etcd.keys(PREFIX).items()}


def converged(cache: reconq.Cache, etcd: Etcd) -> None:
    wait_for(lambda: contents(cache) == etcd_items(etcd), what="the cache to hold what etcd holds")


def cut_off(etcd: Etcd, caches: List[reconq.Cache], keys: str, name: str) -> "tuple[Proxy, reconq.Cache]":
    """`keys` put (each its own value), a synced cache of them behind a
    proxy, then the proxy cut: returns once the cache noticed the break."""
    for key in keys:
        etcd.put(PREFIX + key, key)
    proxy = Proxy(etcd.endpoint)
    cache = text_cache(caches, proxy.endpoint, name)
    assert cache.wait_synced(PATIENCE)
    converged(cache, etcd)
    proxy.cut()
    wait_for(lambda: cache.stats()["errors"] >= 1, what="the break noticed")
    return proxy, cache


def test_keys_are_str_or_bytes_and_values_bytes_or_decoded_and_decode_failures_skipped(
    etcd: Etcd, caches: List[reconq.Cache], caplog: pytest.LogCaptureFixture
) -> None:
    etcd.put(PREFIX + "a", "1")
    etcd.put_bytes(PREFIX.encode() + b"\xff\xfe", b"\x00raw")
    etcd.put(PREFIX + "bad", "not a number")
    raw = reconq.Cache(reconq.EtcdSource([etcd.endpoint], PREFIX), name="raw")
    caches.append(raw)
    raw.start()
    assert raw.wait_synced(PATIENCE)
    assert contents(raw) == {"a": b"1", b"\xff\xfe": b"\x00raw", "bad": b"not a number"}
    assert raw.stats()["position"] == etcd.revision()
    with caplog.at_level(logging.WARNING, logger="reconq"):
        numbers = reconq.Cache(reconq.EtcdSource(etcd.endpoint, PREFIX, decode=int), name="numbers")
        caches.append(numbers)
        numbers.start()
        assert numbers.wait_synced(PATIENCE)
        assert numbers.get("a") == 1 and "bad" not in numbers and len(numbers) == 1
        etcd.put(PREFIX + "b", "2")
        etcd.put(PREFIX + "c", "three")
        wait_for(lambda: numbers.get("b") == 2)
        wait_for(lambda: numbers.stats()["position"] == etcd.revision())
        assert "c" not in numbers and numbers.stats()["errors"] == 0
    skipped = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert any("bad" in line and "ValueError" in line for line in skipped), skipped
    assert any("/items/c" in line and "ValueError" in line for line in skipped), skipped


def test_etcd_restarted_with_its_data_is_resumed_not_relisted(etcd: Etcd, caches: List[reconq.Cache]) -> None:
    for key in "abc":
        etcd.put(PREFIX + key, key)
    cache = text_cache(caches, etcd.endpoint, "restarted")
    assert cache.wait_synced(PATIENCE)
    etcd.restart()
    etcd.put(PREFIX + "d", "d")
    etcd.delete(PREFIX + "a")
    converged(cache, etcd)
    stats = cache.stats()
    assert stats["relists"] == 0 and stats["errors"] >= 1, stats
    wait_for(lambda: cache.stats()["position"] == etcd.revision())


def test_etcd_wiped_under_a_running_cache_is_relisted_and_every_old_key_deleted(
    etcd: Etcd, caches: List[reconq.Cache]
) -> None:
    for key in "abcdef":
        etcd.put(PREFIX + key, key)
    cache = text_cache(caches, etcd.endpoint, "wiped")
    assert cache.wait_synced(PATIENCE)
    etcd.wipe()
    etcd.put(PREFIX + "new", "n")
    converged(cache, etcd)
    assert contents(cache) == {"new": "n"}
    assert cache.stats()["relists"] >= 1


def test_etcd_wiped_and_written_past_the_cache_revision_while_cut_off_is_relisted(
    etcd: Etcd, caches: List[reconq.Cache]
) -> None:
    """E1: 1,000 keys (revision 11), a synced cache cut off, etcd wiped
    (same ids, raft term 2 again), refilled with 100 keys and written to
    revision 63: no reply's header goes back, yet the cache relists and
    holds exactly the new keys."""
    etcd.put_all({f"{PREFIX}old{i:04}": f"v{i}" for i in range(1000)})
    assert etcd.revision() == 11
    proxy, cache = cut_off(etcd, caches, "", "wiped-past")
    etcd.wipe()
    etcd.put_all({f"{PREFIX}new{i:03}": f"n{i}" for i in range(100)})
    etcd.bump(61)
    assert etcd.revision() == 63
    proxy.heal()
    converged(cache, etcd)
    assert len(cache) == 100 and cache.stats()["relists"] >= 1
    proxy.close()


def test_etcd_restored_from_an_older_backup_and_written_past_the_cache_revision_is_relisted(
    etcd: Etcd, caches: List[reconq.Cache]
) -> None:
    """E1: etcd put back to a copy of its data taken before the cache's
    last changes, then written past the cache's revision elsewhere: the
    keys put after the backup are gone, and the cache sees that."""
    for key in "abc":
        etcd.put(PREFIX + key, key)
    backup = etcd.backup()
    proxy, cache = cut_off(etcd, caches, "de", "restored")
    held = cache.stats()["position"]
    etcd.restore(backup)
    etcd.bump(5)
    assert etcd.revision() > held
    proxy.heal()
    converged(cache, etcd)
    assert sorted(cache.keys()) == ["a", "b", "c"] and cache.stats()["relists"] >= 1
    proxy.close()


def test_deletes_made_while_the_stream_was_down_arrive_without_a_relist(
    etcd: Etcd, caches: List[reconq.Cache]
) -> None:
    proxy, cache = cut_off(etcd, caches, "abc", "deletes")
    etcd.delete(PREFIX + "a")
    etcd.put(PREFIX + "b", "changed")
    proxy.heal()
    converged(cache, etcd)
    assert cache.stats()["relists"] == 0, "E3: resumed, not relisted"
    proxy.close()


def test_a_compaction_past_the_cache_revision_relists_and_keys_gone_meanwhile_are_deleted(
    etcd: Etcd, caches: List[reconq.Cache]
) -> None:
    proxy, cache = cut_off(etcd, caches, "abc", "compacted")
    etcd.delete(PREFIX + "b")
    etcd.put(PREFIX + "c", "changed")
    etcd.compact()
    proxy.heal()
    converged(cache, etcd)
    assert cache.stats()["relists"] == 1, "E3: the compacted revision expired"
    assert "b" not in cache
    proxy.close()


def test_a_cache_started_before_etcd_is_reachable_syncs_once_it_is_and_says_why_it_waits(
    etcd: Etcd, caches: List[reconq.Cache]
) -> None:
    etcd.put(PREFIX + "a", "1")
    proxy = Proxy(etcd.endpoint)
    proxy.cut()
    cache = text_cache(caches, proxy.endpoint, "unreachable")
    wait_for(lambda: cache.stats()["errors"] >= 1)
    assert not cache.synced
    rows = [row for row in reconq.status() if row["kind"] == "cache" and row["name"] == "unreachable"]
    assert rows and rows[0]["last_error"] and not rows[0]["synced"], rows
    proxy.heal()
    assert cache.wait_synced(PATIENCE * 3)
    converged(cache, etcd)
    proxy.close()


def test_a_controller_started_before_etcd_is_up_reconciles_every_key_once_it_is(etcd: Etcd) -> None:
    """E5 with a real source: nothing is handed out before the first list;
    then every key, and every later change, is reconciled with the cache
    holding it."""
    for key in "ab":
        etcd.put(PREFIX + key, key)
    proxy = Proxy(etcd.endpoint)
    proxy.cut()
    cache = reconq.Cache(reconq.EtcdSource(proxy.endpoint, PREFIX, decode=bytes.decode), name="before-up")
    lock = threading.Lock()
    seen: List[Any] = []

    def reconcile(key: Any) -> None:
        with lock:
            seen.append((key, cache.get(key)))

    c = reconq.Controller(reconcile, name="before-up", sync_timeout=0.5)
    c.watch_cache(cache)
    c.enqueue("early")
    c.start()
    try:
        wait_for(lambda: cache.stats()["errors"] >= 1)
        assert not c.wait_synced(0.2) and seen == [], "E5: no key before the first list"
        proxy.heal()
        assert c.wait_synced(PATIENCE * 3)
        wait_for(lambda: {k for k, _ in seen} >= {"a", "b", "early"})
        etcd.put(PREFIX + "c", "c")
        wait_for(lambda: ("c", "c") in seen, what="the later put reconciled with the cache holding it")
        assert c.wait_idle(PATIENCE)
    finally:
        c.stop()
        proxy.close()
    assert cache.stats()["synced"]


def test_an_idle_cache_blocked_on_its_etcd_watch_uses_no_cpu(etcd: Etcd, caches: List[reconq.Cache]) -> None:
    etcd.put(PREFIX + "a", "1")
    cache = text_cache(caches, etcd.endpoint, "e")
    assert cache.wait_synced(PATIENCE)
    etcd.put(PREFIX + "b", "2")
    converged(cache, etcd)  # the watch is open: it delivered a put
    before = thread_cpu_seconds("reconq-cache-e")
    time.sleep(2)  # the window measured, not a wait for a condition
    used = thread_cpu_seconds("reconq-cache-e") - before
    assert used <= 0.02, f"G8: an idle etcd cache used {used} s of CPU in 2 s"


PUT_LATER = """
import base64, json, sys, time, urllib.request
time.sleep(1.0)
b64 = lambda text: base64.b64encode(text.encode()).decode()
body = json.dumps({"key": b64(sys.argv[2]), "value": b64("2")}).encode()
request = urllib.request.Request(sys.argv[1] + "/v3/kv/put", data=body, method="POST")
urllib.request.urlopen(request, timeout=10).read()
"""


def test_a_cache_of_raw_etcd_values_applies_a_change_while_python_holds_the_gil(
    etcd: Etcd, caches: List[reconq.Cache]
) -> None:
    """Issue 36's tail: without `decode`, a value stays Rust bytes and the
    cache's thread applies an etcd change without the GIL, so a change is
    not held up behind Python code (a reconcile) until the switch interval
    forces the GIL over. Here this thread keeps the GIL (a switch interval
    of 1,000 s) while another process puts; `repr` reads the cache
    without letting the GIL go."""
    etcd.put(PREFIX + "a", "1")
    cache = reconq.Cache(reconq.EtcdSource(etcd.endpoint, PREFIX), name="raw")
    caches.append(cache)
    cache.start()
    assert cache.wait_synced(PATIENCE)
    putter = subprocess.Popen([sys.executable, "-c", PUT_LATER, etcd.endpoint, PREFIX + "b"])
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1000.0)
    try:
        deadline = time.monotonic() + 2 * PATIENCE
        while "keys=2" not in repr(cache) and time.monotonic() < deadline:
            pass
        applied_while_held = "keys=2" in repr(cache)
    finally:
        sys.setswitchinterval(interval)
    assert putter.wait(PATIENCE) == 0
    assert applied_while_held, (repr(cache), cache.stats()["last_error"])
    assert contents(cache) == {"a": b"1", "b": b"2"}


def test_raw_etcd_values_read_back_whole_and_compare_by_content_on_both_sides_of_the_inline_limit(
    etcd: Etcd, caches: List[reconq.Cache]
) -> None:
    """Without `decode`, a value of up to 22 bytes is held inside the
    cache's object and a longer one in a box of its own
    (src/python/value_bytes.rs): both read back whole, a put of an equal
    value is no change to the default predicate, and a value moved across
    the limit is one."""

    def value(n: int, last: int = 0) -> bytes:
        """`n` bytes, the last one `last`."""
        return bytes(i % 251 + 1 for i in range(n - 1)) + bytes([last]) if n else b""

    held = {f"len{n}": value(n) for n in (0, 1, 21, 22, 23, 300)}
    for key, data in held.items():
        etcd.put_bytes((PREFIX + key).encode(), data)
    cache = reconq.Cache(reconq.EtcdSource(etcd.endpoint, PREFIX), name="raw")
    caches.append(cache)
    reconciled: List[str] = []
    controller = reconq.Controller(reconciled.append, name="raw")
    controller.watch_cache(cache)
    controller.start()
    try:
        assert controller.wait_synced(PATIENCE) and controller.wait_idle(PATIENCE)
        assert contents(cache) == held and sorted(reconciled) == sorted(held)
        reconciled.clear()
        changed = {"len22": value(23), "len23": value(22), "len300": value(300, last=1)}
        for key, data in [("len21", held["len21"]), ("len300", held["len300"]), *changed.items()]:
            etcd.put_bytes((PREFIX + key).encode(), data)
        wait_for(lambda: contents(cache) == {**held, **changed}, what="the changes applied")
        # The equal puts were delivered before the changes that followed them.
        wait_for(lambda: set(changed) <= set(reconciled), what="the changes reconciled")
        assert controller.wait_idle(PATIENCE)
        assert sorted(reconciled) == sorted(changed), "equal values are no change; the others are"
    finally:
        controller.stop(timeout=PATIENCE)


def test_a_raw_etcd_value_of_a_few_bytes_costs_no_allocation_of_its_own(
    etcd: Etcd, caches: List[reconq.Cache]
) -> None:
    """What a key costs (docs/sources.md): malloc's bytes in use grown, per
    key, while a cache without `decode` lists 30,000 keys of 6-byte
    values. A key costs its entry (48 B, packed: `src/cache/dense_map.rs`)
    and its place in the hash table (65,536 slots of 5 bytes: 11 B a key
    at this count, just past the table's doubling), its `Arc<str>` (32 B)
    and the object's `Arc` (48 B, the value's bytes inside): 139 B. A
    `HashMap` slot of the key and entry instead would cost 107 B a key at
    this count (187 B), a value in a box of its own 32 B more. Measured:
    150 B, and 197 B with the `HashMap`."""
    if malloc_in_use() is None:
        pytest.skip("needs glibc's mallinfo2")
    keys = 30_000
    etcd.put_all({f"{PREFIX}k{i:05d}": f"v{i:05d}" for i in range(keys)})
    gc.collect()
    before = malloc_in_use()
    cache = reconq.Cache(reconq.EtcdSource(etcd.endpoint, PREFIX), name="memory")
    caches.append(cache)
    cache.start()
    assert cache.wait_synced(PATIENCE) and len(cache) == keys
    gc.collect()
    per_key = (malloc_in_use() - before) / keys  # type: ignore[operator]
    assert per_key <= 160, f"{per_key:.0f} B of malloc's a key"


def test_a_list_decodes_a_page_under_one_hold_of_the_gil(etcd: Etcd, caches: List[reconq.Cache]) -> None:
    """A list's values reach `decode` a page at a time under one hold of
    the GIL (the first page of 10 keys, then the rest), not one hold per
    value: each hold waits for a running Python thread to hand the GIL
    over."""
    keys = 2_000
    etcd.put_all({f"{PREFIX}k{i:05d}": f"v{i}" for i in range(keys)})
    with GilHolds() as gil:
        cache = reconq.Cache(reconq.EtcdSource(etcd.endpoint, PREFIX, decode=gil.decode), name="one-hold")
        caches.append(cache)
        cache.start()
        assert cache.wait_synced(PATIENCE)
    assert len(gil.seen) == keys and cache.get("k01999") == "v1999"
    assert gil.holds() <= 4, f"{gil.holds()} holds of the GIL for {keys} decodes"


def test_a_restart_reads_its_kept_values_back_under_one_hold_of_the_gil(
    etcd: Etcd, caches: List[reconq.Cache], tmp_path: Path
) -> None:
    """A stored cache's restart decodes the values it kept (etcd's bytes)
    under one hold of the GIL, and resumes (no relist)."""
    keys = 2_000
    etcd.put_all({f"{PREFIX}k{i:05d}": f"v{i}" for i in range(keys)})
    store = str(tmp_path / "state.db")

    def run(decode: Callable[[bytes], str]) -> reconq.Cache:
        cache = reconq.Cache(reconq.EtcdSource(etcd.endpoint, PREFIX, decode=decode), name="kept", store=store)
        controller = reconq.Controller(lambda key: None, name="sync", store=store)
        controller.watch_cache(cache)
        controller.start()
        try:
            assert controller.wait_synced(PATIENCE) and controller.wait_idle(PATIENCE)
            cache.flush()
        finally:
            controller.stop(timeout=PATIENCE)
        return cache

    run(bytes.decode)
    with GilHolds() as gil:
        cache = run(gil.decode)
    assert cache.stats()["resumed"] and len(gil.seen) == keys
    assert gil.holds() <= 2, f"{gil.holds()} holds of the GIL for {keys} decodes"

"""Durable state (guarantees §9) from Python: store= shorthand and
SqliteStore, S2 stop/restart, S3 StoreLocked, bad files, the shared key
encoding, and S1 crashes by SIGKILL of a Python child."""

from __future__ import annotations

import gc
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

import reconq
from waiting import wait_for

HOUR = 3600.0


def hour_limiter() -> reconq.ExponentialBackoff:
    return reconq.ExponentialBackoff(HOUR, HOUR)


def query_from_another_process(db, sql):
    """Runs `sql` on `db` in a child process: reading a store this process
    has open with the sqlite3 module is refused (see the test below)."""
    script = "import json, sqlite3, sys; print(json.dumps(sqlite3.connect(sys.argv[1]).execute(sys.argv[2]).fetchall()))"
    out = subprocess.run([sys.executable, "-c", script, str(db), sql], capture_output=True, text=True, check=True)
    return [tuple(row) for row in json.loads(out.stdout)]


def test_store_path_shorthand_keeps_delayed_failed_and_parked_keys(tmp_path):
    db = str(tmp_path / "state.db")
    calls = []

    def reconcile(key):
        calls.append(key)
        if key == "fail":
            raise RuntimeError("backend down")
        if key == "park":
            raise reconq.PermanentError("bad spec")

    c = reconq.Controller(reconcile, name="sync", store=db, rate_limiter=hour_limiter())
    c.start()
    c.enqueue_after(("ns", 1), HOUR, priority=3)
    c.enqueue("fail")
    c.enqueue("park")
    c.enqueue("ok")
    wait_for(lambda: c.inspect("fail")["state"] == "waiting" and c.inspect("park")["state"] == "parked")
    assert c.stats()["store_error"] is None
    assert c.stop_with_report()["store_error"] is None

    again = reconq.Controller(reconcile, name="sync", store=reconq.SqliteStore(db), rate_limiter=hour_limiter())
    again.start()
    try:
        assert again.inspect(("ns", 1))["state"] == "waiting"
        assert again.inspect("fail")["state"] == "waiting"
        assert again.inspect("fail")["attempts"] == 1
        assert again.parked() == ["park"]
        assert again.inspect("park")["last_error"] is not None
        assert again.inspect("ok")["state"] == "unknown"
        stats = again.stats()
        assert stats["waiting"] == 2 and stats["parked"] == 1
    finally:
        again.stop()


def test_flushes_within_the_interval_and_reports_stats(tmp_path):
    store = reconq.SqliteStore(tmp_path / "state.db", flush_interval=0.05)
    assert store.flush_interval == pytest.approx(0.05)
    c = reconq.Controller(lambda key: None, name="sync", store=store)
    c.start()
    try:
        c.enqueue_after("later", HOUR)
        wait_for(lambda: c.stats()["store_pending"] == 0 and c.stats()["last_flush_time"] is not None)
        assert query_from_another_process(tmp_path / "state.db", "SELECT count(*) FROM keys") == [(1,)]
        entry = next(e for e in reconq.status() if e["name"] == "sync")
        assert (entry["store_pending"], entry["store_error"]) == (0, None)
        assert entry["last_flush_time"] is not None
    finally:
        c.stop()


def test_second_holder_raises_store_locked_and_changes_nothing(tmp_path):
    db = tmp_path / "state.db"
    first = reconq.Controller(lambda key: None, name="sync", store=str(db))
    first.start()
    try:
        first.enqueue_after("kept", HOUR)
        second = reconq.Controller(lambda key: None, name="sync", store=str(db))
        with pytest.raises(reconq.StoreLocked):
            second.start()
    finally:
        first.stop()
    third = reconq.Controller(lambda key: None, name="sync", store=str(db))
    third.start()
    try:
        assert third.inspect("kept")["state"] == "waiting"
    finally:
        third.stop()


def test_bad_files(tmp_path):
    text = tmp_path / "notes.txt"
    text.write_bytes(b"not a database\n" * 100)
    with pytest.raises(ValueError, match="not a SQLite database"):
        reconq.SqliteStore(text)
    assert text.read_bytes() == b"not a database\n" * 100

    newer = tmp_path / "newer.db"
    conn = sqlite3.connect(newer)
    conn.execute("PRAGMA user_version = 99")
    conn.close()
    before = newer.read_bytes()
    with pytest.raises(ValueError, match="newer"):
        reconq.Controller(lambda key: None, store=str(newer))
    assert newer.read_bytes() == before

    with pytest.raises(OSError):
        reconq.SqliteStore("/proc/reconq-no-such-dir/state.db")
    with pytest.raises(TypeError):
        reconq.Controller(lambda key: None, store=42)
    with pytest.raises(ValueError, match="flush_interval must be a positive number of seconds, got 0"):
        reconq.SqliteStore(tmp_path / "x.db", flush_interval=0)
    with pytest.raises(OverflowError, match=r"^flush_interval is out of range: 1e300 seconds \(at most 1.8"):
        reconq.SqliteStore(tmp_path / "x.db", flush_interval=1e300)


def test_a_path_that_is_no_file_is_refused_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for path in ("", ":memory:"):
        with pytest.raises(ValueError, match="store path"):
            reconq.Controller(lambda key: None, name="sync", store=path)
        with pytest.raises(ValueError, match="store path"):
            reconq.SqliteStore(path)
    assert list(tmp_path.iterdir()) == []


def test_python_keys_encode_like_rust_keys(tmp_path):
    db = tmp_path / "state.db"
    c = reconq.Controller(lambda key: None, name="enc", store=str(db))
    c.start()
    c.enqueue_after(("ns", 3), HOUR)
    c.enqueue_after(b"\x07", HOUR)
    c.stop()
    blobs = {bytes.fromhex(row[0]) for row in query_from_another_process(db, "SELECT hex(key) FROM keys")}
    # The bytes tests/store.rs checks for the Rust key ("ns".to_string(), 3i64).
    assert bytes([4, 0, 0, 0, 2, 1, 0, 0, 0, 2]) + b"ns" + bytes([2, 0, 0, 0, 0, 0, 0, 0, 3]) in blobs
    assert bytes([3, 0, 0, 0, 1, 7]) in blobs


def test_sqlite3_in_the_same_process_is_refused_while_a_store_is_open(tmp_path, monkeypatch):
    """Python's sqlite3 is a second SQLite library in the process: its locks
    do not see ours, and opening a store file with it while a controller
    writes crashed the process (SIGBUS) or corrupted the file. It is refused
    with sqlite3.OperationalError, in every spelling of the path, while the
    controller keeps writing; once the store is closed it opens normally."""
    db = tmp_path / "state.db"
    c = reconq.Controller(lambda key: None, name="sync", store=reconq.SqliteStore(db, flush_interval=0.01))
    c.start()
    monkeypatch.chdir(tmp_path)
    spellings = [(db,), (str(db),), ("state.db",), (f"file:{db}?mode=ro",), (db.as_uri() + "?mode=ro",)]
    for round in range(50):
        for key in range(round * 200, round * 200 + 200):
            c.enqueue_after(key, 0.005 if key % 2 else HOUR)
        for spelling in spellings:
            uri = str(spelling[0]).startswith("file:")
            with pytest.raises(sqlite3.OperationalError, match="reconq store open in this process"):
                sqlite3.connect(*spelling, uri=uri)
    wait_for(lambda: c.stats()["store_pending"] == 0)
    assert c.stats()["store_error"] is None
    c.stop()
    del c
    gc.collect()
    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    assert conn.execute("SELECT count(*) FROM keys").fetchone() == (50 * 100,)
    conn.close()


FULL_DISK_CHILD = r"""
import resource, signal, sys, reconq
sys.path.insert(0, sys.argv[2])
from waiting import wait_for
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # "file too large" as an error, not a kill
c = reconq.Controller(lambda key: None, name="full", store=reconq.SqliteStore(sys.argv[1], flush_interval=0.05))
c.start()
for i in range(10):
    c.enqueue_after(f"early-{i}", 3600)
wait_for(lambda: c.stats()["store_pending"] == 0 and c.stats()["last_flush_time"] is not None)
resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, resource.RLIM_INFINITY))
for i in range(60000):
    c.enqueue_after(f"{i:0>100}", 3600)
report = c.stop_with_report()
stats = c.stats()
assert report["store_error"] is not None, report
assert stats["store_error"] is not None and stats["store_pending"] >= 60000, stats
try:
    c.flush()
    raise AssertionError("flush() after a stop returns the outcome of its failed last flush")
except OSError as e:
    assert "store I/O error" in str(e), e
print("reported")
"""


def test_a_failed_last_flush_at_stop_is_reported_and_keeps_what_was_written(tmp_path):
    """Issue 22 item 1: a stop whose last flush fails (file size limit) says
    so in stop_with_report() and stats(), and the file keeps what the
    earlier flushes wrote."""
    db = tmp_path / "state.db"
    out = subprocess.run(
        [sys.executable, "-c", FULL_DISK_CHILD, str(db), str(Path(__file__).parent)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0 and "reported" in out.stdout, out.stdout + out.stderr
    again = reconq.Controller(lambda key: None, name="full", store=str(db))
    again.start()
    try:
        assert all(again.inspect(f"early-{i}")["state"] == "waiting" for i in range(10))
    finally:
        again.stop()


CHILD = r"""
import sys, time, reconq
db, log_path, keys = sys.argv[1], sys.argv[2], int(sys.argv[3])
log = open(log_path, "a", buffering=1)

def reconcile(key):
    attempt = reconq.context().attempt
    time.sleep(0.0005)
    log.write(f"{key} {attempt}\n")
    if attempt < 2:
        raise RuntimeError("not yet")

c = reconq.Controller(reconcile, name="crash", workers=4,
                      rate_limiter=reconq.ExponentialBackoff(0.02, 0.2),
                      store=reconq.SqliteStore(db, flush_interval=0.1))
c.start()
if sys.argv[4] == "enqueue":
    for key in range(keys):
        c.enqueue(key)
print("ready", flush=True)
time.sleep(3600)
"""

KEYS = 200


def run_child(db, log, enqueue):
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(db), str(log), str(KEYS), "enqueue" if enqueue else "restore"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline().strip() == "ready"
    return proc


def calls(log: Path):
    if not log.exists():
        return []
    return [tuple(map(int, line.split())) for line in log.read_text().splitlines() if len(line.split()) == 2]


def test_sigkill_at_random_moments_loses_no_key_and_failure_counts_continue(tmp_path):
    db, log = tmp_path / "state.db", tmp_path / "calls.log"
    rng = random.Random(11)
    for round in range(20):
        proc = run_child(db, log, enqueue=round == 0)
        # The first run outlives S1's window (flush_interval + 1 s).
        time.sleep(1.2 if round == 0 else rng.uniform(0, 0.4))
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    conn = sqlite3.connect(db)
    stored = {}
    for blob, failures in conn.execute("SELECT key, failures FROM keys WHERE controller = 'crash'"):
        blob = bytes(blob)
        assert blob[0] == 2  # an int key
        stored[int.from_bytes(blob[1:], "big", signed=True)] = failures
    conn.close()
    succeeded = {key for key, attempt in calls(log) if attempt >= 2}
    lost = [key for key in range(KEYS) if key not in succeeded and key not in stored]
    assert not lost, f"keys neither succeeded nor stored: {lost}"

    last = tmp_path / "last.log"
    proc = run_child(db, last, enqueue=False)
    try:
        wait_for(
            lambda: set(stored) <= {key for key, attempt in calls(last) if attempt >= 2},
            timeout=60,
            what="every stored key reconciled to success",
        )
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    first_attempt = {}
    for key, attempt in calls(last):
        first_attempt.setdefault(key, attempt)
    for key, failures in stored.items():
        assert first_attempt[key] == failures, f"key {key}: failure count did not continue"


# flush(): everything changed before it returned is on disk.

FLUSH_CHILD = r"""
import sys, threading, reconq
sys.path.insert(0, sys.argv[2])
from waiting import wait_for
n = int(sys.argv[3])

def reconcile(key):
    if key.startswith("block"):
        threading.Event().wait()
    if key.startswith("park"):
        raise reconq.PermanentError("bad spec")
    raise RuntimeError("backend down")

# Flushes 30 s apart: only flush() can have written anything by the kill.
c = reconq.Controller(reconcile, name="flush", workers=4, rate_limiter=reconq.ExponentialBackoff(3600, 3600),
                      store=reconq.SqliteStore(sys.argv[1], flush_interval=30.0))
c.start()
for i in range(n):
    c.enqueue(f"fail-{i}")
    c.enqueue(f"park-{i}")
wait_for(lambda: c.stats()["parked"] == n and c.stats()["reconciles"] == 2 * n)
for i in range(4):
    c.enqueue(f"block-{i}")
wait_for(lambda: c.stats()["processing"] == 4)
for i in range(n):
    c.enqueue(f"ready-{i}")
    c.enqueue_after(f"later-{i}", 3600)
c.flush()
print("flushed", flush=True)
threading.Event().wait()
"""

FLUSH_KEYS = 30


def test_flush_then_sigkill_loses_nothing_enqueued_before_it(tmp_path):
    """Issue 25: every key enqueued (ready, delayed, retried, parked, in
    flight) before flush() returned survives a SIGKILL right after it."""
    n = FLUSH_KEYS
    for round in range(10):
        db = tmp_path / f"round-{round}.db"
        proc = subprocess.Popen(
            [sys.executable, "-c", FLUSH_CHILD, str(db), str(Path(__file__).parent), str(n)],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert proc.stdout.readline().strip() == "flushed"
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
        seen = set()
        again = reconq.Controller(seen.add, name="flush", store=str(db), rate_limiter=hour_limiter())
        again.start()
        try:
            run = {f"ready-{i}" for i in range(n)} | {f"block-{i}" for i in range(4)}
            wait_for(lambda: run <= seen, what=f"round {round}: the ready and in-flight keys reconciled")
            assert sorted(again.parked()) == sorted(f"park-{i}" for i in range(n)), f"round {round}"
            for i in range(n):
                assert again.inspect(f"later-{i}")["state"] == "waiting", f"round {round}: later-{i}"
                retried = again.inspect(f"fail-{i}")
                assert retried["state"] == "waiting" and retried["attempts"] == 1, f"round {round}: fail-{i}"
        finally:
            again.stop()


FAILED_FLUSH_CHILD = r"""
import resource, signal, sys, reconq
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # "file too large" as an error, not a kill
c = reconq.Controller(lambda key: None, name="full", store=reconq.SqliteStore(sys.argv[1], flush_interval=30.0))
c.start()
resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, resource.RLIM_INFINITY))
for i in range(3000):
    c.enqueue_after(f"{i:0>100}", 3600)
try:
    c.flush()
    raise AssertionError("a write past the file size limit fails")
except OSError as e:
    assert "store I/O error" in str(e), e
stats = c.stats()
assert stats["store_pending"] >= 3000 and stats["store_error"] is not None, stats
assert stats["waiting"] == 3000, stats
resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
c.flush()
assert c.stats()["store_pending"] == 0 and c.stats()["store_error"] is None, c.stats()
c.stop()
print("raised, then flushed")
"""


def test_a_failed_flush_raises_the_store_error_and_keeps_the_keys_pending(tmp_path):
    db = tmp_path / "state.db"
    out = subprocess.run(
        [sys.executable, "-c", FAILED_FLUSH_CHILD, str(db)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0 and "raised, then flushed" in out.stdout, out.stdout + out.stderr
    assert query_from_another_process(db, "SELECT count(*) FROM keys") == [(3000,)]


def test_concurrent_flushes_from_threads_all_return_with_their_keys_written(tmp_path):
    import threading

    db = tmp_path / "state.db"
    c = reconq.Controller(lambda key: None, name="many", store=reconq.SqliteStore(db, flush_interval=30.0))
    c.start()
    errors = []

    def flusher(thread):
        try:
            for round in range(20):
                c.enqueue_after(f"{thread}-{round}", HOUR)
                c.flush()
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=flusher, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    try:
        assert not any(t.is_alive() for t in threads) and not errors, errors
        assert query_from_another_process(db, "SELECT count(*) FROM keys") == [(8 * 20,)]
    finally:
        c.stop()


def test_flush_before_start_raises_and_without_a_store_or_after_stop_returns(tmp_path):
    stored = reconq.Controller(lambda key: None, name="sync", store=str(tmp_path / "state.db"))
    with pytest.raises(RuntimeError, match="was not started"):
        stored.flush()
    stored.start()
    stored.enqueue_after("later", HOUR)
    stored.stop()
    stored.flush()  # the stop's last flush succeeded
    assert query_from_another_process(tmp_path / "state.db", "SELECT count(*) FROM keys") == [(1,)]

    plain = reconq.Controller(lambda key: None, name="plain")
    with pytest.raises(RuntimeError, match="was not started"):
        plain.flush()
    plain.start()
    plain.enqueue_after("later", HOUR)
    plain.flush()
    plain.stop()
    plain.flush()


def edges_controller(store):
    return reconq.Controller(lambda key: None, name="edges", store=store)


# Sets edges on a controller `c` not started yet, starts it, sets more (run
# here and by EDGES_CHILD).
SET_EDGES_AROUND_START = """
c.set_dependencies("dashboard", ["model"])
c.start()
c.set_dependencies("model", ["source", ("ns", 1)])
"""


def assert_edges_set_around_start(c):
    """What SET_EDGES_AROUND_START set, read back from `c`."""
    assert c.dependencies("model") == ["source", ("ns", 1)]
    assert c.dependencies("dashboard") == ["model"]


def test_edges_come_back_after_a_stop_and_cleared_ones_leave_the_file(tmp_path):
    """Guarantees §14: edges are kept in the store, set before or after
    start, in the order set; clearing a key's parents deletes its rows."""
    db = tmp_path / "state.db"
    c = edges_controller(str(db))
    exec(SET_EDGES_AROUND_START, {"c": c})
    c.set_dependencies("report", ["model"])
    c.stop()

    again = edges_controller(str(db))
    again.start()
    try:
        assert_edges_set_around_start(again)
        assert sorted(again.dependents("model")) == ["dashboard", "report"]
        with pytest.raises(reconq.CycleError):
            again.set_dependencies("source", ["report"])
        again.set_dependencies("report", [])
    finally:
        again.stop()
    children = [bytes.fromhex(row[0]) for row in query_from_another_process(
        db, "SELECT hex(child) FROM edges WHERE controller = 'edges'")]

    def encoded(key: str) -> bytes:  # a str key's encoding (test_python_keys_encode_like_rust_keys)
        return bytes([1]) + len(key).to_bytes(4, "big") + key.encode()

    assert sorted(children) == sorted([encoded("model"), encoded("model"), encoded("dashboard")]), "report's row went"
    assert again.dependencies("report") == []


EDGES_CHILD = """
import sys, time
import reconq
c = reconq.Controller(lambda key: None, name="edges",
                      store=reconq.SqliteStore(sys.argv[1], flush_interval=0.5))
""" + SET_EDGES_AROUND_START + """
print("ready", flush=True)
time.sleep(3600)
"""


def test_edges_set_more_than_the_interval_plus_a_second_before_a_sigkill_come_back(tmp_path):
    db = tmp_path / "state.db"
    proc = subprocess.Popen([sys.executable, "-c", EDGES_CHILD, str(db)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        # S1's bound (flush_interval + 1 s) is the guarantee under test, not
        # a wait for a condition.
        time.sleep(0.5 + 1.0)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    c = edges_controller(str(db))
    c.start()
    try:
        assert_edges_set_around_start(c)
    finally:
        c.stop()


# D2 across a crash: a finished parent is never written without the
# dependents it enqueued.

DEPENDENTS_CHILD = r"""
import os, sys, time, reconq
db, record, mode = sys.argv[1], sys.argv[2], sys.argv[3]
fd = os.open(record, os.O_WRONLY | os.O_APPEND | os.O_CREAT)

def reconcile(key):
    time.sleep(0.01)
    os.write(fd, f"{key}\n".encode())  # one write: whole or absent at a kill

c = reconq.Controller(reconcile, name="chains", workers=4,
                      store=reconq.SqliteStore(db, flush_interval=0.1))
for chain in range(CHAINS):
    for link in range(1, LINKS):
        c.set_dependencies((chain, link), [(chain, link - 1)])
c.start()
if mode == "settle":
    assert c.wait_idle(120)
    print("idle", flush=True)
    c.stop()
    sys.exit(0)
for chain in range(CHAINS):
    c.enqueue((chain, 0))
print("ready", flush=True)
time.sleep(3600)
"""
#: Each chain takes about LINKS * 10 ms, longer than a run lives.
CHAINS, LINKS = 4, 200


def test_a_finished_parent_is_never_written_without_its_dependents_after_a_sigkill(tmp_path):
    """D2 with a store, killed at random moments while chains of keys run
    link after link: after the last restart settles, every link last ran
    after its parent's last run. The chains' heads are enqueued more than
    S1's bound (flush_interval + 1 s) before each kill, so every later
    link descends from a kept enqueue; a link that ran without its
    dependents following was lost by a flush that wrote its parent as
    finished before writing the link as pending."""
    db, record = tmp_path / "state.db", tmp_path / "record"
    script = DEPENDENTS_CHILD.replace("CHAINS", str(CHAINS)).replace("LINKS", str(LINKS))
    rng = random.Random(26)
    for _ in range(8):
        proc = subprocess.Popen([sys.executable, "-c", script, str(db), str(record), "run"],
                                stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(1.1 + rng.uniform(0.05, 0.5))  # S1's bound, then a random moment: not a wait
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    settle = subprocess.run([sys.executable, "-c", script, str(db), str(record), "settle"],
                            capture_output=True, text=True, timeout=300)
    assert settle.stdout.strip() == "idle", settle.stderr
    last_run = {key: at for at, key in enumerate(record.read_text().splitlines())}
    stale = [key for key, at in last_run.items() if at < last_run.get(parent_of(key), -1)]
    assert not stale, f"links whose parent ran after their last run: {sorted(stale)[:10]}"


def parent_of(link: str) -> str:
    """`(chain, n)`'s parent `(chain, n - 1)`, as the record spells them."""
    chain, n = map(int, link.strip("()").split(","))
    return f"({chain}, {n - 1})"

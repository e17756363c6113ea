"""The PostgreSQL recipe of docs/sources.md (docs/recipes/postgres_source.py,
imported from there so that the code a reader copies is the code tested),
against a real PostgreSQL started for each test.

First its `list` and `changes` on their own, then a `reconq.Cache` and a
controller over it. Convergence is checked against the table's own
listing, never by sleeping."""

from __future__ import annotations

import pathlib
import queue
import subprocess
import sys
import threading
from typing import Any, Dict, Iterator, List, Optional, Tuple

import psycopg
import pytest

from postgres_server import Postgres, postgres  # noqa: F401  (the fixture)
from proxy import Proxy
from test_readme import PYTHON_BLOCK
from waiting import wait_for

DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs"
RECIPE = DOCS / "recipes" / "postgres_source.py"
sys.path.insert(0, str(RECIPE.parent))
from postgres_source import PostgresTable  # noqa: E402

import reconq  # noqa: E402


def test_the_docs_show_the_recipe_whole() -> None:
    """docs/sources.md shows the file these tests import, as it is."""
    shown = [block for block in PYTHON_BLOCK.findall((DOCS / "sources.md").read_text()) if "class PostgresTable" in block]
    assert shown == [RECIPE.read_text()]


def test_the_recipe_type_checks() -> None:
    """`mypy --strict` accepts the recipe against reconq's stubs and
    psycopg's types, so a change of the API it uses shows here."""
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", str(RECIPE)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.fixture
def table(postgres: Postgres) -> PostgresTable:
    table = PostgresTable(postgres.dsn, "desired", wait=0.2)
    table.create()
    return table


class Writer:
    """The application's side: plain SQL, each statement on a connection
    of its own (so a restart of the server needs nothing of it)."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn

    def sql(self, statement: str, *args: Any) -> List[Tuple[Any, ...]]:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            cursor = conn.execute(statement, args)
            return cursor.fetchall() if cursor.description else []

    def put(self, key: str, value: str) -> None:
        self.sql("INSERT INTO desired (key, value) VALUES (%s, %s) ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value", key, value)

    def delete(self, key: str) -> None:
        self.sql("DELETE FROM desired WHERE key = %s", key)

    def rows(self) -> Dict[str, str]:
        """The table as the database lists it: the truth to converge to."""
        return dict(self.sql("SELECT key, value FROM desired"))

    def version(self, key: str) -> int:
        ((version,),) = self.sql("SELECT version FROM desired WHERE key = %s", key)
        return int(version)


@pytest.fixture
def db(postgres: Postgres, table: PostgresTable) -> Writer:
    return Writer(postgres.dsn)


def described(event: Any) -> Tuple[Any, ...]:
    if isinstance(event, reconq.Delete):
        return ("delete", event.key)
    return ("put", event.key, event.obj)


class Stream:
    """`changes(position, stop)` iterated on a thread, as a cache does,
    its events and its end (an exception, or None when it returned)
    collected for the test."""

    def __init__(self, table: PostgresTable, position: int) -> None:
        self.stop = threading.Event()
        self.events: "queue.Queue[Any]" = queue.Queue()
        self.ended: Optional[BaseException] = None
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(table, position), daemon=True)
        self.thread.start()

    def _run(self, table: PostgresTable, position: int) -> None:
        try:
            for event in table.changes(position, self.stop):
                self.events.put(event)
        except BaseException as error:  # noqa: B036 (recorded for the test)
            self.ended = error
        finally:
            self.done.set()

    def take(self, count: int) -> List[Any]:
        return [self.events.get(timeout=10) for _ in range(count)]

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=10)


@pytest.fixture
def streams() -> Iterator[List[Stream]]:
    made: List[Stream] = []
    yield made
    for stream in made:
        stream.close()


def follow(table: PostgresTable, position: int, streams: List[Stream]) -> Stream:
    stream = Stream(table, position)
    streams.append(stream)
    return stream


def test_list_returns_the_live_rows_and_the_highest_version(table: PostgresTable, db: Writer) -> None:
    assert table.list() == ([], 0)
    for key in ("a", "b", "c"):
        db.put(key, key.upper())
    db.put("a", "A2")
    db.delete("b")
    rows, position = table.list()
    assert sorted(rows) == [("a", "A2", db.version("a")), ("c", "C", db.version("c"))]
    # The delete of b came last: the position includes it, so a stream
    # from there does not deliver it again.
    assert position > db.version("a") > db.version("c")
    assert db.sql("SELECT version FROM desired_tombstones WHERE key = 'b'") == [(position,)]


def test_changes_yields_puts_and_deletes_in_commit_order(table: PostgresTable, db: Writer, streams: List[Stream]) -> None:
    db.put("old", "1")
    _, position = table.list()
    stream = follow(table, position, streams)
    db.put("x", "1")
    assert [described(e) for e in stream.take(1)] == [("put", "x", "1")]
    db.put("x", "2")
    db.delete("old")
    db.put("y", "1")
    events = stream.take(3)
    assert [described(e) for e in events] == [("put", "x", "2"), ("delete", "old"), ("put", "y", "1")]
    # Positions are the versions, increasing; a put carries its version.
    positions = [e.position for e in events]
    assert positions == sorted(positions) and positions[-1] == db.version("y")
    assert events[0].version == events[0].position == db.version("x")


def test_changes_before_the_stream_collapse_to_each_keys_last_state(table: PostgresTable, db: Writer, streams: List[Stream]) -> None:
    """Changes made before `changes` was called come first, oldest first,
    each key once, in its latest state (level-triggered, and a page of a
    few rows at a time)."""
    table.page = 2
    _, position = table.list()
    for step in range(3):
        for key in ("a", "b", "c", "d", "e"):
            db.put(key, f"{key}{step}")
    db.delete("b")
    db.put("d", "last")
    stream = follow(table, position, streams)
    events = stream.take(5)
    assert [described(e) for e in events] == [
        ("put", "a", "a2"), ("put", "c", "c2"), ("put", "e", "e2"), ("delete", "b"), ("put", "d", "last"),
    ]
    assert stream.events.empty()


def test_the_stop_event_ends_changes_promptly(table: PostgresTable, streams: List[Stream]) -> None:
    stream = follow(table, 0, streams)
    stream.stop.set()
    # Blocked for a notification, it looks at `stop` every `wait` (0.2 s).
    assert stream.done.wait(timeout=10)
    assert stream.ended is None


def test_versions_follow_commit_order(postgres: Postgres, table: PostgresTable, db: Writer) -> None:
    """A transaction that wrote first but commits last must not be skipped:
    the second writer waits for the first, so its version is higher. (Without
    the lock in the trigger, b takes version 2 and commits while a's 1 is
    open: a reader at that moment moves past 2 and never sees a.)"""
    _, position = table.list()
    first = psycopg.connect(postgres.dsn)  # a transaction, left open
    first.execute("INSERT INTO desired (key, value) VALUES ('a', 'first')")
    second_done = threading.Event()

    def second_writer() -> None:
        Writer(postgres.dsn).put("b", "second")
        second_done.set()

    thread = threading.Thread(target=second_writer, daemon=True)
    thread.start()

    def second_waits() -> bool:
        rows = db.sql("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE 'INSERT%%'")
        return second_done.is_set() or rows[0][0] == 1

    wait_for(second_waits, what="the second writer to commit or wait")
    with psycopg.connect(postgres.dsn, autocommit=True) as reader:
        # A reader looks now, while the first transaction is still open...
        seen = list(table.since(reader, position))
        first.commit()
        first.close()
        thread.join(timeout=10)
        assert second_done.is_set()
        # ... and again from where it got to, once both have committed.
        seen += table.since(reader, seen[-1].position if seen else position)
    assert [described(e) for e in seen] == [("put", "a", "first"), ("put", "b", "second")]


def following_a_change(table: PostgresTable, db: Writer, streams: List[Stream]) -> Tuple[Stream, Any]:
    """A stream from a listing of keys a, b and c, and the event it gave
    for a change of a."""
    for key in ("a", "b", "c"):
        db.put(key, "1")
    _, position = table.list()
    stream = follow(table, position, streams)
    db.put("a", "2")
    (event,) = stream.take(1)
    assert described(event) == ("put", "a", "2")
    return stream, event


def test_a_reconnect_misses_no_change_made_while_disconnected(table: PostgresTable, db: Writer, streams: List[Stream]) -> None:
    """Nobody listens while the changes are made, so their notifications
    are lost: the query by version still finds them."""
    stream, event = following_a_change(table, db, streams)
    stream.close()
    assert stream.ended is None
    db.put("b", "2")
    db.delete("c")
    db.put("d", "1")
    resumed = follow(table, event.position, streams)
    assert [described(e) for e in resumed.take(3)] == [("put", "b", "2"), ("delete", "c"), ("put", "d", "1")]


@pytest.mark.parametrize("crash", [False, True], ids=["fast shutdown", "crash"])
def test_changes_resume_from_the_position_after_a_server_restart(
    postgres: Postgres, table: PostgresTable, db: Writer, streams: List[Stream], crash: bool
) -> None:
    stream, event = following_a_change(table, db, streams)
    postgres.restart(crash=crash)
    # The broken connection ends the stream with an error (a cache backs
    # off, then calls `changes` again from the last position it applied).
    assert stream.done.wait(timeout=30)
    assert isinstance(stream.ended, psycopg.OperationalError), stream.ended
    db.put("b", "2")
    db.delete("c")
    resumed = follow(table, event.position, streams)
    assert [described(e) for e in resumed.take(2)] == [("put", "b", "2"), ("delete", "c")]
    db.put("e", "1")
    assert [described(e) for e in resumed.take(1)] == [("put", "e", "1")]
    rows, _ = table.list()
    assert sorted(rows) == sorted((key, value, db.version(key)) for key, value in db.rows().items())


# A reconq.Cache over the recipe.


def started(table: PostgresTable, caches: List[reconq.Cache]) -> reconq.Cache:
    cache = reconq.Cache(table.source())
    caches.append(cache)
    cache.start()
    assert cache.wait_synced(timeout=30)
    return cache


def contents(cache: reconq.Cache) -> Dict[Any, Any]:
    return {key: cache.get(key) for key in cache.keys()}


def converged(cache: reconq.Cache, db: Writer) -> bool:
    return contents(cache) == db.rows()


def test_a_cache_converges_to_the_table(table: PostgresTable, db: Writer, caches: List[reconq.Cache]) -> None:
    for key in ("a", "b", "c"):
        db.put(key, "1")
    cache = started(table, caches)
    assert contents(cache) == db.rows() == {"a": "1", "b": "1", "c": "1"}
    db.put("a", "2")
    db.delete("b")
    db.put("d", "1")
    wait_for(lambda: converged(cache, db), what="the cache to hold the table")
    assert cache.stats()["position"] == table.list()[1]
    # Followed, not listed again.
    assert cache.stats()["relists"] == 0 and cache.stats()["errors"] == 0


@pytest.mark.timeout(180)
def test_a_cache_notices_a_stalled_connection_and_converges(
    postgres: Postgres, db: Writer, caches: List[reconq.Cache]
) -> None:
    """A connection that stays open and forwards nothing (a stuck proxy)
    hears no notification and answers no query: the recipe's reread finds
    it out, its query deadline breaks it, and the cache resumes from its
    position on a new connection."""
    proxy = Proxy(f"http://127.0.0.1:{postgres.port}")
    try:
        through_proxy = postgres.dsn.replace(f"port={postgres.port}", f"port={proxy.endpoint.rsplit(':', 1)[1]}")
        table = PostgresTable(through_proxy, "desired", wait=0.2, reread=1, timeout=2)
        for key in ("a", "b", "c"):
            db.put(key, "1")
        cache = started(table, caches)
        db.put("a", "2")
        wait_for(lambda: converged(cache, db), what="the cache to follow the table")

        proxy.stall()  # the stream's connection stays open, carrying nothing
        db.put("a", "3")
        db.delete("b")
        db.put("d", "1")
        wait_for(lambda: converged(cache, db), timeout=60, what="the cache to converge past the stalled connection")
        assert cache.stats()["errors"] >= 1, "the stall was noticed as a broken stream"
        assert cache.stats()["relists"] == 0, "resumed from its position"
    finally:
        for cache in caches:
            cache.stop()
        proxy.close()


class Follower:
    """The cache's own role, which a test can lock out: its sessions are
    terminated and it may not log in until `let_in`, so the table changes
    while the cache's stream cannot reconnect."""

    def __init__(self, postgres: Postgres, db: Writer) -> None:
        self.db = db
        db.sql("CREATE ROLE follower LOGIN")
        db.sql("GRANT SELECT ON desired, desired_tombstones TO follower")
        self.table = PostgresTable(postgres.dsn_as("follower"), "desired", wait=0.2)

    def lock_out(self) -> None:
        self.db.sql("ALTER ROLE follower NOLOGIN")
        self.db.sql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = 'follower'")

    def let_in(self) -> None:
        self.db.sql("ALTER ROLE follower LOGIN")


@pytest.fixture
def follower(postgres: Postgres, db: Writer) -> Follower:
    return Follower(postgres, db)


@pytest.mark.timeout(120)
def test_a_delete_made_while_the_stream_is_down_arrives_as_a_delete(
    follower: Follower, db: Writer, caches: List[reconq.Cache]
) -> None:
    """The resumed stream (not a relist) brings the deletes."""
    for key in ("a", "b", "c", "d"):
        db.put(key, "1")
    cache = started(follower.table, caches)
    follower.lock_out()
    wait_for(lambda: cache.stats()["errors"] >= 1, what="the stream to break")
    db.delete("b")
    db.delete("c")
    db.put("a", "2")
    assert "b" in cache and "c" in cache
    follower.let_in()
    wait_for(lambda: converged(cache, db), timeout=60, what="the cache to hold the table again")
    assert contents(cache) == {"a": "2", "d": "1"}
    assert cache.stats()["relists"] == 0


@pytest.mark.timeout(120)
@pytest.mark.parametrize("crash", [False, True], ids=["fast shutdown", "crash"])
def test_a_cache_follows_the_table_through_a_server_restart(
    postgres: Postgres, table: PostgresTable, db: Writer, caches: List[reconq.Cache], crash: bool
) -> None:
    for key in ("a", "b", "c"):
        db.put(key, "1")
    cache = started(table, caches)
    postgres.restart(crash=crash)
    wait_for(lambda: cache.stats()["errors"] >= 1, timeout=30, what="the stream to break")
    db.delete("a")
    db.put("b", "2")
    db.put("e", "1")
    wait_for(lambda: converged(cache, db), timeout=60, what="the cache to hold the table again")
    assert contents(cache) == {"b": "2", "c": "1", "e": "1"}
    assert cache.stats()["relists"] == 0


# A controller watching that cache.


class Reconciled:
    """What a reconcile saw: for each key, `cache.get(key)` at each of its
    reconciles, in order."""

    def __init__(self, cache: reconq.Cache) -> None:
        self.cache = cache
        self.lock = threading.Lock()
        self.seen: Dict[Any, List[Any]] = {}

    def __call__(self, key: Any) -> None:
        state = self.cache.get(key)
        with self.lock:
            self.seen.setdefault(key, []).append(state)

    def last(self) -> Dict[Any, Any]:
        """Each key's state at its last reconcile."""
        with self.lock:
            return {key: states[-1] for key, states in self.seen.items()}


def watching(cache: reconq.Cache, make: Any) -> Tuple[Reconciled, reconq.Controller]:
    reconciled = Reconciled(cache)
    c = make(reconciled, name="follower")
    c.watch_cache(cache)
    c.start()
    assert c.wait_synced(timeout=30)
    return reconciled, c


def test_a_controller_reconciles_each_changed_key_reading_the_cache(
    table: PostgresTable, db: Writer, caches: List[reconq.Cache], make: Any
) -> None:
    for key in ("a", "b", "c"):
        db.put(key, "1")
    cache = reconq.Cache(table.source())
    caches.append(cache)
    reconciled, _ = watching(cache, make)  # its start() starts the cache
    wait_for(lambda: reconciled.last() == {"a": "1", "b": "1", "c": "1"}, what="the listed keys to be reconciled")
    db.put("a", "2")
    db.delete("b")
    db.put("d", "1")
    # Each changed key is reconciled after the cache holds its change,
    # and reads it there (a delete reads None).
    wait_for(lambda: reconciled.last() == {"a": "2", "b": None, "c": "1", "d": "1"}, what="the changes to be reconciled")
    assert reconciled.seen["c"] == ["1"]  # unchanged: not reconciled again


@pytest.mark.timeout(120)
def test_a_controller_hears_deletes_made_while_the_stream_was_down(
    follower: Follower, db: Writer, caches: List[reconq.Cache], make: Any
) -> None:
    for key in ("a", "b", "c"):
        db.put(key, "1")
    cache = reconq.Cache(follower.table.source())
    caches.append(cache)
    reconciled, _ = watching(cache, make)
    wait_for(lambda: reconciled.last() == {"a": "1", "b": "1", "c": "1"}, what="the listed keys to be reconciled")
    follower.lock_out()
    wait_for(lambda: cache.stats()["errors"] >= 1, what="the stream to break")
    db.delete("a")
    db.delete("b")
    follower.let_in()
    wait_for(lambda: reconciled.last() == {"a": None, "b": None, "c": "1"}, timeout=60, what="the deletes to be reconciled")
    assert cache.stats()["relists"] == 0


@pytest.mark.timeout(120)
def test_a_controller_follows_the_table_through_a_server_crash(
    postgres: Postgres, table: PostgresTable, db: Writer, caches: List[reconq.Cache], make: Any
) -> None:
    for key in ("a", "b"):
        db.put(key, "1")
    cache = reconq.Cache(table.source())
    caches.append(cache)
    reconciled, c = watching(cache, make)
    wait_for(lambda: reconciled.last() == {"a": "1", "b": "1"}, what="the listed keys to be reconciled")
    postgres.restart(crash=True)
    db.delete("a")
    db.put("b", "2")
    db.put("e", "1")
    wait_for(lambda: reconciled.last() == {"a": None, "b": "2", "e": "1"}, timeout=60, what="the changes to be reconciled")
    assert contents(cache) == db.rows()
    assert cache.stats()["relists"] == 0 and c.stats()["failures"] == 0

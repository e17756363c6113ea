"""A reconq source over a PostgreSQL table (psycopg 3.2.4 or later).

The table holds the desired state, one row per key. Triggers keep what a
reader needs to follow it:

* every insert and update stamps the row's ``version`` from a sequence, and
  a delete leaves a *tombstone* (the key and a new version) in a second
  table, so a reader that was away still learns of it;
* versions follow commit order: each writing statement first takes a lock
  that its transaction holds until it ends, so no row can commit with a
  version below one a reader has already seen (without it, a transaction
  that took version 10 and committed after one with version 11 would be
  skipped by a reader already at 11);
* each write notifies the channel named after the table at commit.

The cache's position is the highest version it applied. `list()` reads
every row and that position in one snapshot; `changes(position, stop)`
listens to the channel, reads what changed after the position in version
order, and waits for the next notification. A notification is only a
wake-up: the query by version finds the changes, so the notifications a
reconnect missed lose nothing, and a broken connection raises, after which
the cache calls `changes` again from the last version it applied.

A connection can also stall: stay open and carry nothing (a stuck proxy or
middlebox, a frozen server), which neither keepalives nor a server-side
timeout see, since something still answers at the TCP level. So `changes`
reads again from its position every `reread` seconds even without a
notification, and every query has `timeout` seconds to answer: the server
cancels a statement running longer (`statement_timeout`), and a reply that
never comes breaks the connection from this side, which raises as any
broken connection does.

Use it as::

    table = PostgresTable("host=127.0.0.1 dbname=app", "desired")
    table.create()                 # once: the table, tombstones, triggers
    cache = reconq.Cache(table.source(), name="desired")
"""

from __future__ import annotations

import os
import re
import socket
import threading
import time
from contextlib import contextmanager
from typing import Dict, Iterator, List, Tuple, Union

import psycopg
from psycopg import sql

import reconq

# The table and its bookkeeping. `{table}` etc. are identifiers filled in
# by `PostgresTable.create`; the writers' SQL needs nothing of this.
SCHEMA = """
CREATE SEQUENCE IF NOT EXISTS {versions};

CREATE TABLE IF NOT EXISTS {table} (
    key text PRIMARY KEY,
    value text NOT NULL,
    version bigint NOT NULL DEFAULT 0   -- stamped by the trigger
);
CREATE INDEX IF NOT EXISTS {table_by_version} ON {table} (version);

CREATE TABLE IF NOT EXISTS {tombstones} (
    key text PRIMARY KEY,
    version bigint NOT NULL
);
CREATE INDEX IF NOT EXISTS {tombstones_by_version} ON {tombstones} (version);

-- Before a statement writes a row: serialise the writers (held to the end
-- of the transaction, so versions follow commit order; readers, which take
-- no lock beyond ACCESS SHARE, never wait) and wake the listeners at commit.
CREATE OR REPLACE FUNCTION {serialise}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    LOCK TABLE {tombstones} IN EXCLUSIVE MODE;
    PERFORM pg_notify({channel}, '');
    RETURN NULL;
END $$;
CREATE OR REPLACE TRIGGER {serialise} BEFORE INSERT OR UPDATE OR DELETE ON {table}
    FOR EACH STATEMENT EXECUTE FUNCTION {serialise}();

-- Each row: a new version for a put, a tombstone for a delete (or for the
-- old key of an update that renames one), no tombstone for a live key.
CREATE OR REPLACE FUNCTION {stamp}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' OR (TG_OP = 'UPDATE' AND NEW.key <> OLD.key) THEN
        INSERT INTO {tombstones} (key, version) VALUES (OLD.key, nextval({versions_name}))
            ON CONFLICT (key) DO UPDATE SET version = EXCLUDED.version;
    END IF;
    IF TG_OP = 'DELETE' THEN
        RETURN OLD;
    END IF;
    DELETE FROM {tombstones} WHERE key = NEW.key;
    NEW.version := nextval({versions_name});
    RETURN NEW;
END $$;
CREATE OR REPLACE TRIGGER {stamp} BEFORE INSERT OR UPDATE OR DELETE ON {table}
    FOR EACH ROW EXECUTE FUNCTION {stamp}();
"""

# Everything after a version, oldest first: rows are puts, tombstones deletes.
SINCE = """
SELECT key, value, version FROM {table} WHERE version > %(after)s
UNION ALL
SELECT key, NULL, version FROM {tombstones} WHERE version > %(after)s
ORDER BY version
LIMIT %(page)s
"""

Event = Union[reconq.Put, reconq.Delete]


class PostgresTable:
    """The rows of `table` as a reconq source: keys are the `key` column,
    objects the `value` column, versions and positions the `version`.

    `wait` is how long `changes` blocks for a notification before it looks
    at its `stop` event again (how late a stopping cache may be); `page` how
    many changes one query reads; `reread` how often `changes` reads from its
    position without a notification (how late a stalled connection is
    noticed, with `timeout`); `timeout` how long a query may take."""

    def __init__(
        self, conninfo: str, table: str = "desired", wait: float = 1.0, page: int = 1000,
        reread: float = 30.0, timeout: float = 10.0,
    ) -> None:
        # Lower case, so that the name is the same quoted or not (the
        # channel and the sequence are also named by strings).
        if not re.fullmatch(r"[a-z_][a-z0-9_]{0,40}", table):
            raise ValueError(f"table: a lower-case SQL name, not {table!r}")
        self.conninfo = conninfo
        self.table = table
        self.wait = wait
        self.page = page
        self.reread = reread
        self.timeout = timeout
        names = {
            "table": table, "versions": f"{table}_versions", "tombstones": f"{table}_tombstones",
            "table_by_version": f"{table}_by_version", "tombstones_by_version": f"{table}_tombstones_by_version",
            "serialise": f"{table}_serialise", "stamp": f"{table}_stamp",
        }
        self.names: Dict[str, sql.Composable] = {name: sql.Identifier(value) for name, value in names.items()}
        self.names.update(channel=sql.Literal(table), versions_name=sql.Literal(names["versions"]))

    def _sql(self, template: str) -> sql.Composed:
        return sql.SQL(template).format(**self.names)

    def connect(self) -> psycopg.Connection:
        # Keepalives: a peer that vanished without closing the connection
        # (a partition, a powered-off host) is noticed within a minute, and
        # the wait below raises. A statement the server runs longer than
        # `timeout` is cancelled.
        return psycopg.connect(
            self.conninfo, autocommit=True, connect_timeout=10,
            keepalives=1, keepalives_idle=30, keepalives_interval=10, keepalives_count=3,
            options=f"-c statement_timeout={round(self.timeout * 1000)}",
        )

    @contextmanager
    def answered(self, conn: psycopg.Connection) -> Iterator[None]:
        """Breaks `conn` (shuts its socket down, so the query raises) if the
        block takes longer than `timeout`: a reply that never comes, from a
        stalled connection or a frozen server, would otherwise be waited
        for forever."""

        def cut() -> None:
            try:
                with socket.socket(fileno=os.dup(conn.fileno())) as sock:
                    sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

        timer = threading.Timer(self.timeout, cut)
        timer.daemon = True
        timer.start()
        try:
            yield
        finally:
            timer.cancel()
            timer.join()  # a cut under way ends before `conn` can be closed

    def create(self) -> None:
        """Creates the table, its sequence, tombstones and triggers (if
        they are missing)."""
        with self.connect() as conn:
            conn.execute(self._sql(SCHEMA))

    def source(self) -> reconq.Source:
        return reconq.Source(self.list, self.changes, name=self.table)

    def list(self) -> Tuple[List[Tuple[str, str, int]], int]:
        """Every row as (key, value, version), and the highest version of
        the rows and tombstones: the position to follow from. One
        REPEATABLE READ transaction, so both are of the same moment."""
        with self.connect() as conn:
            conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            with self.answered(conn), conn.transaction():
                rows = conn.execute(self._sql("SELECT key, value, version FROM {table}")).fetchall()
                (position,) = conn.execute(self._sql(
                    "SELECT coalesce(greatest((SELECT max(version) FROM {table}),"
                    " (SELECT max(version) FROM {tombstones})), 0)"
                )).fetchone() or (0,)
        return rows, position

    def changes(self, position: int, stop: threading.Event) -> Iterator[Event]:
        """The puts and deletes after `position`, in version order, then
        those that follow as they commit, until `stop` is set. Raises (a
        psycopg error) when the connection breaks, or stalls."""
        with self.connect() as conn:
            # Listen first: a change committed after this is either in the
            # next query or notified after it.
            with self.answered(conn):
                conn.execute(self._sql("LISTEN {table}"))
            behind = True  # changes made while nobody listened
            read_at = time.monotonic()
            while not stop.is_set():
                if behind or time.monotonic() - read_at >= self.reread:
                    # Also without a notification, every `reread` seconds:
                    # a stalled connection hears of nothing, and only a
                    # query that goes unanswered finds it out.
                    read_at = time.monotonic()
                    for event in self.since(conn, position):
                        position = event.position
                        yield event
                # Notifications that came during the query are kept by
                # psycopg (3.2.4 and later) and returned at once here.
                behind = bool(list(conn.notifies(timeout=self.wait, stop_after=1)))

    def since(self, conn: psycopg.Connection, position: int) -> Iterator[Event]:
        """Everything that changed after `position`, oldest first, a page
        of rows per query."""
        while True:
            with self.answered(conn):
                rows = conn.execute(self._sql(SINCE), {"after": position, "page": self.page}).fetchall()
            for key, value, version in rows:
                if value is None:
                    yield reconq.Delete(key, position=version)
                else:
                    yield reconq.Put(key, value, position=version, version=version)
                position = version
            if len(rows) < self.page:
                return

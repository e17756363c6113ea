"""A table in a SQLite file, shared by processes, as a ``reconq.Source``
sees one (guarantees §13): rows with per-key versions, and a log of every
change by revision. One process writes it (``put``, ``delete``); another
runs a cache over ``source()``, whose ``list`` reads the rows and the last
revision in one transaction and whose ``changes`` follow the log from a
revision. Versions and positions are that revision (ints, which a cache
with ``store=`` keeps, E9).

Python's ``sqlite3`` on this file, never on a reconq store's file (that one
is refused in a process holding it open)."""

from __future__ import annotations

import sqlite3
import threading
from contextlib import closing
from typing import Dict, Iterator, List, Optional, Tuple, Union

import reconq

Event = Union[reconq.Put, reconq.Delete]

#: How often ``changes`` looks for new log rows.
POLL = 0.01

SCHEMA = """
CREATE TABLE IF NOT EXISTS items (key TEXT PRIMARY KEY, value TEXT NOT NULL, version INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS log (rev INTEGER PRIMARY KEY AUTOINCREMENT, key TEXT NOT NULL, value TEXT);
"""


class Table:
    def __init__(self, path: str) -> None:
        self.path = path
        with closing(self._connect()) as conn:
            conn.execute("PRAGMA journal_mode = WAL")
            conn.executescript(SCHEMA)
        self._writer: Optional[sqlite3.Connection] = None

    def _connect(self) -> sqlite3.Connection:
        # Autocommit: transactions are the explicit BEGINs below.
        return sqlite3.connect(self.path, timeout=30, isolation_level=None, check_same_thread=False)

    # --- changing the table (the writer's process) ---

    def put(self, key: str, value: str) -> int:
        """Creates or changes `key`; returns the change's revision (its version)."""
        return self._change(key, value)

    def delete(self, key: str) -> int:
        return self._change(key, None)

    def _change(self, key: str, value: Optional[str]) -> int:
        if self._writer is None:
            self._writer = self._connect()
        conn = self._writer
        conn.execute("BEGIN IMMEDIATE")
        try:
            rev = conn.execute("INSERT INTO log (key, value) VALUES (?, ?)", (key, value)).lastrowid
            assert rev is not None
            if value is None:
                conn.execute("DELETE FROM items WHERE key = ?", (key,))
            else:
                conn.execute(
                    "INSERT INTO items VALUES (?, ?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value, version = excluded.version",
                    (key, value, rev),
                )
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
        return rev

    def state(self) -> Dict[str, str]:
        with closing(self._connect()) as conn:
            return dict(conn.execute("SELECT key, value FROM items"))

    def revision(self) -> int:
        """The revision of the last change (0 before any)."""
        with closing(self._connect()) as conn:
            return self._revision(conn)

    @staticmethod
    def _revision(conn: sqlite3.Connection) -> int:
        row = conn.execute("SELECT max(rev) FROM log").fetchone()
        return int(row[0] or 0)

    # --- the Source functions (the cache's process) ---

    def source(self, name: str = "table") -> reconq.Source:
        return reconq.Source(self.list, self.changes, name=name)

    def list(self) -> Tuple[List[Tuple[str, str, int]], int]:
        with closing(self._connect()) as conn:
            conn.execute("BEGIN")
            items = list(conn.execute("SELECT key, value, version FROM items"))
            revision = self._revision(conn)
            conn.execute("COMMIT")
        return items, revision

    def changes(self, position: int, stop: threading.Event) -> Iterator[Event]:
        conn = self._connect()
        try:
            while not stop.is_set():
                rows = conn.execute("SELECT rev, key, value FROM log WHERE rev > ? ORDER BY rev", (position,)).fetchall()
                for rev, key, value in rows:
                    yield reconq.Delete(key, position=rev) if value is None else reconq.Put(
                        key, value, position=rev, version=rev
                    )
                    position = rev
                stop.wait(POLL)
        finally:
            conn.close()

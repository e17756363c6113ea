"""A restart that resumes (issue 36 item 2, guarantees §13 E9) against a
real etcd, with real processes: runs of ``cache_child.py`` (a controller
watching ``Cache(EtcdSource(...), store=...)`` on the same store,
recording every reconcile and what it saw) restarted after a SIGKILL or
a clean stop. Beside the writer's keys, the prefix holds ``QUIET`` keys
nobody changes, so a list of it costs etcd many times what a resume does:
what etcd sent its clients over a restart (its own counter,
``Etcd.sent_bytes``) tells a resume from a relist, measured against one
list of the prefix in the same test. Afterwards each test checks, against
etcd's own listing, what must never happen:

- a key created, changed or deleted while down (or during the burst a
  run was killed in) whose last reconcile did not see its state in etcd
  (a delete is seen as absence);
- a restart that resumes but read the whole prefix again (a relist,
  ``stats()["relists"]``, or a list's worth of bytes);
- a key unchanged and reconciled more than ``flush_interval`` + 1 s
  before a kill reconciled again (E9); after a clean stop or
  ``cache.flush()``, any key reconciled but those changed while down;
- a delete while down given to ``map`` without the object the cache held
  (the kept object, not None);
- after a compaction past the kept revision, anything but the relist path
  with exactly the changes reconciled;
- a cache whose contents at the end differ from etcd's listing.

How fast a restart is belongs to W14 (benches/python/w14_input.py).
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from pathlib import Path
from typing import Any, Dict, List, Set, Tuple

import pytest

from appended import AppendedLines
from cache_child import ABSENT, PREFIX
from etcd_server import Etcd
from restarts import EtcdItems, Runs, System, Writer, change_while_down, reconciled_only, seeded

SEED = 36
#: Keys nobody changes: a list reads them all, a resume none.
QUIET = 1000
#: The writer keeps between this many keys and twice as many.
KEYS = 100
KILLS = 6
ROUNDS = 3
#: A reconcile's work in the runs (short: the first run reconciles every key).
WORK = ("--work", "0.001")
#: Runs that take ``cache.flush()`` from stdin, settled first (see flush_then_kill).
SETTLED = ("--flush-on-stdin", "--settle")

pytestmark = pytest.mark.timeout(300)


class Restarts:
    """cache_child.py's runs over one etcd, each restart measured by what
    etcd sent meanwhile; the map calls and the dump a clean stop writes."""

    def __init__(self, etcd: Etcd, directory: Path, kind: str) -> None:
        self.etcd = etcd
        self.system = System(kind, etcd.endpoint, EtcdItems(etcd))
        self.runs = Runs(self.system, directory)
        self.maps_path = directory / "maps"
        self.dump_path = directory / "dump.json"
        self._maps = AppendedLines(self.maps_path)
        self.maps: List[Tuple[int, str, str]] = []
        quiet = {f"q{i:04}": f"q{i}" for i in range(QUIET)}
        etcd.put_all({PREFIX + key: value for key, value in quiet.items()})
        self.quiet = set(quiet)
        #: What one list of the prefix costs etcd (the first one: the
        #: writer's keys make the prefix longer, never shorter than this).
        before = etcd.sent_bytes()
        etcd.keys(PREFIX)
        self.list_bytes = etcd.sent_bytes() - before

    def start(self, written: Set[str], what: str, *args: str) -> int:
        """Starts the next run and waits until the last reconcile of each
        key in `written` and of each quiet key saw its state in etcd (which
        must not change meanwhile); returns what etcd sent its clients meanwhile. With
        ``--flush-on-stdin``, also waits for ``idle``."""
        state = self.system.items.state()
        before = self.etcd.sent_bytes()
        self.runs.start(*WORK, "--maps", str(self.maps_path), "--dump", str(self.dump_path), *args)
        self.runs.wait_line("synced")
        if "--flush-on-stdin" in args:
            self.runs.wait_line("idle")
        self.runs.wait_state_reconciled(state, written | self.quiet, what)
        return self.etcd.sent_bytes() - before

    def resumed(self, sent: int, what: str) -> None:
        assert sent < self.list_bytes / 2, (
            f"{what}: etcd sent {sent} bytes over the restart, one list of the prefix is {self.list_bytes}: "
            f"it relisted instead of resuming"
        )

    def flush_then_kill(self) -> None:
        """``cache.flush()`` in the run (with ``--flush-on-stdin --settle``:
        once idle, and its controller's marks written too), then SIGKILL."""
        proc = self.runs.proc
        assert proc is not None and proc.stdin is not None
        proc.stdin.write(f"{self.system.items.revision()}\n")
        proc.stdin.flush()
        self.runs.wait_line("flushed")
        self.runs.kill()

    def stop(self, how: str) -> None:
        if how == "sigkill":
            self.flush_then_kill()
        else:
            assert how == "clean", how
            self.runs.stop()

    def mapped(self, run: int) -> Dict[str, List[str]]:
        """key -> the objects ``map`` was given for it in run `run`."""
        for line in self._maps.new():
            number, key, obj = line.split()
            self.maps.append((int(number), key, obj))
        out: Dict[str, List[str]] = {}
        for of_run, key, obj in self.maps:
            if of_run == run:
                out.setdefault(key, []).append(obj)
        return out

    def reconciled(self, run: int) -> "Counter[str]":
        return Counter(r.key for r in self.runs.record.of_run(run))

    def dumped(self) -> Dict[str, Any]:
        """What the last clean stop wrote: ``{"stats": ..., "contents": ...}``."""
        dump: Dict[str, Any] = json.loads(self.dump_path.read_text())
        return dump

    def stop_and_compare(self) -> Dict[str, Any]:
        """A clean stop, then the cache's contents must be etcd's; returns
        the run's stats."""
        self.runs.stop()
        dump = self.dumped()
        state = self.system.items.state()
        assert dump["contents"] == state, (
            f"the cache differs from etcd: only in the cache {sorted(set(dump['contents']) - set(state))[:10]}, "
            f"only in etcd {sorted(set(state) - set(dump['contents']))[:10]}, "
            f"other values {[k for k in state if k in dump['contents'] and dump['contents'][k] != state[k]][:10]}"
        )
        stats: Dict[str, Any] = dump["stats"]
        return stats

    def close(self) -> None:
        self.runs.close()


@pytest.fixture
def restarts(etcd: Etcd, tmp_path: Path, request: pytest.FixtureRequest) -> Any:
    """The runs, of ``EtcdSource`` without ``decode`` unless a test asks
    for ``etcd-decoded`` (indirect parametrization)."""
    made = Restarts(etcd, tmp_path / "runs", getattr(request, "param", "etcd"))
    try:
        yield made
    finally:
        made.close()


def some_changes_while_down(writer: Writer, rng: random.Random) -> "Counter[str]":
    """1 to 10 creates, changes and deletes (``restarts.change_while_down``)."""
    return change_while_down(writer, rng, rng.randint(1, 10), rng.randint(1, 10), rng.randint(1, 10))


def test_a_restart_after_a_sigkill_in_a_burst_resumes_and_reconciles_every_change(restarts: Restarts) -> None:
    """Each run is killed in a burst of creates, changes and deletes that
    goes on while it is down; each restart resumes (etcd sends it less
    than half of one list), reconciles every key's final state, and
    reconciles no settled key again."""
    rng, writer = seeded(restarts.system.items, SEED)
    for _ in range(KEYS):
        writer.create()
    writer.start(KEYS, 2 * KEYS)
    try:
        restarts.start(writer.written, "the first run")
        for kill in range(KILLS):
            writer.resume()
            # The first burst is long enough for the first list's keys to
            # settle (E9), so that the last check checks them.
            time.sleep(rng.uniform(1.5, 2.5) if kill == 0 else rng.uniform(0.1, 2.5))
            restarts.runs.kill()
            time.sleep(rng.uniform(0.05, 0.4))  # the burst goes on while down
            writer.pause()
            what = f"the restart after kill {kill} (seed {SEED})"
            restarts.resumed(restarts.start(writer.written, what), what)
        stats = restarts.stop_and_compare()
    finally:
        writer.close()
    assert stats["relists"] == 0, stats
    violations, settled = restarts.runs.reconciled_again()
    print(f"{writer.changes} changes, {len(restarts.runs.record.read())} reconciles, {settled} settled")
    assert settled >= QUIET, "the first list's keys settled before the first kill: the check below checks them"
    assert not violations, f"seed {SEED}, {len(violations)} violations:\n" + "\n".join(violations[:20])


@pytest.mark.parametrize("restarts", ["etcd", "etcd-decoded"], indirect=True)
@pytest.mark.parametrize("stop", ["sigkill", "clean"])
def test_deletes_while_down_arrive_as_deletes_with_the_object_the_cache_held(restarts: Restarts, stop: str) -> None:
    """Stopped cleanly, or killed right after ``cache.flush()``; keys
    deleted (and others created and changed) while down. The restart
    resumes, reconciles exactly those keys (none more often than it
    changed while down), each deleted one seen absent, and ``map`` is given each deleted key with the object the
    cache held before (E9 gave None when the restart relisted). With
    ``decode`` too: the store keeps etcd's bytes, and every object read
    after the restart is ``decode``'s again."""
    rng, writer = seeded(restarts.system.items, SEED)
    for _ in range(KEYS):
        writer.create()
    restarts.start(writer.written, "the first run", *SETTLED)
    for round in range(ROUNDS):
        held = restarts.system.items.state()
        restarts.stop(stop)
        changed = some_changes_while_down(writer, rng)
        deleted = {key for key in changed if key in held and key not in writer.live}
        what = f"round {round} (seed {SEED})"
        sent = restarts.start(writer.written, what, *SETTLED)
        run = restarts.runs.run
        restarts.resumed(sent, what)
        reconciled_only(restarts.reconciled(run), changed, changed, what)
        mapped = restarts.mapped(run)
        wrong = {key: mapped.get(key) for key in deleted if mapped.get(key) != [held[key]]}
        assert not wrong, f"{what}: deleted while down, map given (want the object held before): {wrong}"
    assert restarts.stop_and_compare()["relists"] == 0


@pytest.mark.parametrize("stop", ["sigkill", "clean"])
def test_a_compaction_while_down_takes_the_relist_path_and_reconciles_exactly_the_changes(
    restarts: Restarts, stop: str
) -> None:
    """Changes while down, then etcd compacted past the revision the run
    kept: the restart cannot resume, relists (one relist, a list's worth
    of bytes: the probe the other tests rely on sees a list), and still
    reconciles exactly the keys changed while down."""
    rng, writer = seeded(restarts.system.items, SEED)
    for _ in range(KEYS):
        writer.create()
    restarts.start(writer.written, "the first run", *SETTLED)
    for round in range(ROUNDS):
        restarts.stop(stop)
        changed = some_changes_while_down(writer, rng)
        restarts.etcd.compact()
        what = f"round {round} (seed {SEED})"
        sent = restarts.start(writer.written, what, *SETTLED)
        run = restarts.runs.run
        assert sent >= restarts.list_bytes, f"{what}: etcd sent {sent} bytes, one list is {restarts.list_bytes}"
        reconciled_only(restarts.reconciled(run), changed, Counter(set(changed)), what)
        assert restarts.stop_and_compare()["relists"] == 1, f"{what}: {restarts.dumped()['stats']}"
        restarts.start(writer.written, f"{what}, once more", *SETTLED)
    restarts.runs.stop()


def test_a_clean_restart_with_nothing_changed_reconciles_nothing_and_reads_no_list(restarts: Restarts) -> None:
    rng, writer = seeded(restarts.system.items, SEED)
    for _ in range(KEYS):
        writer.create()
    restarts.start(writer.written, "the first run", *SETTLED)
    restarts.runs.stop()
    for round in range(ROUNDS):
        what = f"round {round}"
        restarts.resumed(restarts.start(writer.written, what, *SETTLED), what)
        stats = restarts.stop_and_compare()
        assert stats["relists"] == 0, f"{what}: {stats}"
        assert not restarts.reconciled(restarts.runs.run), f"{what}: reconciled with nothing changed"
        assert not restarts.mapped(restarts.runs.run), f"{what}: map called with nothing changed"

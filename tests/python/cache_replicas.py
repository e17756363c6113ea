"""The harness of the sharded cache chaos tests and the W13 benchmark:
replica processes (``sharded_cache_child.py``) sharded on a real etcd,
each watching a cache of the ``/items/`` prefix and appending every
reconcile to one record (replica_record.py), and a writer that changes the
items in bursts of transactions."""

from __future__ import annotations

import signal
import sys
from typing import Dict, Iterable, List, Optional

from cache_child import PREFIX
from etcd_server import Etcd
from replica_record import Record, append, fencing_violations, open_for_append, overlaps, unreconciled
from replicas import HERE, Replicas
from restarts import EtcdItems


class CacheReplicas(Replicas):
    """sharded_cache_child.py replicas; a SIGKILL is written to the record
    (a ``kill`` line) right before the signal, so the checks know the
    victim's reconciles ended there."""

    def __init__(self, etcd: Etcd, record: Record, ttl: float, partitions: int, workers: int = 2,
                 work: float = 0.001) -> None:
        args = ["--partitions", str(partitions), "--workers", str(workers), "--work", str(work)]
        super().__init__(etcd, record, ttl=ttl, args=args)  # type: ignore[arg-type]
        self.cache_record = record
        self.partitions = partitions
        self._kills = open_for_append(record.path)

    def command(self, identity: str) -> List[str]:
        return [sys.executable, str(HERE / "sharded_cache_child.py"), self.etcd.endpoint, self.cache_record.path,
                str(self.ttl), identity, *self.args]

    def kill(self, pid: int, sig: int) -> None:
        if sig == signal.SIGKILL:
            append(self._kills, "kill", pid=pid)
        super().kill(pid, sig)

    def owed(self, state: Dict[str, str], written: Iterable[str]) -> Dict[str, str]:
        """The changed keys not yet reconciled after their last change."""
        return unreconciled(self.cache_record, state, written)

    def never_twice_at_once(self) -> None:
        """What may never happen in the record: a write a fenced system
        would refuse, a key reconciled twice at once."""
        lines = self.cache_record.read()
        assert lines, "nothing ran"
        refused = fencing_violations(lines)
        assert not refused, f"{len(refused)} writes of an old owner after a newer one: {refused[:5]}"
        both = overlaps(lines)
        assert not both, f"{len(both)} reconciles of a key while another ran: {both[:5]}"


class EtcdBatch(EtcdItems):
    """EtcdItems whose changes go to etcd in transactions of up to `size`
    (one revision each): a burst. A key changed twice goes in the next
    transaction (etcd refuses a key twice in one). ``flush()`` sends what
    is pending."""

    def __init__(self, etcd: Etcd, size: int = 50) -> None:
        super().__init__(etcd)
        self.size = size
        self.puts: Dict[str, str] = {}
        self.deletes: Dict[str, None] = {}  # ordered, as the puts
        #: transactions sent
        self.sent = 0

    def put(self, key: str, value: str) -> None:
        self._add(key, value)

    def delete(self, key: str) -> None:
        self._add(key, None)

    def _add(self, key: str, value: Optional[str]) -> None:
        if key in self.puts or key in self.deletes:
            self.flush()
        if value is None:
            self.deletes[key] = None
        else:
            self.puts[key] = value
        if len(self.puts) + len(self.deletes) >= self.size:
            self.flush()

    def flush(self) -> None:
        if not self.puts and not self.deletes:
            return
        self.etcd.txn({PREFIX + k: v for k, v in self.puts.items()}, [PREFIX + k for k in self.deletes])
        self.puts.clear()
        self.deletes.clear()
        self.sent += 1

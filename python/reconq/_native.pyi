"""Type stubs for the Rust extension module ``reconq._native``."""

from threading import Event
from types import TracebackType
from os import PathLike
from typing import Any, Callable, Dict, Iterable, List, Literal, Optional, Set, Tuple, Type, TypedDict, Union, final

from typing_extensions import NotRequired, Self, TypeAlias, disjoint_base

from ._results import Requeue
from ._sources import Bookmark, Delete, Put
from ._triggers import StopEvent

__all__ = [
    "Batch",
    "Cache",
    "Context",
    "Controller",
    "CycleError",
    "EtcdSource",
    "ExponentialBackoff",
    "FakeClock",
    "FastSlow",
    "LeaderElection",
    "Manager",
    "MaxOf",
    "MetricsServer",
    "PollingSource",
    "RateLimiter",
    "ShutDown",
    "Sharding",
    "Source",
    "SqliteStore",
    "StoreLocked",
    "TokenBucket",
    "WithMaxWait",
    "WorkQueue",
    "__version__",
    "context",
    "default_rate_limiter",
    "format_status",
    "status",
    "metrics_text",
    "partition_of",
    "start_http_server",
]

_Key: TypeAlias = Union[str, int, bytes, Tuple["_Key", ...]]
"""A queue key: str, int (signed 64-bit; bool counts), bytes, or tuples of these."""

_Seconds: TypeAlias = Union[int, float]

__version__: str

@final
class FakeClock:
    """A clock that moves only when told to; give it to ``Controller(clock=)`` or ``WorkQueue(clock=)``."""

    def __new__(cls) -> Self: ...
    def now(self) -> float:
        """Seconds since the clock was made (starts at 0.0)."""
    def advance(self, seconds: _Seconds) -> None:
        """Moves forward; returns once what became due is ready."""

class ShutDown(Exception):
    """Raised by ``WorkQueue.get()`` once the queue is shut down and nothing is ready."""

class CycleError(ValueError):
    """Raised by ``Controller.set_dependencies()`` when the parents would close a cycle (the message names every key of it); nothing was changed."""

class StoreLocked(Exception):
    """Raised by ``start()`` when another live controller holds this name in the store file."""

@final
class SqliteStore:
    """An embedded SQLite file keeping controllers' pending, delayed and parked keys."""

    def __new__(cls, path: Union[str, PathLike[str]], flush_interval: _Seconds = 1.0) -> Self: ...
    @property
    def path(self) -> str: ...
    @property
    def flush_interval(self) -> float: ...

@disjoint_base
class RateLimiter:
    """Base class of the rate limiters; not constructible itself."""

    def when(self, key: _Key) -> float: ...
    def forget(self, key: _Key) -> None: ...
    def num_requeues(self, key: _Key) -> int: ...

@final
class ExponentialBackoff(RateLimiter):
    def __new__(cls, base: _Seconds, max: _Seconds) -> Self: ...

@final
class FastSlow(RateLimiter):
    def __new__(cls, fast: _Seconds, slow: _Seconds, max_fast_attempts: int) -> Self: ...

@final
class TokenBucket(RateLimiter):
    def __new__(cls, qps: float, burst: int) -> Self: ...

@final
class MaxOf(RateLimiter):
    def __new__(cls, *limiters: Union[RateLimiter, list[RateLimiter], tuple[RateLimiter, ...]]) -> Self: ...

@final
class WithMaxWait(RateLimiter):
    def __new__(cls, limiter: RateLimiter, max: _Seconds) -> Self: ...

def default_rate_limiter() -> MaxOf: ...

@final
class WorkQueue:
    def __new__(
        cls, rate_limiter: Optional[RateLimiter] = None, name: Optional[str] = None, clock: Optional[FakeClock] = None
    ) -> Self: ...
    def add(self, key: _Key, priority: int = 0) -> None: ...
    def add_after(self, key: _Key, seconds: _Seconds, priority: int = 0) -> None: ...
    def add_rate_limited(self, key: _Key) -> None: ...
    def forget(self, key: _Key) -> None: ...
    def num_requeues(self, key: _Key) -> int: ...
    def get(self, timeout: Optional[_Seconds] = None) -> _Key: ...
    def done(self, key: _Key) -> None: ...
    def __len__(self) -> int: ...
    def shut_down(self) -> None: ...
    def shut_down_with_drain(self, timeout: Optional[_Seconds] = None) -> bool: ...
    @property
    def shutting_down(self) -> bool: ...

# --- Manager (guarantees §5) ---

from typing import Callable, TypedDict

class _ControllerStatus(TypedDict):
    name: str
    successes: int
    failures: int
    consecutive_failures: int
    last_error: Optional[str]
    last_error_time: Optional[float]
    last_success_time: Optional[float]
    last_duration: Optional[float]
    running: bool
    next_run_in: Optional[float]

@final
class Manager:
    """Named periodic controllers (Cilium ``pkg/controller``)."""

    def __new__(cls, name: str = "manager", leader_election: Optional[LeaderElection] = None) -> Self: ...
    @property
    def name(self) -> str:
        """Labels this manager's controllers in ``reconq.status()``."""
    def update(
        self,
        name: str,
        do: Callable[[], None],
        stop: Optional[Callable[[], object]] = None,
        interval: Optional[_Seconds] = None,
        error_retry_base: _Seconds = 1.0,
        no_error_retry: bool = False,
        max_retry_interval: Optional[_Seconds] = None,
    ) -> None: ...
    def trigger(self, name: str) -> None: ...
    def remove(self, name: str, wait: bool = False) -> None: ...
    def remove_all(self, wait: bool = False) -> None: ...
    def _stop_at_exit(self, timeout: float) -> None: ...
    def status(self) -> list[_ControllerStatus]: ...
    def names(self) -> list[str]: ...
    def __len__(self) -> int: ...
    def __contains__(self, key: object, /) -> bool: ...
    def __enter__(self) -> Self: ...
    def __exit__(self, *_args: object) -> None: ...

# --- Leader election (guarantees §10) ---

@final
class LeaderElection:
    """A campaign for leadership of ``name`` on etcd; pass it to ``Controller(leader_election=)``."""

    def __new__(
        cls,
        endpoints: Union[str, List[str]],
        name: str,
        ttl: Optional[_Seconds] = None,
        identity: Optional[str] = None,
        on_lost: Literal["standby", "exit"] = "standby",
    ) -> Self: ...
    @property
    def is_leader(self) -> bool: ...
    @property
    def leader(self) -> Optional[str]: ...
    @property
    def fencing_token(self) -> Optional[int]: ...
    @property
    def last_error(self) -> Optional[str]: ...
    def start(self) -> None: ...
    def stop(self) -> None: ...

def _after_fork_in_child() -> None: ...

# --- Sharding (guarantees §11) ---

@final
class Sharding:
    """Membership of a group of replicas splitting the keys' partitions; pass it to ``Controller(sharding=, resync=)``."""

    def __new__(
        cls,
        endpoints: Union[str, List[str]],
        name: str,
        partitions: int = 64,
        ttl: Optional[_Seconds] = None,
        identity: Optional[str] = None,
    ) -> Self: ...
    @property
    def partitions(self) -> int: ...
    @property
    def last_error(self) -> Optional[str]: ...
    def owned_partitions(self) -> Set[int]: ...

def partition_of(key: _Key, partitions: int) -> int:
    """The key's partition (FNV-1a of its store encoding, modulo ``partitions``), as in every replica and in Rust."""

# --- Sources and caches (guarantees §13, docs/sources.md) ---

_Items: TypeAlias = Union[
    Dict[Any, Any], Iterable[Union[Tuple[Any, Any], Tuple[Any, Any, Any]]]
]
"""What a list gives: ``{key: obj}``, or ``(key, obj)`` / ``(key, obj, version)`` tuples."""

@final
class PollingSource:
    """Calls ``list_fn()`` every ``interval`` seconds; the differences between polls are puts and deletes."""

    def __new__(cls, list_fn: Callable[[], _Items], interval: _Seconds, name: Optional[str] = None) -> Self: ...
    @property
    def name(self) -> str: ...
    @property
    def interval(self) -> float: ...

@final
class EtcdSource:
    """The keys under ``prefix`` of etcd: keys without the prefix (str; bytes if not UTF-8), values bytes or ``decode(bytes)``."""

    def __new__(
        cls,
        endpoints: Union[str, List[str]],
        prefix: str,
        decode: Optional[Callable[[bytes], object]] = None,
        name: Optional[str] = None,
        progress_timeout: Optional[_Seconds] = None,
    ) -> Self: ...
    @property
    def name(self) -> str: ...
    @property
    def prefix(self) -> str: ...
    @property
    def progress_timeout(self) -> Optional[float]:
        """Seconds a watch may stay silent (no event, no progress notification) before it is resumed; None: 11 minutes."""

@final
class Source:
    """Any other system: ``list() -> (items, position)``, ``changes(position, stop)`` -> iterator of events.

    A ``list`` that needs one positional argument (``def list(stop)``) is given the stop event too."""

    def __new__(
        cls,
        list: Union[Callable[[], Tuple[_Items, Any]], Callable[[Event], Tuple[_Items, Any]]],
        changes: Callable[[Any, Event], Iterable[Union[Put, Delete, Bookmark]]],
        name: Optional[str] = None,
    ) -> Self: ...
    @property
    def name(self) -> str: ...

class _CacheStats(TypedDict):
    name: str
    synced: bool
    keys: int
    position: Any
    """The position of the last list or event applied (etcd: its revision; a poll count)."""
    relists: int
    events: int
    errors: int
    last_error: Optional[str]
    last_error_time: Optional[float]

@final
class Cache:
    """A local copy of a source, kept by its own thread (list, stream, resume, relist, back-off)."""

    def __new__(
        cls,
        source: Union[PollingSource, EtcdSource, Source],
        name: Optional[str] = None,
        indexes: Optional[Dict[str, Callable[[Any, Any], object]]] = None,
        store: Union[SqliteStore, str, PathLike[str], None] = None,
    ) -> Self: ...
    @property
    def name(self) -> str: ...
    def get(self, key: _Key) -> Any:
        """The last state seen of ``key``; None when absent."""
    def keys(self) -> List[Any]: ...
    def __len__(self) -> int: ...
    def __contains__(self, key: object, /) -> bool: ...
    def by_index(self, index: str, value: _Key) -> List[Any]:
        """Keys whose index function gave ``value`` (KeyError: unknown index)."""
    @property
    def synced(self) -> bool: ...
    def wait_synced(self, timeout: Optional[_Seconds] = None) -> bool: ...
    def stats(self) -> _CacheStats: ...
    def flush(self) -> None:
        """Blocks until every change applied before the call is on disk with what it enqueued (E9)."""
    def start(self) -> None: ...
    def stop(self, timeout: Optional[_Seconds] = None) -> bool:
        """Whether the cache's thread exited within ``timeout`` (a source that ignores its stop event is left behind)."""
    def _stop_at_exit(self, timeout: float) -> None: ...

# --- The reconcile context (guarantees §7) ---

@final
class Context:
    """What a reconcile (or a Manager ``do``) sees besides its key; see ``context()``."""

    @property
    def key(self) -> Any:
        """The key being reconciled; in a Manager ``do``, the controller's name."""
    @property
    def attempt(self) -> int:
        """Tries since the last success or forget: 0 on the first."""
    @property
    def priority(self) -> int:
        """The priority the key was handed out with."""
    @property
    def fencing_token(self) -> Optional[int]:
        """The fencing token of the leadership this runs under; None without one."""
    @property
    def cancelled(self) -> bool:
        """Read live: stop(), cancel(key), a timeout; for a ``do``: remove, replace, stop."""
    def wait_cancelled(self, timeout: Optional[_Seconds] = None) -> bool:
        """Sleeps (GIL released) until cancelled or ``timeout``; returns whether cancelled."""

def context() -> Context:
    """The context of the reconcile or Manager ``do`` running on this thread (RuntimeError elsewhere)."""

# --- Controller (guarantees §4, §5) ---

class _LeaderFields(TypedDict, total=False):
    """With ``leader_election`` (guarantees §10)."""

    is_leader: bool
    """Whether this process leads (a running standby's status ``state`` is "standby")."""
    leader: Optional[str]
    fencing_token: Optional[int]
    leader_error: Optional[str]
    """The last error talking to etcd, if the last attempt failed."""

class _ShardFields(TypedDict, total=False):
    """With ``sharding`` (guarantees §11)."""

    not_owned: int
    """Keys dropped because another replica owns them."""
    owned_partitions: int
    members: int
    shard_error: Optional[str]

class _StoreFields(TypedDict, total=False):
    """With ``store`` (guarantees §9)."""

    store_pending: int
    """Changes not yet written, including those a flush is writing (a key changed twice counts twice until then)."""
    last_flush_time: Optional[float]
    store_error: Optional[str]
    """The last flush's error, until a flush succeeds."""

class _ControllerStats(_StoreFields, _LeaderFields, _ShardFields):
    name: str
    workers: int
    state: Literal["not started", "running", "standby", "stopping", "stopped"]
    reconciles: int
    successes: int
    failures: int
    requeues: int
    depth: int
    processing: int
    waiting: int
    parked: int
    handler_errors: int
    """Failures of a watched cache's ``map`` or ``predicate`` (the changed key was enqueued instead)."""
    held: int
    superseded: int
    background_threads: int
    hanging: Dict[_Key, float]
    last_error: Optional[str]
    last_error_time: Optional[float]
    by_priority: Dict[int, int]
    in_flight_by_group: NotRequired[Dict[Optional[_Key], int]]

class _StopReport(TypedDict):
    finished: bool
    unfinished: List[_Key]
    dropped: List[_Key]
    unfinished_caches: List[str]
    """Caches the stop stopped whose source was still blocked (ignoring its stop event) at the deadline: left behind."""
    store_error: NotRequired[Optional[str]]
    """With ``store``: why the stop's last flush failed (the file keeps the last successful flush), else None."""

class _KeyInfo(TypedDict):
    state: Literal["unknown", "ready", "waiting", "running", "parked"]
    attempts: int
    last_error: Optional[str]
    next_run: Optional[float]
    since: Optional[float]
    waiting_for: List[_Key]

@final
class Batch:
    """``with c.batch():`` — while any block is open, keys that become ready are held; the last one out schedules them together, parents first."""

    def __enter__(self) -> Self: ...
    def __exit__(
        self,
        _exc_type: Optional[Type[BaseException]] = None,
        _exc: Optional[BaseException] = None,
        _tb: Optional[TracebackType] = None,
    ) -> bool: ...

@final
class Controller:
    def __new__(
        cls,
        reconcile: Callable[[Any], Optional[Requeue]],
        workers: int = 1,
        rate_limiter: Optional[RateLimiter] = None,
        name: str = "controller",
        hanging_threshold: Optional[_Seconds] = None,
        timeout: Optional[_Seconds] = None,
        group: Optional[Callable[[Any], Optional[_Key]]] = None,
        max_in_flight_per_group: Optional[int] = None,
        clock: Optional[FakeClock] = None,
        jitter: Optional[Tuple[float, int]] = None,
        parked_capacity: Optional[int] = None,
        leader_election: Optional[LeaderElection] = None,
        store: Union[SqliteStore, str, PathLike[str], None] = None,
        sharding: Optional[Sharding] = None,
        resync: Optional[Callable[[], Iterable[_Key]]] = None,
        sync_timeout: float = 120.0,
        supersede: bool = False,
        debounce: Optional[float] = None,
    ) -> Self: ...
    @property
    def name(self) -> str: ...
    @property
    def workers(self) -> int: ...
    def enqueue(self, key: _Key, priority: int = 0) -> None: ...
    def enqueue_after(self, key: _Key, seconds: _Seconds, priority: int = 0) -> None: ...
    def enqueue_at(self, key: _Key, t: _Seconds, priority: int = 0) -> None: ...
    def start(self) -> None: ...
    def run(self, stop_timeout: Optional[_Seconds] = None) -> None: ...
    def stop(self, drain: bool = True, timeout: Optional[_Seconds] = None) -> bool: ...
    def stop_with_report(self, timeout: Optional[_Seconds] = None) -> _StopReport: ...
    def wait_idle(self, timeout: Optional[_Seconds] = None) -> bool: ...
    def flush(self) -> None: ...
    def stats(self) -> _ControllerStats: ...
    def owned_partitions(self) -> Set[int]: ...
    def cancel(self, key: _Key) -> bool: ...
    def inspect(self, key: _Key) -> _KeyInfo: ...
    def parked(self) -> List[_Key]: ...
    def requeue_parked(self, key: _Key) -> bool: ...
    def watch_cache(
        self,
        cache: Cache,
        map: Optional[Callable[[Any, Any], Union[_Key, Iterable[_Key], None]]] = None,
        predicate: Optional[Callable[[Any, Any], object]] = None,
        resync: Optional[_Seconds] = None,
        priority: int = 0,
        list_priority: int = -100,
    ) -> None: ...
    def wait_synced(self, timeout: Optional[_Seconds] = None) -> bool:
        """Waits until every watched cache has synced and its keys reached the controller (True at once if none)."""
    def set_dependencies(self, key: _Key, parents: Iterable[_Key]) -> None: ...
    def dependencies(self, key: _Key) -> List[_Key]: ...
    def dependents(self, key: _Key) -> List[_Key]: ...
    def batch(self) -> Batch: ...
    def add_trigger(self, key: _Key, fn: Callable[[StopEvent], object]) -> None: ...
    def remove_trigger(self, key: _Key) -> bool: ...
    def watch(self, iterable: Iterable[Any], transform: Optional[Callable[[Any], object]] = None) -> None: ...
    def __enter__(self) -> Self: ...
    def __exit__(
        self,
        _exc_type: Optional[Type[BaseException]] = None,
        _exc: Optional[BaseException] = None,
        _tb: Optional[TracebackType] = None,
    ) -> None: ...

# --- Global status (issue 6) ---

class _ControllerEntry(_StoreFields, _LeaderFields, _ShardFields):
    """A ``reconq.Controller`` in ``status()``."""

    kind: Literal["controller"]
    name: str
    state: Literal["not started", "running", "standby", "stopping", "stopped"]
    workers: int
    reconciles: int
    successes: int
    failures: int
    requeues: int
    panics: int
    consecutive_failures: int
    """Failures since the last success of any key (requeues count as neither)."""
    last_error: Optional[str]
    """The last failure ("Type: message"); kept after later successes, as in ``stats()``."""
    last_error_time: Optional[float]
    last_success_time: Optional[float]
    depth: int
    processing: int
    waiting: int
    parked: int
    held: int
    """Ready keys held by a pending ancestor or waiting for cancelled descendants (counted in ``depth`` too)."""
    superseded: int
    """Reconciles cancelled because an ancestor became pending (counted in ``reconciles`` too)."""
    hanging_threshold: Optional[float]
    hanging: Dict[_Key, float]
    """Keys whose reconcile has run longer than ``hanging_threshold``: seconds running."""

class _PeriodicEntry(_LeaderFields):
    """A named controller of a ``reconq.Manager`` in ``status()``."""

    kind: Literal["periodic"]
    name: str
    manager: str
    state: Literal["running", "standby", "scheduled", "idle"]
    successes: int
    failures: int
    consecutive_failures: int
    last_error: Optional[str]
    """Cleared by a success, as in ``Manager.status()``."""
    last_error_time: Optional[float]
    last_success_time: Optional[float]
    running: bool
    last_duration: Optional[float]
    next_run_in: Optional[float]

class _CacheEntry(TypedDict):
    """A ``reconq.Cache`` (or a Rust cache) in ``status()``."""

    kind: Literal["cache"]
    name: str
    state: Literal["not started", "running", "stopped"]
    successes: int
    """Events applied."""
    failures: int
    """Failures of the source (each logged as a warning)."""
    consecutive_failures: int
    last_error: Optional[str]
    last_error_time: Optional[float]
    last_success_time: Optional[float]
    synced: bool
    keys: int
    position: Optional[str]
    """The position, as text."""
    relists: int

_StatusEntry: TypeAlias = Union[_ControllerEntry, _PeriodicEntry, _CacheEntry]

def status() -> List[_StatusEntry]:
    """Every live Controller, named Manager controller and Cache in this process:
    controllers first, then periodic ones, then caches, each sorted by name."""

def format_status() -> str:
    """``status()`` as an aligned text table under a summary line."""
# --- Metrics (issue 6) ---

def metrics_text() -> str:
    """Every live named queue's and controller's metrics, Prometheus text format 0.0.4."""

@final
class MetricsServer:
    """A running ``GET /metrics`` endpoint (see ``start_http_server``)."""

    @property
    def port(self) -> int: ...
    @property
    def addr(self) -> str: ...
    @property
    def closed(self) -> bool: ...
    def close(self) -> None: ...
    def __enter__(self) -> Self: ...
    def __exit__(self, *_args: object) -> None: ...

def start_http_server(port: int = 0, addr: str = "127.0.0.1") -> MetricsServer: ...

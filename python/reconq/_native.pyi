"""Type stubs for the Rust extension module ``reconq._native``."""

from asyncio import AbstractEventLoop
from threading import Event
from types import TracebackType
from os import PathLike
from typing import Any, Awaitable, Callable, Dict, Iterable, List, Literal, Optional, Set, Tuple, Type, TypedDict, Union, final

from typing_extensions import NotRequired, Self, TypeAlias, disjoint_base

from ._results import Requeue
from ._sources import Bookmark, Delete, Put
from ._triggers import StopEvent

__all__ = [
    "Batch",
    "Cache",
    "Context",
    "Controller",
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
    "Sharding",
    "Source",
    "SqliteStore",
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

@final
class SqliteStore:
    """An embedded SQLite file keeping controllers' pending, delayed and parked keys."""

    def __new__(cls, path: Union[str, PathLike[str]], flush_interval: _Seconds = 1.0) -> Self: ...
    @property
    def path(self) -> str:
        """The database file."""
    @property
    def flush_interval(self) -> float:
        """Seconds between flushes, at most."""

@disjoint_base
class RateLimiter:
    """Base class of the rate limiters; not constructible itself."""

    def when(self, key: _Key) -> float:
        """How long ``key`` should wait now, in seconds. Each call counts as one more requeue of
        ``key``."""
    def forget(self, key: _Key) -> None:
        """Forgets ``key``'s history."""
    def num_requeues(self, key: _Key) -> int:
        """How many times ``when(key)`` was asked since ``key`` was last forgotten."""

@final
class ExponentialBackoff(RateLimiter):
    """``base * 2**n`` seconds capped at ``max``, n = the key's failures so far."""

    def __new__(cls, base: _Seconds, max: _Seconds) -> Self: ...

@final
class FastSlow(RateLimiter):
    """``fast`` seconds for a key's first ``max_fast_attempts`` tries, then ``slow``."""

    def __new__(cls, fast: _Seconds, slow: _Seconds, max_fast_attempts: int) -> Self: ...

@final
class TokenBucket(RateLimiter):
    """One token bucket for all keys: ``qps`` tokens a second, at most ``burst`` saved.
    ``num_requeues`` is always 0."""

    def __new__(cls, qps: float, burst: int) -> Self: ...

@final
class MaxOf(RateLimiter):
    """The longest wait of its members; ``forget`` goes to all of them and ``num_requeues`` is their
    maximum. ``MaxOf(a, b)`` or ``MaxOf([a, b])``."""

    def __new__(cls, *limiters: Union[RateLimiter, list[RateLimiter], tuple[RateLimiter, ...]]) -> Self: ...

@final
class WithMaxWait(RateLimiter):
    """Another limiter's wait, capped at ``max`` seconds."""

    def __new__(cls, limiter: RateLimiter, max: _Seconds) -> Self: ...

def default_rate_limiter() -> MaxOf:
    """client-go's default controller limiter: ``MaxOf(ExponentialBackoff(0.005, 1000.0),
    TokenBucket(10.0, 100))``."""

@final
class WorkQueue:
    """A deduplicating, delaying, rate-limiting work queue (client-go's ``workqueue`` semantics).
    Keys are str, int, bytes or tuples of these."""

    def __new__(
        cls, rate_limiter: Optional[RateLimiter] = None, *, name: Optional[str] = None, clock: Optional[FakeClock] = None
    ) -> Self: ...
    def add(self, key: _Key, priority: int = 0) -> None:
        """Marks ``key`` as needing processing now, at ``priority`` (higher is handed out first;
        adding a waiting key raises its priority, never lowers it). Ignored once shut down."""
    def add_after(self, key: _Key, seconds: _Seconds, priority: int = 0) -> None:
        """Marks ``key`` as needing processing ``seconds`` from now (<= 0: now); it keeps
        ``priority`` when it becomes ready."""
    def add_rate_limited(self, key: _Key) -> None:
        """Re-adds ``key`` after the wait the queue's rate limiter gives."""
    def forget(self, key: _Key) -> None:
        """Clears the rate limiter's memory of ``key`` (does not mark it done)."""
    def num_requeues(self, key: _Key) -> int:
        """How many times ``key`` was rate-limited since it was last forgotten."""
    def get(self, timeout: Optional[_Seconds] = None) -> _Key:
        """Blocks until a key is ready and returns it; pair it with ``done(key)``. Raises
        ``ShutDown`` once the queue is shut down and nothing is ready, ``TimeoutError`` if
        ``timeout`` seconds pass first."""
    def done(self, key: _Key) -> None:
        """Marks the processing of ``key`` finished; if it was added meanwhile it becomes ready
        again. A key not being processed is left alone."""
    def __len__(self) -> int: ...
    def shut_down(self) -> None:
        """Stops accepting keys and drops delayed ones; ready keys are still handed out, then
        ``get`` raises ``ShutDown``. Ends a pending drain."""
    def shut_down_with_drain(self, timeout: Optional[_Seconds] = None) -> bool:
        """``shut_down()``, then blocks until every key handed out is done. With a ``timeout``
        (seconds), returns whether the drain finished in time."""
    @property
    def shutting_down(self) -> bool:
        """Whether ``shut_down()`` (or a drain) was called."""
    def __enter__(self) -> Self:
        """The queue itself."""
    def __exit__(self, *_args: object) -> None:
        """Shuts the queue down: ``shut_down()`` (no drain)."""

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
    """Named periodic controllers: each runs its ``do()`` on its own thread until
    it succeeds, then every ``interval`` seconds, retrying failures with linear
    backoff; ``stop()`` runs once when it is removed.

    ``do`` may be an ``async def`` function: it then runs as a task on the
    asyncio loop ``loop`` (keyword-only; running, on a thread of the
    user's), or on a loop thread of the manager's own
    (``reconq-<name>-asyncio``, started at the first coroutine, ended by
    ``remove_all(wait=True)`` and at exit), and is cancelled
    (``asyncio.CancelledError``) when its context is. ``stop`` stays a
    plain function."""

    def __new__(
        cls,
        name: str = "manager",
        leader_election: Optional[LeaderElection] = None,
        *,
        loop: Optional[AbstractEventLoop] = None,
    ) -> Self: ...
    @property
    def name(self) -> str:
        """Labels this manager's controllers in ``reconq.status()``."""
    def update(
        self,
        name: str,
        do: Callable[[], Optional[Awaitable[None]]],
        *,
        stop: Optional[Callable[[], object]] = None,
        interval: Optional[_Seconds] = None,
        error_retry_base: _Seconds = 1.0,
        no_error_retry: bool = False,
        max_retry_interval: Optional[_Seconds] = None,
    ) -> None:
        """Creates the controller ``name``, or replaces its parameters; either way its (new) ``do``
        runs at once (right after a run in progress). ``do()`` fails by raising; after the n-th
        consecutive failure the next try is ``n * error_retry_base`` seconds later
        (``no_error_retry=True``: after ``interval``). After a success it runs again every
        ``interval`` seconds (``None`` or 0: only on the next update or trigger). ``stop()`` runs
        once when the controller is removed, after ``do`` ran at least once; only the latest
        ``stop`` given runs. ``error_retry_base=0`` means the default, 1 s.
        ``max_retry_interval`` caps the wait after a failure (None or 0: no cap), as Cilium's
        ``MaxRetryInterval``. Inside ``do``, ``reconq.context()`` gives the run's context:
        cancelled when the controller is removed, replaced by an update, or its manager stopped."""
    def trigger(self, name: str) -> None:
        """Runs the controller's ``do`` now (or right after a run in progress). ``KeyError`` if
        there is no such controller."""
    def remove(self, name: str, wait: bool = False) -> None:
        """Removes the controller: it finishes a run in progress (or runs ``do`` once if it never
        ran), then ``stop`` runs. With ``wait=True``, blocks until that is done (not when called
        from the controller's own ``do``). ``KeyError`` if there is no such controller."""
    def remove_all(self, wait: bool = False) -> None:
        """Removes every controller; with ``wait=True``, blocks until all their ``stop`` functions
        ran and their threads exited."""
    def _stop_at_exit(self, timeout: float) -> None: ...
    def status(self) -> list[_ControllerStatus]:
        """One dict per controller, sorted by name: ``name``, ``successes``, ``failures``,
        ``consecutive_failures``, ``last_error`` ("Type: message" or None), ``last_error_time``,
        ``last_success_time`` (``time.time()`` floats or None), plus ``last_duration``,
        ``running`` and ``next_run_in`` (seconds or None: waiting for an update or trigger)."""
    def names(self) -> list[str]:
        """The controllers' names, sorted."""
    def __len__(self) -> int: ...
    def __contains__(self, key: object, /) -> bool: ...
    def __enter__(self) -> Self: ...
    def __exit__(self, *_args: object) -> None: ...

# --- Leader election (guarantees §10) ---

@final
class LeaderElection:
    """A campaign for leadership of ``name`` among every process with an
    election of that name on the same etcd (``endpoints``: one
    ``http://host:port`` or a list). Pass it to ``Controller(leader_election=)``:
    the controller reconciles only while this process leads."""

    def __new__(
        cls,
        endpoints: Union[str, List[str]],
        name: str,
        *,
        ttl: Optional[_Seconds] = None,
        identity: Optional[str] = None,
        on_lost: Literal["standby", "exit"] = "standby",
    ) -> Self: ...
    @property
    def is_leader(self) -> bool:
        """Whether this process leads now."""
    @property
    def leader(self) -> Optional[str]:
        """Who leads, as last seen (their identity), or None."""
    @property
    def fencing_token(self) -> Optional[int]:
        """The current leadership's fencing token if this process leads."""
    @property
    def last_error(self) -> Optional[str]:
        """The last error talking to etcd, or None."""
    def start(self) -> None:
        """Starts campaigning (a controller using it starts it too, and gives it up when it stops).
        It is given up at the interpreter's exit (``reconq._lifecycle``), after controllers
        drained."""
    def stop(self) -> None:
        """Gives leadership up at once (a standby takes over) and stops campaigning."""
    def __enter__(self) -> Self:
        """The election itself, not started (a controller using it starts it)."""
    def __exit__(self, *_args: object) -> None:
        """Gives leadership up: ``stop()``."""

def _after_fork_in_child() -> None: ...

# --- Sharding (guarantees §11) ---

@final
class Sharding:
    """Membership of a group of replicas that split the keys' ``partitions``
    between them, on the etcd at ``endpoints`` (one ``http://host:port`` or a
    list). Pass it to one ``Controller(sharding=, resync=)``: the controller
    reconciles only the keys of the partitions this process owns. With
    ``partition_by(key) -> key``, a key belongs to the partition of the key it
    names (guarantees §17, C3): keys naming one value share a partition on
    every replica and in Rust, so a pipeline of ``set_dependencies`` whose keys
    name one value runs on one replica. If it raises or returns what is not a
    key, the controller logs an ERROR naming the key and partitions the key by
    itself. With sharding, ``set_dependencies`` refuses an edge across
    partitions (C4)."""

    def __new__(
        cls,
        endpoints: Union[str, List[str]],
        name: str,
        *,
        partitions: int = 64,
        ttl: Optional[_Seconds] = None,
        identity: Optional[str] = None,
        partition_by: Optional[Callable[[Any], _Key]] = None,
    ) -> Self: ...
    @property
    def partitions(self) -> int:
        """How many partitions the keys are split into."""
    @property
    def last_error(self) -> Optional[str]:
        """The last error talking to etcd, or None."""
    def owned_partitions(self) -> Set[int]:
        """The partitions this process owns now."""

def partition_of(key: _Key, partitions: int, partition_by: Optional[Callable[[Any], _Key]] = None) -> int:
    """The key's partition (FNV-1a of its store encoding, modulo ``partitions``), as in every replica and in Rust.
    With ``partition_by``, the partition of the key ``partition_by(key)`` names, as a controller with
    ``Sharding(partition_by=)`` computes it (Rust's ``partition_of_by``); what it raises propagates."""

# --- Sources and caches (guarantees §13, docs/sources.md) ---

_Items: TypeAlias = Union[
    Dict[Any, Any], Iterable[Union[Tuple[Any, Any], Tuple[Any, Any, Any]]]
]
"""What a list gives: ``{key: obj}``, or ``(key, obj)`` / ``(key, obj, version)`` tuples."""

@final
class PollingSource:
    """Calls ``list_fn()`` every ``interval`` seconds and turns the differences
    from the poll before into puts and deletes (a poll is not a relist).
    ``list_fn`` returns a dict ``{key: obj}`` or an iterable of ``(key, obj)`` /
    ``(key, obj, version)``. ``name`` (default: ``list_fn``'s qualified name)
    names a cache made of it unless the cache is given one."""

    def __new__(cls, list_fn: Callable[[], _Items], interval: _Seconds, *, name: Optional[str] = None) -> Self: ...
    @property
    def name(self) -> str:
        """The source's name (the cache's name defaults to it)."""
    @property
    def interval(self) -> float:
        """Seconds between polls."""

@final
class EtcdSource:
    """The keys under ``prefix`` of the etcd cluster at ``endpoints`` (one
    ``http://host:port`` or a list): keys are the etcd key without the prefix
    (``str``, or ``bytes`` when not UTF-8), objects the values (``bytes``, or
    ``decode(bytes)``; a ``decode`` that raises is logged and that change
    skipped), a key's version its ``mod_revision``, the position etcd's
    revision. ``progress_timeout`` (seconds, positive; None: 11 minutes) is
    how long the watch may go without an event or a progress notification
    before it is taken as stalled and resumed: above etcd's
    ``--experimental-watch-progress-notify-interval`` (10 min unless set)."""

    def __new__(
        cls,
        endpoints: Union[str, List[str]],
        prefix: str,
        *,
        decode: Optional[Callable[[bytes], object]] = None,
        name: Optional[str] = None,
        progress_timeout: Optional[_Seconds] = None,
    ) -> Self: ...
    @property
    def name(self) -> str:
        """The source's name (the cache's name defaults to it)."""
    @property
    def prefix(self) -> str:
        """The etcd key prefix this source lists and watches."""
    @property
    def progress_timeout(self) -> Optional[float]:
        """Seconds a watch may stay silent (no event, no progress notification) before it is resumed; None: 11 minutes."""

@final
class Source:
    """Any other system, from Python: ``list()`` returns ``(items, position)``
    (items as for ``PollingSource``; position None: the source has no
    positions and is relisted after every break), ``changes(position, stop)``
    an iterator of ``Put``, ``Delete`` and ``Bookmark`` from ``position`` on.
    ``stop`` is a ``threading.Event`` set when the cache stops: a blocking
    iterator should return soon after. A ``list`` that needs one positional
    argument (``def list(stop)``) is given the same event; one that can be
    called with none is called with none. A stop with a deadline (a
    controller's ``stop(timeout=)``, ``Cache.stop(timeout=)``, the exit hook)
    leaves a call that ignores the event behind, still running.
    Raising ``PositionExpired`` relists; raising anything else, or ending, is
    a break, resumed from the last position applied."""

    def __new__(
        cls,
        list: Union[Callable[[], Tuple[_Items, Any]], Callable[[Event], Tuple[_Items, Any]]],
        changes: Callable[[Any, Event], Iterable[Union[Put, Delete, Bookmark]]],
        *,
        name: Optional[str] = None,
    ) -> Self: ...
    @property
    def name(self) -> str:
        """The source's name (the cache's name defaults to it)."""

class _CacheStats(TypedDict):
    name: str
    synced: bool
    keys: int
    position: Any
    """The position of the last list or event applied (etcd: its revision; a poll count)."""
    relists: int
    resumed: bool
    """This run started from the contents its store kept and resumed the stream there (E9)."""
    events: int
    errors: int
    last_error: Optional[str]
    last_error_time: Optional[float]

@final
class Cache:
    """A local copy of a source's items, kept by its own thread: it lists,
    then applies the change stream, resumes it after a break, relists when
    its position expired (keys missing from the new list are deletes), and
    backs off after failures. ``indexes={"name": fn}`` with ``fn(key, obj)``
    giving the values ``by_index(name, value)`` finds the key under. A
    controller's ``watch_cache`` starts it; or ``start()`` it yourself.
    ``store=`` (a path or ``SqliteStore``, its controllers' file) keeps its key
    set and versions (for a key without one, a digest of its object, if it
    is plain data) with their pending keys, so a restart reconciles only
    what changed while down (E9); ``flush()`` waits for them to be on disk.
    An ``EtcdSource`` also keeps its values there (etcd's bytes, which
    ``decode`` reads again), so a
    restart loads them and resumes etcd's stream from the kept revision
    instead of listing the prefix again (it relists only if that revision
    was compacted)."""

    def __new__(
        cls,
        source: Union[PollingSource, EtcdSource, Source],
        *,
        name: Optional[str] = None,
        indexes: Optional[Dict[str, Callable[[Any, Any], object]]] = None,
        store: Union[SqliteStore, str, PathLike[str], None] = None,
    ) -> Self: ...
    @property
    def name(self) -> str:
        """The cache's name: its row in ``status()`` and its metrics' ``cache`` label."""
    def get(self, key: _Key) -> Any:
        """The last state seen of ``key``; None when absent."""
    def keys(self) -> List[Any]:
        """Every key held now, in no particular order."""
    def __len__(self) -> int: ...
    def __contains__(self, key: object, /) -> bool: ...
    def by_index(self, index: str, value: _Key) -> List[Any]:
        """Keys whose index function gave ``value`` (KeyError: unknown index)."""
    @property
    def synced(self) -> bool:
        """Whether the first list has been applied."""
    def wait_synced(self, timeout: Optional[_Seconds] = None) -> bool:
        """Waits (GIL released) until the first list has been applied; returns whether it was, False
        at once if the cache is stopped unsynced, or after ``timeout`` seconds (None: no limit)."""
    def stats(self) -> _CacheStats:
        """A dict: name, synced, keys, position, relists, resumed, events, errors, last_error,
        last_error_time."""
    def flush(self) -> None:
        """Blocks until every change applied before the call is on disk with what it enqueued (E9)."""
    def start(self) -> None:
        """Starts the cache's thread (a controller that watches it starts it too). ``RuntimeError``
        once stopped: a cache runs once."""
    def stop(self, timeout: Optional[_Seconds] = None) -> bool:
        """Whether the cache's thread exited within ``timeout`` (a source that ignores its stop event is left behind)."""
    def _stop_at_exit(self, timeout: float) -> None: ...
    def __enter__(self) -> Self:
        """The cache itself, not started (``watch_cache`` or ``start()`` starts it)."""
    def __exit__(self, *_args: object) -> None:
        """Stops the cache, waiting for its thread at most ``reconq._lifecycle.WITH_EXIT_TIMEOUT`` seconds."""

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
    panics: int
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
    """A pool of worker threads calling ``reconcile(key)`` for keys enqueued,
    never two at once for one key.

    ``reconcile`` returns None (success), ``Requeue()`` / ``Requeue(after=s)``, or
    raises ``RetryAfter(s)``, ``PermanentError`` (no retry; see ``parked()``) or
    anything else (retried with the rate limiter's backoff). Any other return
    value is a failure (TypeError). Every exception is a failure, including
    ``KeyboardInterrupt`` and ``SystemExit``: a worker never dies. Failures are
    logged on the "reconq" logger.

    Keyword-only arguments (durations in seconds; docs/guarantees.md has
    the details):

    - ``workers=1``: worker threads, at least 1.
    - ``rate_limiter=None``: the retry back-off (a ``RateLimiter``); None means
      ``default_rate_limiter()``.
    - ``name="controller"``: the name in logs, metrics, ``status()`` and a
      store.
    - ``hanging_threshold=None``: report reconciles running longer than this
      (``stats()["hanging"]``, the status table, a log line).
    - ``timeout=None``: cancel a reconcile running longer than this; it then
      counts as a failure and is retried.
    - ``group=None``: ``group(key)`` names the key's group, for
      ``max_in_flight_per_group``.
    - ``max_in_flight_per_group=None``: at most this many reconciles of one
      group at once.
    - ``clock=None``: a ``FakeClock`` that every delay and back-off is measured
      on (tests).
    - ``jitter=None``: ``(fraction, seed)``: retry delays scaled by a seeded
      random factor in [1 - fraction, 1 + fraction].
    - ``parked_capacity=None``: the most permanently failed keys kept.
    - ``leader_election=None``: a ``LeaderElection``: reconcile only while this
      process leads.
    - ``store=None``: a ``SqliteStore`` or a path: pending and parked keys and
      failure counts survive a restart.
    - ``sharding=None``: a ``Sharding``: reconcile only the keys of the
      partitions this replica owns; on gaining partitions, the keys of those
      partitions that the watched caches map to are enqueued (deletes too).
    - ``resync=None``: with ``sharding``, a callable listing every key; called
      when partitions are gained (for keys no watched cache maps to).
    - ``sync_timeout=120.0``: while a cache watched at start has not synced,
      an ERROR every this many seconds names it and its last error.
    - ``supersede=False``: a key that becomes ready while it is reconciled
      cancels that reconcile (counted as ``superseded``) and runs again after
      it, with the higher of the two priorities; not when the reconcile
      enqueued its own key.
    - ``debounce=None``: seconds: an enqueue, a watch or cache event or a
      trigger makes the key due this long after the latest of them, but at
      most 10 times this after the first of the burst.
    - ``loop=None``: the asyncio event loop ``async def`` reconciles run on
      (running, on a thread of the user's); None: a loop on a thread of the
      controller's own (``reconq-<name>-asyncio``), started at the first
      coroutine and ended by ``stop()`` once the workers exited.

    ``reconcile`` may be an ``async def`` function (or return any awaitable):
    the worker runs the coroutine as a task on that loop and waits for it
    with the GIL released; its result or exception counts as a sync
    reconcile's would. A cancellation (stop, ``cancel(key)``, ``timeout``,
    ``supersede``, lost leadership or partition) cancels the task, and the
    coroutine sees ``asyncio.CancelledError``; ``reconq.context()`` works inside."""

    def __new__(
        cls,
        reconcile: Callable[[Any], Union[Optional[Requeue], Awaitable[Optional[Requeue]]]],
        *,
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
        loop: Optional[AbstractEventLoop] = None,
    ) -> Self: ...
    @property
    def name(self) -> str:
        """The controller's name."""
    @property
    def workers(self) -> int:
        """The number of worker threads."""
    def enqueue(self, key: _Key, priority: int = 0) -> None:
        """Asks for ``key`` to be reconciled, at ``priority`` (higher first; an enqueue raises a
        waiting key's priority, never lowers it). Ignored once stopped."""
    def enqueue_after(self, key: _Key, seconds: _Seconds, priority: int = 0) -> None:
        """Asks for ``key`` to be reconciled ``seconds`` from now (<= 0: now)."""
    def enqueue_at(self, key: _Key, t: _Seconds, priority: int = 0) -> None:
        """Asks for ``key`` to be reconciled at ``t``, a ``time.time()`` timestamp (a time in the
        past means now)."""
    def start(self) -> None:
        """Starts the worker threads and returns at once. Raises RuntimeError if it was started
        before or stopped (a controller runs once: make a new one), and, with nothing left
        running and the controller stopped, if the OS refuses a thread (each worker needs a
        stack: thousands of workers can exceed a memory or thread limit)."""
    def run(self, stop_timeout: Optional[_Seconds] = None) -> None:
        """Starts, then blocks until the controller is stopped (by ``stop()`` from another thread).
        Ctrl-C (SIGINT) or SIGTERM (when it has no handler of the program's own) stops it with
        drain, for at most ``stop_timeout`` seconds (None: until the reconciles return); a second
        signal during the drain stops at once (running reconciles are cancelled and left to
        return on their own). Either way ``run()`` then returns normally; the keys it left are
        logged. After ``start()``, it only blocks until the controller is stopped; stopped before
        it ever started, it raises RuntimeError, as ``start()`` does. Raises RuntimeError when
        called from one of this controller's reconciles (it would wait for itself)."""
    def stop(self, drain: bool = True, timeout: Optional[_Seconds] = None) -> bool:
        """Stops the controller; returns whether every worker finished within ``timeout`` seconds
        (None: no limit). With ``drain``, keys ready now are still reconciled and delayed keys
        dropped; without, workers finish their current reconcile and ready keys are abandoned.
        Every trigger's stop event is set. Stopping twice, or before start, returns True. Called
        from a reconcile of this controller, it starts the stop and returns False at once (it
        cannot wait for itself)."""
    def stop_with_report(self, timeout: Optional[_Seconds] = None) -> _StopReport:
        """``stop(drain=True, timeout)`` that also says what it left: a dict with ``finished``
        (every worker finished in time), ``unfinished`` (keys whose reconcile was still running
        at the deadline) and ``dropped`` (keys dropped without a reconcile: waiting on a delay or
        a retry, or ready at the deadline) and, with a store, ``store_error`` (why the stop's
        last flush failed, else None; the file then keeps the last successful flush), and
        ``unfinished_caches``: the names of the caches this stop stopped whose thread was still
        in its source at the deadline (a ``list`` or iterator that ignores its stop event), left
        behind."""
    def wait_idle(self, timeout: Optional[_Seconds] = None) -> bool:
        """Blocks until nothing is ready, being reconciled or waiting for a due time; returns False
        if ``timeout`` seconds passed first. Once it returns True, ``stats()`` counts every
        reconcile that has returned. Keys waiting for a retry or a ``Requeue(after=)`` resync
        count as busy, so a controller that resyncs never becomes idle. Raises RuntimeError when
        called from one of this controller's reconciles (it would wait for itself)."""
    def flush(self) -> None:
        """Blocks (without the GIL) until everything enqueued or changed (done, retried, delayed,
        parked) before the call is on disk in the controller's store, without waiting for
        ``flush_interval``: the point to record a change feed's position from. Raises OSError (or
        ValueError) naming the store error when the write fails (the keys stay pending and are
        written again at the next flush), and RuntimeError before start(). Without a store it
        returns at once; after stop() it returns the outcome of the stop's last flush."""
    def stats(self) -> _ControllerStats:
        """Counters, queue sizes, hanging reconciles, the last error."""
    def owned_partitions(self) -> Set[int]:
        """With ``sharding``: the partitions this replica owns now (empty before start, or while cut
        off from etcd)."""
    def cancel(self, key: _Key) -> bool:
        """Cancels the running reconcile of ``key`` (cooperatively: it sees
        ``reconq.context().cancelled``); returns whether one was running."""
    def inspect(self, key: _Key) -> _KeyInfo:
        """Where ``key`` stands: a dict with ``state`` ("unknown", "ready", "waiting", "running" or
        "parked"), ``attempts``, ``last_error``, ``next_run`` (a time.time() timestamp or None)
        and ``since`` (when the running reconcile started, or None)."""
    def parked(self) -> List[_Key]:
        """Keys that failed permanently (raised PermanentError), oldest first."""
    def requeue_parked(self, key: _Key) -> bool:
        """Takes ``key`` out of the parked set and enqueues it; returns whether it was parked."""
    def watch_cache(
        self,
        cache: Cache,
        *,
        map: Optional[Callable[[Any, Any], Union[_Key, Iterable[_Key], None]]] = None,
        predicate: Optional[Callable[[Any, Any], object]] = None,
        resync: Optional[_Seconds] = None,
        priority: int = 0,
        list_priority: int = -100,
    ) -> None:
        """Reconciles what changes in ``cache`` (guarantees §13): each change enqueues the keys
        ``map(key, obj)`` gives (default: the key; for a delete ``obj`` is the last state held,
        or None; an update maps the old object, then the new one, and enqueues both results), if
        ``predicate(old, new)`` accepts it (default: every delete, every put whose object
        differs); at ``priority`` for live changes and ``list_priority`` for lists, relists and
        the ``resync`` every ``resync`` seconds (on the controller's ``clock``). A ``map`` or
        ``predicate`` that raises is logged and counted (``stats()["handler_errors"]``), and the
        changed key is enqueued. Watched before ``start()``, the cache holds the controller
        until it has synced and its keys reached the controller (and ``start()`` starts it);
        after, it is started at once and holds nothing. Returns at once: the keys a synced cache
        already holds go through ``map`` on a catch-up thread of the cache. RuntimeError if the
        cache or the controller was stopped."""
    def wait_synced(self, timeout: Optional[_Seconds] = None) -> bool:
        """Waits until every watched cache has synced and its keys reached the controller (True at once if none)."""
    def set_dependencies(self, key: _Key, parents: Iterable[_Key]) -> None:
        """Makes ``key`` run after ``parents`` (a list or any iterable of keys but a str, bytes or
        tuple, which are keys themselves): replaces its earlier parents (``[]`` clears them),
        enqueues nothing, may be called before start. Raises ``CycleError`` (nothing changed) if
        they would close a cycle, and with ``sharding`` ``ValueError`` (nothing changed) naming the
        key, the parent and both partitions if a parent lies in another partition (C4)."""
    def dependencies(self, key: _Key) -> List[_Key]:
        """``key``'s direct parents (``[]`` if none)."""
    def dependents(self, key: _Key) -> List[_Key]:
        """``key``'s direct dependents (``[]`` if none)."""
    def batch(self) -> Batch:
        """A batch, for a ``with`` block (guarantees §15, U3): while any block is open (any thread,
        nested or overlapping), no key that becomes ready is handed out; when the last one exits,
        they are scheduled together, parents first. May be used before start."""
    def add_trigger(self, key: _Key, fn: Callable[[StopEvent], object]) -> None:
        """Runs ``fn(stop_event)`` (``stop_event`` a ``StopEvent``) on its own thread and
        enqueues ``key`` when it returns, unless it raised or its stop event was set. A second
        trigger for ``key`` replaces (stops) this one; ``remove_trigger(key)`` and ``stop()`` set
        its stop event. Ignored once stopped."""
    def remove_trigger(self, key: _Key) -> bool:
        """Sets the stop event of the trigger for ``key`` (it will not enqueue); returns whether
        there was one running."""
    def watch(self, iterable: Iterable[Any], transform: Optional[Callable[[Any], object]] = None) -> None:
        """Consumes ``iterable`` on its own thread and enqueues ``transform(event)`` (or the event
        itself) for each event: a list enqueues each element, anything else (a tuple too) is one
        key. Bad keys and exceptions in ``transform`` are logged and skipped; an exception from
        the iterable ends the watch. Ignored once stopped."""
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
    def port(self) -> int:
        """The port the server listens on."""
    @property
    def addr(self) -> str:
        """The address the server listens on."""
    @property
    def closed(self) -> bool:
        """Whether ``close()`` was called."""
    def close(self) -> None:
        """Stops the server (waits for its accepting thread; connections being answered end on their
        own, each within 5 s). Closing twice is fine."""
    def __enter__(self) -> Self: ...
    def __exit__(self, *_args: object) -> None: ...

def start_http_server(port: int = 0, addr: str = "127.0.0.1") -> MetricsServer:
    """Serves ``GET /metrics`` on ``addr:port`` from one background thread (no CPU while idle), and
    ``/status`` (the status table; JSON on ``Accept: application/json`` or ``?format=json``),
    ``/healthz`` and ``/readyz`` (Kubernetes probes: 200 ``ok``, or 503 with one line per
    problem). ``port=0`` picks a free port (see ``.port``). ``addr`` defaults to 127.0.0.1 (this
    machine only); pass ``addr="0.0.0.0"`` for a scrape from outside a container. Returns a
    ``MetricsServer``; the server runs until it is closed (``close()``, or a ``with`` block) or
    the process ends, even if the returned object is dropped."""

"""reconq: a synchronous controller engine.

A deduplicating, delaying, rate-limiting work queue (client-go's
``workqueue`` semantics) and a reconcile loop on OS threads, implemented in
Rust. Keys are ``str``, ``int`` (64-bit; ``bool`` counts as ``int``),
``bytes``, or tuples of these, nested. A key comes back equal (``==``) to the
one added, though not always of the same type: ``True`` comes back as ``1``,
a ``str`` subclass as a plain ``str``.
"""

from . import _lifecycle  # noqa: F401  (exit and fork: reconq._lifecycle)
from ._native import (
    Batch,
    Cache,
    Context,
    Controller,
    EtcdSource,
    ExponentialBackoff,
    FakeClock,
    FastSlow,
    LeaderElection,
    Manager,
    MaxOf,
    MetricsServer,
    PollingSource,
    RateLimiter,
    Sharding,
    Source,
    SqliteStore,
    TokenBucket,
    WithMaxWait,
    WorkQueue,
    __version__,
    context,
    default_rate_limiter,
    format_status,
    partition_of,
    status,
    metrics_text,
    start_http_server,
)
from ._errors import CycleError, ReconqError, ShutDown, StoreLocked
from ._results import PermanentError, Requeue, RetryAfter
from ._sources import Bookmark, Delete, PositionExpired, Put
from ._triggers import StopEvent
from ._types import Key

# At exit, one hook stops running controllers, then managers, then
# elections, then caches; after os.fork() the child forgets the parent's (reconq._lifecycle).
#
# `reconq.status()` and `reconq.format_status()` report every live
# controller and manager controller; `python -m reconq.status_demo` shows the
# table for a small demo (reconq/status_demo.py).

__all__ = [
    "Batch",
    "Bookmark",
    "Cache",
    "Context",
    "Delete",
    "EtcdSource",
    "Key",
    "LeaderElection",
    "Controller",
    "CycleError",
    "ExponentialBackoff",
    "FakeClock",
    "FastSlow",
    "Manager",
    "MaxOf",
    "MetricsServer",
    "PermanentError",
    "PollingSource",
    "PositionExpired",
    "Put",
    "RateLimiter",
    "ReconqError",
    "Requeue",
    "RetryAfter",
    "Sharding",
    "ShutDown",
    "Source",
    "SqliteStore",
    "StopEvent",
    "StoreLocked",
    "TokenBucket",
    "WithMaxWait",
    "WorkQueue",
    "__version__",
    "context",
    "default_rate_limiter",
    "partition_of",
    "format_status",
    "status",
    "metrics_text",
    "start_http_server",
]

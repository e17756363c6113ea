"""The exceptions reconq raises, under one base class, ``ReconqError``.

Defined in Python rather than in the extension so that ``CycleError`` can
be both a ``ReconqError`` and a ``ValueError`` (an extension exception has
one base); the extension raises these classes (``pyo3::import_exception!``
in src/python/errors.rs and store.rs).

What a user raises *to* reconq (``RetryAfter``, ``PermanentError`` from a
reconcile, ``PositionExpired`` from a source) is not a ``ReconqError``: those
are signals reconq catches, not errors it reports, and an
``except reconq.ReconqError`` around code that reconciles must not swallow
them on their way out.
"""

__all__ = ["CycleError", "ReconqError", "ShutDown", "StoreLocked"]


class ReconqError(Exception):
    """The base class of the exceptions reconq raises (``ShutDown``, ``CycleError``,
    ``StoreLocked``): ``except reconq.ReconqError`` catches any of them."""


class ShutDown(ReconqError):
    """Raised by ``WorkQueue.get()`` once the queue is shut down and nothing is ready."""


class CycleError(ReconqError, ValueError):
    """Raised by ``Controller.set_dependencies()`` when the parents would close a cycle (the
    message names every key of it); nothing was changed. Also a ``ValueError``."""


class StoreLocked(ReconqError):
    """Raised by ``start()`` when another live controller holds this name in the store file."""


# Shown, and pickled, as `reconq.X`: the name users import them by.
for _cls in (ReconqError, ShutDown, CycleError, StoreLocked):
    _cls.__module__ = "reconq"
del _cls

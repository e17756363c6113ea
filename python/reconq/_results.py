"""What a reconcile function returns or raises to steer the controller.

| reconcile does                      | controller does                      |
| ----------------------------------- | ------------------------------------ |
| returns None                        | forget(key); success                 |
| returns Requeue()                   | add_rate_limited(key); requeue       |
| returns Requeue(after=s)            | forget(key), add_after(key, s);      |
|                                     | success (a resync)                   |
| raises RetryAfter(s)                | add_after(key, s); failure           |
| raises PermanentError(...)          | forget(key), no retry; failure       |
| raises any other exception          | add_rate_limited(key); failure       |
"""

from __future__ import annotations

import math
from typing import Optional, Tuple, Type, Union

__all__ = ["PermanentError", "Requeue", "RetryAfter"]

Seconds = Union[int, float]


def _check_seconds(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{what} must be a number of seconds, not {type(value).__name__}")
    seconds = float(value)  # OverflowError for ints too big for a float
    if math.isnan(seconds):
        raise ValueError(f"{what} must not be NaN")
    if seconds < 0:
        raise ValueError(f"{what} must not be negative, got {value!r}")
    if math.isinf(seconds):
        raise OverflowError(f"{what} is out of range: {value!r}")
    return seconds


class Requeue:
    """Return this from a reconcile to run the key again.

    ``Requeue()`` re-adds the key through the rate limiter;
    ``Requeue(after=s)`` forgets its failures and re-adds it ``s`` seconds
    from now.
    """

    __slots__ = ("after",)

    after: Optional[float]

    def __init__(self, after: Optional[Seconds] = None) -> None:
        self.after = None if after is None else _check_seconds(after, "after")

    def __repr__(self) -> str:
        return "reconq.Requeue()" if self.after is None else f"reconq.Requeue(after={self.after!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Requeue):
            return NotImplemented
        return self.after == other.after

    def __hash__(self) -> int:
        return hash((Requeue, self.after))


class RetryAfter(Exception):
    """Raise this from a reconcile to retry the key ``seconds`` from now.

    Counted as a failure; the rate limiter is not consulted.
    """

    after: float
    message: Optional[str]

    def __init__(self, seconds: Seconds, message: Optional[str] = None) -> None:
        self.after = _check_seconds(seconds, "seconds")
        self.message = message
        if message is None:
            super().__init__(f"retry after {self.after} s")
        else:
            super().__init__(message)

    def __reduce__(self) -> Tuple[Type[RetryAfter], Tuple[float, Optional[str]]]:
        return (type(self), (self.after, self.message))


class PermanentError(Exception):
    """Raise this from a reconcile for a failure that retrying cannot fix.

    The key is forgotten and not retried (until it is added again).
    """


for _cls in (Requeue, RetryAfter, PermanentError):
    _cls.__module__ = "reconq"
del _cls

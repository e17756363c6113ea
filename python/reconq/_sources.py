"""The events a ``reconq.Source``'s change stream yields, and the exception
that says its position is gone (docs/sources.md, "Caches and sources from
Python").

``changes(position, stop)`` returns an iterator of ``Put``, ``Delete`` and
``Bookmark``; an event with a ``position`` moves the cache's position there
once applied (a later resume starts from it), one without leaves it as it
was. Raising ``PositionExpired`` (from ``changes`` or its iterator) makes the
cache relist; raising anything else, or ending, is a break: the stream is
resumed from the last position applied (after a back-off when it is the
second end in a row with no change and no new position applied, such as a
lone ``Bookmark`` at the position asked for: a "nothing yet" is not called
again in a loop).

Plain Python classes, like ``Requeue`` and ``RetryAfter``: the cache reads
their fields, so subclasses work too.
"""

from __future__ import annotations

from typing import Any, ClassVar

__all__ = ["Bookmark", "Delete", "PositionExpired", "Put"]


class Put:
    """``key`` now holds ``obj``. ``version`` (if any) identifies this state
    of the key; a relist that finds the same object and version is no
    change."""

    __slots__ = ("key", "obj", "position", "version")
    key: Any
    obj: Any
    position: Any
    version: Any

    def __init__(self, key: Any, obj: Any, position: Any = None, version: Any = None) -> None:
        self.key = key
        self.obj = obj
        self.position = position
        self.version = version

    def __repr__(self) -> str:
        return f"Put({self.key!r}, {self.obj!r}, position={self.position!r}, version={self.version!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Put):
            return NotImplemented
        return (self.key, self.obj, self.position, self.version) == (other.key, other.obj, other.position, other.version)

    __hash__: ClassVar[None] = None  # type: ignore[assignment]  # mutable, compared by value


class Delete:
    """``key`` is gone."""

    __slots__ = ("key", "position")
    key: Any
    position: Any

    def __init__(self, key: Any, position: Any = None) -> None:
        self.key = key
        self.position = position

    def __repr__(self) -> str:
        return f"Delete({self.key!r}, position={self.position!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Delete):
            return NotImplemented
        return (self.key, self.position) == (other.key, other.position)

    __hash__: ClassVar[None] = None  # type: ignore[assignment]


class Bookmark:
    """Nothing changed up to ``position``: a later resume starts there."""

    __slots__ = ("position",)
    position: Any

    def __init__(self, position: Any) -> None:
        self.position = position

    def __repr__(self) -> str:
        return f"Bookmark({self.position!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Bookmark):
            return NotImplemented
        return bool(self.position == other.position)

    __hash__: ClassVar[None] = None  # type: ignore[assignment]


class PositionExpired(Exception):
    """Raised by a source's ``changes`` (or its iterator): the position asked
    for is gone (compacted, or the system's history was reset), so the cache
    relists."""

"""reconq's metrics for ``prometheus_client`` programs.

>>> from prometheus_client import REGISTRY, start_http_server
>>> from reconq.prometheus import Collector
>>> REGISTRY.register(Collector())   # doctest: +SKIP

Each ``collect()`` reads reconq's current values (``reconq.metrics_text()``,
rendered in Rust with the GIL released) and yields them as
``prometheus_client`` metric families, so they are served and pushed with
the program's own metrics. ``prometheus_client`` is imported only when
collecting: reconq itself does not depend on it.

Register one ``Collector`` per registry: its ``describe()`` is empty (the
series appear as queues and controllers are created), so the registry
cannot detect a second one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator, List

from ._native import metrics_text

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

__all__ = ["Collector"]


class Collector:
    """A ``prometheus_client`` custom collector of every named reconq queue's
    and controller's metrics (``workqueue_*``, ``controller_runtime_*``)."""

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.parser import text_string_to_metric_families

        yield from text_string_to_metric_families(metrics_text())

    def describe(self) -> List[Metric]:
        return []

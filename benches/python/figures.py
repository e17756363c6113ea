"""Summaries the benchmark scripts share."""

from __future__ import annotations

from typing import List


def percentile(values: List[float], q: float) -> float:
    """The `q` quantile (0..1) of `values`, nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]

"""Waiting in tests: poll a condition against a generous deadline, so tests
stay deterministic on a loaded machine (never sleep, then assert)."""

from __future__ import annotations

import time
from typing import Any, Callable

import pytest

#: How long anything that must eventually happen may take before the test fails.
PATIENCE = 10.0


def wait_for(cond: Callable[[], Any], timeout: float = PATIENCE, what: str = "condition") -> Any:
    """Polls `cond` until it is truthy and returns its value; fails the test
    after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.005)

"""CPU time of one of this process's threads, for idle tests (G8): an idle
cache or controller blocks, so its thread's CPU time does not grow."""

from __future__ import annotations

import os


def thread_cpu_seconds(name: str) -> float:
    """CPU time (user + system) of this process's thread named `name` (its
    first 15 characters, as Linux keeps them)."""
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                comm = f.read().strip()
            with open(f"/proc/self/task/{task}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if comm == name[:15]:
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    raise AssertionError(f"no thread named {name!r}")

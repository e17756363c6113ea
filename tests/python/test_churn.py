"""Many controllers and managers created and stopped in a loop: their
threads are joined (the process's thread count returns to where it started)
and they do not pile up in memory."""

from __future__ import annotations

import gc
import os
import sys

import reconq
from waiting import wait_for


def thread_count() -> int:
    return len(os.listdir("/proc/self/task"))


def test_hundreds_of_controllers_leave_no_threads_or_references_behind() -> None:
    def reconcile(key: object) -> None:
        return None

    gc.collect()
    before_threads = thread_count()
    refs_before = sys.getrefcount(reconcile)
    for i in range(300):
        c = reconq.Controller(reconcile, workers=2)
        c.start()
        c.enqueue(i)
        assert c.wait_idle(10)
        assert c.stop(drain=True, timeout=10)
        m = reconq.Manager()
        m.update("job", do=lambda: None)
        m.remove_all(wait=True)
    del c, m
    gc.collect()
    wait_for(lambda: thread_count() <= before_threads, what="engine threads to exit")
    assert sys.getrefcount(reconcile) == refs_before, "controllers kept references to the callback"

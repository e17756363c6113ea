"""A controller whose threads cannot all be made (issue 16): start() raises a
clean RuntimeError, nothing is left running, and the controller is stopped.
Run in a child process under a memory limit (RLIMIT_AS), so the limit cannot
disturb other tests."""

from __future__ import annotations

import subprocess
import sys
import textwrap

CHILD = textwrap.dedent(
    """
    import os, resource, threading
    import reconq

    def tasks():
        return len(os.listdir("/proc/self/task"))

    def vm_bytes():
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024

    c = reconq.Controller(lambda key: None, workers=1024, name="huge")
    c.enqueue("k")
    before = tasks()
    # Room for a few dozen worker stacks, not 1,024.
    limit = vm_bytes() + 256 * 1024 * 1024
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    try:
        c.start()
    except RuntimeError as e:
        print("error:", e)
    else:
        print("started")
    resource.setrlimit(resource.RLIMIT_AS, (hard, hard))
    print("state:", c.stats()["state"])
    print("threads left:", tasks() - before)
    c.enqueue("k2")
    print("depth:", c.stats()["depth"])
    small = reconq.Controller(lambda key: None, workers=2)
    small.start(); small.enqueue(1)
    print("a small controller still works:", small.wait_idle(10))
    small.stop()
    """
)


def test_a_start_the_os_refuses_is_a_clean_runtime_error():
    proc = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=120)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert 'error: controller "huge" could not start: cannot spawn worker thread' in out, out + proc.stderr
    assert "of 1024" in out
    assert "state: stopped" in out
    assert "threads left: 0" in out
    assert "depth: 0" in out
    assert "a small controller still works: True" in out

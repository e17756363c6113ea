"""A controller whose threads cannot all be made (issue 16): start() raises a
clean RuntimeError, nothing is left running, and the controller is stopped.
Run in a child process under a memory limit (RLIMIT_AS), so the limit cannot
disturb other tests."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

CHILD = textwrap.dedent(
    """
    import os, resource, threading
    import reconq

    STACK = int(os.environ["RUST_MIN_STACK"])

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
    # Room for four worker stacks (RUST_MIN_STACK, below) and 64 MiB more,
    # not 1,024 stacks: the spawn that fails leaves that slack, so the
    # threads already made can still allocate their thread-local data
    # (glibc aborts a thread that cannot).
    limit = vm_bytes() + 4 * STACK + 64 * 1024 * 1024
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
    # Large worker stacks make the address-space limit count stacks, not
    # whatever else the process maps; one malloc arena keeps glibc from
    # reserving 64 MiB per thread out of the slack.
    env = dict(os.environ, RUST_MIN_STACK=str(128 * 1024 * 1024), MALLOC_ARENA_MAX="1")
    proc = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=120, env=env)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert 'error: controller "huge" could not start: cannot spawn worker thread' in out, out + proc.stderr
    assert "of 1024" in out
    assert "state: stopped" in out
    assert "threads left: 0" in out
    assert "depth: 0" in out
    assert "a small controller still works: True" in out

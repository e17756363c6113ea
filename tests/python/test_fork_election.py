"""os.fork() while this process leads an election (reconq._lifecycle): each
forked child forgets the parent's controllers, managers and elections, runs
its own controller and exits at once through the exit hooks, without
touching the parent's leadership; the parent then still leads under the same
token and, at its own exit, hands over to a standby at once."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

import reconq
from etcd_server import Etcd
from waiting import PATIENCE, wait_for

FORKS = 50

PARENT = textwrap.dedent(
    """
    import os, sys, time, reconq
    from waiting import wait_for

    le = reconq.LeaderElection(ENDPOINT, "fork", ttl=30, identity="parent")
    le.start()
    c = reconq.Controller(lambda key: None, name="parent", leader_election=le)
    c.start()
    manager = reconq.Manager(leader_election=le)
    # It runs once (no interval): at each fork no engine thread is busy, so
    # none holds a lock the child would inherit held (docs/lifecycle.md).
    manager.update("tick", do=lambda: None)
    wait_for(lambda: le.is_leader, what="leadership")
    wait_for(lambda: manager.status()[0]["successes"] == 1, what="the manager's run")
    token = le.fencing_token

    for round in range(FORKS):
        pid = os.fork()
        if pid == 0:
            assert reconq._lifecycle.running() == [], "the child kept the parent's controllers"
            seen = []
            child = reconq.Controller(seen.append, name="child")
            child.start()
            child.enqueue(round)
            assert child.wait_idle(60) and seen == [round], seen
            sys.exit(0)  # the exit hooks run here, in the child
        deadline = time.monotonic() + 60
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.kill(pid, 9)
                sys.exit(f"child {round} hung at exit")
            time.sleep(0.01)
        assert os.waitstatus_to_exitcode(status) == 0, f"child {round} exited with {status}"

    assert le.is_leader and le.fencing_token == token, "a child's exit touched the parent's leadership"
    print("forked", FORKS, flush=True)
    """
)


@pytest.mark.timeout(FORKS * 60 + 120)
def test_forked_children_of_a_leader_exit_cleanly_and_leave_its_leadership(etcd: Etcd) -> None:
    script = PARENT.replace("ENDPOINT", repr(etcd.endpoint)).replace("FORKS", str(FORKS))
    parent = subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=str(__import__("pathlib").Path(__file__).parent),
    )
    out, err = parent.communicate(timeout=FORKS * 60 + 60)
    assert parent.returncode == 0, err
    assert f"forked {FORKS}" in out, (out, err)
    # The parent's exit gave its 30 s lease up: a standby leads long before it
    # could have expired.
    standby = reconq.LeaderElection(etcd.endpoint, "fork", ttl=30, identity="standby")
    standby.start()
    try:
        wait_for(lambda: standby.is_leader, timeout=PATIENCE, what="the standby to lead well before 30 s")
    finally:
        standby.stop()

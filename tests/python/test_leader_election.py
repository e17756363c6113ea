"""reconq.LeaderElection on a real etcd (guarantees §10): one leader, fencing
tokens in reconq.context(), hand-over on stop and at interpreter exit, bad
input."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from typing import Any, List, Optional, Tuple

import pytest

import reconq
from etcd_server import Etcd
from waiting import PATIENCE, wait_for


def test_only_the_leader_reconciles_with_its_token_and_a_standby_takes_over(etcd: Etcd, make: Any) -> None:
    lock = threading.Lock()
    done: List[Tuple[str, Any, Optional[int]]] = []

    def reconciler(who: str) -> Any:
        def reconcile(key: Any) -> None:
            with lock:
                done.append((who, key, reconq.context().fencing_token))

        return reconcile

    ea = reconq.LeaderElection(etcd.endpoint, "py", ttl=2, identity="a")
    eb = reconq.LeaderElection([etcd.endpoint], "py", ttl=2, identity="b")
    a = make(reconciler("a"), leader_election=ea)
    b = make(reconciler("b"), leader_election=eb)
    a.start()
    b.start()
    for key in range(10):
        a.enqueue(key)
        b.enqueue(key)
    wait_for(lambda: ea.is_leader or eb.is_leader, what="a leader")
    leader, leader_c, standby, standby_c = (ea, a, eb, b) if ea.is_leader else (eb, b, ea, a)
    assert leader_c.wait_idle(PATIENCE)
    assert standby_c.stats()["reconciles"] == 0 and standby_c.stats()["depth"] == 10
    first_token = leader.fencing_token
    assert first_token is not None and {t for (_, _, t) in done} == {first_token}
    wait_for(lambda: standby.leader == leader.leader, what="the standby to see the leader")

    leader_c.stop()
    leader.stop()
    wait_for(lambda: standby.is_leader, what="the standby to take over")
    assert standby_c.wait_idle(PATIENCE)
    second_token = standby.fencing_token
    assert second_token is not None and second_token > first_token
    assert sorted(k for (w, k, _) in done if w == ("b" if leader is ea else "a")) == list(range(10))
    standby.stop()


def leading_child(etcd: Etcd, election: str, then: str) -> "subprocess.Popen[str]":
    """A child process whose controller leads `election` (Python source,
    with ENDPOINT for the test etcd's); returns once it leads, while the
    child goes on with `then`."""
    child = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import reconq
            from waiting import wait_for
            le = {election.replace("ENDPOINT", repr(etcd.endpoint))}
            c = reconq.Controller(lambda key: None, leader_election=le)
            c.start()
            wait_for(lambda: le.is_leader, what="leadership")
            print("leading", flush=True)
            {then}
        """)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=str(__import__("pathlib").Path(__file__).parent),
    )
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "leading"
    return child


def test_interpreter_exit_gives_leadership_up_at_once(etcd: Etcd) -> None:
    # A 30 s lease: without the exit revoking it, the standby would wait 30 s.
    child = leading_child(etcd, 'reconq.LeaderElection(ENDPOINT, "exit", ttl=30, identity="child")', then="pass")
    standby = reconq.LeaderElection(etcd.endpoint, "exit", ttl=30, identity="parent")
    standby.start()
    assert child.wait(PATIENCE) == 0
    wait_for(lambda: standby.is_leader, timeout=PATIENCE, what="the standby to lead well before 30 s")
    standby.stop()


@pytest.mark.parametrize(
    "kw, error",
    [
        ({"endpoints": "127.0.0.1:2379"}, ValueError),
        ({"endpoints": "http://nohost"}, ValueError),
        ({"endpoints": 5}, TypeError),
        ({"ttl": 1.5}, ValueError),
        ({"ttl": -1}, ValueError),
        ({"on_lost": "panic"}, ValueError),
        ({"name": ""}, ValueError),
    ],
)
def test_bad_input_is_refused(kw: Any, error: type) -> None:
    args = {"endpoints": "http://127.0.0.1:2379", "name": "x", **kw}
    with pytest.raises(error):
        reconq.LeaderElection(**args)


def test_etcd_unreachable_is_a_standby_not_an_exception(make: Any) -> None:
    from etcd_server import free_port

    le = reconq.LeaderElection(f"http://127.0.0.1:{free_port()}", "down")
    c = make(lambda key: pytest.fail("a standby never reconciles"), leader_election=le)
    c.start()
    c.enqueue(1)
    wait_for(lambda: le.last_error is not None, what="the error to show")
    assert not le.is_leader and c.stats()["reconciles"] == 0
    assert c.stats()["state"] == "standby"
    c.stop(drain=False, timeout=PATIENCE)
    le.stop()


def test_a_manager_runs_do_only_while_leading_with_the_token(etcd: Etcd) -> None:
    lock = threading.Lock()
    runs: List[Tuple[str, Any]] = []

    def manager(who: str, election: reconq.LeaderElection) -> reconq.Manager:
        def do() -> None:
            with lock:
                runs.append((who, reconq.context().fencing_token))

        m = reconq.Manager(name=f"mgr-{who}", leader_election=election)
        m.update("sync", do, interval=0.05)
        return m

    ea = reconq.LeaderElection(etcd.endpoint, "py-mgr", ttl=2, identity="a")
    eb = reconq.LeaderElection(etcd.endpoint, "py-mgr", ttl=2, identity="b")
    a = manager("a", ea)
    wait_for(lambda: len(runs) >= 2, what="a to lead and run")
    b = manager("b", eb)
    wait_for(lambda: eb.leader == "a", what="b to see a lead")
    entries = {(e["name"], e.get("manager")): e for e in reconq.status()}
    standby = entries[("sync", "mgr-b")]
    assert standby["state"] == "standby" and standby["is_leader"] is False and standby["leader"] == "a"
    assert entries[("sync", "mgr-a")]["is_leader"] is True
    token = ea.fencing_token

    a.remove_all(wait=True)  # its last controller gone, the campaign ends
    wait_for(lambda: any(who == "b" for who, _ in runs), what="b to lead and run")
    split = next(i for i, (who, _) in enumerate(runs) if who == "b")
    assert set(runs[:split]) == {("a", token)}
    assert eb.fencing_token is not None and eb.fencing_token > token  # type: ignore[operator]
    assert set(runs[split:]) == {("b", eb.fencing_token)}
    b.remove_all(wait=True)


def test_stats_status_and_the_metric_show_who_leads(etcd: Etcd, make: Any) -> None:
    ea = reconq.LeaderElection(etcd.endpoint, "py-status", ttl=2, identity="a")
    eb = reconq.LeaderElection(etcd.endpoint, "py-status", ttl=2, identity="b")
    a = make(lambda key: None, name="py-status-a", leader_election=ea)
    a.start()
    wait_for(lambda: ea.is_leader, what="a to lead")
    b = make(lambda key: None, name="py-status-b", leader_election=eb)
    b.start()
    wait_for(lambda: eb.leader == "a", what="b to see a lead")
    sa, sb = a.stats(), b.stats()
    assert (sa["is_leader"], sa["leader"], sa["fencing_token"]) == (True, "a", ea.fencing_token)
    assert (sb["is_leader"], sb["leader"], sb["fencing_token"], sb["leader_error"]) == (False, "a", None, None)
    states = {e["name"]: e["state"] for e in reconq.status()}
    assert (states["py-status-a"], states["py-status-b"]) == ("running", "standby")
    assert "standby" in reconq.format_status()
    # One vocabulary: stats() says what the status says.
    assert (sa["state"], sb["state"]) == ("running", "standby")
    assert 'leader_election_master_status{name="py-status"} 1' in reconq.metrics_text()

    # The controller was the election's only user: stopping it hands over.
    a.stop()
    wait_for(lambda: eb.is_leader, what="b to take over without ea.stop()")
    b.stop()


def test_on_lost_exit_ends_the_process_with_status_1(etcd: Etcd) -> None:
    child = leading_child(
        etcd,
        'reconq.LeaderElection(ENDPOINT, "exit-on-loss", ttl=2, on_lost="exit")',
        then="__import__('time').sleep(60)  # the exit comes first",
    )
    etcd.pause()  # renewals hang: the leader gives up at its renew deadline
    try:
        assert child.wait(PATIENCE) == 1
    finally:
        etcd.resume()

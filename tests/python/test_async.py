"""`async def` reconciles and Manager `do` functions (issue 35 item 5): they
run as tasks on an asyncio loop the controller owns (or the user's), with
the outcome rules of a sync reconcile, cancelled as a sync one is told to
stop, with reconq.context() inside."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import threading
from typing import Any, Dict, Iterator, List, Optional

import pytest

import reconq
from waiting import PATIENCE, wait_for

FAST_RETRY = reconq.ExponentialBackoff(0.001, 0.01)


def loop_threads() -> List[str]:
    return [t.name for t in threading.enumerate() if t.name.endswith("-asyncio")]


# --- a new user's program ------------------------------------------------------------


class FakeAsyncClient:
    """What an async HTTP or database client looks like to a reconcile:
    every call awaits (here, the loop: asyncio.sleep)."""

    def __init__(self) -> None:
        self.desired: Dict[str, int] = {}
        self.actual: Dict[str, int] = {}
        self.calls = 0

    async def get_desired(self, name: str) -> Optional[int]:
        self.calls += 1
        await asyncio.sleep(0.001)
        return self.desired.get(name)

    async def scale(self, name: str, replicas: Optional[int]) -> None:
        self.calls += 1
        await asyncio.sleep(0.001)
        if replicas is None:
            self.actual.pop(name, None)
        else:
            self.actual[name] = replicas


def test_a_new_users_async_program_converges(make):
    client = FakeAsyncClient()
    client.desired = {f"app-{i}": i for i in range(20)}
    client.actual = {"stale": 3}

    async def reconcile(name: str) -> None:
        desired = await client.get_desired(name)
        if client.actual.get(name) != desired:
            await client.scale(name, desired)

    c = make(reconcile, workers=4, name="scaler")
    c.start()
    for name in [*client.desired, "stale"]:
        c.enqueue(name)
    assert c.wait_idle(PATIENCE)
    assert client.actual == client.desired
    stats = c.stats()
    assert (stats["successes"], stats["failures"]) == (21, 0)
    assert loop_threads() == ["reconq-scaler-asyncio"]
    assert c.stop(timeout=PATIENCE)
    assert loop_threads() == []


def test_a_callable_returning_an_awaitable_is_awaited_too(make):
    done: List[Any] = []

    async def work(key: Any) -> None:
        await asyncio.sleep(0)
        done.append(key)

    c = make(lambda key: work(key))
    c.start()
    c.enqueue("k")
    assert c.wait_idle(PATIENCE)
    assert done == ["k"] and c.stats()["successes"] == 1


# --- outcomes: the same table as a sync reconcile --------------------------------------


def test_exceptions_are_retried_and_context_counts_attempts(make):
    seen: List[Any] = []

    async def reconcile(key: Any) -> None:
        await asyncio.sleep(0)
        ctx = reconq.context()
        seen.append((ctx.key, ctx.attempt, threading.current_thread().name))
        if ctx.attempt < 2:
            raise ValueError("not yet")

    c = make(reconcile, rate_limiter=FAST_RETRY, name="retrying")
    c.start()
    c.enqueue(("ns", "a"))
    assert c.wait_idle(PATIENCE)
    assert seen == [(("ns", "a"), n, "reconq-retrying-asyncio") for n in range(3)]
    stats = c.stats()
    assert (stats["successes"], stats["failures"]) == (1, 2)
    assert stats["last_error"] == "ValueError: not yet"


def test_results_follow_the_sync_table(make):
    runs: Dict[str, int] = {}

    async def reconcile(key: str) -> Any:
        runs[key] = runs.get(key, 0) + 1
        await asyncio.sleep(0)
        if key == "permanent":
            raise reconq.PermanentError("gone")
        if key == "requeue" and runs[key] == 1:
            return reconq.Requeue()
        if key == "bad":
            return 42
        return None

    c = make(reconcile, rate_limiter=FAST_RETRY, parked_capacity=10)
    c.start()
    for key in ("permanent", "requeue"):
        c.enqueue(key)
    assert c.wait_idle(PATIENCE)
    assert runs == {"permanent": 1, "requeue": 2}
    assert list(c.parked()) == ["permanent"]
    c.enqueue("bad")
    wait_for(lambda: runs.get("bad", 0) >= 2, what="a bad result retried")
    assert (c.stats()["last_error"] or "").startswith("TypeError")


# --- cancellation -------------------------------------------------------------------------


class Blocking:
    """An async reconcile that blocks in an await until cancelled the first
    time, recording what it saw; later runs return at once."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.cancelled: List[Any] = []
        self.runs = 0

    async def __call__(self, key: Any) -> None:
        self.runs += 1
        if self.runs > 1:
            return
        ctx = reconq.context()
        self.started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            self.cancelled.append((key, ctx.cancelled))
            raise


def test_a_timeout_cancels_the_task_and_counts_a_timeout_failure(make):
    blocking = Blocking()
    c = make(blocking, timeout=0.2, rate_limiter=FAST_RETRY)
    c.start()
    c.enqueue("k")
    wait_for(lambda: blocking.runs >= 2, what="the retry after the timeout")
    assert c.wait_idle(PATIENCE)
    assert blocking.cancelled == [("k", True)]
    stats = c.stats()
    assert (stats["successes"], stats["failures"]) == (1, 1)
    assert (stats["last_error"] or "").startswith("TimeoutError")


def test_supersede_cancels_the_task_and_runs_the_key_again(make):
    blocking = Blocking()
    c = make(blocking, supersede=True)
    c.start()
    c.enqueue("k")
    assert blocking.started.wait(PATIENCE)
    c.enqueue("k")
    wait_for(lambda: blocking.runs >= 2, what="the superseding run")
    assert c.wait_idle(PATIENCE)
    assert blocking.cancelled == [("k", True)]
    assert c.stats()["superseded"] == 1


def test_stop_cancels_the_task_and_ends_the_loop_thread(make):
    blocking = Blocking()
    c = make(blocking, name="stopping")
    c.start()
    c.enqueue("k")
    assert blocking.started.wait(PATIENCE)
    assert c.stop(drain=False, timeout=PATIENCE)
    assert blocking.cancelled == [("k", True)]
    assert "reconq-stopping-asyncio" not in loop_threads()


def test_cancel_of_a_key_cancels_its_task(make):
    blocking = Blocking()
    c = make(blocking, rate_limiter=FAST_RETRY)
    c.start()
    c.enqueue("k")
    assert blocking.started.wait(PATIENCE)
    assert c.cancel("k")
    wait_for(lambda: blocking.cancelled, what="the task cancelled")
    assert blocking.cancelled == [("k", True)]


def test_stop_from_inside_an_async_reconcile_returns_and_the_loop_ends_after(make):
    returned: List[bool] = []

    async def reconcile(key: Any) -> None:
        # On the loop's thread: waiting for the workers would wait for
        # this very task, so the stop returns at once (as on a worker).
        returned.append(c.stop(drain=False))

    c = make(reconcile, name="self-stopping")
    c.start()
    c.enqueue("k")
    wait_for(lambda: returned, what="stop() to return inside the reconcile")
    assert returned == [False]
    wait_for(lambda: "reconq-self-stopping-asyncio" not in loop_threads(), what="the loop thread to end")


# --- loops ------------------------------------------------------------------------------


@pytest.fixture
def user_loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="users-loop", daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(PATIENCE)
    loop.close()


def test_a_user_loop_runs_the_tasks_and_is_left_running(make, user_loop):
    threads: List[str] = []

    async def reconcile(key: Any) -> None:
        await asyncio.sleep(0)
        threads.append(threading.current_thread().name)
        assert asyncio.get_running_loop() is user_loop
        assert reconq.context().key == key

    c = make(reconcile, loop=user_loop, name="borrowing")
    c.start()
    c.enqueue("k")
    assert c.wait_idle(PATIENCE)
    assert threads == ["users-loop"]
    assert c.stop(timeout=PATIENCE)
    assert user_loop.is_running() and loop_threads() == []


def test_a_bad_loop_is_refused_with_a_clear_error():
    with pytest.raises(TypeError, match="loop must be an asyncio event loop"):
        reconq.Controller(lambda key: None, loop="nope")
    with pytest.raises(TypeError, match="loop must be an asyncio event loop"):
        reconq.Manager("m", loop=42)


def test_many_keys_run_concurrently_but_never_one_key_twice(make):
    workers = 4
    running: Dict[Any, int] = {}
    overlaps: List[Any] = []
    peak = [0]
    crowd = threading.Event()

    async def reconcile(key: Any) -> None:
        running[key] = running.get(key, 0) + 1
        if running[key] > 1:
            overlaps.append(key)
        in_flight = sum(running.values())
        peak[0] = max(peak[0], in_flight)
        if in_flight >= workers:
            crowd.set()
        # The first keys wait for each other: proof the workers wait for
        # their tasks with the GIL released, side by side.
        deadline = asyncio.get_running_loop().time() + PATIENCE
        while not crowd.is_set() and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.001)
        await asyncio.sleep(0)
        running[key] -= 1

    c = make(reconcile, workers=workers)
    c.start()
    for round_ in range(20):
        for key in range(10):
            c.enqueue(key)
    assert c.wait_idle(PATIENCE * 3)
    assert overlaps == []
    assert peak[0] >= workers


# --- Manager ----------------------------------------------------------------------------


def test_a_manager_async_do_runs_on_its_loop_and_remove_cancels_it():
    started = threading.Event()
    seen: List[Any] = []

    async def do() -> None:
        ctx = reconq.context()
        seen.append((ctx.key, threading.current_thread().name))
        started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            seen.append(("cancelled", ctx.cancelled))
            raise

    m = reconq.Manager("jobs")
    m.update("sync-job", do)
    assert started.wait(PATIENCE)
    m.remove_all(wait=True)
    assert seen == [("sync-job", "reconq-jobs-asyncio"), ("cancelled", True)]
    assert loop_threads() == []


def test_a_manager_async_do_failure_is_retried():
    runs: List[int] = []

    async def do() -> None:
        await asyncio.sleep(0)
        runs.append(reconq.context().attempt)
        if len(runs) < 3:
            raise RuntimeError("flaky")

    with reconq.Manager("retrying") as m:
        m.update("job", do, error_retry_base=0.01)
        wait_for(lambda: m.status()[0]["successes"] == 1, what="a success after two failures")
        status = m.status()[0]
        assert status["failures"] == 2 and status["last_error"] is None
    assert runs == [0, 1, 2]


# --- the interpreter's exit -------------------------------------------------------------


def test_exit_with_async_reconciles_still_running_is_clean(tmp_path):
    program = textwrap.dedent(
        """
        import asyncio, threading, reconq

        started = threading.Event()

        async def reconcile(key):
            started.set()
            await asyncio.sleep(0.05)

        async def do():
            await asyncio.sleep(0.05)

        c = reconq.Controller(reconcile, workers=2, name="left")
        c.start()
        for k in range(50):
            c.enqueue(k)
        m = reconq.Manager("left-jobs")
        m.update("job", do, interval=0.01)
        assert started.wait(30)
        print("exiting")
        """
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "exiting\n"
    # The exit hook cancels the manager's running do (logged as a do that
    # raised CancelledError); nothing is left pending or never awaited.
    for unclean in ("never awaited", "Task was destroyed", "Exception ignored", "Fatal Python error", "leaked"):
        assert unclean not in done.stderr, done.stderr


def test_a_program_of_sync_reconciles_never_imports_asyncio() -> None:
    """The loop's machinery is made at the first awaitable: a sync program
    pays neither asyncio's import nor a loop object (it did: 52 modules)."""
    program = (
        "import sys, reconq\n"
        "c = reconq.Controller(lambda key: None, name='sync-only')\n"
        "c.start(); c.enqueue(1); assert c.wait_idle(60); c.stop()\n"
        "m = reconq.Manager('sync-only-jobs'); m.update('job', do=lambda: None); m.remove_all(wait=True)\n"
        "print('asyncio' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False", out.stdout

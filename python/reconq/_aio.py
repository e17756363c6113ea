"""``async def`` reconciles and Manager ``do`` functions: the asyncio side.

The engine has no async runtime and wants none. When a reconcile (or a
Manager ``do``) returns an awaitable, the worker thread that called it hands
the awaitable to an event loop that runs on a thread the binding owns (an
:class:`EventLoopThread`, one per controller or manager, started at the first
awaitable) or on the loop the user passed, and waits with the GIL released
until the task is done (``src/python/awaiting.rs``). This module is what runs
on the loop's side: it creates the task in a copy of the worker's
``contextvars`` context with :func:`reconq.context` answering the reconcile's
context, tells the worker when the task is done, and cancels the task when
the worker asks.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from typing import Any, Awaitable, Callable, Optional

#: The ``reconq.Context`` of the reconcile a task runs, read by
#: ``reconq.context()`` on a loop thread (where no worker's scope is).
CURRENT: "contextvars.ContextVar[Any]" = contextvars.ContextVar("reconq_context")


def current() -> Any:
    """The ``reconq.Context`` of the task running here, or None."""
    return CURRENT.get(None)


class EventLoopThread:
    """The event loop the async reconciles of one controller (or the ``do``
    functions of one manager) run on.

    Without a user loop, a new loop runs on a daemon thread named
    ``reconq-<name>-asyncio``, started by the first :meth:`loop` call and
    ended by :meth:`stop` (after the workers exited); a later :meth:`loop`
    starts a new one (a manager may get controllers again). A user's loop is
    only borrowed: it must be running (on another thread than the workers)
    and :meth:`stop` leaves it alone.
    """

    def __init__(self, name: str, loop: Optional[asyncio.AbstractEventLoop] = None) -> None:
        if loop is not None and not isinstance(loop, asyncio.AbstractEventLoop):
            raise TypeError(f"loop must be an asyncio event loop or None, not {type(loop).__name__}")
        self._name = f"reconq-{name}-asyncio"
        self._user_loop = loop
        self._lock = threading.Lock()
        self._owned: Optional[asyncio.AbstractEventLoop] = None
        self._thread: Optional[threading.Thread] = None

    def loop(self) -> asyncio.AbstractEventLoop:
        """The loop to run on, started if it is ours and not running yet."""
        if self._user_loop is not None:
            return self._user_loop
        with self._lock:
            if self._owned is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=_run_forever, args=(loop,), name=self._name, daemon=True)
                thread.start()
                self._owned, self._thread = loop, thread
            return self._owned

    def on_loop_thread(self) -> bool:
        """Whether the caller runs on this loop's thread (a task of ours)."""
        thread = self._thread
        if self._user_loop is not None:
            try:
                return asyncio.get_running_loop() is self._user_loop
            except RuntimeError:
                return False
        return thread is not None and thread is threading.current_thread()

    def stop(self) -> None:
        """Ends our loop's thread (no-op for a user's loop, or if never
        started). Call only once no worker waits on a task of it: tasks
        still pending are cancelled and given one last pass of the loop."""
        with self._lock:
            loop, thread = self._owned, self._thread
            self._owned = self._thread = None
        if loop is None or thread is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        if thread is not threading.current_thread():
            thread.join()


def _run_forever(loop: asyncio.AbstractEventLoop) -> None:
    asyncio.set_event_loop(loop)
    try:
        loop.run_forever()
    finally:
        pending = asyncio.all_tasks(loop)
        for task in pending:
            task.cancel()
        if pending:
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


class Run:
    """One awaitable running as a task on a loop, for a waiting worker.

    ``done()`` is called on the loop's thread once the task finished
    (however: returned, raised or cancelled), or at once if it could not be
    scheduled; then :meth:`result` gives what the awaitable returned or
    raises what it raised (``asyncio.CancelledError`` if cancelled).
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        awaitable: Awaitable[Any],
        context: Any,
        done: Callable[[], None],
    ) -> None:
        self._loop = loop
        self._task: "Optional[asyncio.Future[Any]]" = None
        self._failed: Optional[BaseException] = None
        self._done = done
        # The task runs in a copy of the worker's context (what the
        # reconcile's caller had set), where reconq.context() answers.
        copied = contextvars.copy_context()
        copied.run(CURRENT.set, context)
        try:
            loop.call_soon_threadsafe(self._start, awaitable, context=copied)
        except RuntimeError as e:  # the loop is closed
            self._fail(e, awaitable)

    def _start(self, awaitable: Awaitable[Any]) -> None:
        try:
            # ensure_future copies the current context: ``copied`` above.
            task = asyncio.ensure_future(awaitable, loop=self._loop)
        except BaseException as e:  # noqa: BLE001 - the worker reports it
            self._fail(e, awaitable)
            return
        self._task = task
        task.add_done_callback(lambda _task: self._done())

    def _fail(self, error: BaseException, awaitable: Awaitable[Any]) -> None:
        close = getattr(awaitable, "close", None)
        if close is not None:
            close()  # no "coroutine was never awaited" warning
        self._failed = error
        self._done()

    def cancel(self) -> None:
        """Asks the task to stop: ``task.cancel()`` on the loop's thread
        (after the task was created: callbacks run in order)."""
        try:
            self._loop.call_soon_threadsafe(self._cancel)
        except RuntimeError:
            pass  # the loop is closed: the task is over

    def _cancel(self) -> None:
        if self._task is not None:
            self._task.cancel()

    def result(self) -> Any:
        """What the awaitable returned; raises what it raised. Only once
        ``done()`` was called."""
        if self._failed is not None:
            raise self._failed
        assert self._task is not None
        return self._task.result()

"""Fuzzing the Python surface with random calls and random (often bad)
arguments (reliability issue).

Every call must either work or raise one of the documented exception types,
and a refused call must change nothing observable: `len(q)`,
`q.num_requeues(k)`, a limiter's memory, a controller's `stats()` counts.
The expected outcome of each call is computed by a small oracle that
mirrors the contract (guarantees §4: keys, durations, timeouts), so a call that
*works* when it should have been refused fails the test too.

Runtime is bounded (`max_examples`, short state machines, `get(timeout=0)`),
so the file runs in a few seconds; it never sleeps and then asserts.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from decimal import Decimal
from fractions import Fraction
from typing import Any, Optional

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import reconq
from waiting import PATIENCE, wait_for

pytestmark = pytest.mark.timeout(120)

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
MACHINE = settings(
    max_examples=25, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)

I64_MIN, I64_MAX = -(2**63), 2**63 - 1
MAX_DEPTH = 64  # src/python/key.rs
DOCUMENTED = (TypeError, ValueError, OverflowError, KeyError, RecursionError, TimeoutError, reconq.ShutDown)


class StrSub(str):
    pass


class BytesSub(bytes):
    pass


class IntSub(int):
    pass


def deep_tuple(depth: int, leaf: Any = "x") -> Any:
    key = leaf
    for _ in range(depth):
        key = (key,)
    return key


# --- strategies --------------------------------------------------------------

atoms = st.one_of(
    st.text(max_size=8),
    st.integers(I64_MIN, I64_MAX),
    st.binary(max_size=8),
    st.booleans(),
    st.sampled_from(["\ud800", "a\udfffb", ""]),  # lone surrogates are valid str keys
    st.builds(StrSub, st.text(max_size=4)),
    st.builds(BytesSub, st.binary(max_size=4)),
    st.builds(IntSub, st.integers(-5, 5)),
)
good_keys = st.recursive(atoms, lambda inner: st.tuples(inner) | st.tuples(inner, inner) | st.tuples(), max_leaves=6)
small_keys = st.one_of(st.sampled_from(["a", "b", "c", 1, 2, True, b"a", ("a", 1), StrSub("b")]))

bad_atoms = st.one_of(
    st.none(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=2**63, max_value=2**200),
    st.integers(min_value=-(2**200), max_value=-(2**63) - 1),
    st.sampled_from([2**63, -(2**63) - 1, 2**64, 10**30]),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
    st.sampled_from([set(), frozenset({1}), bytearray(b"x"), memoryview(b"x"), 1j, Decimal("1.5"), object(), ...]),
    st.sampled_from([deep_tuple(MAX_DEPTH + 1), deep_tuple(200), ("ok", deep_tuple(MAX_DEPTH))]),
)
any_keys = st.one_of(
    good_keys,
    bad_atoms,
    st.tuples(good_keys, bad_atoms),
    st.tuples(bad_atoms, good_keys),
    st.integers(min_value=0, max_value=MAX_DEPTH + 3).map(deep_tuple),
)

numbers = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-(2**80), 2**80),
    st.sampled_from([0, -0.0, 1e-9, -1e-9, 1e19, 1.8e19, 2e19, 2**1100, -(2**1100), 1e308, IntSub(1)]),
    st.sampled_from([None, True, False, "1", b"1", [1], {}, 1j, Decimal("nan"), Fraction(1, 3), object()]),
)


# --- oracle ------------------------------------------------------------------


def key_error(key: Any, depth: int = 0) -> Optional[type]:
    """The exception a key should raise (None: accepted), as src/python/key.rs."""
    if isinstance(key, (str, bytes)):
        return None
    if isinstance(key, int):
        return None if I64_MIN <= key <= I64_MAX else OverflowError
    if isinstance(key, tuple):
        if depth >= MAX_DEPTH:
            return RecursionError
        for item in key:
            err = key_error(item, depth + 1)
            if err is not None:
                return err
        return None
    return TypeError


DURATION_MAX = 18446744073709551615.999999999  # Duration::MAX in seconds


def _as_seconds(value: Any) -> tuple[Optional[type], float]:
    if isinstance(value, bool):
        return TypeError, 0.0
    try:
        secs = float(value)  # __float__ / __index__, as PyFloat_AsDouble
    except OverflowError:
        return OverflowError, 0.0
    except (TypeError, ValueError):
        return TypeError, 0.0
    if isinstance(value, (str, bytes)):
        return TypeError, 0.0
    if math.isnan(secs):
        return ValueError, secs
    return None, secs


def delay_error(value: Any) -> Optional[type]:
    """add_after / enqueue_after: negative means now."""
    err, secs = _as_seconds(value)
    if err is not None:
        return err
    if secs <= 0:
        return None
    return None if secs < DURATION_MAX * 0.999 else OverflowError


def timeout_error(value: Any) -> Optional[type]:
    """get / wait_idle / stop timeouts and limiter parameters: >= 0."""
    if value is None:
        return None
    err, secs = _as_seconds(value)
    if err is not None:
        return err
    if secs < 0:
        return ValueError
    return None if secs < DURATION_MAX * 0.999 else OverflowError


def ambiguous_seconds(value: Any) -> bool:
    """Values too close to Duration::MAX for the oracle to call."""
    err, secs = _as_seconds(value)
    return err is None and DURATION_MAX * 0.9 < abs(secs) < DURATION_MAX * 1.1


def call(expected: Optional[type], fn, *args, **kwargs) -> Any:
    """Calls fn; asserts it works iff expected is None, else raises exactly
    (a subclass of) the expected documented type."""
    if expected is None:
        return fn(*args, **kwargs)
    with pytest.raises(DOCUMENTED) as info:
        fn(*args, **kwargs)
    assert isinstance(info.value, expected), f"{fn.__name__}{args}: {info.value!r}, expected {expected.__name__}"
    return None


# --- keys everywhere ---------------------------------------------------------


@FAST
@given(key=any_keys)
def test_key_conversion_matches_the_contract(key):
    q = reconq.WorkQueue(rate_limiter=reconq.ExponentialBackoff(1000, 1000))
    err = key_error(key)
    before = len(q)
    call(err, q.add, key)
    if err is None:
        assert len(q) == before + 1
        got = q.get(timeout=0)
        assert got == key and hash(got) == hash(key)
        q.done(got)
    else:
        assert len(q) == before
        for method in (q.add_rate_limited, q.forget, q.num_requeues, q.done):
            call(err, method, key)
        call(err, q.add_after, key, 0)
        assert len(q) == 0
    q.shut_down()


# --- WorkQueue state machine ---------------------------------------------------


class WorkQueueMachine(RuleBasedStateMachine):
    """Random good and bad calls against a single-threaded model of the
    queue. The limiter always waits 1000 s, so a rate-limited key never
    becomes ready during the test and `num_requeues` is exact."""

    @initialize()
    def setup(self):
        self.q = reconq.WorkQueue(rate_limiter=reconq.ExponentialBackoff(1000, 1000))
        self.ready: list = []  # FIFO, deduplicated (== semantics)
        self.processing: set = set()
        self.dirty: set = set()
        self.requeues: dict = {}
        self.shut = False
        self.scratch = reconq.WorkQueue()

    def teardown(self):
        if hasattr(self, "q"):
            self.q.shut_down()
            self.scratch.shut_down()

    def _snapshot(self, probe):
        return len(self.q), self.q.num_requeues(probe), self.q.shutting_down

    def _model_add(self, key):
        if self.shut:
            return
        if key in self.processing:
            self.dirty.add(key)
        elif key not in self.ready:
            self.ready.append(key)

    @rule(key=any_keys, probe=small_keys)
    def add(self, key, probe):
        before = self._snapshot(probe)
        err = key_error(key)
        call(err, self.q.add, key)
        if err is None:
            self._model_add(key)
        else:
            assert self._snapshot(probe) == before

    @rule(key=any_keys, seconds=numbers, probe=small_keys)
    def add_after(self, key, seconds, probe):
        if ambiguous_seconds(seconds):
            return
        before = self._snapshot(probe)
        err = key_error(key) or delay_error(seconds)
        call(err, (self.scratch if err is None and float(seconds) > 0 else self.q).add_after, key, seconds)
        if err is not None:
            assert self._snapshot(probe) == before
        elif float(seconds) <= 0:
            self._model_add(key)
        else:
            # A positive delay: accepted (checked above); the model cannot
            # say when it fires, so the key goes to a scratch queue and the
            # main one gets the same key delayed past the test's end.
            self.q.add_after(key, 1000)

    @rule(key=any_keys, probe=small_keys)
    def add_rate_limited(self, key, probe):
        before = self._snapshot(probe)
        err = key_error(key)
        call(err, self.q.add_rate_limited, key)
        if err is None:
            self.requeues[key] = self.requeues.get(key, 0) + 1
        else:
            assert self._snapshot(probe) == before

    @rule(key=any_keys, probe=small_keys)
    def forget(self, key, probe):
        before = self._snapshot(probe)
        err = key_error(key)
        call(err, self.q.forget, key)
        if err is None:
            self.requeues.pop(key, None)
        else:
            assert self._snapshot(probe) == before

    @rule(key=any_keys)
    def num_requeues(self, key):
        err = key_error(key)
        n = call(err, self.q.num_requeues, key)
        if err is None:
            assert n == self.requeues.get(key, 0)

    @rule(timeout=st.one_of(st.just(0), st.just(0.0), st.just(0.001), numbers), probe=small_keys)
    def get(self, timeout, probe):
        if ambiguous_seconds(timeout) or timeout is None:
            timeout = 0
        err = timeout_error(timeout)
        if err is None and not self.ready and float(timeout) > 0.01:
            timeout = 0.001  # never block long on an empty queue
        before = self._snapshot(probe)
        if err is not None:
            call(err, self.q.get, timeout=timeout)
            assert self._snapshot(probe) == before
            return
        if self.ready:
            got = self.q.get(timeout=timeout)
            assert got == self.ready[0]
            self.ready.pop(0)
            self.processing.add(got)
        elif self.shut:
            with pytest.raises(reconq.ShutDown):
                self.q.get(timeout=timeout)
        else:
            with pytest.raises(TimeoutError):
                self.q.get(timeout=timeout)

    @precondition(lambda self: self.processing)
    @rule(data=st.data())
    def done_processing(self, data):
        key = data.draw(st.sampled_from(sorted(self.processing, key=repr)))
        self.q.done(key)
        self.processing.discard(key)
        if key in self.dirty:
            self.dirty.discard(key)
            if not self.shut and key not in self.ready:
                self.ready.append(key)

    @rule(key=any_keys, probe=small_keys)
    def done_any(self, key, probe):
        before = self._snapshot(probe)
        err = key_error(key)
        if err is None and key in self.processing:
            return  # covered by done_processing
        call(err, self.q.done, key)
        assert self._snapshot(probe) == before  # a key not processing: nothing

    @rule()
    def shut_down(self):
        self.q.shut_down()
        self.shut = True
        self.dirty.clear()  # dirty keys re-added after shut down are dropped

    @invariant()
    def len_matches_model(self):
        if hasattr(self, "q"):
            assert len(self.q) == len(self.ready)
            assert self.q.shutting_down == self.shut


TestWorkQueueMachine = WorkQueueMachine.TestCase
TestWorkQueueMachine.settings = MACHINE


# --- limiters ----------------------------------------------------------------

limiter_args = st.one_of(numbers, st.integers(-3, 5))


def _maybe_construct(cls, *args):
    try:
        return cls(*args)
    except DOCUMENTED as e:
        assert not isinstance(e, (KeyError, reconq.ShutDown, TimeoutError, RecursionError)), repr(e)
        return None


@FAST
@given(base=limiter_args, max_=limiter_args)
def test_exponential_backoff_constructor(base, max_):
    if ambiguous_seconds(base) or ambiguous_seconds(max_):
        return
    err = timeout_error(base) if base is not None else TypeError
    err = err or (timeout_error(max_) if max_ is not None else TypeError)
    lim = call(err, reconq.ExponentialBackoff, base, max_)
    if lim is not None:
        assert lim.when("k") >= 0 and lim.num_requeues("k") == 1


@FAST
@given(fast=limiter_args, slow=limiter_args, attempts=st.one_of(st.integers(-(2**70), 2**70), numbers))
def test_fast_slow_constructor(fast, slow, attempts):
    lim = _maybe_construct(reconq.FastSlow, fast, slow, attempts)
    bad = [a for a in (fast, slow) if a is None or timeout_error(a) is not None]
    if lim is not None:
        assert not bad and not isinstance(attempts, bool) or isinstance(attempts, int)
        assert isinstance(attempts, int) and 0 <= attempts <= 2**32 - 1
        assert lim.when("k") >= 0
    elif not bad and not any(ambiguous_seconds(a) for a in (fast, slow)):
        # Good durations: only the attempts can be at fault.
        assert not (type(attempts) in (int, IntSub) and 0 <= attempts < 2**32)


@FAST
@given(qps=numbers, burst=st.one_of(st.integers(-(2**70), 2**70), numbers))
def test_token_bucket_constructor(qps, burst):
    lim = _maybe_construct(reconq.TokenBucket, qps, burst)
    if lim is not None:
        assert math.isfinite(float(qps)) and float(qps) > 0, qps
        assert isinstance(burst, int) and burst >= 1
        assert lim.num_requeues("k") == 0
        lim.when("k")
        assert lim.num_requeues("k") == 0
    qps_ok = isinstance(qps, (int, float)) and not isinstance(qps, bool)
    if qps_ok and (qps != qps or qps <= 0):
        assert lim is None
    if isinstance(burst, int) and not isinstance(burst, bool) and burst < 1:
        assert lim is None


good_limiters = st.sampled_from(
    [
        lambda: reconq.ExponentialBackoff(0.001, 10),
        lambda: reconq.FastSlow(0.001, 1, 2),
        lambda: reconq.TokenBucket(1000, 10),
        reconq.default_rate_limiter,
    ]
).map(lambda make: make())


@FAST
@given(
    members=st.lists(st.one_of(good_limiters, bad_atoms, st.just(reconq.RateLimiter)), max_size=3),
    as_list=st.booleans(),
)
def test_max_of_and_with_max_wait_constructors(members, as_list):
    args = (members,) if as_list else tuple(members)
    # One list or tuple argument is the member list itself.
    effective = list(args[0]) if len(args) == 1 and isinstance(args[0], (list, tuple)) else list(args)
    ok = effective and all(isinstance(m, reconq.RateLimiter) for m in effective)
    lim = call(None if ok else (ValueError if not effective else TypeError), reconq.MaxOf, *args)
    if lim is not None:
        assert reconq.WithMaxWait(lim, 1).when("k") <= 1
    for bad in (None, 1, "x", reconq.RateLimiter):
        call(TypeError, reconq.WithMaxWait, bad, 1)
    call(ValueError, reconq.WithMaxWait, reconq.TokenBucket(1, 1), -1)
    call(ValueError, reconq.WithMaxWait, reconq.TokenBucket(1, 1), math.nan)


class LimiterMachine(RuleBasedStateMachine):
    """when/forget/num_requeues with random keys against a model of an
    ExponentialBackoff's per-key memory, shared with a MaxOf and a
    WithMaxWait wrapper."""

    @initialize()
    def setup(self):
        self.base = reconq.ExponentialBackoff(0.001, 1000)
        self.maxof = reconq.MaxOf(self.base, reconq.FastSlow(0.0, 0.0, 0))
        self.capped = reconq.WithMaxWait(self.base, 0.5)
        self.counts: dict = {}

    def _probe(self, probe):
        return self.base.num_requeues(probe), self.maxof.num_requeues(probe), self.capped.num_requeues(probe)

    @rule(which=st.integers(0, 2), key=any_keys, probe=small_keys)
    def when(self, which, key, probe):
        lim = (self.base, self.maxof, self.capped)[which]
        before = self._probe(probe)
        err = key_error(key)
        wait = call(err, lim.when, key)
        if err is None:
            n = self.counts.get(key, 0)
            expected = min(0.001 * 2.0**n, 1000.0)
            if which == 2:
                expected = min(expected, 0.5)
            assert wait == pytest.approx(expected, rel=1e-6)
            self.counts[key] = n + 1
        else:
            assert self._probe(probe) == before

    @rule(which=st.integers(0, 2), key=any_keys, probe=small_keys)
    def forget(self, which, key, probe):
        lim = (self.base, self.maxof, self.capped)[which]
        before = self._probe(probe)
        err = key_error(key)
        call(err, lim.forget, key)
        if err is None:
            self.counts.pop(key, None)
        else:
            assert self._probe(probe) == before

    @rule(key=any_keys)
    def num_requeues(self, key):
        err = key_error(key)
        n = call(err, self.base.num_requeues, key)
        if err is None:
            assert n == self.counts.get(key, 0)
            # MaxOf's count is its members' maximum; FastSlow counted only
            # the whens that went through the MaxOf, so it is <= ours.
            assert self.maxof.num_requeues(key) == n
            assert self.capped.num_requeues(key) == n


TestLimiterMachine = LimiterMachine.TestCase
TestLimiterMachine.settings = MACHINE


# --- Controller ---------------------------------------------------------------

bad_callables = st.sampled_from([None, 1, "reconcile", b"x", [], {}, (), object()])


@FAST
@given(
    reconcile_ok=st.booleans(),
    bad=bad_callables,
    workers=st.one_of(st.integers(-(2**70), 2**70), numbers),
    threshold=numbers,
    name=st.one_of(st.text(max_size=5), st.sampled_from(["a\0b", "\ud800", StrSub("n")]), bad_atoms),
    limiter=st.one_of(st.none(), good_limiters, bad_atoms),
)
def test_controller_constructor(reconcile_ok, bad, workers, threshold, name, limiter):
    fn = (lambda key: None) if reconcile_ok else bad
    try:
        c = reconq.Controller(fn, workers=workers, rate_limiter=limiter, name=name, hanging_threshold=threshold)
    except DOCUMENTED as e:
        assert isinstance(e, (TypeError, ValueError, OverflowError)), repr(e)
        workers_ok = type(workers) in (int, IntSub, bool) and 1 <= workers <= 1024
        name_ok = isinstance(name, str) and "\0" not in name and not any(0xD800 <= ord(ch) < 0xE000 for ch in name)
        limiter_ok = limiter is None or isinstance(limiter, reconq.RateLimiter)
        threshold_ok = threshold is None or (timeout_error(threshold) is None and not ambiguous_seconds(threshold))
        assert not (reconcile_ok and workers_ok and name_ok and limiter_ok and threshold_ok), repr(e)
        return
    assert reconcile_ok and callable(fn)
    assert isinstance(workers, int) and workers >= 1
    assert c.workers == workers and c.name == name
    # Never started: stopping returns True and changes nothing else.
    assert c.stop() is True
    assert c.stats()["reconciles"] == 0


COUNTS = ("reconciles", "successes", "failures", "requeues", "depth", "processing", "waiting")

# What a reconcile does with a key (a per-key queue of these; empty: succeed).
BEHAVIOURS = ["ok", "raise", "wrong_type", "requeue", "requeue_after", "retry_after", "permanent", "reenter", "other"]


class ControllerMachine(RuleBasedStateMachine):
    """A running controller (4 workers) fed random good and bad calls. Its
    reconcile pops a behaviour per key (success, raise, wrong return type,
    Requeue(), Requeue(after=), RetryAfter, PermanentError, enqueue of its own
    key from inside, enqueue of another key); the test counts what it did and
    checks `stats()` against it once idle, and that no enqueue was lost (a
    key enqueued after its last reconcile began is reconciled again)."""

    @initialize()
    def setup(self):
        self.lock = threading.Lock()
        self.plan: dict = {}
        self.pending: set = set()
        self.did = {"reconciles": 0, "successes": 0, "failures": 0, "requeues": 0}
        self.c = reconq.Controller(
            self.reconcile, workers=4, rate_limiter=reconq.ExponentialBackoff(0.0005, 0.002), name="fuzz"
        )
        self.c.start()

    def teardown(self):
        if hasattr(self, "c"):
            assert self.c.stop(timeout=PATIENCE)

    def reconcile(self, key):
        with self.lock:
            self.pending.discard(key)
            plan = self.plan.get(key)
            what = plan.popleft() if plan else "ok"
            self.did["reconciles"] += 1
            outcome = {"ok": "successes", "reenter": "successes", "other": "successes"}.get(what, "failures")
            if what == "requeue":
                outcome = "requeues"
            elif what == "requeue_after":
                outcome = "successes"  # a resync: the work was done"
            self.did[outcome] += 1
            if what in ("reenter", "other"):
                target = key if what == "reenter" else ("other", repr(key))
                self.pending.add(target)
        if what == "raise":
            raise RuntimeError(f"boom {key!r}")
        if what == "wrong_type":
            return 42
        if what == "requeue":
            return reconq.Requeue()
        if what == "requeue_after":
            return reconq.Requeue(after=0.001)
        if what == "retry_after":
            raise reconq.RetryAfter(0.001)
        if what == "permanent":
            raise reconq.PermanentError("gone")
        if what in ("reenter", "other"):
            self.c.enqueue(target)
        return None

    def _idle_counts(self):
        assert self.c.wait_idle(timeout=PATIENCE)
        stats = self.c.stats()
        with self.lock:
            assert not self.pending, f"lost enqueues: {self.pending}"
            for name, n in self.did.items():
                assert stats[name] == n, (name, stats, self.did)
        return {name: stats[name] for name in COUNTS}

    @rule(key=good_keys, behaviours=st.lists(st.sampled_from(BEHAVIOURS), max_size=3))
    def enqueue(self, key, behaviours):
        with self.lock:
            self.plan.setdefault(key, deque()).extend(behaviours)
            self.pending.add(key)
        self.c.enqueue(key)

    @rule(key=good_keys, seconds=st.sampled_from([-1, 0, 0.0, 1e-4, 0.002, -math.inf]))
    def enqueue_soon(self, key, seconds):
        with self.lock:
            self.pending.add(key)
        if seconds == 0.002:
            self.c.enqueue_at(key, __import__("time").time() + seconds)
        else:
            self.c.enqueue_after(key, seconds)

    @rule(key=any_keys, seconds=numbers, at=st.booleans())
    def refused_enqueue(self, key, seconds, at):
        err = key_error(key)
        if err is None:
            err = delay_error(seconds) if not at else None
            if at:
                terr, t = _as_seconds(seconds)
                if terr is None and 1e12 < t < math.inf:
                    return  # past the clock's range or not: platform-dependent
                err = terr or (OverflowError if t == math.inf else None)
        if err is None or ambiguous_seconds(seconds):
            return  # a call that would work: not this rule's business
        before = self._idle_counts()
        method = self.c.enqueue_at if at else self.c.enqueue_after
        call(err, method, key, seconds)
        if key_error(key) is not None:
            call(err, self.c.enqueue, key)
        assert self._idle_counts() == before

    @rule(timeout=numbers)
    def bad_timeouts(self, timeout):
        err = timeout_error(timeout)
        if err is None or ambiguous_seconds(timeout):
            return
        before = self._idle_counts()
        call(err, self.c.wait_idle, timeout=timeout)
        call(err, self.c.stop, timeout=timeout)  # refused: does not stop
        assert self.c.stats()["state"] == "running"
        assert self._idle_counts() == before

    @rule(key=any_keys)
    def inspect_and_cancel(self, key):
        err = key_error(key)
        call(err, self.c.inspect, key)
        call(err, self.c.cancel, key)
        call(err, self.c.requeue_parked, key)

    @rule()
    def check_counts(self):
        self._idle_counts()


TestControllerMachine = ControllerMachine.TestCase
TestControllerMachine.settings = settings(MACHINE, max_examples=15, stateful_step_count=30)


@settings(max_examples=30, deadline=None)
@given(drain=st.booleans(), keys=st.lists(good_keys, min_size=1, max_size=20), stopper=st.integers(0, 19))
def test_stop_from_inside_a_reconcile(drain, keys, stopper):
    """A reconcile calling stop() on its own controller returns False at
    once (it cannot wait for itself) and the controller stops."""
    results = []
    stop_key = keys[min(stopper, len(keys) - 1)]

    def reconcile(key):
        if key == stop_key and not results:
            results.append(c.stop(drain=drain))
            c.enqueue(("after", 1))  # ignored once stopping: no error

    c = reconq.Controller(reconcile, workers=2, name="stopper")
    for key in keys:
        c.enqueue(key)
    c.start()
    wait_for(lambda: results, what="the inside stop")
    assert results == [False]
    wait_for(lambda: c.stats()["state"] == "stopped", what="the controller to stop")
    assert c.stop(timeout=PATIENCE) is True
    n = c.stats()["reconciles"]
    c.enqueue("late")
    assert c.stats()["reconciles"] == n and c.stats()["depth"] == 0


@settings(max_examples=20, deadline=None)
@given(rounds=st.integers(1, 30), workers=st.integers(1, 4))
def test_reentrant_enqueue_chains(rounds, workers):
    """A reconcile enqueuing its own key again runs exactly `rounds` times:
    the re-enqueue while processing marks the key dirty, never lost."""
    seen = []
    lock = threading.Lock()
    in_flight = set()

    def reconcile(key):
        with lock:
            assert key not in in_flight
            in_flight.add(key)
            seen.append(key)
            again = len(seen) < rounds
        try:
            if again:
                c.enqueue(key)
        finally:
            with lock:
                in_flight.discard(key)

    with reconq.Controller(reconcile, workers=workers) as c:
        c.enqueue(("self", workers))
        assert c.wait_idle(timeout=PATIENCE)
        assert len(seen) == rounds
        assert c.stats()["successes"] == rounds


# --- Manager -------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    name=st.one_of(st.text(max_size=4), bad_atoms, st.builds(StrSub, st.text(max_size=3))),
    do_ok=st.booleans(),
    bad_do=bad_callables,
    stop=st.one_of(st.none(), bad_callables, st.just(lambda: None)),
    interval=numbers,
    retry_base=numbers,
    no_error_retry=st.one_of(st.booleans(), bad_atoms),
)
def test_manager_update_and_remove(name, do_ok, bad_do, stop, interval, retry_base, no_error_retry):
    runs = []
    do = (lambda: runs.append(1)) if do_ok else bad_do
    with reconq.Manager() as m:
        m.update("keep", lambda: None)
        before = m.names()
        try:
            m.update(
                name, do, stop=stop, interval=interval, error_retry_base=retry_base, no_error_retry=no_error_retry
            )
        except DOCUMENTED as e:
            assert isinstance(e, (TypeError, ValueError, OverflowError)), repr(e)
            name_ok = isinstance(name, str) and not any(0xD800 <= ord(ch) < 0xE000 for ch in name)
            stop_ok = stop is None or callable(stop)
            nums_ok = all(
                v is None or (timeout_error(v) is None and not ambiguous_seconds(v)) for v in (interval, retry_base)
            )
            assert not (name_ok and do_ok and stop_ok and nums_ok and isinstance(no_error_retry, bool)), repr(e)
            assert m.names() == before  # refused: nothing changed
            with pytest.raises((KeyError, TypeError)):
                m.remove(name)
            return
        assert do_ok and isinstance(name, str)
        assert name in m
        wait_for(lambda: runs, what="do to run once")
        m.remove(name, wait=True)
        assert name not in m or name == "keep"
        with pytest.raises(KeyError):
            m.remove("unknown-" + name)


@FAST
@given(name=st.one_of(st.text(max_size=5), bad_atoms), wait=st.booleans())
def test_manager_remove_and_trigger_unknown(name, wait):
    with reconq.Manager() as m:
        m.update("a", lambda: None)
        expected = KeyError if isinstance(name, str) and name != "a" else TypeError
        if name == "a":
            return
        call(expected, m.remove, name, wait=wait)
        call(expected, m.trigger, name)
        assert m.names() == ["a"]

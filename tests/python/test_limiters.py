"""Rate limiters of guarantees §2."""

import math

import pytest

import reconq

approx = pytest.approx


def whens(limiter, key, n):
    return [limiter.when(key) for _ in range(n)]


def test_exponential_backoff_sequence():
    lim = reconq.ExponentialBackoff(0.001, 1)
    assert whens(lim, "k", 4) == approx([0.001, 0.002, 0.004, 0.008])
    assert lim.num_requeues("k") == 4
    assert lim.when("other") == approx(0.001)  # per key
    lim.forget("k")
    assert lim.num_requeues("k") == 0
    assert lim.when("k") == approx(0.001)


def test_exponential_backoff_caps_without_overflow():
    lim = reconq.ExponentialBackoff(0.005, 1000)
    seq = whens(lim, "k", 300)
    assert seq[17] == approx(655.36)
    assert seq[18:] == [1000.0] * (300 - 18)
    assert lim.num_requeues("k") == 300


def test_fast_slow():
    lim = reconq.FastSlow(0.01, 5, 3)
    assert whens(lim, "k", 5) == approx([0.01, 0.01, 0.01, 5, 5])
    assert lim.num_requeues("k") == 5
    lim.forget("k")
    assert lim.when("k") == approx(0.01)


def test_token_bucket_burst_then_waits():
    lim = reconq.TokenBucket(10, 2)
    got = whens(lim, "a", 4)
    assert got[:2] == [0.0, 0.0]
    assert got[2] == approx(0.1, abs=0.01)
    assert got[3] == approx(0.2, abs=0.01)
    assert lim.num_requeues("a") == 0  # not per key
    lim.forget("a")


def test_token_bucket_is_shared_by_all_keys():
    lim = reconq.TokenBucket(1, 1)
    assert lim.when("a") == 0.0
    assert lim.when("b") > 0.5


@pytest.mark.parametrize("qps, burst, exc", [
    (0, 1, ValueError), (-1, 1, ValueError), (math.nan, 1, ValueError), (math.inf, 1, ValueError),
    (10, 0, ValueError), (10, -5, ValueError), (10, 2**40, OverflowError),
    ("10", 1, TypeError), (10, 1.5, TypeError),
])
def test_token_bucket_bad_parameters(qps, burst, exc):
    with pytest.raises(exc):
        reconq.TokenBucket(qps, burst)


def test_max_of_takes_the_longest_and_forgets_everywhere():
    exp = reconq.ExponentialBackoff(0.001, 1)
    fs = reconq.FastSlow(0.005, 10, 2)
    lim = reconq.MaxOf(exp, fs)
    assert whens(lim, "k", 4) == approx([0.005, 0.005, 10, 10])
    # members are shared: the standalone objects saw the calls too
    assert exp.num_requeues("k") == 4 and fs.num_requeues("k") == 4
    assert lim.num_requeues("k") == 4
    lim.forget("k")
    assert exp.num_requeues("k") == 0 and fs.num_requeues("k") == 0


def test_max_of_accepts_a_list():
    lim = reconq.MaxOf([reconq.ExponentialBackoff(0.001, 1), reconq.ExponentialBackoff(0.002, 1)])
    assert lim.when(1) == approx(0.002)
    assert repr(lim) == "MaxOf(ExponentialBackoff(base=0.001, max=1.0), ExponentialBackoff(base=0.002, max=1.0))"


def test_max_of_nests():
    inner = reconq.MaxOf(reconq.FastSlow(1, 2, 1))
    lim = reconq.MaxOf(inner, reconq.ExponentialBackoff(0.5, 100))
    assert whens(lim, "k", 3) == approx([1, 2, 2])


@pytest.mark.parametrize("args, exc", [((), ValueError), (([],), ValueError), (("x",), TypeError),
                                       ((reconq.TokenBucket(1, 1), 3), TypeError)])
def test_max_of_bad_members(args, exc):
    with pytest.raises(exc):
        reconq.MaxOf(*args)


def test_with_max_wait():
    lim = reconq.WithMaxWait(reconq.ExponentialBackoff(1, 100), 2.5)
    assert whens(lim, "k", 4) == approx([1, 2, 2.5, 2.5])
    assert lim.num_requeues("k") == 4
    lim.forget("k")
    assert lim.num_requeues("k") == 0
    assert repr(lim) == "WithMaxWait(ExponentialBackoff(base=1.0, max=100.0), max=2.5)"


def test_with_max_wait_needs_a_limiter():
    with pytest.raises(TypeError):
        reconq.WithMaxWait(lambda k: 1, 1)


def test_default_rate_limiter():
    lim = reconq.default_rate_limiter()
    assert isinstance(lim, reconq.MaxOf) and isinstance(lim, reconq.RateLimiter)
    assert repr(lim) == "MaxOf(ExponentialBackoff(base=0.005, max=1000.0), TokenBucket(qps=10.0, burst=100))"
    assert whens(lim, "k", 3) == approx([0.005, 0.01, 0.02])
    assert lim.num_requeues("k") == 3
    assert reconq.default_rate_limiter().num_requeues("k") == 0  # a new one each call


def test_reprs():
    assert repr(reconq.ExponentialBackoff(0.005, 1000)) == "ExponentialBackoff(base=0.005, max=1000.0)"
    assert repr(reconq.FastSlow(0.1, 3, 5)) == "FastSlow(fast=0.1, slow=3.0, max_fast_attempts=5)"
    assert repr(reconq.TokenBucket(10, 100)) == "TokenBucket(qps=10.0, burst=100)"


@pytest.mark.parametrize("make", [
    lambda v: reconq.ExponentialBackoff(v, 1),
    lambda v: reconq.ExponentialBackoff(0.001, v),
    lambda v: reconq.FastSlow(v, 1, 1),
    lambda v: reconq.FastSlow(1, v, 1),
    lambda v: reconq.WithMaxWait(reconq.TokenBucket(1, 1), v),
])
@pytest.mark.parametrize("value, exc", [(-1, ValueError), (math.nan, ValueError), (math.inf, OverflowError),
                                        ("1", TypeError), (None, TypeError)])
def test_bad_durations(make, value, exc):
    with pytest.raises(exc):
        make(value)


@pytest.mark.parametrize("value, exc", [(-1, ValueError), (2**40, OverflowError), (1.5, TypeError)])
def test_fast_slow_bad_attempts(value, exc):
    with pytest.raises(exc):
        reconq.FastSlow(1, 2, value)


def test_zero_durations_are_allowed():
    assert reconq.ExponentialBackoff(0, 0).when("k") == 0.0
    assert reconq.FastSlow(0, 0, 0).when("k") == 0.0


def test_base_class_is_not_constructible():
    with pytest.raises(TypeError):
        reconq.RateLimiter()
    for cls in [reconq.ExponentialBackoff, reconq.FastSlow, reconq.TokenBucket, reconq.MaxOf, reconq.WithMaxWait]:
        assert issubclass(cls, reconq.RateLimiter)
        assert cls.__module__ == "reconq"

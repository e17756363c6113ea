"""Requeue, RetryAfter, PermanentError."""

import math
import pickle

import pytest

import reconq


def test_requeue():
    assert reconq.Requeue().after is None
    assert reconq.Requeue(after=1.5).after == 1.5
    assert reconq.Requeue(2).after == 2.0
    assert reconq.Requeue(after=0).after == 0
    assert repr(reconq.Requeue(after=0.5)) == "reconq.Requeue(after=0.5)"
    assert reconq.Requeue(1) == reconq.Requeue(after=1.0)
    assert not isinstance(reconq.Requeue(), BaseException)


@pytest.mark.parametrize("bad, exc", [(-1, ValueError), (math.nan, ValueError), (math.inf, OverflowError),
                                      ("1", TypeError), (True, TypeError)])
def test_requeue_and_retry_after_validate(bad, exc):
    with pytest.raises(exc):
        reconq.Requeue(after=bad)
    with pytest.raises(exc):
        reconq.RetryAfter(bad)


def test_retry_after():
    e = reconq.RetryAfter(3, "busy")
    assert isinstance(e, Exception)
    assert e.after == 3.0
    assert e.message == "busy"
    assert str(e) == "busy"
    assert str(reconq.RetryAfter(0.5)) == "retry after 0.5 s"
    back = pickle.loads(pickle.dumps(e))
    assert type(back) is reconq.RetryAfter and back.after == 3.0 and back.message == "busy"


def test_permanent_error():
    e = reconq.PermanentError("bad spec")
    assert isinstance(e, Exception)
    assert str(e) == "bad spec"
    assert type(pickle.loads(pickle.dumps(e))) is reconq.PermanentError

"""Key conversion: what a queue accepts, and what it hands back."""

import enum

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import reconq

I64_MIN = -(2**63)
I64_MAX = 2**63 - 1


def roundtrip(key):
    q = reconq.WorkQueue()
    q.add(key)
    assert len(q) == 1
    out = q.get(timeout=0)
    q.done(key)
    q.shut_down()
    return out


class MyStr(str):
    pass


class MyInt(int):
    pass


class MyBytes(bytes):
    pass


class Color(enum.IntEnum):
    RED = 7


@pytest.mark.parametrize(
    "key",
    [
        "",
        "name",
        "ünïcødé ✓ 🚀",
        "a\x00b",
        0,
        -1,
        I64_MIN,
        I64_MAX,
        b"",
        b"\x00\xff",
        (),
        ("ns", "name"),
        ("a", 1, b"b", ("c", (2, ()))),
        ((("deep",),),),
    ],
)
def test_roundtrip_gives_an_equal_key(key):
    out = roundtrip(key)
    assert out == key
    assert type(out) is type(key)
    assert hash(out) == hash(key)


def test_str_with_lone_surrogate_roundtrips():
    key = "x\ud800y"
    assert roundtrip(key) == key


@pytest.mark.parametrize(
    "key, plain",
    [(MyStr("s"), str), (MyInt(5), int), (MyBytes(b"b"), bytes), (Color.RED, int), (True, int)],
)
def test_subclasses_are_accepted_and_come_back_as_the_base_type(key, plain):
    out = roundtrip(key)
    assert out == key
    assert type(out) is plain


def test_bool_is_the_int_key():
    q = reconq.WorkQueue()
    q.add(True)
    q.add(1)
    q.add((False, "x"))
    q.add((0, "x"))
    assert len(q) == 2
    assert q.get() == 1
    assert q.get() == (0, "x")


def test_str_bytes_and_int_keys_are_distinct():
    q = reconq.WorkQueue()
    for key in ["1", b"1", 1, ("1",), (1,)]:
        q.add(key)
    assert len(q) == 5


@pytest.mark.parametrize("key", [2**63, I64_MIN - 1, 2**100, ("ok", 2**64)])
def test_int_keys_must_fit_in_i64(key):
    q = reconq.WorkQueue()
    with pytest.raises(OverflowError):
        q.add(key)
    assert len(q) == 0


@pytest.mark.parametrize(
    "key, type_name",
    [
        (1.5, "float"),
        (None, "NoneType"),
        (["a"], "list"),
        ({"a": 1}, "dict"),
        (bytearray(b"a"), "bytearray"),
        ({1}, "set"),
        (frozenset([1]), "frozenset"),
        (object(), "object"),
        (1j, "complex"),
        (("a", ["nested list"]), "list"),
        (("a", (1, 2.0)), "float"),
    ],
)
def test_unsupported_keys_raise_type_error_naming_the_type(key, type_name):
    q = reconq.WorkQueue()
    q.add("present")
    for call in (q.add, q.add_rate_limited, q.forget, q.num_requeues, q.done):
        with pytest.raises(TypeError, match=type_name):
            call(key)
    with pytest.raises(TypeError, match=type_name):
        q.add_after(key, 0)
    assert len(q) == 1
    assert "processing=0 delayed=0" in repr(q)
    assert q.num_requeues("present") == 0


def test_very_deep_nesting_is_refused_cleanly():
    key = "leaf"
    for _ in range(1000):
        key = (key,)
    q = reconq.WorkQueue()
    with pytest.raises(RecursionError):
        q.add(key)
    assert len(q) == 0


def test_limiter_methods_check_keys_the_same_way():
    lim = reconq.ExponentialBackoff(0.001, 1)
    for bad, exc in [(1.5, TypeError), ([1], TypeError), (2**63, OverflowError)]:
        with pytest.raises(exc):
            lim.when(bad)
        with pytest.raises(exc):
            lim.forget(bad)
        with pytest.raises(exc):
            lim.num_requeues(bad)
    assert lim.when(True) == lim.when(1) / 2  # True is key 1: second failure


keys = st.recursive(
    st.one_of(
        st.text(),
        st.integers(min_value=I64_MIN, max_value=I64_MAX),
        st.binary(),
        st.booleans(),
    ),
    lambda children: st.lists(children, max_size=4).map(tuple),
    max_leaves=12,
)


@settings(max_examples=200, deadline=None)
@given(st.lists(keys, max_size=20))
def test_queue_dedups_exactly_like_a_python_set(batch):
    q = reconq.WorkQueue()
    for key in batch:
        q.add(key)
    expected = list(dict.fromkeys(batch))  # insertion order, Python equality
    assert len(q) == len(expected)
    out = [q.get(timeout=0) for _ in expected]
    assert out == expected
    assert len(q) == 0
    q.shut_down()



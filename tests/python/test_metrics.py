"""Metrics from Python (issue 6): exact values through ``metrics_text()``
parsed by ``prometheus_client``'s parser, the ``reconq.prometheus.Collector``
in a fresh registry, and the HTTP endpoint.

Metric names are global: every test uses its own queue and controller names.
"""

from __future__ import annotations

import errno
import threading
import urllib.error
import urllib.request
from typing import Dict, Optional, Tuple

import pytest

import reconq
from waiting import PATIENCE, wait_for

prometheus_client = pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

Samples = Dict[Tuple[str, Tuple[Tuple[str, str], ...]], float]


def parse(text: str) -> Samples:
    """Every sample of an exposition, failing on a duplicate series."""
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            key = (s.name, tuple(sorted(s.labels.items())))
            assert key not in samples, f"duplicate series {key}"
            samples[key] = s.value
    return samples


def value(metric: str, samples: Optional[Samples] = None, /, **labels: str) -> Optional[float]:
    """The value of `metric` with exactly `labels` (None if absent)."""
    if samples is None:
        samples = parse(reconq.metrics_text())
    return samples.get((metric, tuple(sorted(labels.items()))))


def queue(name: str) -> Dict[str, str]:
    """The labels of queue ``name``'s series, as controller-runtime labels
    them: ``name``, and ``controller`` (the same name)."""
    return {"name": name, "controller": name}


def depth_at(name: str, priority: str = "0") -> Dict[str, str]:
    """The labels of queue ``name``'s depth at ``priority``."""
    return {**queue(name), "priority": priority}


def queue_counts(name: str) -> Tuple[Optional[float], ...]:
    """adds, depth (at priority 0), retries, queue-duration count,
    work-duration count."""
    s = parse(reconq.metrics_text())
    return tuple(
        value(metric, s, **(depth_at(name) if metric == "workqueue_depth" else queue(name)))
        for metric in (
            "workqueue_adds_total",
            "workqueue_depth",
            "workqueue_retries_total",
            "workqueue_queue_duration_seconds_count",
            "workqueue_work_duration_seconds_count",
        )
    )


def test_named_queue_counts_like_client_go():
    name = "py_queue_sequence"
    q = reconq.WorkQueue(name=name)
    try:
        assert queue_counts(name) == (0, 0, 0, 0, 0)
        q.add("a")
        q.add("a")  # deduplicated
        q.add(("ns", 1))
        assert queue_counts(name) == (2, 2, 0, 0, 0)
        assert q.get() == "a"
        q.add("a")  # dirty while processing: an add, and depth
        assert queue_counts(name) == (3, 2, 0, 1, 0)
        q.done("a")
        q.add_after("later", 3600)  # a retry, not an add until due
        q.add_rate_limited("a")  # a retry; "a" is ready: nothing else
        assert queue_counts(name) == (3, 2, 2, 1, 1)
        keys = [q.get(), q.get()]
        assert keys == [("ns", 1), "a"]
        wait_for(
            lambda: (value("workqueue_longest_running_processor_seconds", **queue(name)) or 0) > 0,
            what="the longest running processor to show",
        )
        for k in keys:
            q.done(k)
        s = parse(reconq.metrics_text())
        assert value("workqueue_unfinished_work_seconds", s, **queue(name)) == 0
        assert value("workqueue_longest_running_processor_seconds", s, **queue(name)) == 0
        assert queue_counts(name) == (3, 0, 2, 3, 3)
    finally:
        q.shut_down()


def test_queue_series_carry_controller_runtime_labels():
    name = "py_queue_labels"
    q = reconq.WorkQueue(name=name)
    q.add("high", 10)
    q.add("plain")
    q.add("low", -1)
    s = parse(reconq.metrics_text())
    label_names = {
        metric: tuple(k for k, _ in labels if k != "le")
        for metric, labels in s
        if metric.startswith("workqueue_") and ("name", name) in labels
    }
    assert len(label_names) == 11, label_names
    for metric, names in label_names.items():
        expected = ("controller", "name", "priority") if metric == "workqueue_depth" else ("controller", "name")
        assert names == expected, metric
    assert [value("workqueue_depth", s, **depth_at(name, p)) for p in ("10", "0", "-1")] == [1, 1, 1]
    q.shut_down()


def test_a_controllers_queue_is_labelled_with_its_name_as_the_controller():
    name = "py_controller_queue_labels"
    with reconq.Controller(lambda k: None, workers=1, name=name) as c:
        c.enqueue("a", 5)
        assert c.wait_idle(timeout=PATIENCE)
        s = parse(reconq.metrics_text())
        assert value("workqueue_adds_total", s, **queue(name)) == 1
        assert value("workqueue_depth", s, **depth_at(name)) == 0
        assert value("workqueue_depth", s, **depth_at(name, "5")) is None, "no key waits at 5 any more"


def test_unnamed_queue_has_no_metrics():
    def names() -> set:
        return {dict(labels).get("name") for _, labels in parse(reconq.metrics_text())}

    before = names()
    q = reconq.WorkQueue()
    q.add("x")
    q.done(q.get())
    # Nothing new appears (queues of earlier tests may only have gone).
    assert names() <= before
    q.shut_down()


def _script(calls: Dict[str, int], lock: threading.Lock):
    """First call of each key: ``s*`` succeed, ``e*`` raise, ``p*`` fail
    permanently, ``t*`` raise RetryAfter, ``r*`` Requeue(), ``a*``
    Requeue(after=...). Later calls succeed."""

    def reconcile(key: str) -> object:
        with lock:
            calls[key] = calls.get(key, 0) + 1
            first = calls[key] == 1
        if not first:
            return None
        kind = key[0]
        if kind == "e":
            raise ValueError("boom")
        if kind == "p":
            raise reconq.PermanentError("never")
        if kind == "t":
            raise reconq.RetryAfter(0.01)
        if kind == "r":
            return reconq.Requeue()
        if kind == "a":
            return reconq.Requeue(after=0.02)
        return None

    return reconcile


def controller_counts(name: str) -> Tuple[Optional[float], ...]:
    s = parse(reconq.metrics_text())
    results = tuple(
        value("controller_runtime_reconcile_total", s, controller=name, result=r)
        for r in ("success", "error", "requeue", "requeue_after")
    )
    others = tuple(
        value(metric, s, controller=name)
        for metric in (
            "controller_runtime_reconcile_errors_total",
            "controller_runtime_terminal_reconcile_errors_total",
            "controller_runtime_reconcile_panics_total",
            "controller_runtime_reconcile_time_seconds_count",
            "controller_runtime_active_workers",
            "controller_runtime_max_concurrent_reconciles",
        )
    )
    return results + others


def test_controller_counts_results_like_controller_runtime(caplog):
    name = "py_ctl_results"
    calls: Dict[str, int] = {}
    c = reconq.Controller(_script(calls, threading.Lock()), workers=2, name=name)
    assert controller_counts(name) == (0, 0, 0, 0, 0, 0, 0, 0, 0, 2)
    with c:
        for key in ("s1", "s2", "e1", "p1", "t1", "r1", "a1"):
            c.enqueue(key)
        assert c.wait_idle(timeout=PATIENCE)
        # success: s1 s2 + the four retried keys; error: e1 p1 t1 (p1
        # terminal); a Python exception is an error, never a panic.
        assert controller_counts(name) == (6, 3, 1, 1, 3, 1, 0, 11, 0, 2)
        assert c.stats()["reconciles"] == 11
        # The controller's queue is named after it: 7 enqueues + 4 retries
        # made ready; 4 retries scheduled (e1, r1 rate-limited; t1, a1 after).
        assert queue_counts(name) == (11, 0, 4, 11, 11)


def test_active_workers_and_unfinished_work_while_blocked():
    name = "py_ctl_blocked"
    entered = threading.Event()
    release = threading.Event()

    def reconcile(key: str) -> None:
        if key == "block":
            entered.set()
            assert release.wait(PATIENCE)

    with reconq.Controller(reconcile, workers=3, name=name) as c:
        c.enqueue("block")
        assert entered.wait(PATIENCE)
        c.enqueue("quick")
        wait_for(lambda: c.stats()["reconciles"] == 1, what="the quick key")
        s = parse(reconq.metrics_text())
        assert value("controller_runtime_active_workers", s, controller=name) == 1
        assert value("controller_runtime_max_concurrent_reconciles", s, controller=name) == 3

        def held() -> bool:
            s = parse(reconq.metrics_text())
            unfinished = value("workqueue_unfinished_work_seconds", s, **queue(name)) or 0
            longest = value("workqueue_longest_running_processor_seconds", s, **queue(name)) or 0
            return longest > 0 and unfinished == longest

        wait_for(held, what="unfinished work of the blocked key")
        release.set()
        assert c.wait_idle(timeout=PATIENCE)
        s = parse(reconq.metrics_text())
        assert value("controller_runtime_active_workers", s, controller=name) == 0
        assert value("workqueue_unfinished_work_seconds", s, **queue(name)) == 0
        assert value("controller_runtime_reconcile_time_seconds_count", s, controller=name) == 2


def test_same_named_controllers_are_summed():
    name = "py_ctl_twins"
    with reconq.Controller(lambda k: None, workers=1, name=name) as a:
        with reconq.Controller(lambda k: None, workers=2, name=name) as b:
            for k in range(3):
                a.enqueue(k)
            b.enqueue(0)
            assert a.wait_idle(timeout=PATIENCE) and b.wait_idle(timeout=PATIENCE)
            s = parse(reconq.metrics_text())  # fails on duplicate series
            assert value("controller_runtime_max_concurrent_reconciles", s, controller=name) == 3
            assert value("controller_runtime_reconcile_total", s, controller=name, result="success") == 4
            assert value("workqueue_adds_total", s, **queue(name)) == 4


def test_collector_in_a_fresh_registry():
    from prometheus_client import CollectorRegistry, generate_latest

    from reconq.prometheus import Collector

    name = "py_collector"
    q = reconq.WorkQueue(name=name)
    for k in range(3):
        q.add(k)
    for _ in range(2):
        q.done(q.get())
    registry = CollectorRegistry()
    registry.register(Collector())
    get = registry.get_sample_value
    assert get("workqueue_adds_total", queue(name)) == 3
    assert get("workqueue_depth", depth_at(name)) == 1
    assert get("workqueue_queue_duration_seconds_count", queue(name)) == 2
    assert get("workqueue_work_duration_seconds_count", queue(name)) == 2
    assert get("workqueue_queue_duration_seconds_bucket", {**queue(name), "le": "+Inf"}) == 2
    assert get("workqueue_queue_duration_seconds_bucket", {**queue(name), "le": "1e-08"}) is not None
    text = generate_latest(registry).decode()
    assert f'workqueue_adds_total{{controller="{name}",name="{name}"}} 3.0' in text
    assert "# TYPE workqueue_queue_duration_seconds histogram" in text
    q.add(9)
    assert get("workqueue_adds_total", queue(name)) == 4, "each collect reads current values"
    q.shut_down()


def test_http_endpoint():
    name = "py_http"
    q = reconq.WorkQueue(name=name)
    q.add("k")
    server = reconq.start_http_server(port=0)
    try:
        assert server.port > 0 and server.addr == "127.0.0.1" and not server.closed
        url = f"http://127.0.0.1:{server.port}"
        with urllib.request.urlopen(f"{url}/metrics", timeout=PATIENCE) as response:
            assert response.status == 200
            assert response.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
            body = response.read().decode()
        assert value("workqueue_depth", parse(body), **depth_at(name)) == 1
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"{url}/other", timeout=PATIENCE)
        assert e.value.code == 404
    finally:
        server.close()
    assert server.closed
    server.close()  # twice is fine
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=PATIENCE)
    with reconq.start_http_server(0, "127.0.0.1") as s2:
        assert "serving" in repr(s2)
        with urllib.request.urlopen(f"http://127.0.0.1:{s2.port}/metrics", timeout=PATIENCE) as response:
            assert response.status == 200
    assert s2.closed
    q.shut_down()


def test_an_address_in_use_is_named():
    with reconq.start_http_server(0, "127.0.0.1") as taken:
        with pytest.raises(OSError, match=f"cannot listen on 127.0.0.1 port {taken.port}: Address already in use") as e:
            reconq.start_http_server(taken.port, "127.0.0.1")
        assert e.value.errno == errno.EADDRINUSE
        with urllib.request.urlopen(f"http://127.0.0.1:{taken.port}/healthz", timeout=PATIENCE) as response:
            assert response.status == 200, "the server already there still answers"


def test_a_server_whose_handle_is_dropped_keeps_serving():
    import gc

    port = reconq.start_http_server(port=0).port  # the handle is dropped at once
    gc.collect()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=PATIENCE) as response:
        assert response.status == 200


def test_metrics_text_from_many_threads():
    name = "py_threads"
    q = reconq.WorkQueue(name=name)
    errors = []

    def scrape() -> None:
        try:
            for _ in range(20):
                parse(reconq.metrics_text())
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    def work() -> None:
        for k in range(2000):
            q.add(k)
            q.done(q.get())

    threads = [threading.Thread(target=scrape) for _ in range(4)] + [threading.Thread(target=work)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(PATIENCE)
    assert not errors
    assert value("workqueue_adds_total", **queue(name)) == 2000
    q.shut_down()


def test_stubs_type_check_metrics_usage(tmp_path):
    from test_stubs import strict_type_errors

    errors = strict_type_errors(
        tmp_path,
        "import reconq\n"
        "q = reconq.WorkQueue(name='orders')\n"
        "text: str = reconq.metrics_text()\n"
        "with reconq.start_http_server(port=0, addr='127.0.0.1') as server:\n"
        "    port: int = server.port\n"
        "s = reconq.start_http_server(0)\n"
        "s.close()\n"
        "closed: bool = s.closed\n"
        "reconq.WorkQueue(name=3)  # E: not a str\n",
    )
    assert len(errors) == 1 and "prog.py:9:" in errors[0], errors

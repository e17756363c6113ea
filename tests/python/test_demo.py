"""`python -m reconq.demo` runs by itself, finishes and converges."""

import json
import subprocess
import sys

import pytest

import reconq


def run_demo(*args, timeout=60):
    return subprocess.run(
        [sys.executable, "-m", "reconq.demo", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


ENGINES = [
    "queue",
    pytest.param(
        "controller",
        marks=pytest.mark.skipif(not hasattr(reconq, "Controller"), reason="no reconq.Controller yet"),
    ),
]


@pytest.mark.parametrize("engine", ENGINES)
def test_demo_converges(tmp_path, engine):
    proc = run_demo("--seconds", "2", "--workers", "3", "--dir", str(tmp_path), "--engine", engine)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert "converged: actual/ matches desired/" in out, out
    # Progress lines: retries of transient failures, the permanent error, the user's edits.
    assert "retry TransientError" in out, out
    assert "permanent: not retried" in out, out
    assert "edit web.json" in out and "deleted" in out, out
    assert "manager job 'resync'" in out, out

    desired, actual = tmp_path / "desired", tmp_path / "actual"
    assert sorted(p.name for p in actual.glob("*.json")) == ["api.json", "db.json", "search.json", "web.json", "worker.json"]
    for p in actual.glob("*.json"):
        assert json.loads(p.read_text())["spec"] == json.loads((desired / p.name).read_text())
    assert json.loads((actual / "web.json").read_text())["spec"]["replicas"] == 5


@pytest.mark.skipif(not hasattr(reconq, "SqliteStore"), reason="no store")
def test_demo_second_run_picks_up_from_the_store(tmp_path):
    first = run_demo("--seconds", "1", "--workers", "2", "--dir", str(tmp_path))
    assert first.returncode == 0, first.stdout + first.stderr
    assert "state.db: restored 0 pending, 0 parked" in first.stdout, first.stdout
    assert (tmp_path / "state.db").exists()
    second = run_demo("--seconds", "1", "--workers", "2", "--dir", str(tmp_path))
    assert second.returncode == 0, second.stdout + second.stderr
    # broken.json failed permanently in the first run: it comes back parked.
    assert "parked (broken)" in second.stdout, second.stdout


def test_demo_default_run_cleans_up():
    proc = run_demo("--seconds", "1", "--workers", "1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "converged" in proc.stdout


def test_demo_rejects_bad_arguments():
    proc = run_demo("--workers", "0")
    assert proc.returncode == 2 and "--workers" in proc.stderr

"""`python -m reconq.demo` runs by itself, finishes and converges, and a
second run picks up what the first left in its directory."""

import json
import os
import re
import subprocess
import sys

import pytest

import reconq


def run_demo(*args, timeout=60, env=None):
    return subprocess.run(
        [sys.executable, "-m", "reconq.demo", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=None if env is None else {**{k: v for k, v in os.environ.items() if k != "RECONQ_DEMO_DIR"}, **env},
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
    env = {"RECONQ_DEMO_DIR": str(tmp_path)}
    first = run_demo("--seconds", "1", "--workers", "2", env=env)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "reconq demo, run 1:" in first.stdout and "state.db: restored nothing" in first.stdout, first.stdout
    assert f"state is kept in {tmp_path} between runs" in first.stdout, first.stdout
    # billing's API is down all the first run: it ends pending.
    tries = [int(n) for n in re.findall(r"billing +try (\d+) +retry TransientError: 503 billing backend down", first.stdout)]
    assert tries and tries == list(range(1, len(tries) + 1)), first.stdout
    assert "billing: its API was down all run; still pending" in first.stdout, first.stdout
    assert "broken   try 1  FAIL" in first.stdout, first.stdout

    second = run_demo("--seconds", "1", "--workers", "2", env=env)
    out = second.stdout
    assert second.returncode == 0, out + second.stderr
    assert "reconq demo, run 2:" in out, out
    # Picked up: still pending with its failure count, and parked.
    assert f"state.db: restored billing pending after {tries[-1]} failures, broken parked" in out, out
    # The count continues: the first try of this run is not try 1.
    assert re.search(rf"billing +try {tries[-1] + 1} +ok +created", out), out
    # The desired state was kept, not reset; this run's user fixes broken.
    assert "edit web.json" not in out and "fix broken.json" in out, out
    assert re.search(r"broken +try 1 +ok +created", out), out
    desired, actual = tmp_path / "desired", tmp_path / "actual"
    assert json.loads((desired / "web.json").read_text())["replicas"] == 5
    assert sorted(p.stem for p in actual.glob("*.json")) == ["api", "billing", "broken", "db", "search", "web", "worker"]


def test_demo_keeps_its_state_in_a_named_directory_and_fresh_starts_over(tmp_path):
    env = {"XDG_STATE_HOME": str(tmp_path)}
    where = tmp_path / "reconq-demo"
    first = run_demo("--seconds", "1", "--workers", "1", env=env)
    assert first.returncode == 0, first.stdout + first.stderr
    assert f"state is kept in {where} between runs; `python -m reconq.demo --fresh` starts over" in first.stdout
    assert (where / "desired").is_dir() and (where / "state.db").exists()
    again = run_demo("--seconds", "1", "--workers", "1", "--fresh", env=env)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "reconq demo, run 1:" in again.stdout and "restored nothing" in again.stdout, again.stdout


def test_demo_rejects_bad_arguments():
    proc = run_demo("--workers", "0")
    assert proc.returncode == 2 and "--workers" in proc.stderr

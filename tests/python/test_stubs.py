"""The hand-written stubs match the extension module."""

import subprocess
import sys

import pytest

pytest.importorskip("mypy")


def test_stubtest():
    proc = subprocess.run(
        [sys.executable, "-m", "mypy.stubtest", "reconq"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_stubs_type_check_a_typical_program(tmp_path):
    prog = tmp_path / "prog.py"
    prog.write_text(
        "import reconq\n"
        "q = reconq.WorkQueue(reconq.MaxOf(reconq.ExponentialBackoff(0.005, 10), reconq.TokenBucket(10, 100)))\n"
        "q.add(('ns', 'name'))\n"
        "q.add_after(1, 0.5)\n"
        "key = q.get(timeout=1.0)\n"
        "q.done(key)\n"
        "n: int = len(q) + q.num_requeues(key)\n"
        "ok: bool = q.shut_down_with_drain() and q.shutting_down\n"
        "w: float = reconq.default_rate_limiter().when(b'k')\n"
        "r = reconq.Requeue(after=1)\n"
        "e: Exception = reconq.RetryAfter(2, 'busy')\n"
        "q.add(1.5)  # E: not a key\n"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", str(prog)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = proc.stdout
    assert proc.returncode == 1, out
    errors = [line for line in out.splitlines() if ": error:" in line]
    assert len(errors) == 1 and "prog.py:12:" in errors[0], out

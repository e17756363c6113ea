"""Every Python example in the README runs as written (the metrics one on a
free port instead of 9100, the replicas ones against a test etcd), so none
can rot."""

from __future__ import annotations

import pathlib
import re
import signal
import threading
from typing import Any, Dict

import pytest

from etcd_server import Etcd
from waiting import wait_for

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def first_line(block: str) -> str:
    return next(line for line in block.splitlines() if line and not line.startswith("import"))


@pytest.mark.parametrize("block", BLOCKS, ids=[first_line(b)[:40] for b in BLOCKS])
def test_readme_example_runs(block: str) -> None:
    block = block.replace("port=9100", "port=0")
    namespace: Dict[str, Any] = {"__name__": "readme_example"}
    if "LeaderElection(" in block or "Sharding(" in block:
        return run_replicas_example(block, namespace)
    exec(compile(block, "README.md", "exec"), namespace)
    # A block written as a pytest file: run its tests.
    for name, value in list(namespace.items()):
        if name.startswith("test_") and callable(value):
            value()


def run_replicas_example(block: str, namespace: Dict[str, Any]) -> None:
    """A replicas example (leader election, sharding), against a test etcd:
    once it has reconciled, Ctrl-C ends its `run()` as it would a user's."""
    etcd = Etcd()
    try:
        block = block.replace("http://127.0.0.1:2379", etcd.endpoint)

        def interrupt_once_reconciled() -> None:
            wait_for(lambda: "c" in namespace and namespace["c"].stats()["successes"] >= 1, what="a reconcile")
            signal.raise_signal(signal.SIGINT)

        threading.Thread(target=interrupt_once_reconciled, daemon=True).start()
        exec(compile(block, "README.md", "exec"), namespace)
        assert namespace["c"].stats()["state"] == "stopped"
    finally:
        etcd.close()


def test_the_first_example_counts_its_work(capsys: pytest.CaptureFixture[str]) -> None:
    (block,) = [b for b in BLOCKS if 'name="sync"' in b]
    exec(compile(block, "README.md", "exec"), {})
    printed = capsys.readouterr().out
    assert "'successes': 3" in printed and "'failures': 1" in printed, printed


def test_every_python_example_is_collected() -> None:
    assert len(BLOCKS) >= 6


def test_nothing_points_outside_the_repository() -> None:
    """The guarantees live in docs/guarantees.md: no README line or doc
    comment may send a reader to a file a clone does not have."""
    root = README.parent
    files = [README, *root.glob("src/**/*.rs"), *root.glob("python/reconq/*.py*"), *root.glob("docs/*.md"),
             *root.glob("tests/**/*.rs"), *root.glob("tests/python/*.py"), *root.glob("benches/**/*.*")]
    offenders = [
        str(f.relative_to(root))
        for f in files
        if f != pathlib.Path(__file__).resolve()
        and any(outside in f.read_text(errors="replace") for outside in ("shared/spec", "API.md", "shared/research"))
    ]
    assert offenders == []

"""The README's Python examples that are complete programs run as written,
so they cannot rot."""

from __future__ import annotations

import pathlib
import re
from typing import Dict

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def block_defining(name: str) -> str:
    (block,) = [b for b in python_blocks() if f"def {name}(" in b]
    return block


def test_the_testing_your_reconcile_example_passes():
    name = "test_a_flaky_backend_is_retried_after_5_then_10_ms"
    namespace: Dict[str, object] = {}
    exec(compile(block_defining(name), "README.md", "exec"), namespace)
    namespace[name]()  # type: ignore[operator]


def test_the_first_python_example_finishes_and_counts_its_work(capsys):
    (block,) = [b for b in python_blocks() if 'name="sync"' in b]
    exec(compile(block, "README.md", "exec"), {})
    printed = capsys.readouterr().out
    assert "'successes': 3" in printed and "'failures': 1" in printed, printed

"""The `reconq` console script that pip installs with the package (issue 35
item 4): the same command as `python -m reconq`, with `--version` saying
the installed package's version. The script is looked for where this
interpreter's environment keeps its scripts, so the test sees what `pip
install` (or `maturin develop`) put there."""

from __future__ import annotations

import importlib.metadata
import shutil
import subprocess
import sys
import sysconfig
from typing import Callable, List

import pytest

import reconq
from etcd_server import free_port


def script() -> List[str]:
    scripts = sysconfig.get_path("scripts")
    path = shutil.which("reconq", path=scripts)
    assert path, f"no reconq script in {scripts}: the package's [project.scripts] was not installed"
    return [path]


def module() -> List[str]:
    return [sys.executable, "-m", "reconq"]


COMMANDS = pytest.mark.parametrize("command", [script, module], ids=["reconq", "python -m reconq"])


def run(command: Callable[[], List[str]], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*command(), *args], capture_output=True, text=True, timeout=30, check=False)


@COMMANDS
def test_version_is_the_installed_package_version(command: Callable[[], List[str]]) -> None:
    version = importlib.metadata.version("reconq")
    assert reconq.__version__ == version
    done = run(command, "--version")
    assert (done.returncode, done.stdout, done.stderr) == (0, f"reconq {version}\n", "")


@COMMANDS
def test_usage_names_the_script(command: Callable[[], List[str]]) -> None:
    done = run(command)
    assert done.returncode == 2
    assert done.stderr.startswith("usage: reconq "), done.stderr
    assert "--version" in done.stderr


def test_the_script_runs_the_status_command() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    done = run(script, "status", url)
    assert done.returncode == 1
    assert done.stderr.startswith(f"reconq status: cannot reach {url}/status: "), done.stderr

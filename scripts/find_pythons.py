"""Every CPython >= 3.9 on this machine that can make a virtualenv, once
each, oldest first: one path per line. `.ci/run` runs the wheel's smoke
program with each.

    python scripts/find_pythons.py

Looks at `python3` and `python3.N` on PATH and in the usual places: the
system's (/usr/bin, /usr/local/bin), pyenv's versions and the manylinux
images' /opt/python. Two paths to one interpreter (a symlink, a pyenv
shim) count once.
"""

from __future__ import annotations

import glob
import os
import re
import subprocess
from typing import Dict, List, Tuple

OLDEST = (3, 9)
NAME = re.compile(r"^python3(\.\d+)?$")
#: Prints what tells interpreters apart; fails without venv and ensurepip
#: (Debian's python3 without the python3-venv package).
PROBE = (
    "import os, sys, venv, ensurepip; "
    "print(sys.implementation.name, sys.version_info[0], sys.version_info[1], sys.version_info[2]); "
    "print(os.path.realpath(sys.executable))"
)


def candidates() -> List[str]:
    places = os.environ.get("PATH", "").split(os.pathsep) + ["/usr/bin", "/usr/local/bin"]
    places += sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/*/bin")))
    places += sorted(glob.glob("/opt/python/*/bin"))
    found = []
    for place in dict.fromkeys(places):
        if os.path.isdir(place):
            found += [os.path.join(place, name) for name in sorted(os.listdir(place)) if NAME.match(name)]
    return found


def main() -> None:
    interpreters: Dict[str, Tuple[int, int, int]] = {}
    for path in candidates():
        try:
            done = subprocess.run([path, "-c", PROBE], capture_output=True, text=True, timeout=30, check=False)
        except OSError:
            continue
        lines = done.stdout.split("\n")
        if done.returncode != 0 or len(lines) < 2:
            continue  # e.g. a pyenv shim for a version not selected here
        implementation, *version = lines[0].split()
        release = (int(version[0]), int(version[1]), int(version[2]))
        if implementation == "cpython" and release[:2] >= OLDEST:
            interpreters.setdefault(lines[1], release)
    for real_path, _ in sorted(interpreters.items(), key=lambda item: (item[1], item[0])):
        print(real_path)


if __name__ == "__main__":
    main()

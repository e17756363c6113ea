"""Checks built wheels and sdists before anyone installs or publishes them
(scripts/build-wheel.sh and the release workflow run it; a wheel's checks
need abi3audit and, for a Linux wheel, auditwheel on PATH):

- a wheel is abi3 (one wheel for every CPython >= 3.9) and abi3audit
  finds no symbol outside the stable ABI of its baseline;
- a Linux wheel runs on manylinux2014 (glibc 2.17) or older, as auditwheel
  reads its symbol versions, and links libgcc_s.so.1 (build-wheel.sh says
  why);
- each carries LICENSE and the PEP 639 licence field, a wheel the `reconq`
  console script, an sdist what building from it needs.

    python scripts/check_dist.py DIST_FILE...    (wheels and sdists)

Prints one line per check; exits 1 naming every check that failed.
"""

from __future__ import annotations

import configparser
import email.parser
import pathlib
import re
import subprocess
import sys
import tarfile
import zipfile
from typing import List, Tuple

#: manylinux2014: what RHEL/CentOS 7 and every later Linux distribution run.
OLDEST_GLIBC = (2, 17)
#: auditwheel's legacy names for the manylinux_2_x tags.
LEGACY_TAGS = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}
LICENSE_EXPRESSION = "Apache-2.0"
CONSOLE_SCRIPT = ("reconq", "reconq.__main__:main")
#: What building from the sdist needs, and the licence.
SDIST_NEEDS = ("LICENSE", "Cargo.toml", "Cargo.lock", "pyproject.toml", "README.md", "src/lib.rs", "python/reconq/__init__.py")

failures: List[str] = []


def check(ok: bool, what: str, detail: str = "") -> None:
    """Records one check; `detail` (a tool's output) is printed if it failed."""
    print(f"{'ok' if ok else 'FAILED'}: {what}")
    if not ok:
        if detail:
            print(detail, end="" if detail.endswith("\n") else "\n")
        failures.append(what)


def run(*argv: str) -> Tuple[int, str]:
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    return done.returncode, done.stdout + done.stderr


def glibc_of(auditwheel_show: str) -> Tuple[int, int]:
    """The glibc version of the platform tag auditwheel says the wheel is
    consistent with (its output wraps lines, never inside the tag)."""
    found = re.search(r'consistent with the following platform tag:\s*"([^"]+)"', auditwheel_show)
    if not found:
        return (999, 0)
    tag = found.group(1)
    modern = re.match(r"manylinux_(\d+)_(\d+)_", tag)
    if modern:
        return (int(modern.group(1)), int(modern.group(2)))
    return LEGACY_TAGS.get(tag.split("_")[0], (999, 0))


def check_wheel(wheel: pathlib.Path) -> None:
    check("-abi3-" in wheel.name, f"{wheel.name} is an abi3 wheel")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        dist_info = next(name.split("/")[0] for name in names if name.endswith(".dist-info/METADATA"))
        metadata = email.parser.Parser().parsestr(archive.read(f"{dist_info}/METADATA").decode())
        entry_points = configparser.ConfigParser(delimiters=("=",))
        if f"{dist_info}/entry_points.txt" in names:
            entry_points.read_string(archive.read(f"{dist_info}/entry_points.txt").decode())
        extension = next((archive.read(n) for n in names if n.startswith("reconq/_native.")), b"")
    # abi3audit passes a library without the module's init function too.
    check(b"PyInit__native" in extension, "the wheel's reconq/_native library defines PyInit__native")
    check(f"{dist_info}/licenses/LICENSE" in names, f"the wheel has {dist_info}/licenses/LICENSE")
    expression = metadata["License-Expression"]
    check(expression == LICENSE_EXPRESSION, f"the wheel's METADATA says License-Expression: {LICENSE_EXPRESSION}")
    name, function = CONSOLE_SCRIPT
    installed = entry_points.get("console_scripts", name, fallback=None)
    check(installed == function, f"the wheel installs the console script {name} = {function}")

    code, report = run("abi3audit", "--strict", str(wheel))
    check(code == 0, "abi3audit --strict: no symbol outside the stable ABI of the wheel's baseline", report)
    if "linux" in wheel.name:
        code, report = run("auditwheel", "show", str(wheel))
        glibc = glibc_of(report)
        check(
            code == 0 and glibc <= OLDEST_GLIBC,
            f"auditwheel show: manylinux_2_17 (manylinux2014) or older; it says glibc {glibc[0]}.{glibc[1]}",
            report,
        )
        # build-wheel.sh: one unwinder for CPython's pthread_exit and our
        # frames (zig's static one crashes a thread CPython ends at exit).
        check(
            "libgcc_s.so.1" in report,
            "the extension takes its unwinder from the system's libgcc_s.so.1 (auditwheel show lists it)",
            report,
        )


def check_sdist(sdist: pathlib.Path) -> None:
    with tarfile.open(sdist) as archive:
        names = archive.getnames()
        top = names[0].split("/")[0]
        pkg_info = archive.extractfile(f"{top}/PKG-INFO")
        metadata = email.parser.Parser().parsestr(pkg_info.read().decode() if pkg_info else "")
    for needed in SDIST_NEEDS:
        check(f"{top}/{needed}" in names, f"the sdist has {top}/{needed}")
    expression = metadata["License-Expression"]
    check(expression == LICENSE_EXPRESSION, f"the sdist's PKG-INFO says License-Expression: {LICENSE_EXPRESSION}")


def main() -> int:
    paths = [pathlib.Path(arg) for arg in sys.argv[1:]]
    check(bool(paths), "something to check (give wheels and sdists)")
    for path in paths:
        if path.name.endswith(".whl"):
            check_wheel(path)
        elif path.name.endswith(".tar.gz"):
            check_sdist(path)
        else:
            check(False, f"{path} is a wheel (.whl) or an sdist (.tar.gz)")
    if failures:
        print(f"{len(failures)} check(s) failed:", *failures, sep="\n  ", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

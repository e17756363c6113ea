#!/usr/bin/env bash
# Builds what a release publishes, into the checkout's dist/ (or the
# directory given), and checks it (scripts/check_dist.py):
#   - one wheel for every CPython >= 3.9 (pyo3/abi3-py39); on Linux a
#     manylinux2014 one (glibc >= 2.17: CentOS 7, Debian 9, Ubuntu 18.04
#     and later), linked with zig so that the build machine's newer glibc
#     does not leak into it;
#   - the sdist.
# The build tools come from PyPI into a virtualenv of their own
# (.venv-build); nothing else is needed beyond a Rust toolchain and
# CPython >= 3.9 with venv.
#
#     bash scripts/build-wheel.sh [OUT_DIR]
#
# TARGET=<rust target triple> builds for that target instead of this
# machine's (the release workflow's macOS job: universal2-apple-darwin).
set -euo pipefail
OUT=${1:-"$(dirname "$0")/../dist"}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)  # absolute (macOS's realpath has no -m)
cd "$(dirname "$0")/.."
ROOT=$PWD
PYTHON=${PYTHON:-python3}
TOOLS="$ROOT/.venv-build"
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1

if [ ! -x "$TOOLS/bin/python" ]; then
    "$PYTHON" -m venv "$TOOLS"
fi
# maturin >= 1.9 writes PEP 639 licence metadata; ziglang is the linker for
# manylinux2014; auditwheel and abi3audit check the result.
"$TOOLS/bin/python" -m pip install --quiet "maturin>=1.9.4,<2" ziglang auditwheel abi3audit
# maturin finds zig as `python -m ziglang` with the python on PATH.
export PATH="$TOOLS/bin:$PATH"

# Only this build's files in OUT: a stale wheel would be checked instead.
rm -f "$OUT"/reconq-*.whl "$OUT"/reconq-*.tar.gz
# `--features` replaces pyproject.toml's list: name `python` (the extension
# module) again, or the wheel's library has no PyInit__native.
args=(--release --features python,pyo3/abi3-py39 --out "$OUT" ${TARGET:+--target "$TARGET"})
rustc_args=()
if [ "$(uname -s)" = Linux ]; then
    args+=(--zig --compatibility manylinux2014)
    # zig turns the `-lgcc_s` Rust links with into its own static unwinder.
    # But CPython < 3.14 ends a thread that wants the GIL while the
    # interpreter finalizes with pthread_exit, whose forced unwind runs on
    # glibc's libgcc_s and calls our frames' personality routine: with zig's
    # unwinder answering that routine, the process crashes (SIGSEGV; see
    # docs/benchmarks.md, "The abi3 wheel"). Naming the file links
    # libgcc_s.so.1 itself (manylinux allows it, and every glibc system has
    # it), so the whole unwind runs on one unwinder; check_dist.py checks.
    libgcc_s=$("${CC:-cc}" -print-file-name=libgcc_s.so.1)
    if [ ! -e "$libgcc_s" ]; then
        echo "build-wheel.sh: libgcc_s.so.1 not found (${CC:-cc} -print-file-name)" >&2
        exit 1
    fi
    rustc_args=(-- -C "link-arg=$libgcc_s")
fi
# (`${a[@]+...}`: bash 3.2, macOS's, calls an empty array unbound.)
maturin build "${args[@]}" ${rustc_args[@]+"${rustc_args[@]}"}
maturin sdist --out "$OUT"

python "$ROOT/scripts/check_dist.py" "$OUT"/reconq-*.whl "$OUT"/reconq-*.tar.gz

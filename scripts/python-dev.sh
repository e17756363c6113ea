#!/usr/bin/env bash
# Developer loop for the Python bindings: makes .venv if needed, builds the
# extension in place (`maturin develop`, incremental), then runs pytest with
# any arguments given, e.g. `bash scripts/python-dev.sh -k drain -x`.
# Set RELEASE=1 for an optimised build (benchmarks).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
export PIP_DISABLE_PIP_VERSION_CHECK=1
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
    .venv/bin/python -m pip install --quiet "maturin>=1.9.4,<2" pytest pytest-timeout mypy hypothesis
fi
# Test tools added since the venv was made.
.venv/bin/python -c "import prometheus_client" 2>/dev/null || .venv/bin/python -m pip install --quiet prometheus_client
.venv/bin/python -c "import psycopg" 2>/dev/null || .venv/bin/python -m pip install --quiet "psycopg[binary]>=3.2.4"
.venv/bin/python -c "import basedpyright" 2>/dev/null || .venv/bin/python -m pip install --quiet basedpyright
# shellcheck disable=SC1091
source .venv/bin/activate
if [ "${RELEASE:-0}" = 1 ]; then
    maturin develop --release --quiet
else
    maturin develop --quiet
fi
exec python -m pytest "$@"

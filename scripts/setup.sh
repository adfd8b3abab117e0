#!/usr/bin/env bash
# Create .venv and install the project with the given extras (comma-separated, e.g. "test").
# torch: kept if the venv already has torch >= 2.5; else torch==2.13.0 (a CUDA build from PyPI on Linux,
# which also runs on the CPU). Set TORCH_SPEC to choose another, e.g. TORCH_SPEC="torch==2.11.0".
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
[ -x .venv/bin/python ] || python3 -m venv .venv
py=.venv/bin/python
if ! "$py" -c 'import sys, torch; sys.exit(tuple(map(int, torch.__version__.split(".")[:2])) < (2, 5))' 2>/dev/null; then
  "$py" -m pip install -q "${TORCH_SPEC:-torch==2.13.0}"
fi
"$py" -m pip install -q -e ".${extras:+[$extras]}"

#!/usr/bin/env bash
# Create (or reuse) the project's virtual environment and install nestbatch into it.
# Usage: source scripts/setup_env.sh [extras]   (extras: e.g. "test,docs,lint")
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${NESTBATCH_VENV:-$root/.venv}"
python="${PYTHON:-python3}"
if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv"
fi
# torch pinned: this version installs a local CPU build; an unpinned torch pulls GBs of CUDA.
if ! "$venv/bin/python" -c 'import torch' 2>/dev/null; then
  "$venv/bin/pip" install -q torch==2.13.0
fi
extras="${1:-}"
spec="$root"
[ -n "$extras" ] && spec="$root[$extras]"
"$venv/bin/pip" install -q -e "$spec"

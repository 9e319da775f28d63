#!/usr/bin/env bash
# Set up a virtual environment and run the checks: lint, docs (warnings are errors), tests.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup_env.sh" "test,docs,lint"
bin="${NESTBATCH_VENV:-$root/.venv}/bin"
cd "$root"
echo "== ruff"
"$bin/ruff" check .
echo "== docs"
"$bin/python" -m sphinx -W --keep-going -q -b html docs docs/_build/html
echo "== tests"
"$bin/python" -m pytest -q "$@"

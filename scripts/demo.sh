#!/usr/bin/env bash
# The main job: set up a virtual environment and run the demo.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup_env.sh"
exec "${NESTBATCH_VENV:-$root/.venv}/bin/python" "$root/examples/demo.py" "$@"

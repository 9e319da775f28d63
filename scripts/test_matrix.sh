#!/usr/bin/env bash
# Run the test suite on several torch releases, each in its own virtual environment.
#
# Usage: bash scripts/test_matrix.sh [versions...]   (default: the supported range, 2.11 to 2.14)
#
# The venvs are cached outside the tree ($NESTBATCH_VENV_CACHE, default ~/.cache/nestbatch-venvs):
# every release but the pinned CPU build (2.13.0) comes with CUDA wheels, several GB each.
# Extra pytest arguments go in $PYTEST_ARGS. Prints one summary line per release and exits
# non-zero when any release fails.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${NESTBATCH_VENV_CACHE:-$HOME/.cache/nestbatch-venvs}"
python="${PYTHON:-python3}"
versions=("$@")
if [ "${#versions[@]}" -eq 0 ]; then
  versions=(2.11.0 2.12.1 2.13.0 2.14.1)
fi
mkdir -p "$cache"
summary=()
status=0
for version in "${versions[@]}"; do
  venv="$cache/torch-$version"
  [ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
  installed="$("$venv/bin/python" -c 'import torch; print(torch.__version__.split("+")[0])' \
    2>/dev/null || true)"
  if [ "$installed" != "$version" ]; then
    "$venv/bin/pip" install -q "torch==$version"
  fi
  "$venv/bin/pip" install -q -e "$root[test]"
  echo "== torch $version ($venv)"
  log="$cache/torch-$version.log"
  set +e
  (cd "$root" && "$venv/bin/python" -m pytest -q -p no:randomly ${PYTEST_ARGS:-}) > "$log" 2>&1
  code=$?
  set -e
  tail -n 1 "$log"
  summary+=("torch $version: $(tail -n 1 "$log")")
  [ "$code" -eq 0 ] || status=1
done
echo "== summary"
printf '%s\n' "${summary[@]}"
exit "$status"

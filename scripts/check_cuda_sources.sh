#!/usr/bin/env bash
# Compile every CUDA source of csrc/ (and the C++ binding) against the installed PyTorch headers,
# without a GPU. Used by CI on CPU-only machines and by tests/test_kernels_build.py.
#
# Usage: scripts/check_cuda_sources.sh [python]      (default: .venv/bin/python, else python3)
# Env:   NVCC (default: nvcc on PATH, else $CUDA_HOME/bin/nvcc), CUDA_ARCH (default: 90).
# Exit:  0 all sources compile, 1 a compile error, 77 no nvcc (skip).
# Prints the registers (and spills) ptxas reports for every kernel instantiation.
#
# CPU wheels of PyTorch ship the c10/cuda and ATen/cuda headers but not the one header that the
# CUDA build generates, c10/cuda/impl/cuda_cmake_macros.h; when it is missing, a temporary copy
# with the content CUDA wheels ship (one define) is put on the include path. Nothing else differs
# from a real build: the real csrc/ files are compiled with the real torch headers.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${1:-}"
if [[ -z "$PYTHON" ]]; then
  if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
NVCC="${NVCC:-$(command -v nvcc || true)}"
if [[ -z "$NVCC" && -n "${CUDA_HOME:-}" && -x "$CUDA_HOME/bin/nvcc" ]]; then NVCC="$CUDA_HOME/bin/nvcc"; fi
if [[ -z "$NVCC" ]]; then
  echo "check_cuda_sources: nvcc not found, skipping" >&2
  exit 77
fi
ARCH="${CUDA_ARCH:-90}"

mapfile -t TORCH_INCLUDES < <("$PYTHON" -c 'import torch.utils.cpp_extension as c; print(*c.include_paths(), sep="\n")')
PY_INCLUDE="$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')"
CXX11_ABI="$("$PYTHON" -c 'import torch; print(int(torch._C._GLIBCXX_USE_CXX11_ABI))')"

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
INCLUDES=()
for dir in "${TORCH_INCLUDES[@]}"; do INCLUDES+=("-I$dir"); done
if [[ ! -f "${TORCH_INCLUDES[0]}/c10/cuda/impl/cuda_cmake_macros.h" ]]; then
  mkdir -p "$WORK/shim/c10/cuda/impl"
  printf '#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n' > "$WORK/shim/c10/cuda/impl/cuda_cmake_macros.h"
  INCLUDES+=("-I$WORK/shim")
fi
DEFINES=(-D_GLIBCXX_USE_CXX11_ABI="$CXX11_ABI" -DTORCH_EXTENSION_NAME=_C -DTORCH_API_INCLUDE_EXTENSION_H)

start=$SECONDS
pids=()
names=()
for source in csrc/*.cu; do
  name="$(basename "$source" .cu)"
  "$NVCC" -std=c++20 -O3 --expt-relaxed-constexpr -Xcompiler -fPIC -Xptxas -v \
    -gencode "arch=compute_${ARCH},code=sm_${ARCH}" "${INCLUDES[@]}" "${DEFINES[@]}" \
    -c "$source" -o "$WORK/$name.o" > "$WORK/$name.log" 2>&1 &
  pids+=($!)
  names+=("$source")
done
CXX="${CXX:-g++}"
if command -v "$CXX" > /dev/null; then
  "$CXX" -std=c++20 -fsyntax-only "${INCLUDES[@]}" "-I$PY_INCLUDE" "${DEFINES[@]}" \
    csrc/bindings.cpp > "$WORK/bindings.log" 2>&1 &
  pids+=($!)
  names+=(csrc/bindings.cpp)
fi

status=0
for i in "${!pids[@]}"; do
  if wait "${pids[$i]}"; then
    echo "ok      ${names[$i]}"
    log="$WORK/$(basename "${names[$i]}" | sed 's/\.cu$//; s/\.cpp$//').log"
    "$PYTHON" scripts/ptxas_registers.py "$log"
  else
    status=1
    echo "FAILED  ${names[$i]}"
    log="$WORK/$(basename "${names[$i]}" | sed 's/\.cu$//; s/\.cpp$//').log"
    cat "$log"
  fi
done
echo "check_cuda_sources: $(( SECONDS - start )) s, nvcc $("$NVCC" --version | tail -1), sm_${ARCH}"
exit $status

#!/usr/bin/env bash
# One command for a machine with a CUDA GPU: build the CUDA extension, run the GPU tests (the
# default and the slow ones), then every benchmark on the GPU in its quick form.
#
# Usage: bash scripts/test_gpu.sh            (uses .venv/bin/python, else python3)
# The torch already installed is used as is: a CUDA build of torch is needed (the CPU pin of
# scripts/setup_env.sh does not install one; install a CUDA torch first on a GPU machine).
set -uo pipefail
cd "$(dirname "$0")/.."
if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
status=0
run() { echo "== $*"; "$@" || status=1; }

run "$PYTHON" -c 'import torch, sys
print("torch", torch.__version__, "cuda", torch.version.cuda, "device",
      torch.cuda.get_device_name() if torch.cuda.is_available() else None)
sys.exit(0 if torch.cuda.is_available() else 1)'
run "$PYTHON" -c 'from nestbatch import kernels
assert kernels.load_extension(), kernels.extension_status()
print("extension:", kernels.extension_status())'
run "$PYTHON" -m pytest -q -p no:cacheprovider -m cuda tests
run "$PYTHON" -m pytest -q -p no:cacheprovider -m "slow and cuda" tests
for bench in benchmarks/bench_conversions.py benchmarks/bench_indexing.py \
             benchmarks/bench_overhead.py benchmarks/bench_attention.py benchmarks/bench_ops.py; do
  run "$PYTHON" "$bench" --device cuda --quick
done
# CUDA-only benchmarks: the GPU path per call (launches, syncs, wall, graph capture) and the
# conversion kernels' bandwidth against a device copy.
run "$PYTHON" benchmarks/bench_gpu_path.py --quick
run "$PYTHON" benchmarks/bench_kernel_bandwidth.py --quick
echo "test_gpu: $([[ $status == 0 ]] && echo all passed || echo FAILURES above)"
exit $status

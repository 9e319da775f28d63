"""The benchmarks build valid arguments for every size they measure (checked without running
them: fake CUDA tensors have shapes but no memory), and every script starts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from gpu_path import fake_cuda

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import bench_conversions  # noqa: E402


@pytest.mark.parametrize("size", bench_conversions.SIZES)
def test_aten_padded_to_jagged_gets_3d_data_at_every_size(size):
    batch, max_len, feature = size
    with fake_cuda():
        shape = (batch, max_len) if feature == 1 else (batch, max_len, feature)
        padded = torch.empty(shape, device="cuda")
        offsets = torch.empty(batch + 1, dtype=torch.int64, device="cuda")
        total = batch * max_len
        data, _, _ = bench_conversions.aten_padded_to_jagged_args(padded, offsets, total)
        out = bench_conversions.aten_padded_to_jagged(padded, offsets, total)
    assert data.dim() == 3 and data.shape[:2] == (batch, max_len)
    assert out.shape == ((total,) if feature == 1 else (total, feature))


def test_every_benchmark_script_starts_from_a_plain_checkout():
    """Each script runs as ``python benchmarks/X.py`` from the repository root with nothing
    installed (as scripts/test_gpu.sh runs them): ``--help`` imports everything it needs."""
    root = Path(__file__).resolve().parents[1]
    scripts = sorted((root / "benchmarks").glob("bench_*.py"))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    runs = [
        subprocess.Popen(
            [sys.executable, str(script), "--help"], cwd=root / "docs", env=env,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        for script in scripts
    ]
    for script, run in zip(scripts, runs):
        output, _ = run.communicate(timeout=120)
        assert run.returncode == 0, f"{script.name}:\n{output}"

"""The CUDA sources compile (nvcc against the installed torch headers), even without a GPU.

Slow (about 2.5 minutes on 2 cores): ``pytest -m slow``, or ``scripts/check_cuda_sources.sh``.
Skipped where ``nvcc`` is missing; the extension loader's fallback is checked in the default run.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from nestbatch.kernels import extension

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_cuda_sources_compile():
    result = subprocess.run(
        [str(ROOT / "scripts" / "check_cuda_sources.sh"), sys.executable],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_sources_listed_exist():
    for name in extension.SOURCES:
        assert (extension.CSRC_DIR / name).is_file()
    assert sorted(p.name for p in extension.CSRC_DIR.glob("*.cu")) == sorted(
        name for name in extension.SOURCES if name.endswith(".cu")
    )


@pytest.mark.skipif(torch.version.cuda is not None, reason="checks the CPU-only fallback")
def test_cpu_only_torch_falls_back_with_one_warning():
    extension.load_extension.cache_clear()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert extension.load_extension() is False
            assert extension.load_extension() is False
        messages = [w for w in caught if "compiled CUDA kernels unavailable" in str(w.message)]
        assert len(messages) == 1
        assert "fallback" in extension.extension_status()
    finally:
        extension.load_extension.cache_clear()

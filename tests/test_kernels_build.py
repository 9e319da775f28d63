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

from nestbatch.kernels import build_config, extension

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
    csrc = build_config.REPOSITORY_CSRC_DIR
    assert extension.csrc_dir() == csrc  # a source checkout builds from its own csrc/
    for name in build_config.SOURCES:
        assert (csrc / name).is_file()
    assert sorted(p.name for p in csrc.glob("*.cu")) == sorted(
        name for name in build_config.SOURCES if name.endswith(".cu")
    )


def test_wheel_carries_the_cuda_sources(tmp_path):
    # A non-editable install has no checkout next to it: the JIT build must find the sources in
    # the package itself.
    wheel_dir, target = tmp_path / "wheel", tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run(
        [*pip, "wheel", str(ROOT), "--no-deps", "--no-build-isolation", "-w", str(wheel_dir)],
        check=True, capture_output=True, timeout=300,
    )
    wheel = next(wheel_dir.glob("nestbatch-*.whl"))
    subprocess.run(
        [*pip, "install", "--no-deps", "--target", str(target), str(wheel)],
        check=True, capture_output=True, timeout=300,
    )
    probe = "from nestbatch.kernels import build_config as b; print(b.csrc_dir())"
    found = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, env={"PYTHONPATH": str(target)},
        check=True, capture_output=True, text=True, timeout=60,
    ).stdout.strip()
    packaged = target / "nestbatch" / "kernels" / "csrc"
    assert Path(found) == packaged
    repository = build_config.REPOSITORY_CSRC_DIR
    for path in repository.iterdir():
        if path.suffix in build_config.CSRC_SUFFIXES:
            assert (packaged / path.name).read_bytes() == path.read_bytes()


def test_cpu_only_torch_falls_back_with_one_warning(monkeypatch):
    # (On a CUDA build too, as a CPU-only one: the build is never attempted.)
    monkeypatch.setattr(torch.version, "cuda", None)
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


def test_direct_kernel_only_where_the_compiled_kernel_covers_the_call(monkeypatch):
    # kernels.call's CUDA road: the compiled kernel for covered dtypes when autograd records
    # nothing, the operator (autograd formula, PyTorch implementation) otherwise.
    from nestbatch.kernels import dispatch, operators

    sentinel = object()
    monkeypatch.setattr(operators, "compiled_kernel", lambda name: (sentinel, name))
    values, offsets = torch.randn(5, 2), torch.tensor([0, 2, 5])
    assert dispatch._direct_kernel("packed_to_padded", (values, offsets, 3, 0.0)) == (
        sentinel, "packed_to_padded"
    )
    leaf = values.double().requires_grad_()
    assert dispatch._direct_kernel("packed_to_padded", (leaf, offsets, 3, 0.0)) is None
    with torch.no_grad():
        assert dispatch._direct_kernel("packed_to_padded", (leaf, offsets, 3, 0.0)) is not None
    complex_values = torch.randn(5, 2, dtype=torch.complex64)
    assert dispatch._direct_kernel("packed_to_padded", (complex_values, offsets, 3, 0.0)) is None
    unsigned = offsets.to(torch.uint32)
    assert dispatch._direct_kernel("packed_to_padded", (values, unsigned, 3, 0.0)) is None


def test_no_compiled_kernel_without_the_extension(monkeypatch):
    from nestbatch.kernels import operators

    monkeypatch.setattr(torch.version, "cuda", None)  # (a CPU-only build, whatever this one is)
    extension.load_extension.cache_clear()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert operators.compiled_kernel("packed_to_padded") is None
    finally:
        extension.load_extension.cache_clear()

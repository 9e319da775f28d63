"""What the compiled kernels are built from, in one place for ``setup.py`` and the loaders.

This module imports nothing but the standard library: ``setup.py`` reads it by path, before
the package (or even torch) is importable.

The sources live in the repository's ``csrc/``. A wheel or a non-editable install carries a copy
in ``nestbatch/kernels/csrc/`` (``setup.py`` puts it there at build time), so that the
just-in-time build works wherever nestbatch is installed, not only from a source checkout.
"""

from __future__ import annotations

from pathlib import Path

__all__ = [
    "CSRC_SUFFIXES",
    "CUDA_FLAGS",
    "CXX_FLAGS",
    "HOST_MODULE_SOURCE",
    "HOST_SOURCE",
    "PACKAGED_CSRC_DIR",
    "REPOSITORY_CSRC_DIR",
    "SOURCES",
    "csrc_dir",
]

#: The translation units of the extension, in build order.
SOURCES = ("bindings.cpp", "packed_padded.cu", "batched_indexing.cu", "mask_indices.cu")

#: The CPU conversions in plain C, and the Python module over them that
#: :mod:`nestbatch.kernels.host_library` compiles (it includes the former).
HOST_SOURCE = "host_kernels.c"
HOST_MODULE_SOURCE = "host_module.c"

#: Every file of ``csrc/`` the builds read (translation units and the headers they include).
CSRC_SUFFIXES = (".c", ".cpp", ".cu", ".cuh", ".h")

#: Host compiler flags.
CXX_FLAGS = ("-O3",)

#: nvcc flags. Relaxed constexpr lets device code use the constexpr helpers of c10 headers;
#: line info costs nothing at run time and makes profiler output readable.
CUDA_FLAGS = ("-O3", "--expt-relaxed-constexpr", "-lineinfo")

#: ``csrc/`` of a source checkout (editable installs, the repository's tests).
REPOSITORY_CSRC_DIR = Path(__file__).resolve().parents[2] / "csrc"

#: The copy of ``csrc/`` inside an installed package.
PACKAGED_CSRC_DIR = Path(__file__).resolve().parent / "csrc"


def csrc_dir() -> Path:
    """The directory holding the extension's sources: the packaged copy if there is one (an
    installed wheel), else the source checkout's ``csrc/`` (which may not exist)."""
    if all((PACKAGED_CSRC_DIR / name).is_file() for name in SOURCES):
        return PACKAGED_CSRC_DIR
    return REPOSITORY_CSRC_DIR

"""Building and loading the compiled CUDA kernels of ``csrc/``.

Three ways to get them, tried in order by :func:`load_extension` on the first CUDA call of a
``nestbatch::*`` operator:

1. Ahead of time: ``NESTBATCH_BUILD_CUDA=1 pip install --no-build-isolation -e .`` compiles
   ``nestbatch.kernels._C`` with ``setup.py``; importing it registers ``torch.ops.nestbatch_cuda``.
2. Just in time: :func:`torch.utils.cpp_extension.load` compiles the sources once (a minute or
   two) into the torch extensions cache (``TORCH_EXTENSIONS_DIR``, by default
   ``~/.cache/torch_extensions``); later processes reuse the cached library. The sources are the
   checkout's ``csrc/``, or the copy that an installed wheel carries
   (:mod:`nestbatch.kernels.build_config`).
3. Neither possible (CPU-only PyTorch, no ``nvcc``, no sources, a failed build): one warning, and
   the operators run their pure-PyTorch implementation on CUDA tensors too.

``NESTBATCH_DISABLE_CUDA_KERNELS=1`` skips 1 and 2 (no warning): the PyTorch path everywhere.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import warnings

import torch

from nestbatch.kernels.build_config import CUDA_FLAGS, CXX_FLAGS, SOURCES, csrc_dir

__all__ = ["SOURCES", "csrc_dir", "extension_status", "load_extension"]

_JIT_NAME = "nestbatch_kernels"
_status = "not loaded yet"


def _why_not_buildable() -> str | None:
    """A reason the JIT build cannot work here, or ``None``."""
    from torch.utils import cpp_extension

    if torch.version.cuda is None:
        return "this PyTorch build has no CUDA support"
    if cpp_extension.CUDA_HOME is None:
        return "no CUDA toolkit (nvcc) was found; set CUDA_HOME"
    missing = [name for name in SOURCES if not (csrc_dir() / name).is_file()]
    if missing:
        return f"the CUDA sources {missing} are not in {csrc_dir()}"
    return None


def _fallback(reason: str) -> bool:
    global _status
    _status = f"PyTorch fallback: {reason}"
    warnings.warn(
        f"nestbatch: compiled CUDA kernels unavailable ({reason}); the nestbatch operators use "
        "their PyTorch implementation on CUDA tensors.",
        RuntimeWarning,
        stacklevel=3,
    )
    return False


@functools.cache
def load_extension() -> bool:
    """Load (building if needed) the CUDA kernels; ``True`` when ``torch.ops.nestbatch_cuda`` works.

    Cached: the build is attempted once per process, and a failure warns once.
    """
    global _status
    if os.environ.get("NESTBATCH_DISABLE_CUDA_KERNELS") == "1":
        _status = "disabled by NESTBATCH_DISABLE_CUDA_KERNELS=1"
        return False
    if importlib.util.find_spec("nestbatch.kernels._C") is not None:
        importlib.import_module("nestbatch.kernels._C")
        _status = "ahead-of-time build (nestbatch.kernels._C)"
        return True
    reason = _why_not_buildable()
    if reason is not None:
        return _fallback(reason)
    from torch.utils import cpp_extension

    try:
        cpp_extension.load(
            name=_JIT_NAME,
            sources=[str(csrc_dir() / name) for name in SOURCES],
            extra_cflags=list(CXX_FLAGS),
            extra_cuda_cflags=list(CUDA_FLAGS),
            is_python_module=False,
        )
    except Exception as error:  # any build failure means: use the fallback
        return _fallback(f"building the extension failed: {type(error).__name__}: {error}")
    _status = "just-in-time build (torch.utils.cpp_extension.load)"
    return True


def extension_status() -> str:
    """How the CUDA operators are implemented in this process (for logs and benchmarks)."""
    return _status

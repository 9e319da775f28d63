"""Tensors next to an inaccessible page: a kernel that reads one byte outside them faults.

The emulated kernels read host memory, so an out-of-bounds read of an input is normally silent
(it reads a neighbour's bytes). Placing the input right before (or right after) a ``PROT_NONE``
page turns the first stray byte into a segmentation fault. Tests run such checks in a child
process (:func:`run_in_child`), where a fault fails the test instead of killing pytest.

Linux only (``mmap``/``mprotect`` through :mod:`ctypes`). Writes out of bounds are not caught
this way: the kernels write into outputs that their host code allocates.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import signal
import subprocess
import sys
from pathlib import Path

import torch
from torch import Tensor

__all__ = ["guarded", "run_in_child"]

_PROT_NONE, _PROT_READ_WRITE = 0, 3
_MAP_PRIVATE_ANONYMOUS = 0x02 | 0x20
_FAILED = ctypes.c_void_p(-1).value

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_long,
]
_libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]

#: The mappings live as long as the process (a few pages per guarded tensor): a tensor may
#: outlive every Python reference to its buffer.
_MAPPINGS: list[int] = []


def guarded(t: Tensor, side: str = "after") -> Tensor:
    """A contiguous copy of ``t`` that ends right before an inaccessible page (``side="after"``)
    or starts right after one (``side="before"``).

    Parameters
    ----------
    t : Tensor
        The content (a CPU tensor).
    side : {"after", "before"}
        Which neighbour of the data is inaccessible.

    Returns
    -------
    Tensor
        Same shape, dtype and values; an empty ``t`` is returned as a plain copy.
    """
    nbytes = t.numel() * t.element_size()
    if nbytes == 0:
        return t.clone()
    page = mmap.PAGESIZE
    pages = -(-nbytes // page)
    base = _libc.mmap(None, (pages + 2) * page, _PROT_READ_WRITE, _MAP_PRIVATE_ANONYMOUS, -1, 0)
    if base in (None, _FAILED):
        raise OSError(ctypes.get_errno(), "mmap failed")
    _MAPPINGS.append(base)
    for guard in (base, base + (pages + 1) * page):
        if _libc.mprotect(guard, page, _PROT_NONE) != 0:
            raise OSError(ctypes.get_errno(), "mprotect failed")
    start = base + page if side == "before" else base + (pages + 1) * page - nbytes
    buffer = (ctypes.c_char * nbytes).from_address(start)
    out = torch.frombuffer(buffer, dtype=t.dtype, count=t.numel()).view(t.shape)
    out.copy_(t)
    return out


def run_in_child(module: str, function: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run ``module.function()`` in a child Python (``cwd`` on its path), so that a segmentation
    fault fails a test instead of ending pytest. The child prints a Python traceback on a fault.

    Returns
    -------
    subprocess.CompletedProcess
        With ``returncode`` ``-SIGSEGV`` (or ``-SIGBUS``) after an out-of-bounds access.
    """
    code = f"import {module}; {module}.{function}()"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(cwd), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run(
        [sys.executable, "-X", "faulthandler", "-c", code],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def describe_fault(result: subprocess.CompletedProcess[str]) -> str:
    """What the child reported: its signal, if any, and the end of its output."""
    how = f"exit status {result.returncode}"
    if result.returncode < 0:
        how = f"killed by {signal.Signals(-result.returncode).name} (an out-of-bounds access)"
    return f"{how}\n{(result.stdout + result.stderr)[-4000:]}"

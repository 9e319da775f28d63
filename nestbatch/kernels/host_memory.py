"""Fresh CPU output buffers backed by transparent huge pages.

A function that returns a new large CPU tensor pays for its memory twice: PyTorch's CPU allocator
hands out freshly mapped pages, and the first write to each 4 KiB page faults into the kernel,
which zeroes it. Measured on 2 cores, writing a fresh 256 MB tensor costs 60-70 ms while copying
into a reused buffer costs 10 ms: the page faults, not the copy, dominate every allocating
conversion (``clone``, ``pad_sequence``, ``torch.nested``'s ``to_padded_tensor``).

Advising the fresh mapping as huge pages (``madvise(MADV_HUGEPAGE)``) before the first write makes
the kernel fault it in 2 MiB at a time, which cuts that cost by about 4x. This is what PyTorch
itself does for every allocation when the process starts with ``THP_MEM_ALLOC_ENABLE=1``; here it
is done only for the large outputs of nestbatch's conversions, so it needs no process-wide
setting. It applies on Linux when the system's transparent-huge-page mode is ``madvise`` (with
``always`` the kernel already uses huge pages; with ``never`` nothing can be done) and changes no
value: the advice only affects how pages are backed.

``NESTBATCH_HUGE_PAGES=0`` turns it off.
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from torch import Tensor

__all__ = ["empty_for_write", "huge_page_size"]

_MADV_HUGEPAGE = 14  # Linux, every architecture
_THP_DIR = Path("/sys/kernel/mm/transparent_hugepage")

#: Outputs smaller than this many huge pages are allocated plainly: the advice only covers the
#: whole huge pages inside the allocation, and the system call is not worth it for a few.
MIN_HUGE_PAGES = 4


@functools.cache
def huge_page_size() -> int:
    """Bytes of a transparent huge page when advising helps here, else 0 (cached: the system's
    mode and the C library are looked up once per process)."""
    if sys.platform != "linux" or os.environ.get("NESTBATCH_HUGE_PAGES") == "0":
        return 0
    try:
        mode = (_THP_DIR / "enabled").read_text()
        size = int((_THP_DIR / "hpage_pmd_size").read_text())
    except (OSError, ValueError):
        return 0
    if "[madvise]" not in mode or size <= 0 or _madvise() is None:
        return 0
    return size


@functools.cache
def _madvise():
    """libc's ``madvise``, or ``None`` where it cannot be loaded."""
    try:
        function = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    function.restype = ctypes.c_int
    return function


def empty_for_write(shape: Sequence[int], like: Tensor) -> Tensor:
    """An uninitialized contiguous tensor with ``like``'s dtype and device, for one full write.

    On the CPU, outputs of at least :data:`MIN_HUGE_PAGES` huge pages have the whole huge pages
    inside them advised as transparent huge pages before anything touches them (see the module
    docstring). Elsewhere this is ``like.new_empty(shape)``.

    Parameters
    ----------
    shape : sequence of int
        The output's shape.
    like : Tensor
        Gives dtype and device.

    Returns
    -------
    Tensor
        ``shape``, contiguous, uninitialized: the caller must write every element.
    """
    out = like.new_empty(shape)
    if not like.is_cpu:
        return out
    page = huge_page_size()
    nbytes = out.numel() * out.element_size()
    if page and nbytes >= MIN_HUGE_PAGES * page:
        start = out.data_ptr()
        first = -(-start // page) * page
        last = (start + nbytes) // page * page
        # Advice is best effort: a refusal (an old kernel, a locked-down sandbox) only means
        # ordinary pages, so the return value is not checked.
        _madvise()(first, last - first, _MADV_HUGEPAGE)
    return out

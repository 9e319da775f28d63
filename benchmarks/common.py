"""Shared helpers of the benchmark scripts: timing, a table printer, common command-line flags.

Not a test module: the scripts print tables meant for humans (and for pasting into reports).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Sequence

import torch

__all__ = ["add_common_args", "gbps", "median_time", "print_table", "sync_for"]


def median_time(
    fn: Callable[[], object], *, warmup: int = 3, repeat: int = 10, cuda_sync: bool = False
) -> float:
    """Median wall time of ``fn()`` in seconds.

    Parameters
    ----------
    fn : callable
        The work to time (its result is discarded).
    warmup : int
        Untimed calls first (caches, lazy initialization, JIT builds, allocator warm-up).
    repeat : int
        Timed calls; the median is robust to the occasional outlier.
    cuda_sync : bool
        Time with CUDA events around each call and wait for the device, so the time covers the
        kernels (not just their launch). Set it for CUDA work.
    """
    for _ in range(warmup):
        fn()
    if cuda_sync:
        torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        if cuda_sync:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            began = time.perf_counter()
            fn()
            times.append(time.perf_counter() - began)
    return statistics.median(times)


def gbps(num_bytes: float, seconds: float) -> float:
    """Achieved bandwidth in GB/s (10^9 bytes per second)."""
    return num_bytes / seconds / 1e9


def print_table(headers: Sequence[str], rows: Sequence[Sequence[object]], title: str = "") -> None:
    """Print a left-aligned text table (floats with 3 significant decimals)."""

    def cell(value: object) -> str:
        if isinstance(value, float):
            return f"{value:.3f}" if abs(value) < 1000 else f"{value:.0f}"
        return str(value)

    text = [[cell(v) for v in row] for row in rows]
    widths = [max([len(h), *(len(r[i]) for r in text)]) for i, h in enumerate(headers)]
    if title:
        print(f"\n{title}")
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths)))
    print("  ".join("-" * w for w in widths))
    for row in text:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)))


def add_common_args(parser: argparse.ArgumentParser) -> None:
    """``--device`` and ``--quick`` (a run of about a minute)."""
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (~1 minute)")


def sync_for(device: torch.device) -> bool:
    """Whether timings on ``device`` need CUDA synchronization."""
    return torch.device(device).type == "cuda"

"""Linear + GELU + per-sample mean: packed NestedBatch vs padded+mask vs a loop vs torch.nested.

Usage: ``python benchmarks/bench_ops.py [--quick] [--device cpu|cuda]``.

Reports the median time of forward + backward and the activation memory of each variant (bytes
of the Linear output it materializes: padding included for the padded one), for uniform and
long-tailed (log-normal) length distributions.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import nestbatch  # noqa: E402


def median_time(fn: Callable[[], object], repeats: int, device: torch.device) -> float:
    """Median wall time of ``fn`` in milliseconds (after one warm-up call)."""
    fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def lengths_for(kind: str, batch: int, mean: int, gen: torch.Generator) -> list[int]:
    """Sample lengths: ``uniform`` in [1, 2 * mean] or ``longtail`` (log-normal, same median)."""
    if kind == "uniform":
        return torch.randint(1, 2 * mean + 1, (batch,), generator=gen).tolist()
    normal = torch.randn(batch, generator=gen) * 1.0 + torch.log(torch.tensor(float(mean)))
    return normal.exp().clamp(1, 40 * mean).long().tolist()


def run(kind: str, batch: int, mean: int, dim: int, repeats: int, device: torch.device) -> list:
    gen = torch.Generator().manual_seed(0)
    lengths = lengths_for(kind, batch, mean, gen)
    samples = [torch.randn(n, dim, generator=gen).to(device) for n in lengths]
    linear = torch.nn.Linear(dim, dim).to(device)
    x = nestbatch.nested(samples, requires_grad=True)
    padded = x.padded(0.0).data.detach().requires_grad_()
    mask = x.mask
    loop_in = [s.clone().requires_grad_() for s in samples]
    nt = torch.nested.nested_tensor(samples, layout=torch.jagged, requires_grad=True)
    count = torch.tensor(lengths, device=device, dtype=torch.float32)[:, None]

    def packed() -> None:
        F.gelu(linear(x)).mean(1).sum().backward()

    def padded_mask() -> None:
        h = F.gelu(linear(padded)) * mask[..., None]
        (h.sum(1) / count).sum().backward()

    def loop() -> None:
        torch.stack([F.gelu(linear(s)).mean(0) for s in loop_in]).sum().backward()

    def nested() -> None:
        F.gelu(linear(nt)).mean(1).sum().backward()

    def nested_forward() -> None:
        with torch.no_grad():
            F.gelu(linear(nt)).mean(1)

    elsize = torch.finfo(torch.float32).bits // 8
    total, rect = sum(lengths), batch * max(lengths)
    rows = []
    for name, fn, rows_used in (
        ("nestbatch packed", packed, total),
        ("padded + mask", padded_mask, rect),
        ("per-sample loop", loop, total),
        ("torch.nested jagged", nested, total),
    ):
        note = ""
        try:
            ms = median_time(fn, repeats, device)
        except (RuntimeError, NotImplementedError):
            # torch.nested's jagged mean(1) backward fails on some torch versions: time forward.
            ms, note = median_time(nested_forward, repeats, device), "forward only (backward fails)"
        rows.append((kind, name, ms, rows_used * dim * elsize, note))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes, few repeats")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    device = torch.device(args.device)
    batch, mean, dim, repeats = (64, 32, 64, 5) if args.quick else (256, 128, 256, 20)
    print(f"B={batch}, median length {mean}, features {dim}, device {device}, forward + backward")
    print("| lengths | variant | time (ms) | x packed | activation memory (KiB) | note |")
    print("|---|---|---|---|---|---|")
    for kind in ("uniform", "longtail"):
        rows = run(kind, batch, mean, dim, repeats, device)
        packed_ms = rows[0][2]  # the first variant is nestbatch on the packed layout
        for kind_, name, ms, nbytes, note in rows:
            ratio = ms / packed_ms
            print(f"| {kind_} | {name} | {ms:.2f} | {ratio:.2f} | {nbytes / 1024:.0f} | {note} |")


if __name__ == "__main__":
    main()

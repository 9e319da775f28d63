"""Bandwidth of the packed <-> padded kernels at large sizes, as a share of a plain device copy.

For each case the bytes moved are the fewest a conversion must move (the packed rows read and the
padded tensor written, or the valid padded rows read and the packed rows written); the copy
ceiling is ``dst.copy_(src)`` of the padded tensor's bytes, counting read plus write. Times are
CUDA events, median over repeats; the padded and packed buffers are rotated among several sets
so that repeats do not hit in L2. Usage::

    python benchmarks/bench_kernel_bandwidth.py [--quick]

Target of issue #14: both directions at >= 90 % of the copy for >= 256 MB.
Also usable under Nsight Compute: ``--ncu`` runs each kernel once per case, untimed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import print_table  # noqa: E402
from nestbatch import kernels  # noqa: E402

#: (name, B, max_len, feature elements, dtype, lengths): uniform lengths in [max_len/2, max_len],
#: or a long tail (most samples short, a few at max_len).
CASES = [
    ("B=256 L=1024 F=256 fp32", 256, 1024, 256, torch.float32, "uniform"),
    ("B=1024 L=65536 F=1 fp32", 1024, 65536, 1, torch.float32, "uniform"),
    ("B=4096 L=1024 F=16 fp32", 4096, 1024, 16, torch.float32, "uniform"),
    ("B=1024 L=4096 F=64 bf16", 1024, 4096, 64, torch.bfloat16, "uniform"),
    ("B=4096 L=4096 F=8 fp32 long tail", 4096, 4096, 8, torch.float32, "long tail"),
    ("B=64 L=8192 F=3 fp32 (12-byte rows)", 64, 8192, 3, torch.float32, "uniform"),
]


def make_lengths(batch: int, max_len: int, kind: str, gen: torch.Generator) -> torch.Tensor:
    if kind == "uniform":
        return torch.randint(max_len // 2, max_len + 1, (batch,), generator=gen)
    lengths = torch.randint(1, max(2, max_len // 64), (batch,), generator=gen)
    lengths[torch.randperm(batch, generator=gen)[: max(1, batch // 64)]] = max_len
    return lengths


def event_ms(fn, sets: int, repeat: int) -> float:
    for i in range(sets):
        fn(i)
    torch.cuda.synchronize()
    times = []
    for r in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(r % sets)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def run_case(name, batch, max_len, feature, dtype, kind, repeat, ncu):
    gen = torch.Generator().manual_seed(batch)
    lengths = make_lengths(batch, max_len, kind, gen)
    offsets = torch.zeros(batch + 1, dtype=torch.int64)
    torch.cumsum(lengths, 0, out=offsets[1:])
    total = int(offsets[-1])
    offsets = offsets.cuda()
    shape = (feature,) if feature > 1 else ()
    element = torch.tensor([], dtype=dtype).element_size()
    padded_bytes = batch * max_len * feature * element
    packed_bytes = total * feature * element
    sets = max(1, min(4, (2 << 30) // max(1, padded_bytes + packed_bytes)))
    packed = [torch.randn(total, *shape, device="cuda").to(dtype) for _ in range(sets)]
    padded = [kernels.packed_to_padded(p, offsets, max_len, 0.0) for p in packed]
    assert torch.equal(kernels.padded_to_packed(padded[0], offsets, total), packed[0])
    copy_dst = [torch.empty_like(p) for p in padded]
    if ncu:
        kernels.packed_to_padded(packed[0], offsets, max_len, 0.0)
        kernels.padded_to_packed(padded[0], offsets, total)
        return []
    jagged = torch.ops.aten
    padded3 = [p.reshape(batch, max_len, -1) for p in padded]
    packed2 = [p.reshape(total, -1) for p in packed]
    timings = {
        "copy_ (padded bytes)": (event_ms(lambda i: copy_dst[i].copy_(padded[i]), sets, repeat),
                                 2 * padded_bytes),
        "nestbatch packed->padded": (
            event_ms(lambda i: kernels.packed_to_padded(packed[i], offsets, max_len, 0.0), sets,
                     repeat), packed_bytes + padded_bytes),
        "aten packed->padded": (
            event_ms(lambda i: jagged._jagged_to_padded_dense_forward(
                packed2[i], [offsets], [max_len], 0.0), sets, repeat),
            packed_bytes + padded_bytes),
        "nestbatch padded->packed": (
            event_ms(lambda i: kernels.padded_to_packed(padded[i], offsets, total), sets, repeat),
            2 * packed_bytes),
        "aten padded->packed": (
            event_ms(lambda i: jagged._padded_dense_to_jagged_forward(padded3[i], [offsets], total),
                     sets, repeat), 2 * packed_bytes),
    }
    copy_ms, copy_bytes = timings["copy_ (padded bytes)"]
    copy_rate = copy_bytes / copy_ms
    rows = []
    for method, (ms, moved) in timings.items():
        rate = moved / ms / 1e6  # GB/s
        rows.append((f"{name} ({padded_bytes >> 20} MB padded)", method, ms, rate,
                     100 * moved / ms / copy_rate))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    parser.add_argument("--ncu", action="store_true", help="one untimed call per kernel and case")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_kernel_bandwidth: needs a CUDA device")
    repeat = 20 if args.quick else 100
    table = []
    for case in CASES:
        rows = run_case(*case, repeat=repeat, ncu=args.ncu)
        for row in rows:
            print("  " + "  ".join(f"{v:.3f}" if isinstance(v, float) else str(v) for v in row),
                  flush=True)
        table.extend(rows)
        torch.cuda.empty_cache()
    if table:
        print_table(["case", "method", "median ms", "GB/s", "% of copy_"], table,
                    title=f"packed <-> padded bandwidth, {torch.cuda.get_device_name()}")


if __name__ == "__main__":
    main()

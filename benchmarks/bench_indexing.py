"""Benchmark per-sample indexing against a per-sample Python loop and plain PyTorch indexing.

Operations (B samples of N rows of F features, M index slots, ragged valid sizes):
indexing access (gather with filler), indexing write (scatter), mask -> indices and boolean
compaction. Compared: the public ``RaggedBatch`` helper a user calls
(``nestbatch.batched_indexing_access`` and friends, with their default bounds check), the bare
operator under it (``nestbatch.kernels``: CUDA kernels on GPU, PyTorch implementation on CPU;
bounds checks off), the vectorized PyTorch reference of ``nestbatch.compat.batched_indexing``, and a
per-sample Python loop. The public call and the bare operator are both shown so the host cost
between them stays visible. Usage::

    python benchmarks/bench_indexing.py [--device cuda] [--quick]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import nestbatch as nb  # noqa: E402
from benchmarks.common import add_common_args, median_time, print_table, sync_for  # noqa: E402
from nestbatch import RaggedBatch, kernels  # noqa: E402
from nestbatch.compat import batched_indexing as bi  # noqa: E402

# (B, N, M, F)
SIZES = [(8, 256, 128, 32), (64, 1024, 512, 64), (256, 2048, 1024, 64)]


def make_case(batch, sources, width, feature, device):
    gen = torch.Generator().manual_seed(batch + sources)
    data = torch.randn(batch, sources, feature, generator=gen).to(device)
    indices = torch.stack([torch.randperm(sources, generator=gen)[:width] for _ in range(batch)])
    sizes = torch.randint(width // 2, width + 1, (batch,), generator=gen)
    mask = torch.rand(batch, sources, generator=gen) > 0.5
    return data, indices.to(device), sizes.to(device), mask.to(device)


def bench_size(batch, sources, width, feature, device, warmup, repeat):
    data, indices, sizes, mask = make_case(batch, sources, width, feature, device)
    timing = {"warmup": warmup, "repeat": repeat, "cuda_sync": sync_for(device)}
    host_sizes = sizes.tolist()
    to_write = data[:, :width].contiguous()
    max_count = int(mask.sum(1).max())

    def loop_access():
        out = data.new_zeros(batch, width, feature)
        for b, n in enumerate(host_sizes):
            out[b, :n] = data[b, indices[b, :n]]
        return out

    def loop_write():
        out = data.clone()
        for b, n in enumerate(host_sizes):
            out[b, indices[b, :n]] = to_write[b, :n]
        return out

    def loop_mask_to_indices():
        rows = [m.nonzero().squeeze(1) for m in mask]
        return torch.nn.utils.rnn.pad_sequence(rows, batch_first=True)

    def loop_compaction():
        rows = [data[b][mask[b]] for b in range(batch)]
        return torch.nn.utils.rnn.pad_sequence(rows, batch_first=True)

    index_batch = RaggedBatch(indices, sample_sizes=sizes)
    operations = {
        "indexing_access": {
            "nestbatch public call": lambda: nb.batched_indexing_access(data, index_batch),
            "nestbatch operator": lambda: kernels.indexing_access(
                data, indices, sizes, 0, check_bounds=False
            ),
            "reference (vectorized torch)": lambda: bi.indexing_access(data, indices, sizes, 0),
            "per-sample loop": loop_access,
        },
        "indexing_write": {
            "nestbatch public call": lambda: nb.batched_indexing_write(
                to_write, index_batch, data
            ),
            "nestbatch operator": lambda: kernels.indexing_write(
                to_write, indices, sizes, data, check_bounds=False
            ),
            "reference (vectorized torch)": lambda: bi.indexing_write(
                to_write, indices, sizes, data
            ),
            "per-sample loop": loop_write,
        },
        "mask_to_indices": {
            "nestbatch public call": lambda: nb.get_indices_from_mask(mask),
            "nestbatch operator": lambda: kernels.mask_to_indices(mask, max_count=max_count),
            "reference (vectorized torch)": lambda: bi.mask_to_indices(mask),
            "per-sample loop": loop_mask_to_indices,
        },
        "bool_compaction": {
            "nestbatch public call": lambda: nb.batched_bool_indexing(data, mask),
            "nestbatch operator": lambda: kernels.bool_compaction(data, mask, max_count=max_count),
            "reference (vectorized torch)": lambda: bi.bool_compaction(data, mask),
            "per-sample loop": loop_compaction,
        },
    }
    rows = []
    label = f"B={batch} N={sources} M={width} F={feature}"
    for operation, methods in operations.items():
        times = {name: median_time(fn, **timing) for name, fn in methods.items()}
        loop = times["per-sample loop"]
        for name, seconds in times.items():
            rows.append([label, operation, name, seconds * 1e3, loop / seconds])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(parser)
    args = parser.parse_args()
    warmup, repeat = (1, 3) if args.quick else (3, 15)
    if sync_for(args.device):
        kernels.load_extension()
    print(f"device={args.device} torch={torch.__version__} kernels: {kernels.extension_status()}")
    rows = []
    for size in SIZES:
        rows.extend(bench_size(*size, args.device, warmup, repeat))
    print_table(
        ["size", "operation", "method", "median ms", "speed-up vs loop"],
        rows,
        title="per-sample indexing (float32 data)",
    )


if __name__ == "__main__":
    main()

"""Eager vs ``torch.compile`` for model blocks that take ragged batches (NestedBatch).

Two blocks on a batch of sequences ``(B, (L_i), D)``: an MLP block (LayerNorm, Linear, GELU,
Linear, residual) and an encoder block (the MLP block after a self-attention sub-block through
``nestbatch.sequence_attention`` on the batch). Each is timed eager and compiled
(``fullgraph=True``; ``aot_eager`` and ``inductor``), forward only and forward + backward, in
one run; the compile time of each compiled variant is printed once. A second table runs the
encoder block on a stream of batches whose lengths and batch size change on every call (as from
a data loader), eager and compiled with ``dynamic=True``, and counts the graphs compiled (one:
the sizes are symbolic; inductor's CPU code generator may guard on a reduction longer than 4096
rows, one recompile whose time the total then includes). Usage::

    python benchmarks/bench_compile.py [--device cuda] [--quick]
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch._dynamo.utils import counters

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import nestbatch  # noqa: E402
from benchmarks.common import add_common_args, median_time, print_table, sync_for  # noqa: E402
from nestbatch import NestedBatch  # noqa: E402


class MLPBlock(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm, self.up, self.down = nn.LayerNorm(dim), nn.Linear(dim, 4 * dim), \
            nn.Linear(4 * dim, dim)

    def forward(self, x: NestedBatch) -> NestedBatch:
        return x + self.down(F.gelu(self.up(self.norm(x))))


class EncoderBlock(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads, self.norm, self.qkv, self.out = heads, nn.LayerNorm(dim), \
            nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = MLPBlock(dim)

    def forward(self, x: NestedBatch) -> NestedBatch:
        qkv = self.qkv(self.norm(x)).values
        head_dim = qkv.shape[-1] // (3 * self.heads)
        q, k, v = (x.with_values(t.reshape(t.shape[0], self.heads, head_dim))
                   for t in qkv.chunk(3, dim=-1))
        # Sequences-first samples (L_i, H, E) attend over L_i: nestbatch.sequence_attention
        # (F.scaled_dot_product_attention attends over dim -2, the heads, as torch's).
        attended = nestbatch.sequence_attention(q, k, v).values.flatten(1)
        return self.mlp(x + self.out(x.with_values(attended)))


def make_batch(batch: int, mean_len: int, dim: int, device: str) -> NestedBatch:
    gen = torch.Generator().manual_seed(batch)
    lengths = torch.randint(1, 2 * mean_len, (batch,), generator=gen).tolist()
    values = torch.randn(sum(lengths), dim, generator=gen).to(device)
    return NestedBatch.from_lengths(values, lengths)


def step(module: nn.Module, fn, x: NestedBatch, backward: bool):
    def run():
        out = fn(x)
        if backward:
            out.values.sum().backward()
            module.zero_grad(set_to_none=True)
        return out

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(parser)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    batch, mean_len, dim = (8, 32, 64) if args.quick else (32, 128, 256)
    repeat = 5 if args.quick else 20
    timing = {"warmup": 2, "repeat": repeat, "cuda_sync": sync_for(args.device)}
    x = make_batch(batch, mean_len, dim, args.device)
    rows = []
    for name, module in (("MLP block", MLPBlock(dim)), ("encoder block", EncoderBlock(dim, 4))):
        module = module.to(args.device)
        variants = {"eager": module}
        for backend in ("aot_eager", "inductor"):
            torch._dynamo.reset()
            compiled = torch.compile(module, fullgraph=True, backend=backend)
            began = time.perf_counter()
            step(module, compiled, x, backward=True)()  # compiles forward and backward
            print(f"  {name}, {backend}: compiled in {time.perf_counter() - began:.1f} s",
                  file=sys.stderr, flush=True)
            variants[backend] = compiled
        for backward in (False, True):
            eager_ms = None
            for variant, fn in variants.items():
                ms = median_time(step(module, fn, x, backward), **timing) * 1e3
                eager_ms = ms if variant == "eager" else eager_ms
                rows.append((name, "fwd+bwd" if backward else "fwd", variant, ms, eager_ms / ms))
    print_table(
        ["block", "pass", "variant", "median ms", "speed-up vs eager"], rows,
        title=f"torch.compile on a NestedBatch, B={batch}, mean length {mean_len}, D={dim}, "
        f"{args.device}, torch {torch.__version__}",
    )
    print_table(
        ["variant", "batches", "total ms (first call excluded)", "graphs compiled"],
        changing_sizes(EncoderBlock(dim, 4).to(args.device), batch, mean_len, dim, args.device,
                       calls=4 if args.quick else 10),
        title="encoder block fwd+bwd on batches of new sizes every call (B and lengths vary)",
    )


def changing_sizes(module: nn.Module, batch: int, mean_len: int, dim: int, device: str,
                   calls: int) -> list[tuple]:
    """Eager and ``dynamic=True`` compiled runs over the same stream of batches of changing
    sizes: total time after the first call (which compiles) and the number of graphs."""
    stream = [make_batch(batch + i % 5, mean_len, dim, device) for i in range(calls + 1)]
    sync = (lambda: torch.cuda.synchronize()) if sync_for(device) else (lambda: None)
    rows = []
    for variant in ("eager", "aot_eager", "inductor"):
        torch._dynamo.reset()
        counters.clear()
        fn = module if variant == "eager" else torch.compile(
            module, fullgraph=True, backend=variant, dynamic=True)
        step(module, fn, stream[0], backward=True)()
        sync()
        began = time.perf_counter()
        for x in stream[1:]:
            step(module, fn, x, backward=True)()
        sync()
        graphs = "-" if variant == "eager" else counters["stats"]["unique_graphs"]
        rows.append((variant, calls, (time.perf_counter() - began) * 1e3, graphs))
    return rows


if __name__ == "__main__":
    main()

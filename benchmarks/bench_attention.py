"""Attention over ragged batches: nestbatch, padded + mask, torch.nested and a per-sample loop.

Self-attention of B sequences with H heads of E dims, lengths uniform (768-1024, padding
1.14x) or long-tailed (32-2048, padding about 6.7x), forward and forward+backward, in one run.
nestbatch and torch.nested take the same ``(B, H, j, E)`` form (``x.transpose(1, 2)`` of a
``(B, j, H, E)`` batch; attention runs over dim -2, as torch's does).
On CUDA (bfloat16 by default) nestbatch runs the varlen flash kernel on the packed rows and the
peak memory of each method is reported (``torch.cuda.max_memory_allocated``); on the CPU the
sizes are scaled down (``--scale``) and only times are reported. Usage::

    python benchmarks/bench_attention.py [--device cuda] [--quick] [--dtype bfloat16]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import nestbatch  # noqa: E402
from benchmarks.common import add_common_args, median_time, print_table, sync_for  # noqa: E402


def lengths_for(kind: str, batch: int, scale: float, gen: torch.Generator) -> list[int]:
    if kind == "uniform":
        raw = torch.randint(768, 1025, (batch,), generator=gen).float()
    else:  # long tail: most short, a few long
        raw = (32 * torch.exp(torch.rand(batch, generator=gen) ** 4 * 4.16)).clamp(max=2048)
    return [max(1, int(n * scale)) for n in raw.tolist()]


def methods(lengths, heads, dim, dtype, device):
    gen = torch.Generator().manual_seed(1)
    samples = [[torch.randn(n, heads, dim, generator=gen).to(device, dtype) for n in lengths]
               for _ in range(3)]
    for group in samples:
        for t in group:
            t.requires_grad_()
    # Packed leaves, as a model's activations would be (no conversion graph to keep), in
    # torch.nested's (B, H, j, E) form: the ragged dim at dim -2, where attention runs.
    q, k, v = (nestbatch.NestedBatch.from_lengths(torch.cat(g).detach().requires_grad_(), lengths)
               .transpose(1, 2) for g in samples)
    width = max(lengths)
    padded = [torch.nn.utils.rnn.pad_sequence(g, batch_first=True).transpose(1, 2).detach()
              .requires_grad_() for g in samples]
    valid = torch.arange(width, device=device) < torch.tensor(lengths, device=device)[:, None]
    mask = (valid[:, None, :, None] & valid[:, None, None, :])
    nested = [torch.nested.nested_tensor([t.detach() for t in g], layout=torch.jagged,
                                         requires_grad=True).transpose(1, 2) for g in samples]

    def ours():
        return F.scaled_dot_product_attention(q, k, v).values

    def padded_mask():
        return F.scaled_dot_product_attention(*padded, attn_mask=mask)

    def torch_nested():
        return F.scaled_dot_product_attention(*nested).values()

    def loop():
        return torch.cat([
            F.scaled_dot_product_attention(a.transpose(0, 1), b.transpose(0, 1),
                                           c.transpose(0, 1)).transpose(0, 1).reshape(-1)
            for a, b, c in zip(*samples)
        ])

    return {"nestbatch": ours, "padded + mask": padded_mask, "torch.nested": torch_nested,
            "per-sample loop": loop}


def measure(fn, backward: bool, timing: dict, device: str) -> tuple[float, float]:
    def step():
        out = fn()
        if backward:
            out.float().square().mean().backward()

    try:
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        seconds = median_time(step, **timing)
        peak = torch.cuda.max_memory_allocated() / 2**20 if device == "cuda" else float("nan")
    except (RuntimeError, NotImplementedError) as error:  # a method that cannot do it
        print(f"    ({error.__class__.__name__}: {str(error)[:80]})", file=sys.stderr)
        return float("nan"), float("nan")
    return seconds * 1e3, peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(parser)
    parser.add_argument("--dtype", default=None, help="default: bfloat16 on CUDA, float32 on CPU")
    parser.add_argument("--scale", type=float, default=None,
                        help="length scale (default 1 on CUDA, 1/16 on the CPU)")
    args = parser.parse_args()
    cuda = args.device == "cuda"
    dtype = getattr(torch, args.dtype) if args.dtype else (torch.bfloat16 if cuda else
                                                          torch.float32)
    scale = args.scale or (1.0 if cuda else 1 / 16)
    batch, heads, dim = (64, 8, 64) if cuda else (16, 4, 32)
    timing = {"warmup": 2, "repeat": 3 if args.quick else 10, "cuda_sync": sync_for(args.device)}
    gen = torch.Generator().manual_seed(0)
    rows = []
    for kind in ("uniform", "long tail"):
        lengths = lengths_for(kind, batch, scale, gen)
        padding = batch * max(lengths) / sum(lengths)
        for name, fn in methods(lengths, heads, dim, dtype, args.device).items():
            for backward in (False, True):
                ms, peak = measure(fn, backward, timing, args.device)
                rows.append([f"{kind} (padding {padding:.1f}x)", name,
                             "fwd+bwd" if backward else "fwd", ms, peak])
                print(f"  {kind} {name} {'fwd+bwd' if backward else 'fwd'}: {ms:.3f} ms",
                      file=sys.stderr, flush=True)
    print_table(["lengths", "method", "pass", "median ms", "peak MiB"], rows,
                title=f"attention, B={batch} H={heads} E={dim}, {dtype}, {args.device}")


if __name__ == "__main__":
    main()

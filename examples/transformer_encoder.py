"""A pre-norm transformer encoder block on a NestedBatch of sentences, forward and backward.

The block (LayerNorm, QKV projection, scaled dot-product attention, output projection, then
LayerNorm and an MLP, each with a residual) is plain PyTorch written for ``(B, L, D)`` inputs,
with torch's (and torch.nested's) recipe for heads: split ``(B, L, H, E)``, ``transpose(1, 2)``
to ``(B, H, L, E)`` so that attention runs over dim -2, the sequence, and transpose back. Given
a :class:`nestbatch.NestedBatch` of sentences of different lengths, every layer runs on the
packed rows, and attention runs per sentence over its ragged dim: on CUDA through the
variable-length flash or memory-efficient kernels (no padding), on the CPU through a masked
padded call. The outputs and the parameter gradients are checked against running the same block
on each sentence alone.

    python examples/transformer_encoder.py [--device cuda] [--dtype bfloat16]
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch import nn

import nestbatch


class EncoderBlock(nn.Module):
    """Pre-norm self-attention block: ``x + attn(norm(x))``, then ``x + mlp(norm(x))``."""

    def __init__(self, dim: int, heads: int, hidden: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim)
        self.q, self.k, self.v = (nn.Linear(dim, dim) for _ in range(3))
        self.out = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))

    def forward(self, x):
        """``x``: ``(B, L, D)``, a dense tensor or a NestedBatch with ragged ``L``."""
        batch, dim = x.size(0), x.size(-1)
        h = self.norm1(x)

        def heads(t):  # (B, L, D) -> (B, H, L, E): the sequence at dim -2, where SDPA attends
            return t.view(batch, -1, self.heads, dim // self.heads).transpose(1, 2)

        attended = F.scaled_dot_product_attention(heads(self.q(h)), heads(self.k(h)),
                                                  heads(self.v(h)))
        x = x + self.out(attended.transpose(1, 2).reshape(batch, -1, dim))
        return x + self.mlp(self.norm2(x))


def check(device: str, dtype: torch.dtype, lengths: list[int], dim: int = 32, heads: int = 4,
          ) -> float:
    """Largest difference between the batched block and the per-sentence block (outputs and
    parameter gradients)."""
    torch.manual_seed(0)
    block = EncoderBlock(dim, heads, 2 * dim).to(device=device, dtype=dtype)
    sentences = [torch.randn(n, dim, device=device, dtype=dtype) for n in lengths]

    batch = nestbatch.nested(sentences)
    out = block(batch)
    out.values.square().sum().backward()
    batched_grads = [p.grad.clone() for p in block.parameters()]
    block.zero_grad()

    alone = [block(s.unsqueeze(0)).squeeze(0) for s in sentences]
    sum(a.square().sum() for a in alone).backward()
    differences = [(a - b).abs().max() for a, b in zip(out.unbind(), alone)]
    differences += [(p.grad - g).abs().max() for p, g in zip(block.parameters(), batched_grads)]
    return float(max(differences))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float64", choices=["float64", "float32", "bfloat16",
                                                                "float16"])
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    lengths = [5, 12, 3, 8, 1, 20]
    worst = check(args.device, dtype, lengths)
    tolerance = {torch.float64: 1e-10, torch.float32: 1e-4}.get(dtype, 5e-2)
    print(f"encoder block on {len(lengths)} sentences ({args.device}, {args.dtype}): "
          f"largest difference to per-sentence runs {worst:.2e}")
    print(f"matches the per-sentence block: {worst <= tolerance}")
    if worst > tolerance:
        raise SystemExit(1)


if __name__ == "__main__":
    main()

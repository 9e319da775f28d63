"""Padding-free training of a small causal language model, against padding and bucketing.

A 2-layer transformer LM (width 64) is trained on sequences of long-tailed lengths (most short, a
few up to ``--max-len``) three ways:

* **padded**: random batches of a fixed number of samples, padded to the batch's longest, with a
  padding + causal attention mask (what a plain ``DataLoader`` and ``pad_sequence`` give);
* **bucketed**: :class:`nestbatch.data.TokenBudgetBatchSampler` with ``cost="padded"``: samples
  of similar length together, each batch padded to its longest, under a token budget;
* **packed**: the same sampler with ``cost="packed"``; the batch stays a
  :class:`nestbatch.NestedBatch` (no padding): positions from
  :func:`nestbatch.data.token_positions`, ``is_causal=True`` attention within each sample,
  targets from :func:`nestbatch.data.causal_lm_targets`.

Every way sums its token losses and divides by the token count
(:func:`nestbatch.data.token_cross_entropy`, :func:`nestbatch.data.normalized_loss`). First, in
float64 on one fixed batch, the three give the same loss and parameter gradients (the bucketed
way accumulating over its buckets); then, in float32, each trains one epoch and prints its
tokens per second and peak memory: on CUDA ``torch.cuda.max_memory_allocated``; on the CPU the
largest total of the tensors autograd saved for the backward of one step (the activation memory,
which padding inflates; parameters left out).

    python examples/train_lm_packed.py [--samples 256] [--max-len 256] [--max-tokens 1024]
                                       [--device cpu] [--seed 0]

``benchmarks/bench_training.py`` runs the same comparison at larger sizes.
"""

from __future__ import annotations

import argparse
import copy
import time
from collections.abc import Callable, Iterable

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader

import nestbatch
from nestbatch import NestedBatch
from nestbatch.data import (
    TokenBudgetBatchSampler,
    causal_lm_targets,
    global_token_count,
    normalized_loss,
    token_count,
    token_cross_entropy,
    token_positions,
)

VOCAB = 128
WIDTH = 64
HEADS = 4
LAYERS = 2


# ----------------------------------------------------------------------------------- the model
class Block(nn.Module):
    """Pre-norm causal self-attention and MLP, written once for padded tensors and batches."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(),
                                 nn.Linear(4 * width, width))

    def forward(self, x, attn_mask: Tensor | None = None, is_causal: bool = False):
        """``x``: ``(B, L, D)``, a padded tensor (with ``attn_mask``) or a NestedBatch (with
        ``is_causal=True``: causal within each sample)."""
        q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
        split = (self.heads, x.size(-1) // self.heads)
        # (B, L, H, E) -> (B, H, L, E): attention runs over dim -2, the sequence.
        q, k, v = (t.unflatten(-1, split).transpose(1, 2) for t in (q, k, v))
        attended = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask,
                                                  is_causal=is_causal)
        x = x + self.proj(attended.transpose(1, 2).flatten(-2))
        return x + self.mlp(self.norm2(x))


class TinyLM(nn.Module):
    """Token and learned position embeddings, ``LAYERS`` blocks, a final norm and the head."""

    def __init__(self, max_len: int, width: int = WIDTH, heads: int = HEADS,
                 layers: int = LAYERS, vocab: int = VOCAB) -> None:
        super().__init__()
        self.tokens, self.positions = nn.Embedding(vocab, width), nn.Embedding(max_len, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.norm, self.head = nn.LayerNorm(width), nn.Linear(width, vocab)

    def forward_padded(self, ids: Tensor, lengths: Tensor) -> Tensor:
        """Logits ``(B, L, V)`` of right-padded ``ids (B, L)``."""
        width = ids.shape[1]
        slots = torch.arange(width, device=ids.device)
        x = self.tokens(ids) + self.positions(slots)
        # A query attends to the earlier keys of its own sample: padding keys are masked.
        valid = slots < lengths[:, None]
        mask = (valid[:, None, None, :] & torch.ones(width, width, dtype=torch.bool,
                                                     device=ids.device).tril())
        for block in self.blocks:
            x = block(x, attn_mask=mask)
        return self.head(self.norm(x))

    def forward_packed(self, ids: NestedBatch) -> NestedBatch:
        """Logits, a batch of ``(L_i, V)``, of a batch of token sequences: no padding."""
        x = self.tokens(ids) + self.positions(ids.with_values(token_positions(ids)))
        for block in self.blocks:
            x = block(x, is_causal=True)
        return self.head(self.norm(x))


# ------------------------------------------------------------------------------------- the data
def long_tailed_lengths(count: int, low: int, high: int, generator: torch.Generator) -> list[int]:
    """``count`` lengths in ``[low, high]``, log-distributed with most near ``low``."""
    u = torch.rand(count, generator=generator, dtype=torch.float64)
    lengths = low * (high / low) ** (u ** 3)
    return lengths.round().long().clamp(low, high).tolist()


def make_dataset(count: int, max_len: int, seed: int) -> list[Tensor]:
    """Token sequences whose next token is mostly predictable (something to learn)."""
    generator = torch.Generator().manual_seed(seed)
    samples = []
    for n in long_tailed_lengths(count, min(8, max_len), max_len, generator):
        start = torch.randint(0, VOCAB, (1,), generator=generator)
        noise = torch.randint(0, 4, (n,), generator=generator)
        samples.append((start + torch.arange(n) * 3 + noise) % VOCAB)
    return samples


# ------------------------------------------------------------------------------ three losses
def padded_loss_sum(model: TinyLM, batch: NestedBatch) -> tuple[Tensor, Tensor]:
    """``(loss sum, token count)`` of a batch run padded to its longest sample."""
    ids = batch.to_padded_tensor(0)
    targets = causal_lm_targets(batch).to_padded_tensor(-100)  # padding: ignored
    logits = model.forward_padded(ids, batch.lengths)
    return token_cross_entropy(logits, targets)


def packed_loss_sum(model: TinyLM, batch: NestedBatch) -> tuple[Tensor, Tensor]:
    """``(loss sum, token count)`` of a batch run packed."""
    return token_cross_entropy(model.forward_packed(batch), causal_lm_targets(batch))


def step_gradients(model: TinyLM, micro_batches: Iterable[NestedBatch],
                   loss_sum: Callable[[TinyLM, NestedBatch], tuple[Tensor, Tensor]]
                   ) -> tuple[float, list[Tensor]]:
    """Loss and gradients of one step over ``micro_batches``, normalised by their token count."""
    micro_batches = list(micro_batches)
    count = global_token_count([token_count(causal_lm_targets(b)) for b in micro_batches])
    model.zero_grad()
    loss = 0.0
    for batch in micro_batches:
        part = normalized_loss(loss_sum(model, batch)[0], count)
        part.backward()  # gradients accumulate over the micro-batches
        loss += float(part.detach())
    return loss, [p.grad.clone() for p in model.parameters()]


def check_float64(samples: list[Tensor], max_len: int, max_tokens: int) -> bool:
    """Whether padded, bucketed and packed give one loss and one gradient on a fixed batch."""
    torch.manual_seed(0)
    model = TinyLM(max_len).double()
    batch = nestbatch.nested(samples)
    lengths = [len(s) for s in samples]
    buckets = TokenBudgetBatchSampler(lengths, max_tokens, cost="padded", seed=0)
    bucketed = [nestbatch.nested([samples[i] for i in indices]) for indices in buckets]
    results = [
        step_gradients(model, [batch], padded_loss_sum),
        step_gradients(model, bucketed, padded_loss_sum),
        step_gradients(model, [batch], packed_loss_sum),
    ]
    (loss, grads), rest = results[0], results[1:]
    return all(
        abs(other_loss - loss) <= 1e-10 * abs(loss)
        and all(torch.allclose(a, b, rtol=1e-9, atol=1e-12) for a, b in zip(grads, other))
        for other_loss, other in rest
    )


# ---------------------------------------------------------------------------- float32 training
class SavedActivations:
    """The largest total size of the tensors autograd saves for one backward (parameters and
    tensors seen twice counted once): the activation memory of a training step, on any device."""

    def __init__(self, model: nn.Module) -> None:
        self.params = {p.untyped_storage().data_ptr() for p in model.parameters()}
        self.peak, self.step = 0, {}

    def pack(self, tensor: Tensor) -> Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in self.params:
            self.step[storage.data_ptr()] = storage.nbytes()
        return tensor

    def run(self, fn: Callable[[], None]) -> None:
        self.step = {}
        with torch.autograd.graph.saved_tensors_hooks(self.pack, lambda t: t):
            fn()
        self.peak = max(self.peak, sum(self.step.values()))


def loaders(samples: list[Tensor], max_tokens: int, seed: int) -> dict[str, DataLoader]:
    """The three ways' loaders over ``samples`` (one epoch each)."""
    lengths = [len(s) for s in samples]
    # The padded baseline takes as many samples per batch as the budget holds on average.
    per_batch = max(1, round(max_tokens * len(lengths) / sum(lengths)))
    generator = torch.Generator().manual_seed(seed)

    def budget(cost: str) -> TokenBudgetBatchSampler:
        return TokenBudgetBatchSampler(lengths, max_tokens, cost=cost, seed=seed)

    return {
        "padded": DataLoader(samples, batch_size=per_batch, shuffle=True, generator=generator,
                             collate_fn=nestbatch.pack),
        "bucketed": DataLoader(samples, batch_sampler=budget("padded"),
                               collate_fn=nestbatch.pack),
        "packed": DataLoader(samples, batch_sampler=budget("packed"),
                             collate_fn=nestbatch.pack),
    }


def train_epoch(model: TinyLM, loader: DataLoader, packed: bool, device: torch.device
                ) -> dict[str, float]:
    """One epoch of AdamW steps: tokens per second (timed after the first step, which pays
    one-time costs), peak memory, the last loss, the padding of the batches."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss_sum = packed_loss_sum if packed else padded_loss_sum
    meter = SavedActivations(model)
    tokens, slots, timed, seconds, last = 0, 0, 0, 0.0, float("nan")
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    for i, batch in enumerate(loader):
        batch = batch.to(device)
        tokens += batch.partition.total
        slots += batch.batch_size * batch.partition.max_shape[0]

        def step(batch: NestedBatch = batch) -> None:
            total, count = loss_sum(model, batch)
            loss = normalized_loss(total, count)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            nonlocal last
            last = float(loss.detach())  # (a sync: the step's work is done when it returns)

        began = time.perf_counter()
        meter.run(step)
        if i > 0 or len(loader) == 1:
            seconds += time.perf_counter() - began
            timed += batch.partition.total
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else meter.peak
    return {"batches": len(loader), "tokens/s": timed / max(seconds, 1e-9),
            "peak MB": peak / 2**20, "padding": 0.0 if packed else 1 - tokens / slots,
            "loss": last}


def compare_float32(samples: list[Tensor], max_len: int, max_tokens: int, seed: int,
                    device: torch.device) -> list[tuple]:
    """One epoch of each way from the same initial weights: rows of a table."""
    torch.manual_seed(seed)
    initial = TinyLM(max_len).to(device)
    rows = []
    for name, loader in loaders(samples, max_tokens, seed).items():
        result = train_epoch(copy.deepcopy(initial), loader, name == "packed", device)
        rows.append((name, result["batches"], f"{result['padding']:.1%}",
                     f"{result['tokens/s']:.0f}", f"{result['peak MB']:.1f}",
                     f"{result['loss']:.3f}"))
    return rows


HEADERS = ("way", "batches", "padding", "tokens/s", "peak MB", "last loss")


def print_rows(rows: list[tuple]) -> None:
    widths = [max(len(str(x)) for x in column) for column in zip(HEADERS, *rows)]
    for row in (HEADERS, *rows):
        print("  ".join(str(x).ljust(w) for x, w in zip(row, widths)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=256, help="sequences in the epoch")
    parser.add_argument("--max-len", type=int, default=256, help="longest sequence (>= 8)")
    parser.add_argument("--max-tokens", type=int, default=1024, help="token budget per batch")
    parser.add_argument("--check-samples", type=int, default=10,
                        help="sequences of the float64 check's fixed batch")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    device = torch.device(args.device)

    check_len = min(args.max_len, 64)  # the float64 check: small, exact
    fixed = make_dataset(args.check_samples, check_len, args.seed + 1)
    same = check_float64(fixed, check_len, max_tokens=4 * check_len)
    print(f"float64: padded, bucketed and packed losses and gradients agree: {same}")

    samples = make_dataset(args.samples, args.max_len, args.seed)
    lengths = [len(s) for s in samples]
    print(f"\nfloat32, one epoch on {device.type}: {len(samples)} sequences of "
          f"{min(lengths)}-{max(lengths)} tokens ({sum(lengths)} in all), budget "
          f"{args.max_tokens} tokens per batch; peak MB: "
          f"{'allocated' if device.type == 'cuda' else 'saved activations'}")
    print_rows(compare_float32(samples, args.max_len, args.max_tokens, args.seed, device))
    sampler = TokenBudgetBatchSampler(lengths, args.max_tokens, cost="packed", seed=args.seed)
    print(f"\npacked sampler: {sampler.stats()}")


if __name__ == "__main__":
    main()

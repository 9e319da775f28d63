"""Two DDP ranks (gloo) trained with the token-budget sampler, gradient accumulation and the
token-count normalisation get the gradient of one process on the concatenated data."""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.distributed as dist
from distributed_harness import run_on_ranks

import nestbatch as nb
from nestbatch.data import (
    TokenBudgetBatchSampler,
    causal_lm_targets,
    global_token_count,
    normalized_loss,
    token_count,
    token_cross_entropy,
    token_positions,
)

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="needs torch.distributed with gloo")

VOCAB, WIDTH, MAX_TOKENS, ACCUMULATION = 11, 6, 12, 2


class _LM(torch.nn.Module):
    """Token + position embeddings, causal attention within each sample, a head."""

    def __init__(self) -> None:
        super().__init__()
        self.tokens = torch.nn.Embedding(VOCAB, WIDTH)
        self.positions = torch.nn.Embedding(32, WIDTH)
        self.qkv = torch.nn.Linear(WIDTH, 3 * WIDTH)
        self.head = torch.nn.Linear(WIDTH, VOCAB)

    def forward(self, ids: nb.NestedBatch) -> nb.NestedBatch:
        x = self.tokens(ids) + self.positions(ids.with_values(token_positions(ids)))
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        x = x + nb.sequence_attention(*(t.unflatten(-1, (1, WIDTH)) for t in (q, k, v)),
                                      is_causal=True).flatten(-2)
        return self.head(x)


def _data() -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(7)
    lengths = [2, 9, 4, 1, 7, 3, 12, 5, 6, 2, 8, 3]
    return [torch.randint(0, VOCAB, (n,), generator=gen) for n in lengths]


def _steps(samplers: list[TokenBudgetBatchSampler]) -> list[list[list[int]]]:
    """Per rank, its batches grouped ACCUMULATION per optimizer step."""
    shards = [list(s) for s in samplers]
    return [[shard[i:i + ACCUMULATION] for i in range(0, len(shard), ACCUMULATION)]
            for shard in shards]


def _sampler(rank: int, world: int) -> TokenBudgetBatchSampler:
    lengths = [len(s) for s in _data()]
    return TokenBudgetBatchSampler(lengths, MAX_TOKENS, cost="packed", seed=3, window=6,
                                   num_replicas=world, rank=rank)


def _train(rank: int, world: int, start: dict, out_path: str) -> None:
    data = _data()
    model = _LM().double()
    model.load_state_dict(start)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.5)
    sampler = _sampler(rank, world)
    assert sampler.num_replicas == world and sampler.rank == rank
    for step in _steps([sampler])[0]:
        batches = [nb.nested([data[i] for i in indices]) for indices in step]
        targets = [causal_lm_targets(b) for b in batches]
        count = global_token_count([token_count(t) for t in targets])  # one all_reduce
        for i, (batch, target) in enumerate(zip(batches, targets)):
            last = i == len(batches) - 1
            with contextlib.nullcontext() if last else ddp.no_sync():
                loss_sum, _ = token_cross_entropy(ddp(batch), target)
                normalized_loss(loss_sum, count).backward()
        optimizer.step()
        optimizer.zero_grad()
    if rank == 0:
        torch.save(model.state_dict(), out_path)


def test_ddp_with_the_sampler_and_token_counts_trains_like_one_process(tmp_path):
    world = 2
    samplers = [_sampler(r, world) for r in range(world)]
    steps = _steps(samplers)
    # Every rank gets the same number of batches and steps; this data needs no repeats, so
    # every sample is used exactly once.
    assert len({len(s) for s in samplers}) == 1 and len(steps[0]) >= 2
    assert samplers[0].stats().repeated_samples == 0
    torch.manual_seed(0)
    reference = _LM().double()
    start = {k: v.clone() for k, v in reference.state_dict().items()}
    out_path = str(tmp_path / "ddp.pt")
    run_on_ranks(_train, world, start, out_path)

    # One process, one optimizer step per step on the concatenation of every rank's
    # micro-batches: the mean token loss of all of them.
    data = _data()
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.5)
    for per_rank in zip(*steps):
        indices = [i for rank_step in per_rank for batch in rank_step for i in batch]
        batch = nb.nested([data[i] for i in indices])
        loss_sum, count = token_cross_entropy(reference(batch), causal_lm_targets(batch))
        (loss_sum / count).backward()
        optimizer.step()
        optimizer.zero_grad()
    trained = torch.load(out_path)
    for name, value in reference.state_dict().items():
        torch.testing.assert_close(trained[name], value, rtol=1e-10, atol=1e-12)

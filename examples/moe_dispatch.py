"""A mixture-of-experts layer over two processes: tokens dispatched to the rank of their expert.

Each of two processes (gloo on the loopback address) holds its own batch of sequences of
different lengths and two of the four experts. A gate picks every token's expert (top 1);
``nestbatch.distributed.dispatch`` sends the tokens to the ranks holding their experts, the
experts run there, and ``combine`` brings the results back in the tokens' order. Both are
differentiable, so a few steps of SGD train the gate and the experts end to end. The same model
trained in one process on both batches with every expert gives the same losses (float64).

Run: ``python examples/moe_dispatch.py``
"""

from __future__ import annotations

import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

import nestbatch as nb
from nestbatch import distributed as nbd

DIM, HIDDEN, EXPERTS, WORLD, STEPS = 8, 16, 4, 2, 4
PER_RANK = EXPERTS // WORLD


class MoE(nn.Module):
    """Top-1 mixture of experts on the packed tokens of a batch (a residual layer)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = nn.Linear(DIM, EXPERTS)
        self.experts = nn.ModuleList(
            nn.Sequential(nn.Linear(DIM, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, DIM))
            for _ in range(EXPERTS))

    def run_experts(self, tokens: torch.Tensor, expert: torch.Tensor, held: range
                    ) -> torch.Tensor:
        out = torch.zeros_like(tokens)
        for e in held:  # a loop over experts, not tokens
            rows = (expert == e).nonzero().flatten()
            out = out.index_put((rows,), self.experts[e](tokens[rows]))
        return out

    def forward(self, batch: nb.NestedBatch, distributed: bool) -> nb.NestedBatch:
        tokens = batch.values  # (tokens, DIM): every sequence's tokens, back to back
        probs = torch.softmax(self.gate(tokens), dim=1)
        expert = probs.argmax(1)
        if distributed:
            received, route = nbd.dispatch(tokens, expert // PER_RANK)  # to the expert's rank
            rank = dist.get_rank()
            held = range(PER_RANK * rank, PER_RANK * (rank + 1))
            out = nbd.combine(self.run_experts(received, route.send(expert), held), route)
        else:
            out = self.run_experts(tokens, expert, range(EXPERTS))
        return batch.with_values(tokens + probs.gather(1, expert[:, None]) * out)


def rank_batch(rank: int) -> nb.NestedBatch:
    """Rank ``rank``'s sequences: their own count and lengths (one of length 0)."""
    gen = torch.Generator().manual_seed(rank)
    lengths = [[5, 0, 12, 3], [9, 1, 7]][rank]
    return nb.nested([torch.randn(n, DIM, generator=gen, dtype=torch.float64) for n in lengths])


def loss_sum(model: MoE, batch: nb.NestedBatch, distributed: bool) -> torch.Tensor:
    """Squared error to a fixed target (the tokens' features rotated), summed over tokens."""
    out = model(batch, distributed).values
    return (out - batch.values.roll(1, dims=1)).pow(2).sum()


def train(model: MoE, batches: list[nb.NestedBatch], distributed: bool, tokens: int
          ) -> list[float]:
    """``STEPS`` of SGD on the mean loss over every rank's tokens; the losses."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = []
    for _ in range(STEPS):
        optimizer.zero_grad()
        loss = sum(loss_sum(model, b, distributed) for b in batches) / tokens
        loss.backward()
        total = loss.detach().clone()
        if distributed:  # the gate is replicated: sum its gradient; experts get theirs
            dist.all_reduce(total)
            for p in model.gate.parameters():
                dist.all_reduce(p.grad)
        optimizer.step()
        losses.append(total.item())
    return losses


def worker(rank: int, port: int) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=WORLD)
    batches = [rank_batch(r) for r in range(WORLD)]
    tokens = sum(b.values.shape[0] for b in batches)
    torch.manual_seed(0)
    model = MoE().double()  # the same initial weights on every rank (and in the reference)
    losses = train(model, [batches[rank]], True, tokens)
    if rank == 0:
        torch.manual_seed(0)
        reference = train(MoE().double(), batches, False, tokens)
        for step, (ours, theirs) in enumerate(zip(losses, reference), 1):
            print(f"step {step}: loss {ours:.6f} over {WORLD} ranks, {theirs:.6f} in one process")
        same = torch.allclose(torch.tensor(losses), torch.tensor(reference), rtol=1e-10)
        print(f"loss equals the single-process reference: {same}")
    dist.barrier()  # no rank tears gloo down while another still talks to it
    dist.destroy_process_group()


def main() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(port,), nprocs=WORLD, join=True)


if __name__ == "__main__":
    main()

"""nestbatch.distributed.all_to_all, dispatch and combine on 2-4 processes (gloo, loopback).

Random ragged batches (empty sends, zero-length samples, ranks without samples, several dtypes
and ragged dims) round-trip and equal an ``all_gather_object`` reference; invalid arguments
raise on every rank (the group keeps working after); gradients through dispatch, experts and
combine equal one process computing the same. Several checks share each spawn (~3 s each).
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from distributed_harness import run_on_ranks

import nestbatch as nb
from nestbatch import distributed as nbd
from nestbatch.compat import distributed as impl

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="needs torch.distributed with gloo")

#: (dtype, ragged dims, feature shape) of the trials: int16 has no gloo all-to-all of its own.
KINDS = ((torch.float32, 1, (3,)), (torch.int16, 2, (2, 3)), (torch.bool, 1, ()),
         (torch.complex64, 1, (2,)), (torch.bfloat16, 3, (1,)), (torch.float64, 1, (0,)))


def _rank_data(rank: int, world: int, trial: int) -> tuple[list[torch.Tensor], list[int], int]:
    """Rank ``rank``'s samples and send counts in ``trial`` (rank 1 of odd trials: none)."""
    dtype, k, feature = KINDS[trial % len(KINDS)]
    gen = torch.Generator().manual_seed(1000 * trial + rank)
    count = 0 if (rank == 1 and trial % 2) else int(torch.randint(0, 7, (1,), generator=gen))
    samples = [(torch.randn(*torch.randint(0, 4, (k,), generator=gen).tolist(), *feature,
                            generator=gen) * 10).to(dtype) for _ in range(count)]
    cuts = torch.randint(0, count + 1, (world - 1,), generator=gen).sort().values.tolist()
    counts = [b - a for a, b in zip([0, *cuts], [*cuts, count])]  # zeros among them
    return samples, counts, k


def _batch(samples: list[torch.Tensor], k: int, dtype: torch.dtype) -> nb.NestedBatch:
    if not samples:
        return nb.nested([], num_ragged_dims=k)  # no feature shape, default dtype: takes the
        # kind of the ranks that have samples
    return nb.nested(samples, num_ragged_dims=k, dtype=dtype)


def _same(batch: nb.NestedBatch, samples: list[torch.Tensor]) -> bool:
    got = batch.unbind()
    return len(got) == len(samples) and all(
        a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(got, samples))


def _check_exchanges(rank: int, world: int) -> None:
    for trial in range(2 * len(KINDS)):
        samples, counts, k = _rank_data(rank, world, trial)
        batch = _batch(samples, k, KINDS[trial % len(KINDS)][0])
        received, back_counts = nbd.all_to_all(batch, counts, return_counts=True)
        # The reference: every rank's samples and counts as objects (pickled).
        everyone: list = [None] * world
        dist.all_gather_object(everyone, (samples, counts))
        expected = []
        for their_samples, their_counts in everyone:
            start = sum(their_counts[:rank])
            expected += their_samples[start: start + their_counts[rank]]
        assert _same(received, expected), (rank, trial)
        assert received.num_ragged_dims == k
        if any(s for s, _ in everyone):  # (else no rank knows the kind)
            assert received.dtype == KINDS[trial % len(KINDS)][0], (rank, trial)
        assert back_counts == tuple(c[1][rank] for c in everyone)
        # The reverse exchange gives the input back.
        assert _same(nbd.all_to_all(received, torch.tensor(back_counts)), samples)


def _check_gradient(rank: int, world: int) -> None:
    # Row i of the rows sent to rank d gets the gradient of sum((d + 1) * out^2): 2 (d + 1) x.
    values = torch.randn(7, 2, generator=torch.Generator().manual_seed(rank), dtype=torch.float64)
    values.requires_grad_()
    batch = nb.NestedBatch.from_lengths(values, [2, 0, 3, 1, 1])
    counts = [2, 3] + [0] * (world - 2) if rank else [0] * (world - 1) + [5]
    out = nbd.all_to_all(batch, counts)
    (out.values.pow(2).sum() * (rank + 1)).backward()
    dest_of_sample = [d for d, c in enumerate(counts) for _ in range(c)]
    rows_dest = torch.repeat_interleave(torch.tensor(dest_of_sample, dtype=torch.float64),
                                        torch.tensor([2, 0, 3, 1, 1]))
    torch.testing.assert_close(values.grad, 2 * (rows_dest[:, None] + 1) * values.detach())


def _check_errors(rank: int, world: int) -> None:
    batch = nb.nested([torch.ones(2, 3), torch.ones(1, 3)])
    good = [2] + [0] * (world - 1)
    bad_counts = {"one count per rank": [2], "counts >= 0": [3, -1] + [0] * (world - 2),
                  "counts summing to the batch size": [1] + [0] * (world - 1)}
    for what, counts in bad_counts.items():
        mine = counts if rank == 0 else good
        match = f"send_counts must hold {what}" if rank == 0 else "rank 0 passed invalid"
        with pytest.raises(ValueError, match=match):
            nbd.all_to_all(batch, mine)
    with pytest.raises(TypeError if rank == 0 else ValueError, match="send_counts"):
        nbd.all_to_all(batch, [1.5, 0.5] if rank == 0 else good)
    odd = {"feature": nb.nested([torch.ones(2, 3 if rank else 4)]),
           "dtype": nb.nested([torch.ones(2, 3, dtype=torch.float64 if rank else torch.float32)]),
           "ragged dims": nb.nested([torch.ones(2, 3)], num_ragged_dims=1 + (rank == 1))}
    for what, batch_ in odd.items():
        with pytest.raises(ValueError, match=what):
            nbd.all_to_all(batch_, [1] + [0] * (world - 1))
    tokens = torch.ones(3, 2)
    dest = torch.tensor([0, world if rank == 0 else 0, 1])
    match = "destination must hold ranks" if rank == 0 else "rank 0 passed destinations"
    with pytest.raises(ValueError, match=match):
        nbd.dispatch(tokens, dest)
    with pytest.raises(ValueError, match="feature shape"):
        nbd.dispatch(torch.ones(3, 2 + (rank == 0)), torch.zeros(3, dtype=torch.int64))
    with pytest.raises(TypeError if rank == 1 else ValueError, match="tokens|rank 1"):
        nbd.dispatch([1, 2] if rank == 1 else tokens, torch.zeros(3, dtype=torch.int64))
    # The group still works after every error (no rank was left inside a collective).
    out = nbd.all_to_all(batch, [1, 1] + [0] * (world - 2))  # sample 0 to rank 0, 1 to 1
    assert _same(out, [batch.unbind()[rank]] * world if rank < 2 else [])


def _check_one_rank_groups(rank: int, world: int) -> None:
    groups = [dist.new_group([r]) for r in range(world)]  # every rank makes every group
    mine = groups[rank]
    batch = nb.nested([torch.randn(2, 3), torch.randn(0, 3)])
    assert nbd.all_to_all(batch, [2], group=mine) is batch  # a local no-op
    tokens = torch.randn(4, 3)
    received, route = nbd.dispatch(tokens, torch.zeros(4, dtype=torch.int64), group=mine)
    assert received is tokens and nbd.combine(received, route) is tokens
    with pytest.raises(ValueError, match="send_counts"):
        nbd.all_to_all(batch, [1], group=mine)
    # The full exchange on a group of one rank (what the no-op skips) gives the same.
    impl._one_rank, saved = (lambda group: False), impl._one_rank
    try:
        assert _same(nbd.all_to_all(batch, [2], group=mine), batch.unbind())
        received, route = nbd.dispatch(tokens, torch.zeros(4, dtype=torch.int64), group=mine)
        assert torch.equal(nbd.combine(received * 2, route), tokens * 2)
    finally:
        impl._one_rank = saved


def _exchanges(rank: int, world: int) -> None:
    _check_exchanges(rank, world)
    _check_gradient(rank, world)
    _check_errors(rank, world)
    _check_one_rank_groups(rank, world)
    _check_dispatch_order(rank, world)


def _check_dispatch_order(rank: int, world: int) -> None:
    gen = torch.Generator().manual_seed(rank)
    n = 0 if rank == 1 else 9
    tokens = torch.randn(n, 2, 2, generator=gen)
    dest = torch.randint(0, world, (n,), generator=gen)
    received, route = nbd.dispatch(tokens, dest)
    everyone: list = [None] * world
    dist.all_gather_object(everyone, (tokens, dest))
    expected = torch.cat([t[d == rank] for t, d in everyone])
    assert torch.equal(received, expected)
    assert torch.equal(route.send(dest), torch.full((len(expected),), rank))
    assert torch.equal(nbd.combine(received + 1, route), tokens + 1)
    assert torch.equal(nbd.combine(received.sum((1, 2)), route), tokens.sum((1, 2)))
    # Tokens given as a batch: its packed rows.
    batch = nb.NestedBatch.from_lengths(tokens, [n - n // 3, n // 3])
    from_batch, route = nbd.dispatch(batch, dest)
    assert torch.equal(from_batch, expected)
    assert _same(batch.with_values(nbd.combine(from_batch, route)), batch.unbind())


@pytest.mark.parametrize("world", [2, 4])
def test_all_to_all_and_dispatch_match_references_and_raise_everywhere(world):
    run_on_ranks(_exchanges, world)


# ---------------------------------------------------------------- dispatch, experts, combine
DIM, HIDDEN, EXPERTS_PER_RANK = 4, 3, 2


def _tokens(rank: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(50 + rank)
    return torch.randn((6, 0, 9, 4)[rank], DIM, generator=gen, dtype=torch.float64)


def _parameters(world: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    gen = torch.Generator().manual_seed(7)
    gate = torch.randn(DIM, EXPERTS_PER_RANK * world, generator=gen, dtype=torch.float64)
    experts = [torch.randn(DIM, HIDDEN, generator=gen, dtype=torch.float64)
               for _ in range(EXPERTS_PER_RANK * world)]
    return gate, experts


def _route(tokens: torch.Tensor, gate: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-1 expert of every token and its gate probability."""
    probs = torch.softmax(tokens @ gate, dim=1)
    expert = probs.argmax(1)
    return expert, probs.gather(1, expert[:, None])


def _experts(tokens: torch.Tensor, expert: torch.Tensor, weights: dict[int, torch.Tensor]
             ) -> torch.Tensor:
    out = tokens.new_zeros(tokens.shape[0], HIDDEN)
    for e, weight in weights.items():
        rows = (expert == e).nonzero().flatten()
        out = out.index_put((rows,), torch.tanh(tokens[rows] @ weight))
    return out


def _moe(rank: int, world: int) -> None:
    gate, experts = _parameters(world)
    for p in (gate, *experts):
        p.requires_grad_()
    tokens = _tokens(rank).requires_grad_()
    expert, prob = _route(tokens, gate)
    received, route = nbd.dispatch(tokens, expert // EXPERTS_PER_RANK)
    local = {e: experts[e] for e in range(EXPERTS_PER_RANK * rank, EXPERTS_PER_RANK * (rank + 1))}
    results = _experts(received, route.send(expert), local)
    combined = nbd.combine(results, route) * prob
    combined.pow(2).sum().backward()
    dist.all_reduce(gate.grad)  # the gate is replicated: sum its gradient (as DDP would)
    # One process, every token and every expert.
    ref_gate, ref_experts = _parameters(world)
    for p in (ref_gate, *ref_experts):
        p.requires_grad_()
    every = [_tokens(r).requires_grad_() for r in range(world)]
    all_tokens = torch.cat(every)
    ref_expert, ref_prob = _route(all_tokens, ref_gate)
    ref = _experts(all_tokens, ref_expert, dict(enumerate(ref_experts))) * ref_prob
    ref.pow(2).sum().backward()
    start = sum(len(t) for t in every[:rank])
    torch.testing.assert_close(combined, ref[start: start + len(tokens)].detach())
    torch.testing.assert_close(tokens.grad, every[rank].grad)
    torch.testing.assert_close(gate.grad, ref_gate.grad)
    for e in local:
        torch.testing.assert_close(experts[e].grad, ref_experts[e].grad)


def test_dispatch_experts_combine_gradients_equal_one_process():
    run_on_ranks(_moe, 3)


# ------------------------------------------------------------------------------------ NCCL
@pytest.mark.cuda
def test_nccl_single_gpu_group(tmp_path, monkeypatch):
    if not torch.cuda.is_available() or not dist.is_nccl_available():
        pytest.skip("needs CUDA and NCCL")
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("nccl", store=store, rank=0, world_size=1)
    try:
        device = torch.device("cuda")
        samples = [torch.randn(n, 3, device=device) for n in (2, 0, 5)]
        batch = nb.nested(samples)
        assert nbd.all_to_all(batch, [3]) is batch
        # The full exchange through NCCL (what the no-op skips on one rank).
        monkeypatch.setattr(impl, "_one_rank", lambda group: False)
        for dtype in (torch.float32, torch.int16, torch.bool, torch.bfloat16):
            cast = [s.to(dtype) for s in samples]
            out = nbd.all_to_all(nb.nested(cast), [3])
            assert out.device.type == "cuda" and _same(out, cast)
        tokens = torch.randn(6, 4, device=device, requires_grad=True)
        received, route = nbd.dispatch(tokens, torch.zeros(6, dtype=torch.int64, device=device))
        nbd.combine(received * 3, route).sum().backward()
        assert torch.equal(tokens.grad, torch.full_like(tokens, 3.0))
    finally:
        dist.destroy_process_group()

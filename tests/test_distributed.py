"""nestbatch.distributed on 2 and 3 processes (gloo, loopback), against the concatenation of
what every rank built, and a DDP model taking a NestedBatch trained like a single process."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from distributed_harness import run_on_ranks

import nestbatch as nb
from nestbatch import distributed as nbd

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="needs torch.distributed with gloo")


def _samples(rank: int, dtype: torch.dtype, k: int = 1) -> list[torch.Tensor]:
    """What rank ``rank`` holds: its own count of samples (rank 1: none), own sizes."""
    gen = torch.Generator().manual_seed(rank)
    count = 0 if rank == 1 else rank + 2
    shapes = [tuple(int(s) for s in torch.randint(0, 4, (k,), generator=gen)) for _ in range(count)]
    return [(torch.randn(*shape, 2, generator=gen) * 10).to(dtype) for shape in shapes]


def _same(batch: nb.NestedBatch, samples: list[torch.Tensor]) -> bool:
    return len(batch.unbind()) == len(samples) and all(
        torch.equal(a, b) for a, b in zip(batch.unbind(), samples))


def _collectives(rank: int, world: int) -> None:
    for dtype, k in ((torch.float32, 1), (torch.int64, 1), (torch.float64, 2)):
        everyone = [s for r in range(world) for s in _samples(r, dtype, k)]
        local = nb.nested(_samples(rank, dtype, k), num_ragged_dims=k, dtype=dtype)
        assert _same(nbd.all_gather(local), everyone)
        gathered = nbd.gather(local, dst=world - 1)
        assert (gathered is None) == (rank != world - 1)
        if gathered is not None:
            assert _same(gathered, everyone)
        source = nbd.broadcast(local if rank == 0 else None, src=0)
        assert _same(source, _samples(0, dtype, k))
        per_rank = [nb.nested(_samples(r, dtype, k), num_ragged_dims=k, dtype=dtype)
                    for r in range(world)]
        mine = nbd.scatter(per_rank if rank == 0 else None, src=0)
        assert _same(mine, _samples(rank, dtype, k))
    # Differentiable all_gather: d(sum of gathered * weight) reaches each rank's own rows.
    values = torch.arange(6.0).view(3, 2) + 10 * rank
    values.requires_grad_()
    batch = nb.NestedBatch.from_lengths(values, [1, 2])
    out = nbd.all_gather(batch)
    weights = torch.arange(out.values.numel(), dtype=torch.float32).view_as(out.values)
    (out.values * weights).sum().backward()
    # Every rank applies the same weights, so each row's gradient is world * its weight.
    assert torch.equal(values.grad, world * weights[3 * rank: 3 * rank + 3])
    # A rank holding another kind of batch makes every rank raise.
    odd = nb.nested([torch.ones(2, 3 if rank == 0 else 2)])
    with pytest.raises(ValueError, match="feature"):
        nbd.all_gather(odd)


@pytest.mark.parametrize("world", [2, 3])
def test_collectives_match_the_concatenation_of_every_rank(world):
    run_on_ranks(_collectives, world)


def _every_rank_raises_and_backward_meets(rank: int, world: int) -> None:
    # A rank holding no row joins the backward's all_reduce (it skipped it: the others hung).
    rows = 0 if rank == 1 else 3
    values = torch.arange(rows * 2.0).view(rows, 2).requires_grad_()
    out = nbd.all_gather(nb.NestedBatch.from_lengths(values, [rows] if rows else []))
    assert out.values.requires_grad
    out.values.sum().backward()
    assert torch.equal(values.grad, torch.full((rows, 2), float(world)))
    # An error found on one rank (a moved ragged dim; scatter's batches of two dtypes on the
    # source) is raised on every rank: alone, it left the others waiting in the collective.
    batch = nb.nested([torch.ones(2, 3)])
    with pytest.raises(ValueError, match="rank 0: move the ragged dim back"):
        nbd.all_gather(batch.transpose(1, 2) if rank == 0 else batch)
    mixed = [nb.nested([torch.ones(2, dtype=torch.float64 if r else torch.float32)])
             for r in range(world)]
    with pytest.raises(ValueError, match=r"batches\[1\] holds a batch with dtype"):
        nbd.scatter(mixed if rank == 0 else None, src=0)
    with pytest.raises(TypeError, match="rank 0: batch must be a NestedBatch"):
        nbd.broadcast(torch.ones(2) if rank == 0 else None, src=0)
    # uint8 destinations (-1 wrapped around: every token counted outside, every rank raised).
    tokens = torch.arange(4.0).view(2, 2) + 10 * rank
    received, route = nbd.dispatch(tokens, torch.tensor([0, world - 1], dtype=torch.uint8))
    assert received.shape[0] == (world if rank in (0, world - 1) else 0)  # (one from each)


@pytest.mark.parametrize("world", [2, 3])
def test_errors_reach_every_rank_and_empty_ranks_join_the_backward(world):
    run_on_ranks(_every_rank_raises_and_backward_meets, world)


class _Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(3, 4)

    def forward(self, batch: nb.NestedBatch) -> torch.Tensor:
        return torch.sum(torch.relu(self.linear(batch)), dim=1).pow(2).mean()


def _rank_batch(rank: int) -> nb.NestedBatch:
    gen = torch.Generator().manual_seed(100 + rank)
    return nb.nested([torch.randn(n, 3, generator=gen) for n in (rank + 1, 3, 0, 2)])


def _ddp(rank: int, world: int, start: dict, out_path: str) -> None:
    model = _Model()
    model.load_state_dict(start)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for _ in range(2):
        optimizer.zero_grad()
        ddp(_rank_batch(rank)).backward()
        optimizer.step()
    if rank == 0:
        torch.save(model.state_dict(), out_path)


def test_ddp_with_nested_batch_inputs_trains_like_one_process(tmp_path):
    torch.manual_seed(0)
    reference = _Model()
    start = {k: v.clone() for k, v in reference.state_dict().items()}
    out_path = str(tmp_path / "ddp.pt")
    run_on_ranks(_ddp, 2, start, out_path)
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    for _ in range(2):  # DDP averages the ranks' gradients: the mean of their losses here
        optimizer.zero_grad()
        (sum(reference(_rank_batch(r)) for r in range(2)) / 2).backward()
        optimizer.step()
    trained = torch.load(out_path)
    for name, value in reference.state_dict().items():
        torch.testing.assert_close(trained[name], value)

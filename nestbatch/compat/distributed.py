"""Ragged batches across processes, on ``torch.distributed`` (any backend).

Data-parallel code gathers ragged outputs (per-rank predictions, detections, token lists) and
usually pads every sample to the global maximum first. Here every collective moves the packed
rows of the samples instead, in two steps:

1. the per-sample ragged shapes, the feature shape and the dtype, as one small object
   collective (their consistency across ranks is checked on every rank, so all raise together);
2. the packed values, as one tensor collective. Tensor collectives need one size on every rank,
   so each rank's packed rows are padded to the largest *rank's* row count (never samples to
   the longest sample), and the padding is dropped on arrival.

:func:`all_gather` is differentiable: the gradient of every gathered row goes back to the rank
that holds it (summed over the ranks that used it), as
``torch.distributed.nn.functional.all_gather`` does for dense tensors.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from nestbatch.batch import NestedBatch
from nestbatch.layouts import Packed, RowPartition

__all__ = ["all_gather", "broadcast", "gather", "scatter"]


# ------------------------------------------------------------------------------- descriptions
def _describe(batch: NestedBatch) -> dict:
    """What the other ranks need to receive ``batch``: host shapes, feature shape, dtype."""
    if not isinstance(batch, NestedBatch):
        raise TypeError(f"batch must be a NestedBatch, got {type(batch).__name__}")
    if batch.ragged_dim != 1:
        raise ValueError("move the ragged dim back to dim 1 before a collective (transpose)")
    return {
        "shapes": [tuple(s) for s in batch.partition.host_shapes],  # a sync if device-only
        "k": batch.num_ragged_dims,
        "feature": tuple(batch.feature_shape),
        "dtype": str(batch.dtype),
    }


def _check_agree(descriptions: Sequence[dict | None]) -> dict:
    """The common ``k`` / feature shape / dtype of the ranks' batches (raises on every rank).

    A rank with no sample has no feature shape to tell (``nested([])``): it takes the others'.
    """
    present = [(r, d) for r, d in enumerate(descriptions) if d is not None]
    holding = [(r, d) for r, d in present if d["shapes"]]
    first_rank, first = (holding or present)[0]
    for rank, d in holding[1:]:
        for key in ("k", "feature", "dtype"):
            if d[key] != first[key]:
                raise ValueError(
                    f"rank {rank} holds a batch with {key}={d[key]!r} but rank {first_rank} "
                    f"with {key}={first[key]!r}: every rank must hold the same kind of batch"
                )
    return first


def _local_rows(batch: NestedBatch, agreed: dict, rows: int, device: torch.device) -> Tensor:
    """This rank's packed values as the agreed kind, padded to ``rows`` rows, on ``device``."""
    values = batch.values.detach()
    if not values.numel():  # possibly an empty batch of unknown feature shape
        values = values.new_empty((0, *agreed["feature"]), dtype=_dtype(agreed["dtype"]))
    return _padded_rows(values.to(device), rows)


def _rows(description: dict) -> int:
    return sum(math.prod(shape) for shape in description["shapes"])


def _dtype(name: str) -> torch.dtype:
    return getattr(torch, name.removeprefix("torch."))


def _device(group: Any) -> torch.device:
    """The device tensor collectives of ``group``'s backend take."""
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _padded_rows(values: Tensor, rows: int) -> Tensor:
    """``values`` with zero rows appended up to ``rows`` (one buffer for the collective)."""
    if values.shape[0] == rows:
        return values.contiguous()
    out = values.new_zeros((rows, *values.shape[1:]))
    out[: values.shape[0]] = values
    return out


def _batch(values: Tensor, description: dict, shapes: Sequence[tuple]) -> NestedBatch:
    partition = RowPartition.from_host_shapes(list(shapes), description["k"], values.device)
    return NestedBatch.trusted(Packed.trusted(values, partition))


# ------------------------------------------------------------------------------- all_gather
class _AllGather(torch.autograd.Function):
    """Packed rows of every rank, in rank order; backward sends each rank its rows' gradient."""

    @staticmethod
    def forward(ctx: Any, values: Tensor, local: Tensor, counts: tuple[int, ...], group: Any
                ) -> Tensor:
        # ``values`` carries the autograd link; ``local`` is them padded for the collective.
        ctx.counts, ctx.group = counts, group
        ctx.rank = dist.get_rank(group)
        if max(counts, default=0) == 0:
            return local.clone().to(values.device)  # no rank holds a row: nothing to send
        parts = [torch.empty_like(local) for _ in counts]
        dist.all_gather(parts, local, group=group)
        out = torch.cat([p[:n] for p, n in zip(parts, counts)])
        return out.to(values.device)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple:
        counts, width = ctx.counts, max(ctx.counts, default=0)
        if width == 0:
            return grad[:0], None, None, None
        device = _device(ctx.group)
        slices = grad.to(device).split(list(counts))
        stacked = torch.stack([_padded_rows(s, width) for s in slices])
        # Every rank's gradient for every rank's rows, summed: the sum for this rank's rows.
        dist.all_reduce(stacked, group=ctx.group)
        mine = stacked[ctx.rank, : counts[ctx.rank]]
        return mine.to(grad.device), None, None, None


def all_gather(batch: NestedBatch, group: Any = None) -> NestedBatch:
    """The samples of every rank's ``batch``, in rank order, on every rank.

    Ranks may hold different numbers of samples (zero included), of any dtype and feature
    shape (the same on every rank) and with several ragged dims. Differentiable: the gradient
    reaching a gathered sample flows back to the rank that holds it.

    Parameters
    ----------
    batch : NestedBatch
        This rank's samples (ragged dim at dim 1).
    group : ProcessGroup, optional
        Default: the whole world.

    Returns
    -------
    NestedBatch
        On this rank's device, packed.
    """
    descriptions: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(descriptions, _describe(batch), group=group)
    agreed = _check_agree(descriptions)
    counts = tuple(_rows(d) for d in descriptions)
    local = _local_rows(batch, agreed, max(counts, default=0), _device(group))
    values = batch.values if batch.values.numel() else local[:0]
    values = _AllGather.apply(values, local, counts, group)
    shapes = [s for d in descriptions for s in d["shapes"]]
    return _batch(values, agreed, shapes)


# ------------------------------------------------------------------------- rooted collectives
def broadcast(batch: NestedBatch | None, src: int, group: Any = None) -> NestedBatch:
    """``src``'s batch on every rank (``batch`` is ignored on the other ranks; may be None)."""
    rank = dist.get_rank(group)
    box = [_describe(batch) if rank == src else None]
    dist.broadcast_object_list(box, src=_global(src, group), group=group)
    description = box[0]
    device = _device(group)
    if rank == src:
        values = batch.values.detach().to(device).contiguous()
    else:
        values = torch.empty((_rows(description), *description["feature"]),
                             dtype=_dtype(description["dtype"]), device=device)
    if values.numel():
        dist.broadcast(values, src=_global(src, group), group=group)
    target = batch.device if rank == src else device
    return _batch(values.to(target), description, description["shapes"])


def scatter(batches: Sequence[NestedBatch] | None, src: int, group: Any = None
            ) -> NestedBatch:
    """Batch ``i`` of ``src``'s list on rank ``i`` (``batches`` is ignored elsewhere).

    Parameters
    ----------
    batches : sequence of NestedBatch
        On ``src``: one batch per rank, all of the same kind (dtype, feature shape, ragged dims).
    src : int
        The rank holding them.
    """
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    descriptions: list = [None] * world
    if rank == src:
        if not isinstance(batches, Sequence) or len(batches) != world:
            got = len(batches) if isinstance(batches, Sequence) else type(batches).__name__
            raise ValueError(f"batches must hold one batch per rank ({world}), got {got}")
        descriptions = [_describe(b) for b in batches]
        agreed = _check_agree(descriptions)
        descriptions = [{**agreed, "shapes": d["shapes"]} for d in descriptions]
    box: list = [None]
    dist.scatter_object_list(box, descriptions if rank == src else None,
                             src=_global(src, group), group=group)
    counts_box = [[_rows(d) for d in descriptions] if rank == src else None]
    dist.broadcast_object_list(counts_box, src=_global(src, group), group=group)
    counts = counts_box[0]
    description, width = box[0], max(counts, default=0)
    device = _device(group)
    out = torch.empty((width, *description["feature"]), dtype=_dtype(description["dtype"]),
                      device=device)
    parts = ([_local_rows(b, description, width, device) for b in batches]
             if rank == src else None)
    dist.scatter(out, parts, src=_global(src, group), group=group)
    return _batch(out[: counts[rank]], description, description["shapes"])


def gather(batch: NestedBatch, dst: int, group: Any = None) -> NestedBatch | None:
    """Every rank's samples, in rank order, on ``dst`` (None on the other ranks)."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    descriptions: list = [None] * world
    dist.all_gather_object(descriptions, _describe(batch), group=group)  # all ranks learn the sizes
    agreed = _check_agree(descriptions)
    counts = [_rows(d) for d in descriptions]
    width, device = max(counts, default=0), _device(group)
    local = _local_rows(batch, agreed, width, device)
    parts = [torch.empty_like(local) for _ in range(world)] if rank == dst else None
    dist.gather(local, parts, dst=_global(dst, group), group=group)
    if rank != dst:
        return None
    values = torch.cat([p[:n] for p, n in zip(parts, counts)]).to(batch.device)
    return _batch(values, agreed, [s for d in descriptions for s in d["shapes"]])


def _global(rank: int, group: Any) -> int:
    """The global rank of ``group``'s rank ``rank`` (what the rooted collectives take)."""
    return rank if group is None else dist.get_global_rank(group, rank)

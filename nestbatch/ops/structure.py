"""Structure ops, with TensorFlow's semantics: ``cat``, ``stack``, ``tile`` / ``repeat``.

* ``torch.cat(batches, dim=0)`` (TF ``concat`` axis=0): the samples of all batches, in order. A
  dense ``(n, L, *feature)`` tensor in the list counts as ``n`` samples of length ``L``.
* ``torch.cat(batches, dim=1)`` with one ragged dim (TF axis=1): sample ``i`` is the
  concatenation of every batch's sample ``i`` (batch sizes must agree).
* ``torch.cat`` on a feature dim, ``torch.stack`` on a new feature dim: batches of the same row
  structure, on their packed values.
* ``torch.tile(x, reps)`` / ``x.repeat(*reps)`` (TF ``tile``): ``reps[0]`` repeats the whole
  batch, ``reps[1]`` repeats every sample along its ragged dim (``[a, b] -> [a, b, a, b]``), the
  rest tile the feature dims.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from nestbatch.layouts import Layout, Packed, RowPartition
from nestbatch.ops.common import (
    check_same_structure,
    dim_kind,
    first_batch,
    is_batch,
    normalize_dim,
)
from nestbatch.ops.registry import register

if TYPE_CHECKING:
    from nestbatch.batch import NestedBatch


def _as_batches(items: Any, ref: NestedBatch) -> list[NestedBatch]:
    from nestbatch.batch import NestedBatch

    out = []
    for item in items:
        if is_batch(item):
            out.append(item)
        elif isinstance(item, Tensor) and item.dim() == ref.dim():
            out.append(NestedBatch.from_list(list(item.unbind(0)), ref.num_ragged_dims))
        else:
            raise TypeError(
                "cat: every item must be a NestedBatch or a dense tensor with the batch's "
                f"{ref.dim()} dims, got {type(item).__name__}"
                + (f" of shape {tuple(item.shape)}" if isinstance(item, Tensor) else "")
            )
    return out


def _merged_partition(parts: list[RowPartition], shapes: Tensor) -> RowPartition:
    if all(p.knows_host_shapes for p in parts):
        host = tuple(s for p in parts for s in p.host_shapes)
        return RowPartition(shapes, host_shapes=host)
    return RowPartition.from_shapes(shapes)


@register(torch.cat, torch.concat, torch.concatenate, layouts=(Layout.PACKED,))
def _cat(layout: Layout, func: Any, args: tuple, kwargs: dict) -> Any:
    items = args[0] if args else kwargs["tensors"]
    ref = first_batch(items)
    dim = normalize_dim(ref, args[1] if len(args) > 1 else kwargs.get("dim", kwargs.get("axis", 0)))
    batches = _as_batches(items, ref)
    kind = dim_kind(ref, dim)
    if kind == "batch":
        return cat_samples(batches)
    if kind == "ragged":
        return cat_rows(batches)
    for b in batches[1:]:
        check_same_structure(ref, b, "batches concatenated on a feature dim")
    k = ref.num_ragged_dims
    return ref.with_values(torch.cat([b.values for b in batches], dim - k))


def cat_samples(batches: list[NestedBatch]) -> NestedBatch:
    """The samples of every batch, in order (TF ``concat`` axis=0)."""
    from nestbatch.batch import NestedBatch

    ks = {b.num_ragged_dims for b in batches}
    features = {tuple(b.feature_shape) for b in batches}
    if len(ks) > 1 or len(features) > 1:
        raise ValueError(
            "cat along dim 0: batches must have the same number of ragged dims and feature "
            f"shape, got ragged dims {sorted(ks)} and feature shapes {sorted(features)}"
        )
    values = torch.cat([b.values for b in batches])
    shapes = torch.cat([b.shape_per_sample for b in batches])
    partition = _merged_partition([b.partition for b in batches], shapes)
    return NestedBatch(Packed(values, partition=partition))


def cat_rows(batches: list[NestedBatch]) -> NestedBatch:
    """Sample ``i`` = every batch's sample ``i`` joined along the ragged dim (TF axis=1)."""
    from nestbatch.batch import NestedBatch

    ref = batches[0]
    if ref.num_ragged_dims != 1 or any(b.num_ragged_dims != 1 for b in batches):
        raise ValueError("cat along the ragged dim needs batches with one ragged dim")
    for b in batches[1:]:
        if b.batch_size != ref.batch_size or b.feature_shape != ref.feature_shape:
            raise ValueError(
                "cat along dim 1: batches must have the same batch size and feature shape, got "
                f"{ref.batch_size} samples of {tuple(ref.feature_shape)} and {b.batch_size} "
                f"of {tuple(b.feature_shape)}"
            )
    lengths = torch.stack([b.lengths for b in batches]).sum(0)
    host = None
    if all(b.partition.knows_host_shapes for b in batches):
        host = [sum(col) for col in zip(*(b.partition.host_lengths for b in batches))]
    partition = RowPartition.from_lengths(lengths, host_lengths=host)
    # Destination row of every source row: its sample's start in the result, plus the rows of
    # that sample contributed by earlier batches, plus its position in its own sample.
    starts = partition.offsets[:-1]
    before = torch.zeros_like(lengths)
    destinations = []
    for b in batches:
        destinations.append(starts[b.row_ids] + before[b.row_ids] + b.partition.positions)
        before = before + b.lengths
    values = torch.cat([b.values for b in batches])
    out = values.new_empty(values.shape).index_copy(0, torch.cat(destinations), values)
    return NestedBatch(Packed(out, partition=partition))


@register(torch.stack, layouts=(Layout.PACKED,))
def _stack(layout: Layout, func: Any, args: tuple, kwargs: dict) -> Any:
    items = args[0] if args else kwargs["tensors"]
    ref = first_batch(items)
    dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
    dim = dim % (ref.dim() + 1)
    k = ref.num_ragged_dims
    if dim <= k:
        raise ValueError(
            f"stack of batches along dim {dim}: only a new feature dim (> {k}) is supported "
            "(cat along dim 0 joins batches of samples)"
        )
    for b in items:
        if not is_batch(b):
            raise TypeError(f"stack: every item must be a NestedBatch, got {type(b).__name__}")
        check_same_structure(ref, b, "stacked batches")
    return ref.with_values(torch.stack([b.values for b in items], dim - k))


@register(torch.tile, torch.Tensor.tile, torch.Tensor.repeat, layouts=(Layout.PACKED,))
def _tile(layout: Layout, func: Any, args: tuple, kwargs: dict) -> Any:
    batch = args[0]
    reps = args[1] if len(args) == 2 and not isinstance(args[1], int) else args[1:]
    reps = tuple(kwargs.get("dims", kwargs.get("repeats", reps)))
    if func is torch.Tensor.repeat and len(reps) < batch.dim():
        raise ValueError(
            f"repeat: number of repeats ({len(reps)}) can't be smaller than the batch's dims "
            f"({batch.dim()})"
        )
    reps = (1,) * (batch.dim() - len(reps)) + reps
    if len(reps) > batch.dim():
        raise ValueError(f"tile: {len(reps)} reps for a batch of {batch.dim()} dims")
    return tile(batch, reps)


def tile(batch: NestedBatch, reps: tuple[int, ...]) -> NestedBatch:
    """TF ``tile``: repeat the batch, every sample along its ragged dim, and the features."""
    from nestbatch.batch import NestedBatch
    from nestbatch.selection import select_samples

    k = batch.num_ragged_dims
    if any(r < 0 for r in reps):
        raise ValueError(f"tile: reps must be non-negative, got {reps}")
    if k != 1 and any(r != 1 for r in reps[1 : 1 + k]):
        raise ValueError("tile along ragged dims is supported for one ragged dim only")
    if reps[0] != 1:
        index = torch.arange(batch.batch_size, device=batch.device).repeat(reps[0])
        batch = select_samples(batch, index)
    features = reps[1 + k :]
    values = batch.values
    if any(r != 1 for r in features):
        values = values.repeat(1, *features)
    r = reps[1]
    if r != 1:
        host = None
        if batch.partition.knows_host_shapes:
            host = [n * r for n in batch.partition.host_lengths]
        partition = RowPartition.from_lengths(batch.lengths * r, host_lengths=host)
        old_lengths = batch.lengths[partition.row_ids].clamp_min(1)
        source = batch.offsets[partition.row_ids] + partition.positions % old_lengths
        return NestedBatch(Packed(values.index_select(0, source), partition=partition))
    return batch.with_values(values)

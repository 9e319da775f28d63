"""Structure ops, with TensorFlow's semantics: ``cat``, ``stack``, ``tile`` / ``repeat``.

Dims are logical: with the one ragged dim presented at logical dim ``r``
(:attr:`~nestbatch.NestedBatch.ragged_dim`, 1 unless moved by ``transpose``), every op reads its
dims as ``torch`` would on the samples ``tolist()`` gives, and the result presents its ragged dim
where ``torch`` would put it.

* ``torch.cat(batches, dim=0)`` (TF ``concat`` axis=0): the samples of all batches, in order. A
  dense ``(n, *sample_shape)`` tensor in the list counts as ``n`` samples of that logical shape,
  read with the ragged dim(s) where the batches present them.
* ``torch.cat(batches, dim=r)`` with one ragged dim (TF axis=1 when ``r == 1``): sample ``i`` is
  the concatenation of every batch's sample ``i`` along its ragged dim (batch sizes must agree).
* ``torch.cat`` on a feature dim: batches of the same row structure, on their packed values.
* ``torch.stack(batches, dim=d)``: batches of the same row structure; the new dim is a feature
  dim at logical dim ``d`` of the result. ``d`` may be any dim but 0 (the batch) and the ragged
  dims' own positions (``r`` for one ragged dim, ``1..k`` for ``k`` of them, as ``torch.nested``'s
  jagged ``stack``); a new dim before a moved ragged dim (``d < r``) shifts it to ``r + 1``.
* ``torch.tile(x, reps)`` / ``x.repeat(*reps)`` (TF ``tile``), ``reps`` in logical order:
  ``reps[0]`` repeats the whole batch, ``reps[r]`` repeats every sample along its ragged dim
  (``[a, b] -> [a, b, a, b]``), the others tile the feature dims.

Every batch of a ``cat`` / ``stack`` must present its ragged dim at the same logical position.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from nestbatch.batch import NestedBatch
from nestbatch.layouts import Layout, Packed, RowPartition
from nestbatch.ops.common import (
    check_same_structure,
    dim_kind,
    first_batch,
    is_batch,
    normalize_dim,
    values_dim,
)
from nestbatch.ops.indexing import select_samples
from nestbatch.ops.registry import register


def _as_batches(items: Any, ref: NestedBatch) -> list[NestedBatch]:
    out = []
    for item in items:
        if is_batch(item):
            out.append(item)
        elif isinstance(item, Tensor) and item.dim() == ref.dim():
            out.append(dense_as_batch(item, ref))
        else:
            raise TypeError(
                "cat: every item must be a NestedBatch or a dense tensor with the batch's "
                f"{ref.dim()} dims, got {type(item).__name__}"
                + (f" of shape {tuple(item.shape)}" if isinstance(item, Tensor) else "")
            )
    return out


def dense_as_batch(item: Tensor, ref: NestedBatch) -> NestedBatch:
    """The ``n`` samples of a dense ``item (n, *sample_shape)``, read in ``ref``'s logical order.

    The ragged dims of ``item`` are the dims where ``ref`` presents its own (logical dim
    ``ref.ragged_dim``, or ``1..k``), so the result has ``ref``'s ragged dim. Stored packed; the
    values are a view of ``item`` where ``reshape`` can make one.
    """
    k, rd = ref.num_ragged_dims, ref.ragged_dim
    stored = item.movedim(rd, 1) if rd != 1 else item
    n, ragged = stored.shape[0], tuple(stored.shape[1 : 1 + k])
    values = stored.reshape(n * math.prod(ragged), *stored.shape[1 + k :])
    # Built from host shapes (not unbind), so an empty item is a valid batch of 0 samples.
    partition = RowPartition.from_host_shapes([ragged] * n, k, item.device)
    return NestedBatch(Packed(values, partition=partition), rd)


def check_same_ragged_dim(batches: Sequence[NestedBatch], what: str) -> int:
    """The logical position of the ragged dim shared by ``batches``.

    Raises
    ------
    ValueError
        Naming two different positions, and how to align them.
    """
    rd = batches[0].ragged_dim
    for b in batches[1:]:
        if b.ragged_dim != rd:
            raise ValueError(
                f"{what}: every batch must present its ragged dim at the same logical dim, got "
                f"ragged_dim {rd} and {b.ragged_dim}; transpose one of them first (e.g. "
                f"x.transpose({min(rd, b.ragged_dim)}, {max(rd, b.ragged_dim)}))"
            )
    return rd


@register(torch.cat, torch.concat, torch.concatenate, layouts=(Layout.PACKED,),
          moved_ragged=True, nested=True)
def _cat(layout: Layout, func: Any, args: tuple, kwargs: dict) -> Any:
    items = args[0] if args else kwargs["tensors"]
    ref = first_batch(items)
    dim = normalize_dim(ref, args[1] if len(args) > 1 else kwargs.get("dim", kwargs.get("axis", 0)))
    batches = _as_batches(items, ref)
    check_same_ragged_dim(batches, f"cat along dim {dim}")
    kind = dim_kind(ref, dim)
    if kind == "batch":
        return cat_samples(batches)
    if kind == "ragged":
        return cat_rows(batches)
    for b in batches:  # (every one but ref itself: a dense tensor before it included)
        if b is not ref:
            check_same_structure(ref, b, "batches concatenated on a feature dim")
    values = [b.packed().values for b in batches]
    return ref.with_values(torch.cat(values, values_dim(ref, dim)))


#: torch's ``atleast_*d`` functions (the Python ones, and the C ones they hand a sequence to),
#: with the number of dims each gives.
_AT_LEAST = {**{getattr(torch, f"atleast_{n}d"): n for n in (1, 2, 3)},
             **{getattr(torch._C._VariableFunctions, f"atleast_{n}d"): n for n in (1, 2, 3)}}


@register(*_AT_LEAST, layouts=(Layout.PACKED,), moved_ragged=True, nested=True)
def _atleast(layout: Layout, func: Any, args: tuple, kwargs: dict) -> Any:
    """``torch.atleast_1d`` / ``2d`` / ``3d``: a batch has at least 2 dims, so only
    ``atleast_3d`` of a ``(B, j)`` batch changes it, to ``(B, j, 1)`` (torch's ``(M, N) ->
    (M, N, 1)``); several tensors (or one sequence of them) give a tuple, as torch's."""
    items = args[0] if len(args) == 1 and isinstance(args[0], (list, tuple)) else args
    wanted = _AT_LEAST[func]
    made = tuple(_at_least(t, wanted) if is_batch(t) else _dense_at_least(t, wanted)
                 for t in items)
    return made[0] if len(args) == 1 and not isinstance(args[0], (list, tuple)) else made


def _at_least(batch: NestedBatch, dims: int) -> NestedBatch:
    return batch.unsqueeze(-1) if batch.dim() < dims else batch


#: The ``torch.*stack`` functions on sequences: the dim they concatenate along and the least
#: number of dims they first give every tensor (torch's ``atleast_*d``).
_STACKS = {torch.hstack: (1, 1), torch.vstack: (0, 2), torch.row_stack: (0, 2),
           torch.dstack: (2, 3), torch.column_stack: (1, 2)}


@register(*_STACKS, layouts=(Layout.PACKED,), moved_ragged=True, nested=True)
def _stacks(layout: Layout, func: Any, args: tuple, kwargs: dict) -> Any:
    """``hstack`` / ``column_stack`` (along dim 1: the ragged dim, each sample the
    concatenation of the tensors' samples), ``vstack`` / ``row_stack`` (dim 0: the samples of
    every tensor in turn), ``dstack`` (dim 2): ``torch.cat`` of the tensors given at least
    that many dims, as torch's (a batch has at least 2: only ``dstack`` of ``(B, j)``
    batches adds one)."""
    items = args[0] if args else kwargs["tensors"]
    dim, least = _STACKS[func]
    made = [_at_least(t, least) if is_batch(t) else _dense_at_least(t, least) for t in items]
    return torch.cat(made, dim)


def _dense_at_least(tensor: Tensor, dims: int) -> Tensor:
    return (torch.atleast_1d, torch.atleast_2d, torch.atleast_3d)[dims - 1](tensor)


def cat_samples(batches: list[NestedBatch]) -> NestedBatch:
    """The samples of every batch, in order (TF ``concat`` axis=0); keeps their ragged dim."""
    rd = check_same_ragged_dim(batches, "cat along dim 0")
    shapes_seen = list(dict.fromkeys(b.sample_shape for b in batches))
    if len(shapes_seen) > 1:
        # sample_shape has None at every ragged dim: equal ones mean the same ragged dims and
        # feature dims, at the same logical positions.
        raise ValueError(
            "cat along dim 0: batches must have the same sample shape (None at ragged dims), "
            f"got {' and '.join(map(str, shapes_seen))}"
        )
    ranks = {b.partition.ragged_rank for b in batches}
    if len(ranks) > 1:
        # (Two ragged dims of one batch and two levels of rows of another print alike.)
        raise ValueError(
            f"cat along dim 0: batches must have the same ragged rank (nested raggedness), got "
            f"{sorted(ranks)}; a dense tensor or a batch of several ragged dims has rank 1"
        )
    values = torch.cat([b.packed().values for b in batches])
    if batches[0].partition.ragged_rank > 1:
        return NestedBatch(Packed(values, partition=_joined_levels(batches)))
    shapes = torch.cat([b.shape_per_sample for b in batches])
    parts = [b.partition for b in batches]
    if all(p.knows_host_shapes for p in parts):
        partition = RowPartition(shapes, host_shapes=tuple(s for p in parts for s in p.host_shapes))
    else:
        partition = RowPartition.from_shapes(shapes)
    return NestedBatch(Packed(values, partition=partition), rd)


def _joined_levels(batches: list[NestedBatch]) -> RowPartition:
    """The nested partition of every batch's samples in turn: every level's rows joined (on
    the host when every batch knows its sizes there)."""
    levels = []
    for depth in range(batches[0].partition.ragged_rank):
        parts = [b.partition.levels[depth] for b in batches]
        if all(p.knows_host_shapes for p in parts):
            lengths = [n for p in parts for n in p.host_lengths]
            levels.append(RowPartition.from_host_lengths(lengths, batches[0].device))
        else:
            levels.append(RowPartition.from_lengths(torch.cat([p.lengths for p in parts])))
    return RowPartition.nested(levels)


def cat_rows(batches: list[NestedBatch]) -> NestedBatch:
    """Sample ``i`` = every batch's sample ``i`` joined along the ragged dim (TF axis=1), which
    stays at its logical position."""
    ref = batches[0]
    rd = check_same_ragged_dim(batches, "cat along the ragged dim")
    if any(b.num_ragged_dims != 1 for b in batches):
        raise ValueError("cat along the ragged dim needs batches with one ragged dim")
    for b in batches[1:]:
        if b.batch_size != ref.batch_size or b.feature_shape != ref.feature_shape:
            raise ValueError(
                f"cat along dim {rd}: batches must have the same batch size and sample shape, "
                f"got {ref.batch_size} samples of shape {ref.sample_shape} and "
                f"{b.batch_size} of {b.sample_shape}"
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
    return NestedBatch(Packed(out, partition=partition), rd)


@register(torch.stack, layouts=(Layout.PACKED,), moved_ragged=True)
def _stack(layout: Layout, func: Any, args: tuple, kwargs: dict) -> Any:
    items = args[0] if args else kwargs["tensors"]
    ref = first_batch(items)
    dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
    ndim = ref.dim() + 1
    if not -ndim <= dim < ndim:
        raise IndexError(f"stack: dim={dim} out of range for a result with {ndim} dims")
    for b in items:
        if not is_batch(b):
            raise TypeError(f"stack: every item must be a NestedBatch, got {type(b).__name__}")
    return stack(list(items), dim % ndim)


def stack(batches: list[NestedBatch], dim: int) -> NestedBatch:
    """Stack batches of the same row structure along a new feature dim.

    Parameters
    ----------
    batches : list of NestedBatch
        ``N`` batches of samples ``(*before, L_i, *after)`` (the ragged dim at logical dim
        ``r``), the same per-sample sizes and sample shape.
    dim : int
        Logical dim of the new dim in the result, in ``[1, ndim]`` except the ragged dims'
        positions (``r`` for one ragged dim, ``1..k`` for ``k``).

    Returns
    -------
    NestedBatch
        Samples ``torch.stack(samples, dim - 1)``; the ragged dim at ``r + 1`` when
        ``dim < r``, else at ``r``.

    Raises
    ------
    ValueError
        For ``dim`` 0 or a ragged dim's position; for batches of other ragged positions or row
        structures.
    """
    ref = batches[0]
    rd = check_same_ragged_dim(batches, f"stack along dim {dim}")
    k = ref.num_ragged_dims
    ragged = tuple(range(1, k + 1)) if k > 1 else (rd,)
    if dim == 0 or dim in ragged:
        # As torch.nested's jagged stack: a new dim takes neither the batch's position nor the
        # ragged dim's (which keeps the behaviour of batches whose ragged dim was never moved).
        where = f"ragged dim ({rd})" if k == 1 else f"ragged dims (1..{k})"
        raise ValueError(
            f"stack of batches along dim {dim}: the new dim cannot take the position of the "
            f"batch dim (0) or of the {where}; stack along another dim, e.g. {ragged[-1] + 1} "
            "(cat along dim 0 joins batches of samples)"
        )
    for b in batches[1:]:
        check_same_structure(ref, b, "stacked batches")
    # Stored feature dims are the logical ones with the batch and ragged dims left out.
    stored = dim - k if k > 1 else (dim if dim < rd else dim - 1)
    values = torch.stack([b.values for b in batches], stored)
    return ref.with_values(values, rd + 1 if dim < rd else rd)


@register(torch.tile, torch.Tensor.tile, torch.Tensor.repeat, layouts=(Layout.PACKED,),
          moved_ragged=True)
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


def _lengths_times(batch: NestedBatch, count: int) -> RowPartition:
    """The partition of ``batch``'s samples with ``count`` times their rows (host sizes kept)."""
    host = None
    if batch.partition.knows_host_shapes:
        host = [n * count for n in batch.partition.host_lengths]
    return RowPartition.from_lengths(batch.lengths * count, host_lengths=host)


def tile_rows(batch: NestedBatch, count: int, values: Tensor) -> NestedBatch:
    """A batch of ``count`` times every sample's rows, ``values`` (in the new order)."""
    return NestedBatch(Packed(values, partition=_lengths_times(batch, count)), batch.ragged_dim)


def tile(batch: NestedBatch, reps: tuple[int, ...]) -> NestedBatch:
    """TF ``tile``: repeat the batch, every sample along its ragged dim, and the features.

    Parameters
    ----------
    batch : NestedBatch
        Samples ``(*before, L_i, *after)``, the ragged dim at logical dim ``r``.
    reps : tuple of int
        One non-negative count per logical dim (``batch.dim()`` of them): ``reps[0]`` repeats
        the batch, ``reps[r]`` every sample along its ragged dim, the others the feature dims.

    Returns
    -------
    NestedBatch
        ``B * reps[0]`` samples ``sample.repeat(*reps[1:])``, the ragged dim still at ``r``.
    """
    k, rd = batch.num_ragged_dims, batch.ragged_dim
    ragged = tuple(range(1, k + 1)) if k > 1 else (rd,)
    if any(r < 0 for r in reps):
        raise ValueError(f"tile: reps must be non-negative, got {reps}")
    if k != 1 and any(reps[d] != 1 for d in ragged):
        raise ValueError("tile along ragged dims is supported for one ragged dim only")
    features = tuple(r for d, r in enumerate(reps) if d != 0 and d not in ragged)
    if reps[0] != 1:
        # A host index: the host sizes carry over (select_samples reads it without a sync).
        index = torch.arange(batch.batch_size).repeat(reps[0])
        batch = select_samples(batch, index)  # stored order: rd is restored below
    values = batch.values
    if any(r != 1 for r in features):
        values = values.repeat(1, *features)
    r = reps[rd]
    if r != 1:
        partition = _lengths_times(batch, r)
        old_lengths = batch.lengths[partition.row_ids].clamp_min(1)
        source = batch.offsets[partition.row_ids] + partition.positions % old_lengths
        return NestedBatch(Packed(values.index_select(0, source), partition=partition), rd)
    if reps[0] == 1 and all(r == 1 for r in features):
        values = values.clone()  # (repeat always copies, as torch's: every rep 1 is no view)
    return batch.with_values(values, rd)


@register(torch.repeat_interleave, torch.Tensor.repeat_interleave, layouts=(Layout.PACKED,),
          moved_ragged=True)
def _repeat_interleave(layout: Layout, func: Any, args: tuple, kwargs: dict) -> NestedBatch:
    """``repeat_interleave`` of every sample along a feature dim (torch's on the packed rows),
    or along its ragged dim by one count (each row ``repeats`` times in place: lengths times
    ``repeats``). A one-element ``repeats`` tensor on a device is read once there (a sync): the
    new lengths need it on the host, as torch's output shape does."""
    batch = args[0]
    repeats = args[1] if len(args) > 1 else kwargs["repeats"]
    dim = args[2] if len(args) > 2 else kwargs.get("dim")
    if dim is None:
        raise ValueError("repeat_interleave of a NestedBatch needs dim (without it torch "
                         "flattens the whole tensor, which mixes the samples)")
    dim = normalize_dim(batch, dim)
    if dim_kind(batch, dim) == "feature":
        return batch.with_values(batch.values.repeat_interleave(
            repeats, values_dim(batch, dim), output_size=kwargs.get("output_size")))
    if dim_kind(batch, dim) != "ragged" or batch.num_ragged_dims != 1 or not (
            isinstance(repeats, int) or isinstance(repeats, Tensor) and repeats.numel() == 1):
        raise ValueError(
            f"repeat_interleave along dim {dim} of a NestedBatch of shape {batch.shape}: along "
            "its ragged dim it takes one count (each sample's rows differ in number)"
        )
    count = int(repeats)
    if count < 0:
        raise RuntimeError(f"repeat_interleave: repeats can not be negative, got {count}")
    return tile_rows(batch, count, batch.values.repeat_interleave(count, 0))


@register(torch.nested.to_padded_tensor, layouts=tuple(Layout), moved_ragged=True, nested=True)
def _to_padded_tensor(layout: Layout, func: Any, args: tuple, kwargs: dict) -> Tensor:
    """``torch.nested.to_padded_tensor(batch, padding, output_size)``: the batch's method."""
    if kwargs.get("out") is not None:
        raise TypeError("torch.nested.to_padded_tensor(out=...) is not supported on a batch")
    kwargs.pop("out", None)
    return args[0].to_padded_tensor(*args[1:], **kwargs)

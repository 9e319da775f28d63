"""Shape ops: reshape / view (and ``*_as``), transpose, permute, select, unbind, unsqueeze,
squeeze, flatten.

These ops rearrange the feature dims, on the packed values. As in ``torch.nested``, a size of
-1 keeps a dim's size, and the only size a ragged dim accepts is -1. Exceptions: ``transpose`` of
two ragged dims (``k > 1``) swaps them on the padded data; ``select`` on a ragged dim picks the
same position in every sample (each must be long enough).

``transpose`` / ``permute`` / ``movedim`` may move the one ragged dim of a batch (``k == 1``)
among the feature dims, as ``torch.nested`` jagged tensors do: the result shares storage, presents
the ragged dim at its new logical position (:attr:`~nestbatch.NestedBatch.ragged_dim`) and views
the stored feature dims in their new order.

``reshape`` / ``view`` of a batch whose ragged dim is at logical dim ``r > 1`` keep it there:
``shape = (B or -1, *before, -1, *after)`` with the -1 at dim ``r``, the ``r - 1`` dims before it
reshaped among themselves and the dims after it among themselves (each group keeps its number of
elements; within a group, one -1 is inferred and several keep their dims' sizes). Any other
reshape would move elements across the ragged dim and raises a ``ValueError``.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from nestbatch.batch import NestedBatch, moved_ragged_error, sample_of, storage_dim
from nestbatch.checks import normalize_dim as checked_dim
from nestbatch.layouts import Layout, RowPartition
from nestbatch.layouts.sizes import RaggedSize
from nestbatch.ops.broadcasting import packed_operand
from nestbatch.ops.common import (
    PACKED_OR_PADDED,
    check_same_structure,
    dim_kind,
    feature_values_dim,
    is_batch,
    normalize_dim,
    torch_funcs,
    values_dim,
    wrap_padded,
)
from nestbatch.ops.registry import register


def _shape_arg(args: tuple, kwargs: dict) -> tuple[int, ...]:
    if len(args) == 2 and not isinstance(args[1], int):
        return tuple(args[1])
    if len(args) > 1:
        return tuple(args[1:])
    return tuple(kwargs.get("shape", kwargs.get("size", ())))


def _ragged_kept(batch: NestedBatch, shape: tuple) -> tuple[int, ...]:
    """``shape`` with this batch's own ragged sizes (``view(*b.size()[:2], H, D)``, as with
    torch.nested) read as -1: the ragged dim keeps its sizes."""
    if not any(isinstance(size, RaggedSize) for size in shape):
        return shape
    own = batch.shape
    for d, size in enumerate(shape):
        if isinstance(size, RaggedSize) and (d >= len(own) or size != own[d]):
            raise ValueError(
                f"shape {shape}: the ragged size at dim {d} is not this batch's own (another "
                f"batch's, with other or unknown per-sample sizes; this batch's shape is {own}): "
                "a reshape keeps the ragged sizes where they are"
            )
    return tuple(-1 if isinstance(size, RaggedSize) else size for size in shape)


def new_feature_shape(batch: NestedBatch, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The feature shape asked for by ``shape = (B or -1, -1 per ragged dim, *feature)``.

    Raises
    ------
    ValueError
        If ``shape`` changes the batch size or gives a ragged dim a size other than -1.
    """
    k = batch.num_ragged_dims
    if len(shape) < 1 + k:
        raise ValueError(
            f"shape {shape} must start with the batch size (or -1) and -1 for each of the {k} "
            "ragged dim(s)"
        )
    _check_batch_size(batch, shape)
    for d in range(1, 1 + k):
        if shape[d] != -1:
            raise ValueError(
                f"shape {shape}: ragged dim {d} has no single size; give -1 there (keep it)"
            )
    return tuple(_keep_sizes(shape[1 + k :], batch.feature_shape))


def moved_feature_shape(batch: NestedBatch, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The stored feature shape asked for by the logical ``shape`` of a batch whose ragged dim is
    at logical dim ``r > 1``.

    Parameters
    ----------
    batch : NestedBatch
        Samples ``(*before, L_i, *after)``, ``len(before) == r - 1``.
    shape : tuple of int
        ``(B or -1, *new_before, -1, *new_after)``, the -1 at dim ``r``: ``new_before`` has
        ``r - 1`` dims holding as many elements as ``before``, ``new_after`` any number of dims
        holding as many as ``after``.

    Returns
    -------
    tuple of int
        ``(*new_before, *new_after)``: the new shape of the packed values' feature dims.

    Raises
    ------
    ValueError
        If ``shape`` changes the batch size, has no -1 at dim ``r``, or regroups elements across
        the ragged dim.
    """
    rd = batch.ragged_dim
    _check_batch_size(batch, shape)
    if len(shape) <= rd or shape[rd] != -1:
        raise ValueError(
            f"shape {shape}: the ragged dim stays at logical dim {rd} and has no single size; "
            f"give -1 there (samples have shape {batch.sample_shape})"
        )
    sample = batch.sample_shape
    before = _group_shape(shape[1:rd], sample[: rd - 1])
    after = _group_shape(shape[rd + 1 :], sample[rd:])
    if before is None or after is None:
        raise ValueError(
            f"cannot reshape samples of shape {sample} to {shape[1:]}: the {rd - 1} dim(s) "
            f"before the ragged dim (logical dim {rd}) hold {math.prod(sample[: rd - 1])} "
            f"elements and the dims after it {math.prod(sample[rd:])}; the new dims on each "
            "side must hold as many (a reshape cannot move elements across the ragged dim)"
        )
    return before + after


def _check_batch_size(batch: NestedBatch, shape: tuple[int, ...]) -> None:
    if not shape or shape[0] not in (-1, batch.batch_size):
        raise ValueError(
            f"shape {shape} changes the batch size {batch.batch_size}: dim 0 must stay "
            f"{batch.batch_size} (or -1)"
        )


def _keep_sizes(asked: tuple[int, ...], old: tuple[int, ...]) -> list[int]:
    # torch.nested's rule: where several sizes are -1, each keeps the size its dim already has.
    if asked.count(-1) > 1:
        return [old[i] if s == -1 and i < len(old) else s for i, s in enumerate(asked)]
    return list(asked)


def _group_shape(asked: tuple[int, ...], old: tuple[int, ...]) -> tuple[int, ...] | None:
    """``asked`` with its -1 resolved against the group of dims ``old``, or None if it does not
    hold as many elements."""
    sizes = _keep_sizes(asked, old)
    numel = math.prod(old)
    if sizes.count(-1) == 1:
        known = math.prod(s for s in sizes if s != -1)
        if known <= 0 or numel % known:
            return None
        sizes[sizes.index(-1)] = numel // known
    if any(s < 0 for s in sizes) or math.prod(sizes) != numel:
        return None
    return tuple(sizes)


@register(*torch_funcs("reshape", "view"), layouts=(Layout.PACKED,), moved_ragged=True)
def _reshape(layout: Layout, func: Any, args: tuple, kwargs: dict) -> Any:
    batch = args[0]
    if func is torch.Tensor.view and len(args) == 2 and isinstance(args[1], torch.dtype):
        return _view_dtype(batch, args[1])
    shape = _ragged_kept(batch, _shape_arg(args, kwargs))
    shaper = new_feature_shape if batch.ragged_dim == 1 else moved_feature_shape
    feature = shaper(batch, shape)
    values = batch.values
    method = values.view if func is torch.Tensor.view else values.reshape
    return batch.with_values(method(values.shape[0], *feature))


def _view_dtype(batch: NestedBatch, dtype: torch.dtype) -> NestedBatch:
    """``view(dtype)``: reinterprets the last logical dim, which must not be a moved ragged dim
    (the stored last dim is then a feature dim that precedes it)."""
    rd = batch.ragged_dim
    if rd != 1 and rd == batch.dim() - 1 and dtype.itemsize != batch.dtype.itemsize:
        raise moved_ragged_error(
            batch, f"view({dtype}) of a {batch.dtype} batch", "its last dim is the ragged dim"
        )
    return batch.with_values(batch.values.view(dtype))


@register(*torch_funcs("reshape_as", "view_as"), layouts=(Layout.PACKED,), moved_ragged=True)
def _reshape_as(layout: Layout, func: Any, args: tuple, kwargs: dict) -> Any:
    batch, other = args[0], args[1]
    values = batch.values
    method = values.view if func.__name__ == "view_as" else values.reshape
    other_rd = other.ragged_dim if is_batch(other) else batch.ragged_dim
    if other_rd != batch.ragged_dim:
        raise ValueError(
            f"{func.__name__}: the batch presents its ragged dim at logical dim "
            f"{batch.ragged_dim} and the other at {other_rd}; a reshape keeps the ragged dim "
            "where it is"
        )
    # torch's result has other's shape: the same samples (a dense other's ragged dim, which
    # cannot hold their sizes, is not compared).
    if is_batch(other):
        check_same_structure(batch, other, f"{func.__name__}: the batch and other")
    elif other.dim() < 1 or other.shape[0] != batch.batch_size:
        raise ValueError(f"{func.__name__}: other must have the batch's {batch.batch_size} "
                         f"samples in dim 0, got shape {tuple(other.shape)}")
    if batch.ragged_dim == 1:
        feature = tuple(other.feature_shape) if is_batch(other) else \
            tuple(other.shape[1 + batch.num_ragged_dims :])
    else:
        feature = moved_feature_shape(batch, _target_of(batch, other))
    return batch.with_values(method(values.shape[0], *feature))


def _target_of(batch: NestedBatch, other: Any) -> tuple[int, ...]:
    # other's logical shape as a reshape target: -1 at the batch and the ragged dim.
    if is_batch(other):
        return (-1, *(-1 if s is None else s for s in other.sample_shape))
    shape = [-1, *other.shape[1:]]
    if len(shape) > batch.ragged_dim:
        shape[batch.ragged_dim] = -1
    return tuple(shape)


@register(*torch_funcs("transpose", "swapaxes", "swapdims"), layouts=PACKED_OR_PADDED,
          prefer=Layout.PACKED, moved_ragged=True)
def _transpose(layout: Layout, func: Any, args: tuple, kwargs: dict) -> Any:
    batch = args[0]
    d0 = normalize_dim(batch, args[1] if len(args) > 1 else kwargs["dim0"], "dim0")
    d1 = normalize_dim(batch, args[2] if len(args) > 2 else kwargs["dim1"], "dim1")
    if d0 == d1:
        return batch
    if dim_kind(batch, d0) == dim_kind(batch, d1) == "ragged":
        padded = batch.padded(None)
        order = list(range(batch.num_ragged_dims))
        order[d0 - 1], order[d1 - 1] = order[d1 - 1], order[d0 - 1]
        partition = RowPartition.from_shapes(batch.shape_per_sample[:, order])
        return wrap_padded(padded.data.transpose(d0, d1), partition)
    order = list(range(batch.dim()))
    order[d0], order[d1] = d1, d0
    return permute(batch, tuple(order), f"transpose({d0}, {d1})")


@register(*torch_funcs("permute"), layouts=(Layout.PACKED,), moved_ragged=True)
def _permute(layout: Layout, func: Any, args: tuple, kwargs: dict) -> Any:
    batch = args[0]
    dims = _shape_arg(args, kwargs) if "dims" not in kwargs else tuple(kwargs["dims"])
    dims = tuple(normalize_dim(batch, d) for d in dims)
    if sorted(dims) != list(range(batch.dim())):
        raise ValueError(f"permute{dims}: dims must be a permutation of 0..{batch.dim() - 1}")
    return permute(batch, dims, f"permute{dims}")


@register(*torch_funcs("movedim", "moveaxis"), layouts=(Layout.PACKED,), moved_ragged=True)
def _movedim(layout: Layout, func: Any, args: tuple, kwargs: dict) -> Any:
    batch = args[0]
    source = args[1] if len(args) > 1 else kwargs["source"]
    destination = args[2] if len(args) > 2 else kwargs["destination"]
    source = (source,) if isinstance(source, int) else tuple(source)
    destination = (destination,) if isinstance(destination, int) else tuple(destination)
    if len(source) != len(destination):
        raise ValueError(f"movedim: {len(source)} source dims but {len(destination)} destinations")
    source = tuple(normalize_dim(batch, d, "source") for d in source)
    destination = tuple(normalize_dim(batch, d, "destination") for d in destination)
    for name, dims in (("source", source), ("destination", destination)):
        if len(set(dims)) != len(dims):
            raise RuntimeError(f"movedim: repeated dim in `{name}` ({dims})")  # (torch's)
    # torch.movedim's rule: the moved dims land at their destinations, the others keep order.
    order: list[int | None] = [None] * batch.dim()
    for src, dst in zip(source, destination):
        order[dst] = src
    remaining = iter(d for d in range(batch.dim()) if d not in source)
    dims = tuple(next(remaining) if d is None else d for d in order)
    return permute(batch, dims, f"movedim({source}, {destination})")


def permute(batch: NestedBatch, dims: tuple[int, ...], what: str) -> NestedBatch:
    """``batch`` with logical dims reordered: new dim ``p`` is old dim ``dims[p]``.

    A view of the packed values. With one ragged dim it may move anywhere after the batch dim
    (the result's :attr:`~nestbatch.NestedBatch.ragged_dim`); with several they stay leading.

    Raises
    ------
    ValueError
        If the batch dim moves, or (``k > 1``) a ragged dim moves.
    """
    k = batch.num_ragged_dims
    if dims[0] != 0 or (k > 1 and dims[: 1 + k] != tuple(range(1 + k))):
        lead = "the batch dim" if k == 1 else f"the batch dim and the ragged dims 1..{k}"
        raise ValueError(f"{what} of a NestedBatch: {lead} must stay in place")
    features = [values_dim(batch, d) for d in dims[1:] if dim_kind(batch, d) == "feature"]
    ragged_dim = next(p for p, d in enumerate(dims) if dim_kind(batch, d) == "ragged")
    values = batch.values
    if any(a > b for a, b in zip(features, features[1:])):  # (sorted() breaks a traced graph)
        values = values.permute(0, *features)
    return batch.with_values(values, ragged_dim if k == 1 else 1)


@register(*torch_funcs("select"), layouts=PACKED_OR_PADDED, prefer=Layout.PACKED,
          moved_ragged=True)
def _select(layout: Layout, func: Any, args: tuple, kwargs: dict) -> Any:
    batch = args[0]
    dim = normalize_dim(batch, args[1] if len(args) > 1 else kwargs["dim"])
    index = int(args[2] if len(args) > 2 else kwargs["index"])
    kind, stored = storage_dim(batch, dim)
    if kind == "batch":
        return sample_of(batch, index)
    if kind == "feature":
        ragged_dim = batch.ragged_dim - (dim < batch.ragged_dim)
        return batch.with_values(batch.values.select(stored, index), ragged_dim)
    return select_ragged(batch, stored, index)


def select_ragged(batch: NestedBatch, dim: int, index: int) -> Tensor | NestedBatch:
    """Position ``index`` of ragged ``dim`` in every sample (negative counts from each end).

    Reads the sample sizes to check them (a sync when they are only on the device).

    ``dim`` is the stored ragged dim (``1..k``).

    Returns
    -------
    Tensor or NestedBatch
        Dense ``(B, *feature)`` when the batch has one ragged dim (the other logical dims in
        order, wherever the ragged dim was); otherwise a batch with one ragged dim fewer.
    """
    partition = batch.partition
    sizes = batch.shape_per_sample[:, dim - 1]
    need = index + 1 if index >= 0 else -index
    if partition.knows_host_shapes:  # checked on the host: no sync
        short = any(shape[dim - 1] < need for shape in partition.host_shapes)
    else:
        short = batch.batch_size and bool((sizes < need).any())  # one read of the device
    if short:
        raise IndexError(
            f"select({dim}, {index}): not every sample has that position along ragged dim "
            f"{dim} (sizes {sizes.tolist()})"
        )
    if batch.num_ragged_dims == 1:
        starts = batch.offsets[:-1] if index >= 0 else batch.offsets[1:]
        return batch.values.index_select(0, starts + index)
    padded = batch.padded(None)
    position = (sizes + index) if index < 0 else torch.full_like(sizes, index)
    position = position.view(-1, *[1] * (padded.data.dim() - 1))
    picked = torch.take_along_dim(padded.data, position, dim).squeeze(dim)
    keep = [d for d in range(batch.num_ragged_dims) if d != dim - 1]
    host = None
    if partition.knows_host_shapes:
        host = tuple(tuple(shape[d] for d in keep) for shape in partition.host_shapes)
    return wrap_padded(picked, RowPartition(batch.shape_per_sample[:, keep], host_shapes=host))


@register(*torch_funcs("unbind"), layouts=(Layout.LIST, Layout.PACKED, Layout.PADDED),
          prefer=Layout.LIST, moved_ragged=True)
def _unbind(layout: Layout, func: Any, args: tuple, kwargs: dict) -> Any:
    return args[0].unbind(args[1] if len(args) > 1 else kwargs.get("dim", 0))


@register(*torch_funcs("unsqueeze", "squeeze", "flatten"), layouts=(Layout.PACKED,),
          moved_ragged=True)
def _feature_dims(layout: Layout, func: Any, args: tuple, kwargs: dict) -> Any:
    """``unsqueeze`` / ``squeeze`` / ``flatten`` restricted to the feature dims.

    With one ragged dim a new dim may go anywhere after the batch dim: inserted at or before the
    ragged dim, it moves the ragged dim up (as ``torch.nested`` does). Several ragged dims stay
    leading, so new dims go after them. Dims removed before a moved ragged dim move it down.
    """
    batch = args[0]
    k, rd = batch.num_ragged_dims, batch.ragged_dim
    name = func.__name__
    values = batch.values
    if name == "unsqueeze":
        # (torch's range for a new dim: one more than the batch has)
        dim = checked_dim(args[1] if len(args) > 1 else kwargs["dim"], batch.dim() + 1)
        if k > 1 and dim <= k:
            raise ValueError(f"unsqueeze({dim}): new dims go after the {k} ragged dims (> {k})")
        if dim == 0:
            raise ValueError("unsqueeze(0): dim 0 is the batch; new dims go after it")
        if k > 1:
            return batch.with_values(values.unsqueeze(dim - k))
        before_ragged = dim <= rd
        # Stored feature dims skip the ragged position: logical d < rd is stored at d.
        stored = dim if before_ragged else dim - 1
        return batch.with_values(values.unsqueeze(stored), rd + 1 if before_ragged else rd)
    if name == "squeeze":
        dims = args[1] if len(args) > 1 else kwargs.get("dim")
        if dims is None:
            dims = tuple(d for d in range(1, batch.dim()) if dim_kind(batch, d) == "feature"
                         and batch.size(d) == 1)
        dims = (dims,) if isinstance(dims, int) else tuple(dims)
        dims = tuple(normalize_dim(batch, d) for d in dims)
        if any(dim_kind(batch, d) != "feature" for d in dims):
            raise ValueError(f"squeeze{dims}: only feature dims can be squeezed")
        kept = tuple(d for d in dims if batch.size(d) == 1)  # torch leaves other sizes alone
        return batch.with_values(
            values.squeeze(tuple(values_dim(batch, d) for d in kept)),
            rd - sum(d < rd for d in kept),
        )
    # torch's default start_dim, 0: flattening the batch dim is refused, as torch.nested does.
    start = normalize_dim(batch, args[1] if len(args) > 1 else kwargs.get("start_dim", 0))
    end = normalize_dim(batch, args[2] if len(args) > 2 else kwargs.get("end_dim", -1))
    if start > end:  # (torch's check, before the dims' kinds: flatten(2, 1) did nothing)
        raise ValueError("flatten() has invalid args: start_dim cannot come after end_dim")
    if any(dim_kind(batch, d) != "feature" for d in range(start, end + 1)):
        raise ValueError(f"flatten({start}, {end}): only feature dims can be flattened")
    flat = values.flatten(values_dim(batch, start), values_dim(batch, end))
    return batch.with_values(flat, rd - (end - start) if end < rd else rd)


@register(*torch_funcs("unflatten"), layouts=(Layout.PACKED,), moved_ragged=True)
def _unflatten(layout: Layout, func: Any, args: tuple, kwargs: dict) -> Any:
    """``unflatten(dim, sizes)`` of a feature dim (``q.unflatten(-1, (H, E))``, torch.nested's
    head split); dims added before a moved ragged dim move it up."""
    batch = args[0]
    dim = args[1] if len(args) > 1 else kwargs["dim"]
    sizes = tuple(args[2] if len(args) > 2 else kwargs["sizes"])
    logical = normalize_dim(batch, dim)
    stored = feature_values_dim(batch, logical, "unflatten")
    moved = batch.ragged_dim + (len(sizes) - 1 if logical < batch.ragged_dim else 0)
    return batch.with_values(batch.values.unflatten(stored, sizes), moved)


@register(*torch_funcs("chunk", "split", "split_with_sizes", "tensor_split"),
          layouts=(Layout.PACKED,), moved_ragged=True)
def _split_features(layout: Layout, func: Any, args: tuple, kwargs: dict) -> Any:
    """``chunk`` / ``split`` / ``split_with_sizes`` / ``tensor_split`` along a feature dim:
    batches of the same partition over views of the packed values (``qkv.chunk(3, dim=-1)``);
    along the batch dim, batches of consecutive samples (as torch.nested's)."""
    batch, how = args[0], args[1] if len(args) > 1 else next(
        kwargs.pop(name) for name in ("chunks", "split_size_or_sections", "split_size",
                                      "split_sizes", "indices_or_sections", "sections",
                                      "indices")
        if name in kwargs)
    dim = args[2] if len(args) > 2 else kwargs.pop("dim", 0)
    method = getattr(torch.Tensor, func.__name__)
    if normalize_dim(batch, dim) == 0:  # (torch's split of the sample numbers, as slices)
        parts = method(torch.arange(batch.batch_size), how, 0)
        return tuple(batch[int(p[0]) : int(p[-1]) + 1] if p.numel() else batch[:0]
                     for p in parts)
    stored = feature_values_dim(batch, dim, func.__name__)
    return tuple(batch.with_values(part) for part in method(batch.values, how, stored))


@register(*torch_funcs("type_as"), layouts=(Layout.PACKED, Layout.PADDED, Layout.LIST),
          moved_ragged=True)
def _type_as(layout: Layout, func: Any, args: tuple, kwargs: dict) -> Any:
    """``type_as``: the batch in the other operand's dtype (a batch or a tensor)."""
    return args[0].to((args[1] if len(args) > 1 else kwargs["other"]).dtype)


@register(*torch_funcs("narrow"), layouts=(Layout.PACKED,), moved_ragged=True)
def _narrow(layout: Layout, func: Any, args: tuple, kwargs: dict) -> Any:
    """``narrow`` of a feature dim (a view); of the ragged dim, torch's ``narrow`` of every
    sample (torch.nested refuses it): ``length`` rows from ``start``, counted from each
    sample's end when negative. As torch's, it raises where a sample is too short, which reads
    the sizes once (a sync) when only the device has them."""
    batch = args[0]
    dim = normalize_dim(batch, args[1] if len(args) > 1 else kwargs["dim"])
    start = int(args[2] if len(args) > 2 else kwargs["start"])
    length = int(args[3] if len(args) > 3 else kwargs["length"])
    if dim_kind(batch, dim) == "ragged" and batch.num_ragged_dims == 1:
        _check_narrow_fits(batch, start, length)
        stop = start + length
        index = [slice(None)] * (dim + 1)
        index[dim] = slice(start, None if start < 0 <= stop else stop)
        return batch[tuple(index)]
    stored = feature_values_dim(batch, dim, "narrow")
    return batch.with_values(batch.values.narrow(stored, start, length))


def _check_narrow_fits(batch: NestedBatch, start: int, length: int) -> None:
    """Raise torch's ``narrow`` errors for the shortest sample (``IndexError`` for a start out
    of range, ``RuntimeError`` for a length past its end)."""
    if length < 0:
        raise RuntimeError(f"narrow(): length must be non-negative, got {length}")
    lengths = batch.partition.host_lengths
    if not lengths:
        return  # (no sample to narrow)
    shortest = min(lengths)
    if not -shortest <= start <= shortest:
        raise IndexError(f"start out of range (expected to be in range of [{-shortest}, "
                         f"{shortest}], but got {start}) for the shortest sample")
    first = start + shortest if start < 0 else start
    if first + length > shortest:
        raise RuntimeError(f"start ({start}) + length ({length}) exceeds dimension size "
                           f"({shortest}) of the shortest sample")


@register(*torch_funcs("expand", "broadcast_to"), layouts=(Layout.PACKED,), moved_ragged=True)
def _expand(layout: Layout, func: Any, args: tuple, kwargs: dict) -> Any:
    """``expand`` / ``broadcast_to``: a view of the packed values with size-1 feature dims
    spread, as torch.nested's (the ragged dims take -1 or the batch's own ragged size)."""
    if kwargs.pop("implicit", False):
        raise ValueError("expand(implicit=True) is not supported for a NestedBatch")
    batch = args[0]
    size = _ragged_kept(batch, _shape_arg(args, kwargs))
    values = batch.values
    return batch.with_values(values.expand(values.shape[0], *_expanded_feature_shape(
        batch, size, func.__name__)))


def _expanded_feature_shape(batch: NestedBatch, size: tuple[int, ...], what: str
                            ) -> tuple[int, ...]:
    """The stored feature shape of ``batch`` expanded to the logical ``size`` (as many dims as
    the batch: a batch gains no dim before its batch dim).

    Raises
    ------
    ValueError
        If ``size`` has another number of dims, changes the batch size, gives a ragged dim a
        size, or changes a feature dim whose size is not 1.
    """
    if len(size) != batch.dim():
        raise ValueError(
            f"{what}: size {size} must have the batch's {batch.dim()} dims (its shape is "
            f"{batch.shape}); a batch gains no dim before its batch dim"
        )
    _check_batch_size(batch, size)
    features = batch.feature_shape
    ragged_count = batch.dim() - 1 - len(features)
    ragged = range(batch.ragged_dim, batch.ragged_dim + ragged_count)
    expanded = []
    logical = (d for d in range(1, batch.dim()) if d not in ragged)
    for d, old in zip(logical, features):
        new = size[d]
        if new == -1:
            expanded.append(old)
        elif new >= 0 and old in (1, new):
            expanded.append(new)
        else:
            raise ValueError(
                f"{what}: the expanded size ({new}) must match the existing size ({old}) at "
                f"non-singleton dim {d} (target sizes {size}, the batch's shape {batch.shape})"
            )
    for d in ragged:
        if size[d] != -1:
            raise ValueError(f"{what}: size {size} gives ragged dim {d} a size; give -1 there "
                             "(or the batch's own ragged size): it keeps its sizes")
    return tuple(expanded)


@register(torch.broadcast_tensors, layouts=(Layout.PACKED,), moved_ragged=True)
def _broadcast_tensors(layout: Layout, func: Any, args: tuple, kwargs: dict) -> tuple:
    """``torch.broadcast_tensors`` with batches among the tensors: each as the common shape,
    a view where torch's is one. Batches (of the same samples) expand their size-1 feature
    dims (:func:`_expand`), dense tensors spread over the samples as in an elementwise op
    (``expand_as``: a view, except a ``(B, 1, ...)`` tensor of one value per sample, whose
    rows are gathered)."""
    if kwargs:
        raise TypeError(f"broadcast_tensors() got unexpected keyword arguments {sorted(kwargs)}")
    batches = [t for t in args if is_batch(t)]
    ref = batches[0]
    for other in batches[1:]:
        check_same_structure(ref, other, "broadcast_tensors")
    ragged = range(ref.ragged_dim, ref.ragged_dim + ref.num_ragged_dims)
    # The ragged dims stand as size 1 among the shapes: a dense tensor spreads over them.
    shapes = [tuple(1 if d in ragged else t.size(d) for d in range(t.dim())) if is_batch(t)
              else tuple(t.shape) for t in args]
    try:
        common = torch.broadcast_shapes(*shapes)
    except RuntimeError as error:
        raise ValueError(f"broadcast_tensors: shapes {[tuple(t.shape) for t in args]} do not "
                         f"broadcast: {error}") from None
    size = tuple(-1 if d in ragged else n for d, n in enumerate(common))
    target = ref.expand(size) if len(size) == ref.dim() else None
    if target is None or any(common[d] != 1 for d in ragged):
        raise ValueError(
            f"broadcast_tensors: shapes {[tuple(t.shape) for t in args]} would give the batch "
            f"more dims or a ragged dim a size ({common}): a batch keeps its dims and its "
            "samples' sizes")
    return tuple(t.expand(size) if is_batch(t) else t.expand_as(target) for t in args)


@register(*torch_funcs("expand_as"), layouts=(Layout.PACKED,), moved_ragged=True)
def _expand_as(layout: Layout, func: Any, args: tuple, kwargs: dict) -> Any:
    """``x.expand_as(other)`` with a batch on either side: a batch of ``other``'s shape.

    A batch ``x`` expands its size-1 feature dims (a view, as ``expand``); ``other`` must be a
    batch of the same samples (a dense one would give every sample one length: torch.nested
    refuses it too). A dense ``x`` is spread over ``other``'s samples as it
    broadcasts in an elementwise op (:mod:`nestbatch.ops.broadcasting`): a view, except for a
    ``(B, 1, ...)`` tensor of one value per sample, whose rows are gathered (a copy).
    """
    source, other = args[0], args[1] if len(args) > 1 else kwargs["other"]
    if not is_batch(source):
        if source.dim() > other.dim():
            raise ValueError(
                f"expand_as: a tensor of shape {tuple(source.shape)} has more dims than the "
                f"batch ({other.dim()}, shape {other.shape})"
            )
        nf = len(other.feature_shape)
        values = other.values
        operand = packed_operand(source, other, nf)
        return other.with_values(operand.expand(values.shape))
    if not is_batch(other):
        raise TypeError(f"expand_as: other must be a NestedBatch of the batch's samples, got "
                        f"{type(other).__name__}")
    if other.ragged_dim != source.ragged_dim or other.dim() != source.dim():
        raise ValueError(
            f"expand_as: the batch presents its ragged dim at dim {source.ragged_dim} of "
            f"{source.dim()} and other at dim {other.ragged_dim} of {other.dim()}"
        )
    check_same_structure(source, other, "expand_as: the batch and other")
    size = (-1, *(-1 if s is None else s for s in other.sample_shape))
    values = source.values
    return source.with_values(values.expand(values.shape[0], *_expanded_feature_shape(
        source, size, "expand_as")))


@register(*torch_funcs("numel", "nelement", "element_size", "is_contiguous", "ndimension",
                       "is_floating_point", "is_complex", "is_signed", "is_conj", "is_neg",
                       "is_inference", "get_device"),
          layouts=(Layout.PACKED, Layout.PADDED, Layout.LIST), moved_ragged=True, nested=True)
def _storage_facts(layout: Layout, func: Any, args: tuple, kwargs: dict) -> Any:
    """``numel()`` / ``nelement()`` (the samples' elements: padding not counted; reads the
    total from the device once when only the device has it), ``element_size()``,
    ``ndimension()``, ``is_contiguous()`` / ``is_conj()`` / ``is_neg()`` /
    ``is_inference()`` (of the stored tensors, all of them), the dtype's kind
    (``is_floating_point()``, ``is_complex()``, ``is_signed()``) and ``get_device()``."""
    batch = args[0]
    name = func.__name__
    if name in ("numel", "nelement"):
        return batch.partition.total * math.prod(batch.feature_shape)
    if name == "element_size":
        return batch.dtype.itemsize
    if name == "ndimension":
        return batch.dim()
    if name in ("is_floating_point", "is_complex", "is_signed", "get_device"):
        return getattr(torch.empty(0, dtype=batch.dtype, device=batch.device), name)()
    stored = batch.stored()
    return all(getattr(t, name)(*args[1:], **kwargs) for t in stored)


@register(torch.result_type, torch.is_same_size, torch.Tensor.is_same_size,
          layouts=(Layout.PACKED, Layout.PADDED, Layout.LIST), moved_ragged=True, nested=True)
def _of_two(layout: Layout, func: Any, args: tuple, kwargs: dict) -> Any:
    """``torch.result_type(a, b)`` (a batch stands for a tensor of its dtype, not a 0-d one)
    and ``is_same_size`` (the same logical shape: the same samples' shapes, and the ragged dim
    in the same place)."""
    first, second = args[0], args[1] if len(args) > 1 else next(iter(kwargs.values()))
    if func is torch.result_type:
        def operand(x: Any) -> Any:
            return torch.empty(1, dtype=x.dtype, device=x.device) if is_batch(x) else x
        return torch.result_type(operand(first), operand(second))
    if not (is_batch(first) and is_batch(second)):
        return False  # (torch.nested refuses a dense operand; a dense tensor has no ragged dim)
    if first.ragged_dim != second.ragged_dim or first.dim() != second.dim() or \
            first.feature_shape != second.feature_shape:
        return False
    try:
        check_same_structure(first, second)
    except ValueError:
        return False
    return True

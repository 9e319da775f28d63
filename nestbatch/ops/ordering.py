"""Ordering ops: ``sort``, ``argsort``, ``msort``, ``topk``, ``kthvalue``, ``flip`` (``fliplr``,
``flipud``), ``roll`` and ``diff``.

Each gives what torch's op gives on every sample alone, batched, with dims read logically (a
moved ragged dim included, see :func:`~nestbatch.batch.storage_dim`):

* over a feature dim: torch's own op on the packed rows;
* over a ragged dim: a few whole-batch ops, with no per-sample loop and no read of the device
  unless the result's shape needs one. ``flip`` / ``roll`` gather every packed row from its
  mirrored / shifted place in its sample. ``sort`` / ``argsort`` run torch's stable sort on the
  padded data, whose filler sorts after every element (NaN ascending, -inf descending, the
  integer extremes), where the padding is cheap or the batch is stored padded; else they sort
  the packed rows stably by value, then stably by sample. Either way every sample comes out in
  torch's stable order (NaN last, or first when descending; equal values, ``-0.0`` and ``0.0``
  among them, in their input order), indices being positions in the sample. ``topk`` /
  ``kthvalue`` take the leading rows of that order (dense ``(B, k, *F)`` / ``(B, *F)`` results
  for a batch with one ragged dim, whose results all have that shape), after raising torch's
  error for the first sample too short for ``k`` (which reads the sizes where only the device
  holds them). ``diff`` is torch's ``diff`` of the packed rows (of the padded data, for several
  ragged dims), keeping the differences inside a sample: ``L_i - n`` rows each (none where
  ``n >= L_i``), as torch's;
* over dim 0 (the batch): ``flip`` / ``roll`` reorder the samples, as torch's on a dense tensor;
  the others would compare elements of different samples and raise a ``ValueError``.

``roll`` without dims rolls the whole batch flattened, as torch's rolls a tensor: the elements,
in logical order and one sample after another, move across samples (refused for a moved ragged
dim, whose logical order the packed rows do not keep).

Ties whose order torch leaves open come out in the stable order: ``sort`` / ``argsort`` with
``stable=False`` (torch's CPU kernel agrees up to 16 elements a sample), ``topk`` (its
``sorted=False`` result is sorted too) and ``kthvalue``, whose CPU selection picks among equal
values in an order of its own. The values equal torch's; an index can differ only among equal
values.

A batch with several ragged dims runs every op over any of them; a batch of ragged rank
``r >= 2`` (nested raggedness) and ``out=`` are refused by the registry.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor

from nestbatch.batch import NestedBatch, moved_ragged_error, storage_dim
from nestbatch.layouts import Layout, Packed, Padded, RowPartition
from nestbatch.ops.common import PACKED_OR_PADDED, argument, normalize_dim, torch_funcs, wrap_padded
from nestbatch.ops.registry import register

_PACKED = (Layout.PACKED,)

#: Dtypes whose ``topk`` / ``kthvalue`` torch computes on every device; for others torch's own
#: op is run on one element first, to raise torch's error (``topk`` of bools on the CPU).
_SELECTABLE = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64,
                         torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64})


# =========================================================================== arguments

def _int_arg(value: Any, op: str, name: str) -> int:
    """``value`` as an int; torch's ``TypeError`` for a bool or a non-integer
    (``topk(b, 1.0)``)."""
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise TypeError(f"{op}(): argument '{name}' must be int, not {type(value).__name__}")
    return operator.index(value)


def _int_tuple(value: Any, op: str, name: str) -> tuple[int, ...]:
    """An int or a sequence of ints as a tuple of ints."""
    if isinstance(value, Sequence) and not isinstance(value, str):
        return tuple(_int_arg(v, op, name) for v in value)
    return (_int_arg(value, op, name),)


def _across_samples(op: str) -> ValueError:
    """The error of an op over dim 0 that would compare elements of different samples."""
    return ValueError(
        f"{op} over dim 0 (the batch) of a NestedBatch is not supported: it would order "
        "elements of different samples, whose sizes differ; apply it to .values (the packed "
        "rows) or to .padded().data (with .mask)"
    )


# =========================================================================== ragged geometry
class _Axis(NamedTuple):
    """One ragged dim seen from every packed row: ``(total,)`` int64 tensors (``stride`` the
    int 1 for a batch with one ragged dim)."""

    index: Tensor  # the row's position along the dim
    size: Tensor  # the dim's size in the row's sample
    stride: Tensor | int  # rows between neighbours along the dim


def _axis(partition: RowPartition, d: int) -> _Axis:
    """Ragged dim ``d`` (``0..k-1``) of ``partition`` from every packed row: samples' rows are
    their ragged dims flattened row-major, so the neighbour along ``d`` is ``stride`` rows on,
    the product of the later ragged sizes."""
    if partition.num_ragged_dims == 1:
        return _Axis(partition.positions, partition.lengths[partition.row_ids], 1)
    shapes = partition.shape_per_sample[partition.row_ids]
    return _Axis(partition.ragged_index[d], shapes[:, d], shapes[:, d + 1:].prod(1))


def _rows(values: Tensor) -> Tensor:
    return torch.arange(values.shape[0], device=values.device)


def _resized(partition: RowPartition, d: int, size: Callable[[int], int],
             sizes: Callable[[Tensor], Tensor]) -> RowPartition:
    """``partition`` with every sample's size ``n`` along ragged dim ``d`` made ``size(n)`` (on
    the host where it knows the shapes), else ``sizes`` of the ``(B,)`` sizes on the device."""
    k, device = partition.num_ragged_dims, partition.device
    if partition.knows_host_shapes and k == 1:
        return RowPartition.from_host_lengths([size(n) for n in partition.host_lengths], device)
    if partition.knows_host_shapes:
        host = tuple((*s[:d], size(s[d]), *s[d + 1:]) for s in partition.host_shapes)
        return RowPartition.from_host_shapes(host, k, device)
    shapes = partition.shape_per_sample.clone()
    shapes[:, d] = sizes(shapes[:, d])
    return RowPartition.from_shapes(shapes)


def _without(partition: RowPartition, d: int) -> RowPartition:
    """``partition`` (``k >= 2`` ragged dims) without ragged dim ``d``."""
    keep = [e for e in range(partition.num_ragged_dims) if e != d]
    if partition.knows_host_shapes:
        host = tuple(tuple(s[e] for e in keep) for s in partition.host_shapes)
        return RowPartition.from_host_shapes(host, len(keep), partition.device)
    return RowPartition.from_shapes(partition.shape_per_sample[:, keep])


def _batch_over(values: Tensor, partition: RowPartition, ragged_dim: int = 1) -> NestedBatch:
    # (Trusted: packed rows an op made for a partition of a valid batch's samples.)
    return NestedBatch.trusted(Packed.trusted(values, partition.to(values.device)), ragged_dim)


# =========================================================================== sort
#: The padded data is sorted where it has at most this many slots per element (with the sizes
#: on the host), else the packed rows: one sort of short rows is several times faster than two
#: sorts of all rows (on the CPU: 3 to 20 times at 1 slot per element), but its memory grows
#: with the padding.
SORT_PADDING_RATIO = 4


def sorts_padded(layout: Layout, batch: NestedBatch) -> bool:
    """Whether an ordering op over a ragged dim sorts the padded data (several ragged dims, a
    batch stored padded, or cheap padding) rather than the packed rows."""
    partition = batch.partition
    if partition.num_ragged_dims > 1 or layout is Layout.PADDED:
        return True
    if not (partition.knows_max_shape and partition.knows_total):
        return False  # (the padded width or the total would be read from the device)
    slots = partition.batch_size * partition.max_shape[0]
    return slots <= SORT_PADDING_RATIO * max(partition.total, 1)


def _last_filler(dtype: torch.dtype, descending: bool) -> float | int | bool:
    """A value that torch's stable sort puts after every element, or after the equal ones that
    come before it: NaN (floats, ascending), -inf (descending), the integer extremes."""
    if dtype == torch.bool:
        return not descending
    if dtype.is_floating_point:
        return -math.inf if descending else math.nan
    if dtype.is_complex:
        return 0  # (torch's sort refuses complex numbers: any filler)
    info = torch.iinfo(dtype)
    return info.min if descending else info.max


def padded_sort(batch: NestedBatch, d: int, descending: bool, width: int = 0
                ) -> tuple[Tensor, Tensor, Padded]:
    """torch's stable sort of the padded data along ragged dim ``d`` (``0..k-1``): its filler
    sorts after every sample's elements, so each line holds torch's sort of the sample's line,
    then the filler. ``width``: the least padded size along ``d`` (``topk`` of no sample).

    Returns
    -------
    values, indices : Tensor
        ``(B, *padded, *F)``: the sorted data (its padding the filler) and the positions.
    padded : Padded
        The padded layout sorted.
    """
    filler = _last_filler(batch.dtype, descending)
    padded = batch.padded(filler)
    if padded.data.shape[d + 1] < width:  # (no sample: nothing is padded to width)
        sizes = [width if e == d else None for e in range(batch.num_ragged_dims)]
        padded = batch.padded(filler, sizes)
    out = torch.sort(padded.data, dim=d + 1, descending=descending, stable=True)
    return out.values, out.indices, padded


def stable_order(batch: NestedBatch, descending: bool) -> tuple[Tensor, Tensor]:
    """Every sample's packed rows sorted stably, per feature (one ragged dim).

    Two stable sorts of all rows: by value (torch's order: NaN last, or first when descending),
    then by sample, which keeps the value order within every sample. Each feature's column is
    sorted as a contiguous row (torch's CPU sort along a strided dim is about twice as slow),
    and the sample numbers as int32 (int64 sorts about 2.5 times slower).

    Returns
    -------
    source : Tensor
        ``(total, *F)`` int64: the packed row whose value every slot receives.
    positions : Tensor
        ``(total, *F)`` int64: that row's position in its sample (torch's indices).
    """
    values, partition = batch.packed().values, batch.partition
    total, features = values.shape[0], values.shape[1:]
    columns = values.detach().reshape(total, math.prod(features)).t().contiguous()  # (C, total)
    order = torch.sort(columns, dim=-1, descending=descending, stable=True).indices
    samples = partition.row_ids.to(torch.int32)  # (batches hold fewer than 2**31 samples)
    order = order.gather(-1, torch.sort(samples[order], dim=-1, stable=True).indices)
    source = order.t().reshape(values.shape)
    return source, partition.positions[source]


def _sorted(layout: Layout, batch: NestedBatch, args: tuple, kwargs: dict, op: str
            ) -> tuple[NestedBatch, NestedBatch]:
    """``batch`` sorted along ``sort``'s / ``argsort``'s dim, and the indices."""
    dim = normalize_dim(batch, argument(args, kwargs, 1, "dim", -1))
    descending = bool(argument(args, kwargs, 2, "descending", False))
    kind, stored = storage_dim(batch, dim)
    if kind == "batch":
        raise _across_samples(op)
    if kind == "feature":
        out = torch.sort(batch.packed().values, dim=stored, descending=descending,
                         stable=bool(kwargs.get("stable", False)))
        return batch.with_values(out.values), batch.with_values(out.indices)
    if sorts_padded(layout, batch):
        values, indices, padded = padded_sort(batch, stored - 1, descending)
        rd, filler = batch.ragged_dim, _last_filler(batch.dtype, descending)
        return (wrap_padded(values, padded.partition, rd, filler),
                wrap_padded(indices, padded.partition, rd))
    source, positions = stable_order(batch, descending)
    return batch.with_values(batch.packed().values.gather(0, source)), \
        batch.with_values(positions)


@register(*torch_funcs("sort"), layouts=PACKED_OR_PADDED, prefer=Layout.PACKED,
          moved_ragged=True)
def _sort(layout: Layout, func: Any, args: tuple, kwargs: dict) -> Any:
    """``sort(input, dim=-1, descending=False, *, stable=False)``: a pair of batches."""
    return torch.return_types.sort(_sorted(layout, args[0], args, kwargs, "sort"))


@register(*torch_funcs("argsort"), layouts=PACKED_OR_PADDED, prefer=Layout.PACKED,
          moved_ragged=True)
def _argsort(layout: Layout, func: Any, args: tuple, kwargs: dict) -> Any:
    """``argsort(input, dim=-1, descending=False, *, stable=False)``: a batch of indices."""
    return _sorted(layout, args[0], args, kwargs, "argsort")[1]


@register(*torch_funcs("msort"), layouts=_PACKED, moved_ragged=True)
def _msort(layout: Layout, func: Any, args: tuple, kwargs: dict) -> Any:
    """``msort`` sorts along dim 0, the batch: refused, as ``sort(input, 0)``."""
    raise _across_samples("msort")


# =========================================================================== topk, kthvalue
def _smallest_along(partition: RowPartition, d: int) -> int:
    """The smallest sample's size along ragged dim ``d``: from the host where it knows the
    sizes, else one read of the device (a sync), because torch's error for a sample too short
    for ``k`` must be raised before anything runs (a kernel would otherwise read past it)."""
    if partition.knows_host_shapes:
        return min(_sizes_along(partition, d), default=0)
    return int(partition.shape_per_sample[:, d].min())


def _sizes_along(partition: RowPartition, d: int) -> Sequence[int]:
    """Every sample's size along ragged dim ``d``, on the host: where only the device holds
    them, read once (a sync) on the error path only, to name the first sample torch refuses."""
    if not partition.knows_host_shapes:
        return partition.shape_per_sample[:, d].tolist()
    if partition.num_ragged_dims == 1:
        return partition.host_lengths
    return [shape[d] for shape in partition.host_shapes]


def _check_k(batch: NestedBatch, d: int, dim: int, op: str, k: int) -> None:
    """Raise what torch raises for the first sample whose size along ragged dim ``d`` cannot
    give ``k`` (``topk``: ``0 <= k <= size``; ``kthvalue``: ``1 <= k <= size``), checking the
    dtype after the first sample's size, as the call on every sample in turn would.

    Reads the smallest size (a device read where only the device holds the sizes: see
    :func:`_smallest_along`), and all of them only to name the sample it raises for.

    Raises
    ------
    RuntimeError
        torch's, for ``k`` out of a sample's range; torch's dtype error (topk of bools on the CPU).
    IndexError
        ``kthvalue`` of a sample empty along ``d``, as torch's.
    """
    if batch.batch_size == 0:
        if k < 0 and op == "topk":  # (no result has a negative size; torch's error)
            raise _k_error(op, k, None, 0, dim - 1)
        return  # (no sample: torch is never called)
    low = 1 if op == "kthvalue" else 0
    first = sizes = None
    if not low <= k <= _smallest_along(batch.partition, d):
        sizes = _sizes_along(batch.partition, d)  # (the error path: to name the sample)
        first = next(i for i, n in enumerate(sizes) if not low <= k <= n)
    if first != 0 and batch.dtype not in _SELECTABLE:  # (torch's own op raises its error)
        probe = batch.packed().values.new_zeros(1)
        if op == "topk":
            torch.topk(probe, 1)
        else:
            torch.kthvalue(probe, 1)
    if first is not None:
        raise _k_error(op, k, first, sizes[first], dim - 1)


def _k_error(op: str, k: int, sample: int | None, size: int, dim: int) -> Exception:
    """torch's error for ``k`` out of range in ``sample`` (None: in every one) of ``size``
    along its ``dim``."""
    where = f"(k={k})" if sample is None else \
        f"(k={k}; sample {sample} has size {size} along its dim {dim})"
    if op == "topk":
        return RuntimeError(f"selected index k out of range {where}")
    if size == 0:
        return IndexError(f"kthvalue(): Expected reduction dim {dim} to have non-zero size. "
                          f"{where}")
    return RuntimeError(f"kthvalue(): selected number k out of range for dimension {dim} {where}")


def _selection_args(batch: NestedBatch, dim: Any, op: str, k: Any
                    ) -> tuple[int, str, int, int]:
    """``dim`` normalized (None: the last), its kind and stored dim, and ``k`` as an int."""
    k = _int_arg(k, op, "k")
    dim = normalize_dim(batch, -1 if dim is None else dim)
    kind, stored = storage_dim(batch, dim)
    if kind == "batch":
        raise _across_samples(op)
    return dim, kind, stored, k


@register(*torch_funcs("topk"), layouts=PACKED_OR_PADDED, prefer=Layout.PACKED,
          moved_ragged=True)
def _topk(layout: Layout, func: Any, args: tuple, kwargs: dict) -> Any:
    """``topk(input, k, dim=-1, largest=True, sorted=True)``."""
    batch = args[0]
    dim, kind, stored, k = _selection_args(batch, argument(args, kwargs, 2, "dim"), "topk",
                                           argument(args, kwargs, 1, "k"))
    largest = bool(argument(args, kwargs, 3, "largest", True))
    if kind == "feature":
        out = torch.topk(batch.packed().values, k, stored, largest,
                         bool(argument(args, kwargs, 4, "sorted", True)))
        return torch.return_types.topk((batch.with_values(out.values),
                                        batch.with_values(out.indices)))
    _check_k(batch, stored - 1, dim, "topk", k)
    return torch.return_types.topk(_leading(layout, batch, stored - 1, k, largest))


def _leading(layout: Layout, batch: NestedBatch, d: int, k: int, largest: bool
             ) -> tuple[Any, Any]:
    """The ``k`` largest (smallest) of every sample along ragged dim ``d``, and their
    positions: dense ``(B, k, *F)`` (the ``k`` at the ragged dim's logical position) for a
    batch with one ragged dim, whose results all have ``k`` rows (as ``select`` of a ragged
    dim gives dense rows); else batches of size ``k`` along ``d``."""
    if not sorts_padded(layout, batch):  # (one ragged dim)
        source, positions = stable_order(batch, largest)
        values = batch.packed().values
        rows = (batch.offsets[:-1, None] + torch.arange(k, device=values.device)).reshape(-1)
        shape = (batch.batch_size, k, *values.shape[1:])
        best = values.gather(0, source.index_select(0, rows)).view(shape)
        return _logical(batch, best), _logical(batch, positions.index_select(0, rows).view(shape))
    values, indices, _ = padded_sort(batch, d, largest, width=k)
    best, index = values.narrow(d + 1, 0, k), indices.narrow(d + 1, 0, k)
    if batch.num_ragged_dims == 1:  # (copies: the padding is let go)
        return _logical(batch, best.contiguous()), _logical(batch, index.contiguous())
    kept = _resized(batch.partition, d, lambda n: k, lambda sizes: torch.full_like(sizes, k))
    return wrap_padded(best, kept), wrap_padded(index, kept)


def _logical(batch: NestedBatch, dense: Tensor) -> Tensor:
    """Dense ``(B, n, *F)`` in stored order, with ``n`` moved to the ragged dim's place."""
    return dense if batch.ragged_dim == 1 else dense.movedim(1, batch.ragged_dim)


@register(*torch_funcs("kthvalue"), layouts=PACKED_OR_PADDED, prefer=Layout.PACKED,
          moved_ragged=True)
def _kthvalue(layout: Layout, func: Any, args: tuple, kwargs: dict) -> Any:
    """``kthvalue(input, k, dim=-1, keepdim=False)``: the ``k``-th smallest along ``dim``."""
    batch = args[0]
    dim, kind, stored, k = _selection_args(batch, argument(args, kwargs, 2, "dim"), "kthvalue",
                                           argument(args, kwargs, 1, "k"))
    keepdim = bool(argument(args, kwargs, 3, "keepdim", False))
    if kind == "feature":
        out = torch.kthvalue(batch.packed().values, k, stored, keepdim)
        ragged_dim = batch.ragged_dim - (not keepdim and dim < batch.ragged_dim)
        return torch.return_types.kthvalue((batch.with_values(out.values, ragged_dim),
                                            batch.with_values(out.indices, ragged_dim)))
    _check_k(batch, stored - 1, dim, "kthvalue", k)
    return torch.return_types.kthvalue(_kth(layout, batch, stored - 1, k, keepdim))


def _kth(layout: Layout, batch: NestedBatch, d: int, k: int, keepdim: bool
         ) -> tuple[Any, Any]:
    """Every sample's ``k``-th smallest along ragged dim ``d`` and its position: dense
    ``(B, *F)`` for one ragged dim (as a reduction over it; ``keepdim`` keeps a dim of 1 at the
    ragged dim's logical position), else batches without ``d`` (``keepdim``: of size 1 there)."""
    at = max(k, 1) - 1  # (k < 1 only where no sample raises it)
    if not sorts_padded(layout, batch):  # (one ragged dim)
        source, positions = stable_order(batch, False)
        rows = batch.offsets[:-1] + at
        best = batch.packed().values.gather(0, source.index_select(0, rows))
        index = positions.index_select(0, rows)
    else:
        values, indices, _ = padded_sort(batch, d, False, width=at + 1)
        best, index = values.select(d + 1, at), indices.select(d + 1, at)
    if batch.num_ragged_dims == 1:  # (copies: the padding is let go)
        best, index = best.contiguous(), index.contiguous()
        if keepdim:
            return best.unsqueeze(batch.ragged_dim), index.unsqueeze(batch.ragged_dim)
        return best, index
    if keepdim:
        kept = _resized(batch.partition, d, lambda n: 1, torch.ones_like)
        return wrap_padded(best.unsqueeze(d + 1), kept), wrap_padded(index.unsqueeze(d + 1), kept)
    kept = _without(batch.partition, d)
    return wrap_padded(best, kept), wrap_padded(index, kept)


# =========================================================================== flip, roll
def _flip_dims(func: Any, args: tuple, kwargs: dict) -> tuple[int, ...]:
    """``flip``'s dims: ``torch.flip(x, dims)`` takes a sequence, ``x.flip(0, 1)`` ints too."""
    if "dims" in kwargs:
        dims = kwargs["dims"]
    elif len(args) < 2:
        raise TypeError("flip() missing required argument 'dims'")
    elif func is torch.Tensor.flip and (len(args) > 2 or not isinstance(args[1], Sequence)):
        dims = args[1:]
    else:
        dims = args[1]
    if not isinstance(dims, Sequence):
        raise TypeError(f"flip(): argument 'dims' must be tuple of ints, not "
                        f"{type(dims).__name__}")
    return _int_tuple(dims, "flip", "dims")


@register(*torch_funcs("flip"), layouts=_PACKED, moved_ragged=True)
def _flip(layout: Layout, func: Any, args: tuple, kwargs: dict) -> Any:
    """``flip(input, dims)``."""
    return flip(args[0], _flip_dims(func, args, kwargs))


@register(*torch_funcs("fliplr"), layouts=_PACKED, moved_ragged=True)
def _fliplr(layout: Layout, func: Any, args: tuple, kwargs: dict) -> Any:
    """``fliplr(input)``: ``flip(input, (1,))`` (a batch has at least two dims)."""
    return flip(args[0], (1,))


@register(*torch_funcs("flipud"), layouts=_PACKED, moved_ragged=True)
def _flipud(layout: Layout, func: Any, args: tuple, kwargs: dict) -> Any:
    """``flipud(input)``: ``flip(input, (0,))``, the samples in reverse order."""
    return flip(args[0], (0,))


def flip(batch: NestedBatch, dims: Sequence[int]) -> NestedBatch:
    """``batch`` reversed along ``dims`` (logical, any kind): feature dims by torch's ``flip``
    of the packed rows; ragged dims by one gather, every row from its mirror in its sample
    (``offsets[b] + L_b - 1 - position`` for one ragged dim); dim 0 reverses the samples.

    Raises
    ------
    RuntimeError
        torch's, for a dim given twice.
    """
    dims = [normalize_dim(batch, d) for d in dims]
    for at, d in enumerate(dims):
        if d in dims[:at]:
            raise RuntimeError(f"dim {d} appears multiple times in the list of dims")
    values, partition = batch.packed().values, batch.partition
    placed = [storage_dim(batch, d) for d in dims]
    features = [stored for kind, stored in placed if kind == "feature"]
    ragged = [stored - 1 for kind, stored in placed if kind == "ragged"]
    if features:
        values = torch.flip(values, features)
    if ragged:
        source = _rows(values)
        for d in ragged:  # (the moves along different dims add up)
            axis = _axis(partition, d)
            source = source + (axis.size - 1 - 2 * axis.index) * axis.stride
        values = values.index_select(0, source)
    elif not features and 0 not in dims:
        values = values.clone()  # (torch's flip returns a copy, never a view)
    out = batch.with_values(values)
    if 0 not in dims:
        return out
    n = batch.batch_size
    order = torch.arange(n - 1, -1, -1, device=values.device)
    host = list(range(n - 1, -1, -1)) if partition.knows_host_shapes else None
    return reorder_samples(out, order, host)


def reorder_samples(batch: NestedBatch, order: Tensor, host_order: list[int] | None = None
                    ) -> NestedBatch:
    """The batch whose sample ``i`` is ``batch``'s sample ``order[i]`` (a permutation), its rows
    gathered in one pass (``host_order``: the same on the host, which keeps the sizes there).

    Parameters
    ----------
    batch : NestedBatch
        ``B`` samples, any number of ragged dims.
    order : Tensor
        ``(B,)`` int64 on the batch's device.
    """
    old, values = batch.partition, batch.packed().values
    new = old.select(order, host_order)
    new.note_total(values.shape[0])  # (the same rows: no read of the new sizes' sum)
    source = old.offsets[:-1][order][new.row_ids] + new.positions
    return _batch_over(values.index_select(0, source), new, batch.ragged_dim)


def _misaligned(shifts: int, dims: int) -> RuntimeError:
    return RuntimeError(f"shifts and dimensions must align. shifts: {shifts}, dims:{dims}")


@register(*torch_funcs("roll"), layouts=_PACKED, moved_ragged=True)
def _roll(layout: Layout, func: Any, args: tuple, kwargs: dict) -> Any:
    """``roll(input, shifts, dims=None)``."""
    batch = args[0]
    shifts = _int_tuple(argument(args, kwargs, 1, "shifts"), "roll", "shifts")
    dims = argument(args, kwargs, 2, "dims")
    if not shifts:
        raise RuntimeError("`shifts` required")
    if dims is None:
        if len(shifts) != 1:
            raise _misaligned(len(shifts), 0)
        return roll_flat(batch, shifts[0])
    dims = _int_tuple(dims, "roll", "dims")
    if len(shifts) != len(dims):
        raise _misaligned(len(shifts), len(dims))
    total: dict[int, int] = {}
    for shift, d in zip(shifts, dims):  # (a dim given twice rolls by both shifts)
        d = normalize_dim(batch, d)
        total[d] = total.get(d, 0) + shift
    return roll(batch, total)


def roll(batch: NestedBatch, shifts: dict[int, int]) -> NestedBatch:
    """``batch`` rolled by ``shifts[d]`` along every logical dim ``d``: feature dims by torch's
    ``roll`` of the packed rows; ragged dims by one gather, every row from its place in its
    sample less the shift, modulo the sample's size; dim 0 rotates the samples."""
    values, partition = batch.packed().values, batch.partition
    features: dict[int, int] = {}
    ragged: dict[int, int] = {}
    for d, shift in shifts.items():
        kind, stored = storage_dim(batch, d)
        if kind == "feature":
            features[stored] = shift
        elif kind == "ragged":
            ragged[stored - 1] = shift
    if features:
        values = torch.roll(values, tuple(features.values()), tuple(features))
    if ragged:
        source = _rows(values)
        for d, shift in ragged.items():  # (the moves along different dims add up)
            axis = _axis(partition, d)
            moved = torch.remainder(axis.index - shift, axis.size) - axis.index
            source = source + moved * axis.stride
        values = values.index_select(0, source)
    elif not features:
        values = values.clone()  # (torch's roll returns a copy, never a view)
    out = batch.with_values(values)
    n = batch.batch_size
    if 0 not in shifts or n == 0:
        return out
    order = torch.remainder(torch.arange(n, device=values.device) - shifts[0], n)
    host = [(i - shifts[0]) % n for i in range(n)] if partition.knows_host_shapes else None
    return reorder_samples(out, order, host)


def roll_flat(batch: NestedBatch, shift: int) -> NestedBatch:
    """``roll(batch, shift)`` with no dims: the whole batch flattened in logical order (the
    packed rows' order when the ragged dims lead), rolled, and given the batch's structure."""
    if batch.ragged_dim != 1:
        raise moved_ragged_error(batch, "roll without dims",
                                 "the elements roll in logical order, which storage does not keep")
    return batch.with_values(torch.roll(batch.packed().values, shift))


# =========================================================================== diff
@register(*torch_funcs("diff"), layouts=_PACKED, moved_ragged=True)
def _diff(layout: Layout, func: Any, args: tuple, kwargs: dict) -> Any:
    """``diff(input, n=1, dim=-1, prepend=None, append=None)``.

    ``prepend`` / ``append`` (batches, or dense tensors of the batch's dims) are joined to the
    batch by ``torch.cat`` along ``dim`` first, as torch's ``diff`` does (so with torch's
    promotion of dtypes, and its checks of their shapes as ``cat``'s); with ``n == 0`` they
    are checked and ignored, as torch's.
    """
    batch = args[0]
    n = _int_arg(argument(args, kwargs, 1, "n", 1), "diff", "n")
    dim = normalize_dim(batch, argument(args, kwargs, 2, "dim", -1))
    if n < 0:
        raise RuntimeError(f"order must be non-negative but got {n}")
    kind, stored = storage_dim(batch, dim)
    if kind == "batch":
        raise _across_samples("diff")
    ends = (argument(args, kwargs, 3, "prepend"), argument(args, kwargs, 4, "append"))
    joined = batch
    if ends != (None, None):
        joined = torch.cat([x for x in (ends[0], batch, ends[1]) if x is not None], dim)
    if n == 0:
        return batch.with_values(batch.packed().values.clone())
    values = joined.packed().values
    if kind == "feature":
        return joined.with_values(torch.diff(values, n, stored))
    return diff_ragged(joined, stored - 1, n)


def diff_ragged(batch: NestedBatch, d: int, n: int) -> NestedBatch:
    """The ``n``-th differences of every sample along ragged dim ``d``: ``L - n`` there (none
    where ``n >= L``), torch's own ``diff`` of neighbours (``logical_xor`` for bools).

    With one ragged dim, torch's ``diff`` of all packed rows, and the rows whose ``n + 1``
    neighbours lie in one sample; with several, torch's ``diff`` of the padded data along
    ``d``, whose entries reaching into the padding fall outside the new sizes. The result's
    size reads the sizes where only the device holds them.
    """
    partition = batch.partition
    new = _resized(partition, d, lambda size: max(size - n, 0),
                   lambda sizes: (sizes - n).clamp(min=0))
    if partition.num_ragged_dims > 1:
        return wrap_padded(torch.diff(batch.padded(None).data, n, d + 1), new)
    rows = batch.offsets[:-1][new.row_ids] + new.positions
    values = torch.diff(batch.packed().values, n, 0).index_select(0, rows)
    return _batch_over(values, new, batch.ragged_dim)

"""Indexing a :class:`~nestbatch.NestedBatch`, with TensorFlow's ragged indexing rules.

* ``x[i]``: sample ``i`` (a tensor, a view into the stored data);
* ``x[i:j]``, ``x[index_tensor]``, ``x[bool_mask]``, ``x[[0, 2]]``: a batch of the selected
  samples;
* ``x[:, a:b]`` (also ``x[:, :k]``, ``x[:, -k:]``, steps > 0): every sample sliced along its
  ragged dim, each slice clipped to the sample's own length as Python slices are;
* later positions index the remaining ragged dims (slices only) and the feature dims (ints and
  slices);
* an integer on a ragged dim is refused: the element may exist in some samples and not in others
  (TF refuses it for the same reason).

``x[index] = value`` writes, in place, what ``x[index]`` reads (:func:`setitem`); a bool batch
of the same samples as index is a mask there (``x[x.isnan()] = 0``).

Positions are logical: when the ragged dim was moved (:attr:`~nestbatch.NestedBatch.ragged_dim`),
the entry at its position slices it and the others index the stored feature dims; an integer on
a feature dim before the ragged dim moves the ragged dim down by one.
"""

from __future__ import annotations

import itertools
import operator
import warnings
from typing import Any

import torch
from torch import Tensor

from nestbatch.batch import (
    NestedBatch,
    after_stored_write,
    cached_layout,
    sample_of,
    stored_layout,
    with_ragged_dim,
)
from nestbatch.checks import check_batch_indices, read_device_values
from nestbatch.conversions.packed_padded import packed_values_to_padded
from nestbatch.kernels import torch_impl
from nestbatch.layouts import Layout, Packed, Padded, RowPartition, TensorList
from nestbatch.ops.common import REQUIRED, bind_arguments, replace_storage
from nestbatch.ops.registry import register


# Every index runs the same code whatever the layouts: the fast path is the whole op.
@register(torch.Tensor.__getitem__, layouts=(Layout.LIST, Layout.PACKED, Layout.PADDED),
          moved_ragged=True, fast=lambda func, args, kwargs: getitem(args[0], args[1]),
          nested=True)
def _getitem(layout: Layout, func: Any, args: tuple, kwargs: dict) -> Tensor | NestedBatch:
    return getitem(args[0], args[1])


@register(torch.Tensor.__setitem__, layouts=(Layout.LIST, Layout.PACKED, Layout.PADDED),
          moved_ragged=True, nested=True)
def _setitem(layout: Layout, func: Any, args: tuple, kwargs: dict) -> None:
    setitem(args[0], args[1], args[2])


#: (a set: torch.compile traces a membership test, not a function's name)
_IN_PLACE_INDEX_PUT = frozenset({torch.Tensor.index_put_, torch.index_put_})


@register(torch.Tensor.index_put_, torch.index_put_, torch.Tensor.index_put, torch.index_put,
          layouts=(Layout.LIST, Layout.PACKED, Layout.PADDED), moved_ragged=True, nested=True)
def _index_put(layout: Layout, func: Any, args: tuple, kwargs: dict) -> NestedBatch:
    """``index_put_(indices, values, accumulate=False)`` (and the out-of-place
    ``index_put``): ``batch[indices] = values``, or ``+=`` with ``accumulate`` (every
    duplicate index adding its value, as torch's), for the indices ``batch[indices]`` reads."""
    batch, indices, values, accumulate = bind_arguments(
        func.__name__, (("input", REQUIRED), ("indices", REQUIRED), ("values", REQUIRED),
                        ("accumulate", False)), args, kwargs).values()
    if not isinstance(indices, (tuple, list)):
        raise TypeError(f"{func.__name__}(): indices must be a tuple of tensors, got "
                        f"{type(indices).__name__}")
    # (a bool batch alone is a mask, as batch[mask] reads it)
    index = indices[0] if len(indices) == 1 and isinstance(indices[0], NestedBatch) \
        else tuple(indices)
    masked_fill = isinstance(index, NestedBatch) and getattr(values, "dim", lambda: 0)() == 0
    if isinstance(values, Tensor | NestedBatch) and values.dtype != batch.dtype \
            and not masked_fill:  # (torch's index_put_ casts no value, but a mask's one)
        raise RuntimeError(
            "Index put requires the source and destination dtypes match, got "
            f"{_scalar_type(batch.dtype)} for the destination and {_scalar_type(values.dtype)} "
            "for the source.")
    target = batch if func in _IN_PLACE_INDEX_PUT else batch.clone()
    setitem(target, index, values, accumulate=bool(accumulate))
    return target


def _scalar_type(dtype: torch.dtype) -> str:
    """torch's name of a dtype in its messages (``Float`` for float32)."""
    return torch.empty(0, dtype=dtype).type().rsplit(".", 1)[-1].removesuffix("Tensor")


def setitem(batch: NestedBatch, index: Any, value: Any, *, accumulate: bool = False) -> None:
    """``batch[index] = value``: writes, in place, the elements ``batch[index]`` reads, as
    torch's assignment does on every sample (with ``accumulate``, adds ``value`` to them, as
    ``index_put_(..., accumulate=True)``: every duplicate index adds).

    ``value`` broadcasts against ``batch[index]`` as ``copy_`` broadcasts (a number, a tensor,
    or a batch of the same samples as ``batch[index]``) and is cast to the batch's dtype. A bool
    batch of the batch's samples as ``index`` is a mask: ``value`` must then be a number or a
    one-element tensor (``masked_fill_``; per sample, torch would line a longer value up with
    each sample's selected elements, which ``torch.where(mask, other, batch)`` says directly).

    Every index ``batch[index]`` takes works; the elements are found by indexing a batch of
    their positions in the packed rows the same way (one ``arange`` over the elements, and the
    syncs ``batch[index]`` itself makes), then written with one ``index_put_``.
    """
    if isinstance(index, NestedBatch):
        if index.dtype != torch.bool:
            raise TypeError(f"a batch used as an index must be a bool mask, got {index.dtype}")
        if isinstance(value, NestedBatch) or (isinstance(value, Tensor) and value.numel() != 1):
            raise TypeError(
                "batch[mask] = value takes a number or a one-element tensor as value; for "
                "values from another batch, use torch.where(mask, other, batch)"
            )
        # A 0-d tensor of the batch's dtype: cast as torch's assignment casts (1e6 in a half
        # batch is inf, which masked_fill_ of the number refuses).
        fill = _as_tensor(value).reshape(()).to(batch.dtype)
        if accumulate:
            batch.add_(torch.where(index, fill, torch.zeros((), dtype=batch.dtype)))
        else:
            batch.masked_fill_(index, fill)
        return
    stored = stored_layout(batch)
    rows = batch.packed().values
    positions = torch.arange(rows.numel(), device=rows.device).view(rows.shape)
    chosen = getitem(batch.with_values(positions), index)
    written = torch.empty_like(chosen, dtype=batch.dtype)
    if isinstance(value, Tensor):
        while value.dim() > chosen.dim() and value.shape[0] == 1:
            value = value[0]  # (torch's assignment drops a value's leading size-1 dims)
    written.copy_(value if isinstance(value, Tensor | NestedBatch) else _as_tensor(value))
    if isinstance(chosen, NestedBatch):
        chosen, written = chosen.packed().values, written.packed().values
    if isinstance(stored, Packed) and rows.is_contiguous():
        rows.view(-1).index_put_((chosen.reshape(-1),), written.reshape(-1), accumulate)
        after_stored_write(batch)
        return
    rows = rows.clone(memory_format=torch.contiguous_format)
    rows.view(-1).index_put_((chosen.reshape(-1),), written.reshape(-1), accumulate)
    replace_storage(batch, batch.with_values(rows))


def _as_tensor(value: Any) -> Tensor:
    """``value`` as a tensor that holds it exactly (a Python float as float64, a complex as
    complex128), for a copy that casts it as torch's assignment does."""
    if isinstance(value, Tensor):
        return value
    kinds = {bool: torch.bool, int: torch.int64, float: torch.float64, complex: torch.complex128}
    return torch.as_tensor(value, dtype=kinds.get(type(value)))


def getitem(batch: NestedBatch, index: Any) -> Tensor | NestedBatch:
    """``batch[index]`` (see the module docstring for the rules)."""
    if (type(index) is tuple and len(index) == 2 and type(index[1]) is slice
            and index[0] == _ALL and batch.ragged_dim == 1 and batch.num_ragged_dims == 1):
        # x[:, a:b], the most common form: straight to the slice.
        return slice_ragged(batch, (index[1],)) if index[1] != _ALL else batch
    if type(index) is Tensor and index.dim() == 1 and batch.ragged_dim == 1:
        # x[index_tensor], the other common form: the selected samples.
        return select_samples(batch, *batch_index_tensor(index, batch.batch_size))
    index = _expand_ellipsis(index if isinstance(index, tuple) else (index,), batch.dim())
    if not index:  # batch[()]: the batch itself, as a tensor's x[()] is a view of all of it
        return batch
    head, rest = index[0], index[1:]
    if rest and _is_index_array(head) and _is_index_array(rest[0]) and batch.ragged_dim == 1 \
            and batch.num_ragged_dims == 1 and batch.partition.ragged_rank == 1:
        if any(_is_index_array(entry) or isinstance(entry, Tensor) and entry.dim() > 0
               for entry in rest[1:]):
            raise TypeError(
                "after integer tensors at the batch and the ragged dim, feature dims accept "
                "ints, slices and None (an index tensor there would broadcast with them: index "
                "the result instead)")
        return paired_elements(batch, head, rest[0], rest[1:])
    if _is_integer(head):
        i = operator.index(head)
        return sample_of(batch, i)[rest] if rest else sample_of(batch, i)
    if batch.ragged_dim != 1:
        return _getitem_moved(batch, head, rest)
    if not (isinstance(head, slice) and head == slice(None)):
        batch = select_samples(batch, *batch_index_tensor(head, batch.batch_size))
    k = batch.num_ragged_dims
    ragged, features = rest[:k], rest[k:]
    for d, entry in enumerate(ragged, start=1):
        if _is_integer(entry):
            raise IndexError(
                f"cannot index ragged dim {d} with an integer: the element may exist in some "
                "samples and not in others; slice it instead (e.g. x[:, i:i + 1])"
            )
        if not isinstance(entry, slice):
            raise TypeError(f"ragged dim {d} accepts only slices, got {type(entry).__name__}")
    if any(entry != slice(None) for entry in ragged):
        batch = slice_ragged(batch, tuple(ragged) + (slice(None),) * (k - len(ragged)))
    if features:
        for entry in features:
            if not (_is_integer(entry) or isinstance(entry, slice) or entry is None):
                raise TypeError(
                    f"feature dims accept ints, slices and None, got {type(entry).__name__}")
        batch = batch.with_values(batch.packed().values[(slice(None), *features)])
    return batch


_ALL = slice(None)


def _is_index_array(entry: Any) -> bool:
    """An integer tensor of at least one dim, or a list of ints: an advanced index."""
    if isinstance(entry, Tensor):
        return entry.dim() > 0 and not (entry.is_floating_point() or entry.is_complex()
                                        or entry.dtype in (torch.bool, torch.uint8))
    return type(entry) is list and all(type(i) is int for i in entry)


def paired_elements(batch: NestedBatch, samples: Any, positions: Any, features: tuple
                    ) -> Tensor:
    """``batch[samples, positions, *features]``: torch's advanced indexing with integer
    indices at the batch dim and the ragged dim, which pair up (broadcast together to a shape
    ``S``) to name elements, as torch.nested's ``index_put``. A dense ``(*S, *feature)``
    tensor (``features``, basic indices, then index the feature dims).

    Negative indices count from the end of the batch and of each sample, as torch on every
    sample. Every pair is checked: an index outside the batch or outside its sample raises
    ``IndexError``. Host indices of a batch whose sizes the host knows are checked there (no
    sync; the rows found are copied to the device once); else the check reads its flag from
    the device (one sync), as the CUDA kernels would otherwise assert on the device.
    """
    partition = batch.partition
    # Host indices and host sizes are checked, and the rows found, on the host (no sync; one
    # copy of the rows); else on the batch's device.
    on_host = partition.knows_host_shapes and not any(
        isinstance(i, Tensor) and not i.is_cpu for i in (samples, positions))
    device = torch.device("cpu") if on_host else batch.device
    samples, positions = torch.broadcast_tensors(
        *(torch.as_tensor(i, device=device, dtype=None if isinstance(i, Tensor) else torch.int64)
          for i in (samples, positions)))
    size = batch.batch_size
    lengths = torch.tensor(partition.host_lengths) if on_host else partition.lengths
    offsets = torch.tensor(partition.host_offsets) if on_host else partition.offsets
    sample_out = (samples < -size) | (samples >= size)
    given, samples = samples, samples.remainder(size) if size else samples
    length = lengths[samples.masked_fill(sample_out, 0)] if size else samples
    position_out = sample_out | (positions < -length) | (positions >= length)
    if samples.numel() and read_device_values(position_out.any().reshape(1))[0]:
        _raise_outside(given, positions, length, sample_out, size)
    rows = offsets[samples] + torch.where(positions < 0, positions + length, positions)
    elements = batch.packed().values[rows.reshape(-1).to(batch.device)]
    elements = elements.view(*rows.shape, *batch.feature_shape)
    return elements[(_ALL,) * rows.dim() + tuple(features)] if features else elements


def _raise_outside(samples: Tensor, positions: Tensor, length: Tensor, sample_out: Tensor,
                   size: int) -> None:
    """The ``IndexError`` torch raises for the first index outside the batch or its sample."""
    first = int((sample_out | (positions < -length) | (positions >= length))
                .reshape(-1).nonzero()[0])  # (the error path reads more, to name it)
    # (each read into a name first: dynamo, resuming after one inside an f-string, would
    # join an int into it)
    sample = int(samples.reshape(-1)[first])
    if bool(sample_out.reshape(-1)[first]):
        raise IndexError(f"index {sample} is out of bounds for dimension 0 with size {size}")
    position, sample_size = int(positions.reshape(-1)[first]), int(length.reshape(-1)[first])
    raise IndexError(f"index {position} is out of bounds for dimension 1 with size "
                     f"{sample_size} (sample {sample})")


def _getitem_moved(batch: NestedBatch, head: Any, rest: tuple) -> NestedBatch:
    """``batch[head, *rest]`` for a batch whose one ragged dim is at logical dim ``r > 1``:
    the index is reordered to stored order, applied, and the ragged dim placed back."""
    at = _entry_of_dim(rest, batch.ragged_dim - 1)  # the ragged entry's position in ``rest``
    rest = rest + (slice(None),) * max(0, at + 1 - len(rest))
    before, ragged, after = rest[:at], rest[at], rest[at + 1 :]
    if ragged is None:
        raise TypeError(f"ragged dim {batch.ragged_dim} accepts only slices, got NoneType")
    # Integers before the ragged dim drop dims, None entries add some.
    moved = sum(1 for entry in before if entry is None) - sum(map(_is_integer, before))
    stored = with_ragged_dim(batch, 1)[(head, ragged, *before, *after)]
    if not isinstance(stored, NestedBatch):  # (elements named by index tensors: dense, and
        return stored  # in torch's order, the indexed dims first as they are not adjacent)
    return with_ragged_dim(stored, batch.ragged_dim + moved)


def _entry_of_dim(entries: tuple, dim: int) -> int:
    """The position in ``entries`` (an index past the batch dim, no Ellipsis) of the entry
    that takes the ``dim``-th dim after the batch dim: None entries take none."""
    taken = 0
    for position, entry in enumerate(entries):
        if entry is not None:
            if taken == dim:
                return position
            taken += 1
    return len(entries) + dim - taken  # (past the entries given: full slices)


def _is_integer(entry: Any) -> bool:
    """Python ints, NumPy integers and 0-d integer tensors (not bools): one sample."""
    if isinstance(entry, bool):
        return False
    if isinstance(entry, Tensor):
        return entry.dim() == 0 and not entry.is_floating_point() and not entry.is_complex() \
            and entry.dtype != torch.bool
    if isinstance(entry, int):
        return True
    # NumPy integer scalars (and 0-d integer arrays), without importing NumPy.
    return (
        type(entry).__module__ == "numpy"
        and getattr(entry, "shape", None) == ()
        and getattr(getattr(entry, "dtype", None), "kind", "?") in ("i", "u")
    )


def _expand_ellipsis(index: tuple, ndim: int) -> tuple:
    # Identity tests: ``Ellipsis in index`` would compare tensors elementwise.
    at = next((i for i, entry in enumerate(index) if entry is Ellipsis), None)
    if at is None:
        return index
    taking = sum(1 for entry in index if entry is not None and entry is not Ellipsis)
    fill = (slice(None),) * (ndim - taking)  # (None takes no dim)
    return index[:at] + fill + index[at + 1 :]


def batch_index_tensor(index: Any, batch_size: int) -> tuple[Tensor, list[int] | None]:
    """Normalize a batch selector to a 1-d int64 tensor of in-range sample indices, with the
    same indices as a Python list when they are read on the host anyway (else ``None``).

    Accepts slices, sequences of ints or bools, and int or bool tensors. Host selectors are
    checked on the host. A bool tensor on a device is read once (its count sizes the result),
    and so is an int tensor on a device (its smallest and largest entry, for the range check).

    Raises
    ------
    IndexError
        If an index is out of range or a bool mask has the wrong length.
    """
    if isinstance(index, slice):
        return torch.arange(batch_size)[index], None
    if type(index) in (list, tuple) and all(type(i) is int for i in index):
        check_batch_indices(index, batch_size)
        host = [i % batch_size for i in index]
        return torch.tensor(host, dtype=torch.int64), host
    if not isinstance(index, Tensor):
        index = _host_index(index)
    dtype = index.dtype
    if dtype is torch.uint8:  # torch's deprecated reading of a uint8 index: a mask
        warnings.warn("indexing with dtype torch.uint8 is now deprecated, please use a dtype "
                      "torch.bool instead.", UserWarning, stacklevel=2)
        index, dtype = index.bool(), torch.bool
    if dtype is torch.bool:
        if index.shape != (batch_size,):
            raise IndexError(
                f"a bool batch index must have shape ({batch_size},), got {tuple(index.shape)}"
            )
        return index.nonzero().flatten(), None
    if dtype.is_floating_point or dtype.is_complex:
        raise TypeError(f"batch index must be integer or bool, got {dtype}")
    ndim = index.dim()
    if ndim > 1:  # (dense indexing would add batch dims: a batch has one)
        raise IndexError(f"a batch index tensor must be 1-d, got shape {tuple(index.shape)}")
    if ndim == 0:
        index = index.reshape(-1)
    if index.is_cpu:
        host = index.tolist()
        if host and not (-batch_size <= min(host) and max(host) < batch_size):
            check_batch_indices(host, batch_size)
        if host and min(host) < 0:
            host = [i % batch_size for i in host]
            return torch.tensor(host, dtype=torch.int64), host
        return (index if index.dtype == torch.int64 else index.long()), host
    if index.numel() == 0:
        return index, None
    smallest, largest = read_device_values(torch.stack(torch.aminmax(index)))
    check_batch_indices((smallest, largest), batch_size)
    return (index.remainder(batch_size) if smallest < 0 else index), None


def _host_index(index: Any) -> Tensor:
    error = TypeError(
        "a batch index must be an int, a slice, a sequence of ints or bools, or a tensor; got "
        f"{index!r}"
    )
    if isinstance(index, (str, bytes)) or index is None:
        raise error
    try:
        tensor = torch.as_tensor(index)
    except (TypeError, ValueError, RuntimeError) as cause:
        raise error from cause
    if tensor.numel() == 0:
        return tensor.to(torch.int64).reshape(0)
    return tensor


def select_samples(batch: NestedBatch, index: Tensor,
                   host_index: list[int] | None = None) -> NestedBatch:
    """A batch of the samples ``index`` (1-d int64, in range), in that order; ``host_index``:
    the same indices as a list, when the caller has them.

    Uses the cheapest materialized layout: list entries, padded rows, or a gather of packed
    rows. With a host index and host sizes, the rows to gather are computed on the host and the
    device sees one copy of them and one ``index_select``.
    """
    if host_index is None and index.is_cpu:
        host_index = index.tolist()  # a host tensor: no sync
    partition = batch.partition.select(index, host_index)
    listed = cached_layout(batch, Layout.LIST)
    if listed is not None and host_index is not None:
        tensors = [listed.tensors[i] for i in host_index]
        return NestedBatch(TensorList(tensors, batch.num_ragged_dims, partition=partition,
                                      feature_shape=batch.feature_shape, dtype=batch.dtype,
                                      device=batch.device))
    padded = cached_layout(batch, Layout.PADDED)
    if padded is None and not partition.knows_host_shapes:
        padded = batch.padded(None)  # a device index: gather whole padded rows, no size read
    if padded is not None:
        data = padded.data.index_select(0, index.to(padded.data.device))
        return NestedBatch.trusted(Padded.trusted(data, partition.to(data.device),
                                                  padded.padding_value))
    # Host shapes carried over: ``index`` is a host tensor, so reading it is no sync.
    offsets = batch.partition.host_offsets
    ranges = [range(offsets[i], offsets[i + 1]) for i in host_index]
    rows = host_row_index(ranges, partition.host_lengths)
    values = gather_rows(batch.packed().values, rows)
    return NestedBatch.trusted(Packed.trusted(values, partition))


#: Up to this many rows, a row index is listed by Python's C-level range iteration (one
#: ``torch.tensor``); beyond, it is computed with four host tensor ops of fixed cost.
_LISTED_ROWS = 512


def host_row_index(ranges: list[range], lengths: list[int]) -> Tensor:
    """``(sum(lengths),)`` int64 on the host: the rows of ``ranges`` (one per sample, all with
    the same step; ``lengths`` their lengths), back to back, with no per-row Python work."""
    total = sum(lengths)
    if total <= _LISTED_ROWS:
        return torch.tensor(list(itertools.chain.from_iterable(ranges)), dtype=torch.int64)
    step = ranges[0].step
    counts = torch.tensor(lengths, dtype=torch.int64)
    first = [0, *itertools.accumulate(lengths)][:-1]
    shift = torch.tensor([r.start - f * step for r, f in zip(ranges, first)], dtype=torch.int64)
    rows = torch.arange(0, total * step, step, dtype=torch.int64) if step != 1 else \
        torch.arange(total, dtype=torch.int64)
    return rows.add_(shift.repeat_interleave(counts, output_size=total))


def gather_rows(values: Tensor, rows: Tensor) -> Tensor:
    """``values[rows]`` for a host row index: one host-to-device copy of the index (when the
    values live on a device) and one ``index_select``."""
    if not values.is_cpu:
        rows = torch.ops.aten._to_copy.default(rows, device=values.device)
    return values.index_select(0, rows)


def slice_ragged(batch: NestedBatch, slices: tuple[slice, ...]) -> NestedBatch:
    """Every sample sliced along its ragged dims, one Python slice per ragged dim.

    Slice bounds are resolved per sample against that sample's size, as Python does for a
    list: negative bounds count from the sample's end, and bounds are clipped.

    Costs, one ragged dim: with host sizes, the rows are found on the host and gathered with one
    copy of their index and one ``index_select`` (a prefix of a cached padded layout is a view);
    with device sizes, a prefix ``x[:, :k]`` is one padding kernel (the result is padded), and
    other slices read the sizes once.
    """
    partition = batch.partition
    first = slices[0]
    whole = first.stop is None and not first.start  # (a quick test of the first slice)
    if whole and all(s.stop is None and _is_prefix(s) for s in slices):
        return batch  # x[:, 0:], x[:, ::1]: every sample whole
    if partition.ragged_rank > 1:
        return _slice_outer_rows(batch, slices)
    if batch.num_ragged_dims == 1 and (partition.knows_host_shapes or _is_prefix(first)):
        return NestedBatch.trusted(_slice_one_ragged_dim(batch, slices[0]))
    sizes = (
        torch.tensor(partition.host_shapes, dtype=torch.int64).reshape(-1, len(slices))
        if partition.knows_host_shapes
        else partition.shape_per_sample
    )
    starts, new_sizes, steps = _resolve_slices(sizes, slices)
    new_partition = RowPartition(
        new_sizes.to(partition.device),
        host_shapes=tuple(map(tuple, new_sizes.tolist())) if sizes.device.type == "cpu" else None,
    )
    if all(map(_is_prefix, slices)):
        padded = cached_layout(batch, Layout.PADDED)
        if padded is not None:
            return NestedBatch(_narrow_padded(padded, new_partition, slices))
    packed = batch.packed()
    rows = new_partition.row_ids
    starts = starts.to(partition.device)[rows]
    shapes = partition.shape_per_sample[rows]
    flat = torch.zeros_like(rows)
    for d, (position, step) in enumerate(zip(new_partition.ragged_index, steps)):
        flat = flat * shapes[:, d] + starts[:, d] + position * step
    source_rows = partition.offsets[rows] + flat
    return NestedBatch(Packed(packed.values[source_rows], partition=new_partition))


def _slice_outer_rows(batch: NestedBatch, slices: tuple[slice, ...]) -> NestedBatch:
    """``x[:, a:b]`` of a batch of ragged rank ``r >= 2``: every sample's outermost rows sliced
    as a Python list is (clipped; negative bounds from the sample's end), the rows below them
    kept. The sizes are read on the host (once, a sync, if only the device has them).

    Raises
    ------
    ValueError
        For a slice of an inner level (``x[:, :, a:b]``) or a step that is not positive.
    """
    if any(s != slice(None) for s in slices[1:]):
        raise ValueError(
            "slicing a batch of ragged rank >= 2 slices its outermost rows only (x[:, a:b]); "
            "slice an inner level through .values or unbind()"
        )
    s = slices[0]
    _slice_step(s)
    levels = batch.partition.levels
    offsets = levels[0].host_offsets
    ranges = [range(offsets[b], offsets[b + 1])[s] for b in range(batch.batch_size)]
    rows = list(itertools.chain.from_iterable(ranges))
    kept = [RowPartition.from_host_lengths([len(r) for r in ranges], batch.device)]
    index, host_index = torch.tensor(rows, dtype=torch.int64), rows
    for level in levels[1:]:  # every level keeps the rows under the kept ones
        kept.append(level.select(index, host_index))
        index, host_index = level.rows_under(index, host_index)
    values = gather_rows(batch.packed().values, index.cpu())
    return NestedBatch(Packed(values, partition=RowPartition.nested(kept)))


def _slice_step(s: slice, dim: int = 1) -> int:
    step = 1 if s.step is None else _slice_bound(s.step, "step")
    if step <= 0:
        raise ValueError(f"slice step on ragged dim {dim} must be positive, got {step}")
    return step


def _slice_one_ragged_dim(batch: NestedBatch, s: slice) -> Packed | Padded:
    partition = batch.partition
    _slice_step(s)
    prefix = _is_prefix(s)
    if not partition.knows_host_shapes or (prefix and torch.compiler.is_compiling()):
        return _slice_prefix_on_device(batch, s)
    if prefix:
        padded = cached_layout(batch, Layout.PADDED)
        if padded is not None:
            # x[:, :k] of a cached padded layout: new lengths on the host, a view of the data.
            if s.stop is None:
                return Padded.trusted(padded.data, partition, padded.padding_value)
            return _narrow_padded(padded, partition.clamped(s.stop), (s,))
    # Each sample's rows, sliced as Python slices a range (clipped, negative bounds from the
    # sample's end): the slicing is done in C, one range per sample.
    offsets = partition.host_offsets
    ranges = [range(offsets[b], offsets[b + 1])[s] for b in range(partition.batch_size)]
    lengths = [len(r) for r in ranges]
    new = RowPartition.from_host_lengths(lengths, partition.device)
    return Packed.trusted(gather_rows(batch.packed().values, host_row_index(ranges, lengths)),
                          new)


def _slice_prefix_on_device(batch: NestedBatch, s: slice) -> Padded:
    """``x[:, :k]`` of a batch whose sizes are on the device (or traced): the padding kernel
    cuts every sample at the stop, and the result is padded.

    (Also while torch.compile traces, whatever the host knows: the sizes stay tensors and the
    width one int, so the graph does not specialize on every length.)
    """
    partition = batch.partition
    padded = cached_layout(batch, Layout.PADDED)
    known = partition.cached_max_shape
    stop = known[0] if s.stop is None and known else s.stop
    width = _slice_bound(stop, "stop")
    if known is not None:
        width = min(width, known[0])  # no wider than the longest sample
    lengths = partition.lengths.clamp(max=width)
    # The longest cut sample is known only where the longest sample was (else a stop past it
    # would make the padded width the stop: host sizes give the tightest); a traced graph
    # keeps the stop, one int, so that it does not read the sizes.
    longest = width if known is not None or torch.compiler.is_compiling() else None
    new = RowPartition.from_lengths(lengths, max_len=longest)
    if padded is not None:
        return _narrow_padded(padded, new, (slice(None, width),))
    if s.stop is None:
        data = batch.padded(0.0, max_shape=None).data
    else:
        packed = batch.packed()
        if packed.values.requires_grad and torch.is_grad_enabled():
            # The operator's backward reads every row of every sample back, and the rows of a
            # cut sample past the width are not in the gradient: plain torch ops, whose
            # autograd differentiates the cut.
            data = torch_impl.packed_to_padded(packed.values, packed.partition.offsets, width,
                                               0.0)
        else:
            data = packed_values_to_padded(packed.values, packed.partition, (width,), 0.0)
    return Padded(data, partition=new, padding_value=0.0)


def _slice_bound(value: Any, name: str) -> int:
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"slice {name} must be an int, got {type(value).__name__}") from None


def _resolve_slices(
    sizes: Tensor, slices: tuple[slice, ...]
) -> tuple[Tensor, Tensor, tuple[int, ...]]:
    starts, new_sizes, steps = [], [], []
    for d, s in enumerate(slices):
        step = _slice_step(s, d + 1)
        size = sizes[:, d]
        start = _resolve_bound(s.start, size, 0)
        stop = _resolve_bound(s.stop, size, None)
        starts.append(start)
        new_sizes.append(((stop - start).clamp_min(0) + step - 1) // step)
        steps.append(step)
    return torch.stack(starts, 1), torch.stack(new_sizes, 1), tuple(steps)


def _resolve_bound(bound: int | None, size: Tensor, default: int | None) -> Tensor:
    if bound is None:
        return torch.zeros_like(size) if default == 0 else size.clone()
    bound = int(bound)
    value = size + bound if bound < 0 else torch.full_like(size, bound)
    return torch.minimum(value.clamp_min(0), size)


def _is_prefix(s: slice) -> bool:
    """Whether ``s`` keeps the first elements of every sample (``:k`` or ``:``)."""
    start, stop = s.start, s.stop
    return (start is None or (isinstance(start, int) and start == 0)) and s.step in (None, 1) \
        and (stop is None or stop >= 0)


def _narrow_padded(padded: Padded, partition: RowPartition, slices: tuple[slice, ...]) -> Padded:
    # Prefix slices keep every sample's first elements in place: a view of the padded data.
    data = padded.data
    for d, s in enumerate(slices):
        if s.stop is not None and s.stop < data.shape[d + 1]:
            data = data.narrow(d + 1, 0, s.stop)
    return Padded.trusted(data, partition.to(data.device), padded.padding_value)

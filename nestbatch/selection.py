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

Positions are logical: when the ragged dim was moved (:attr:`~nestbatch.NestedBatch.ragged_dim`),
the entry at its position slices it and the others index the stored feature dims; an integer on
a feature dim before the ragged dim moves the ragged dim down by one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from nestbatch.layouts import Layout, Packed, Padded, RowPartition, TensorList

if TYPE_CHECKING:
    from nestbatch.batch import NestedBatch


def getitem(batch: NestedBatch, index: Any) -> Tensor | NestedBatch:
    """``batch[index]`` (see the module docstring for the rules)."""
    index = _expand_ellipsis(index if isinstance(index, tuple) else (index,), batch.dim())
    head, rest = index[0], index[1:]
    if _is_integer(head):
        return batch.sample(int(head))[rest] if rest else batch.sample(int(head))
    if batch.ragged_dim != 1:
        return _getitem_moved(batch, head, rest)
    if not (isinstance(head, slice) and head == slice(None)):
        batch = select_samples(batch, batch_index_tensor(head, batch.batch_size))
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
            if not (_is_integer(entry) or isinstance(entry, slice)):
                raise TypeError(
                    f"feature dims accept ints and slices, got {type(entry).__name__}"
                )
        batch = batch.with_values(batch.values[(slice(None), *features)])
    return batch


def _getitem_moved(batch: NestedBatch, head: Any, rest: tuple) -> NestedBatch:
    """``batch[head, *rest]`` for a batch whose one ragged dim is at logical dim ``r > 1``:
    the index is reordered to stored order, applied, and the ragged dim placed back."""
    at = batch.ragged_dim - 1  # position of the ragged entry in ``rest``
    rest = rest + (slice(None),) * max(0, at + 1 - len(rest))
    before, ragged, after = rest[:at], rest[at], rest[at + 1 :]
    dropped = sum(1 for entry in before if _is_integer(entry))
    stored = batch._with_ragged_dim(1)[(head, ragged, *before, *after)]
    return stored._with_ragged_dim(batch.ragged_dim - dropped)


def _is_integer(entry: Any) -> bool:
    if isinstance(entry, bool):
        return False
    if isinstance(entry, int):
        return True
    return isinstance(entry, Tensor) and entry.dim() == 0 and not entry.is_floating_point() \
        and entry.dtype != torch.bool


def _expand_ellipsis(index: tuple, ndim: int) -> tuple:
    if Ellipsis not in index:
        return index
    at = index.index(Ellipsis)
    fill = (slice(None),) * (ndim - len(index) + 1)
    return index[:at] + fill + index[at + 1 :]


def batch_index_tensor(index: Any, batch_size: int) -> Tensor:
    """Normalize a batch selector to a 1-d int64 tensor of in-range sample indices.

    Accepts slices, sequences of ints or bools, and int or bool tensors. A bool tensor on a
    device, or an int tensor on a device that must be range-checked, is read once (a sync).

    Raises
    ------
    IndexError
        If an index is out of range or a bool mask has the wrong length.
    """
    if isinstance(index, slice):
        return torch.arange(batch_size)[index]
    if not isinstance(index, Tensor):
        index = torch.as_tensor(index)
    if index.dtype == torch.bool:
        if index.shape != (batch_size,):
            raise IndexError(
                f"a bool batch index must have shape ({batch_size},), got {tuple(index.shape)}"
            )
        return index.nonzero().flatten()
    if index.is_floating_point() or index.is_complex():
        raise TypeError(f"batch index must be integer or bool, got {index.dtype}")
    index = index.reshape(-1).to(torch.int64)
    if index.numel() and bool(((index < -batch_size) | (index >= batch_size)).any()):
        raise IndexError(f"batch index out of range for batch size {batch_size}")
    return torch.where(index < 0, index + batch_size, index)


def select_samples(batch: NestedBatch, index: Tensor) -> NestedBatch:
    """A batch of the samples ``index`` (1-d int64, in range), in that order.

    Uses the cheapest materialized layout: list entries, padded rows, or a gather of packed rows.
    """
    from nestbatch.batch import NestedBatch

    partition = batch.partition.select(index)
    cache = batch._cache
    if Layout.LIST in cache and index.device.type == "cpu":
        tensors = cache[Layout.LIST].tensors
        return NestedBatch(
            TensorList(
                [tensors[i] for i in index.tolist()],
                batch.num_ragged_dims,
                feature_shape=batch.feature_shape,
                dtype=batch.dtype,
                device=batch.device,
                partition=partition,
            )
        )
    padded = next((layout for key, layout in cache.items() if isinstance(key, tuple)), None)
    if padded is not None:
        data = padded.data[index.to(padded.data.device)]
        return NestedBatch(Padded(data, partition=partition, padding_value=padded.padding_value))
    packed = batch.packed()
    old_starts = packed.offsets[index.to(packed.values.device)]
    source_rows = old_starts[partition.row_ids] + partition.positions
    return NestedBatch(Packed(packed.values[source_rows], partition=partition))


def slice_ragged(batch: NestedBatch, slices: tuple[slice, ...]) -> NestedBatch:
    """Every sample sliced along its ragged dims, one Python slice per ragged dim.

    Slice bounds are resolved per sample against that sample's size, as Python does for a
    list: negative bounds count from the sample's end, and bounds are clipped.
    """
    from nestbatch.batch import NestedBatch

    partition = batch.partition
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
    if _is_prefix_slice(slices):
        padded = next((lay for key, lay in batch._cache.items() if isinstance(key, tuple)), None)
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


def _resolve_slices(
    sizes: Tensor, slices: tuple[slice, ...]
) -> tuple[Tensor, Tensor, tuple[int, ...]]:
    starts, new_sizes, steps = [], [], []
    for d, s in enumerate(slices):
        step = 1 if s.step is None else int(s.step)
        if step <= 0:
            raise ValueError(f"slice step on ragged dim {d + 1} must be positive, got {step}")
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


def _is_prefix_slice(slices: tuple[slice, ...]) -> bool:
    return all(
        (s.start is None or (isinstance(s.start, int) and s.start == 0)) and s.step in (None, 1)
        and (s.stop is None or s.stop >= 0)
        for s in slices
    )


def _narrow_padded(padded: Padded, partition: RowPartition, slices: tuple[slice, ...]) -> Padded:
    # Prefix slices keep every sample's first elements in place: a view of the padded data.
    data = padded.data
    for d, s in enumerate(slices):
        if s.stop is not None:
            data = data.narrow(d + 1, 0, min(s.stop, data.shape[d + 1]))
    return Padded(data, partition=partition, padding_value=padded.padding_value)

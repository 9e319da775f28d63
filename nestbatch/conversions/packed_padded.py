"""Conversions between the packed and the padded layout.

Both directions are one vectorized indexing op over the packed rows: every row knows its sample
(``row_ids``) and its multi-index inside the sample (``ragged_index``), both cached on the shared
:class:`~nestbatch.layouts.RowPartition`. Both are differentiable: the gradient of packing is a
scatter, the gradient of padding a gather, and padded slots get zero gradient.

With one ragged dim (``k == 1``) the public functions call the ``nestbatch::*`` operators
through :func:`nestbatch.kernels.call` on the partition's cached offsets (a CUDA kernel on CUDA
tensors, the CPU implementation on host tensors); ``k > 1`` always runs the ``reference_*``
indexing path.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from nestbatch import kernels
from nestbatch.kernels import torch_impl
from nestbatch.layouts import Packed, Padded, RowPartition
from nestbatch.layouts.padded import filler_key


def resolve_padded_shape(
    partition: RowPartition, padded_shape: Sequence[int | None] | None
) -> tuple[int, ...]:
    """The ragged dims of a padded tensor: the batch's maximum, or a larger requested shape.

    ``None`` or ``-1`` entries of ``padded_shape`` mean "the maximum" (kaolin's ``max_shape``).

    Raises
    ------
    ValueError
        If ``padded_shape`` has the wrong length or is smaller than the largest sample.
    """
    largest = partition.max_shape
    if padded_shape is None:
        return largest
    padded_shape = tuple(padded_shape)
    if len(padded_shape) != partition.num_ragged_dims:
        raise ValueError(
            f"max_shape must have one entry per ragged dim ({partition.num_ragged_dims}), got "
            f"{padded_shape}"
        )
    resolved = tuple(
        big if size is None or size == -1 else int(size) for size, big in zip(padded_shape, largest)
    )
    if any(size < big for size, big in zip(resolved, largest)):
        raise ValueError(
            f"max_shape {padded_shape} is smaller than the largest sample's shape {largest}"
        )
    return resolved


def packed_values_to_padded(
    values: Tensor, partition: RowPartition, padded_shape: Sequence[int], padding_value: float
) -> Tensor:
    """Lay packed rows out in a padded tensor.

    With one ragged dim this runs the ``nestbatch::packed_to_padded`` operator (a CUDA kernel on
    CUDA tensors) on the partition's cached offsets, otherwise
    :func:`reference_packed_values_to_padded`.

    Parameters
    ----------
    values : Tensor
        ``(total, *feature)``.
    partition : RowPartition
        The batch's partition (``B`` samples, ``k`` ragged dims).
    padded_shape : sequence of int
        Size of the ``k`` ragged dims of the output, at least the largest sample's.
    padding_value : float
        Filler for slots outside every sample.

    Returns
    -------
    Tensor
        ``(B, *padded_shape, *feature)``.
    """
    if partition.num_ragged_dims == 1:
        return kernels.call(
            "packed_to_padded", values, partition.offsets, padded_shape[0], padding_value
        )
    return reference_packed_values_to_padded(values, partition, padded_shape, padding_value)


def reference_packed_values_to_padded(
    values: Tensor, partition: RowPartition, padded_shape: Sequence[int], padding_value: float
) -> Tensor:
    """:func:`packed_values_to_padded` in pure PyTorch, for any ``k`` (same arguments).

    Padded slots are computed as a gather (each slot reads its source row or is filled), so every
    output element is written once. One ragged dim runs
    :func:`nestbatch.kernels.torch_impl.packed_to_padded`.
    """
    padded_shape = tuple(padded_shape)
    if partition.num_ragged_dims == 1:
        return torch_impl.packed_to_padded(
            values, partition.offsets, padded_shape[0], padding_value
        )
    shape = (partition.batch_size, *padded_shape, *values.shape[1:])
    if partition.ragged_rank > 1:
        # Nested raggedness: every value written at its position in every level's row (an
        # out-of-place index_put: differentiable).
        out = values.new_full(shape, padding_value)
        return out.index_put((partition.row_ids, *partition.ragged_index), values)
    if values.shape[0] == 0 or math.prod(shape) == 0:
        # Nothing to read; adding ``values.sum() * 0`` keeps the autograd link to ``values``.
        out = values.new_full(shape, padding_value)
        return out + values.sum() * 0 if values.requires_grad else out
    sources, inside = padded_slot_sources(partition, padded_shape)
    rows = values.index_select(0, sources.clamp(max=values.shape[0] - 1).reshape(-1))
    out = rows.view(shape)
    trailing = (1,) * (values.dim() - 1)
    # In place on the fresh gather output (see kernels.torch_impl.packed_to_padded).
    return out.masked_fill_(~inside.view(*inside.shape, *trailing), padding_value)


def padded_slot_sources(
    partition: RowPartition, padded_shape: Sequence[int]
) -> tuple[Tensor, Tensor]:
    """The packed row behind every padded slot, and whether the slot is inside its sample.

    Returns
    -------
    sources : Tensor
        ``(B, *padded_shape)`` int64: ``offsets[b]`` plus the slot's row-major position in
        sample ``b``'s own shape (meaningless where ``inside`` is False).
    inside : Tensor
        ``(B, *padded_shape)`` bool: the mask.
    """
    k, shapes = partition.num_ragged_dims, partition.shape_per_sample
    column = (partition.batch_size,) + (1,) * k  # one value per sample
    position = torch.zeros(column, dtype=torch.int64, device=partition.device)
    for d, size in enumerate(padded_shape):
        view = [1] * (k + 1)
        view[d + 1] = size
        index = torch.arange(size, device=partition.device).view(view)
        position = position * shapes[:, d].view(column) + index
    sources = partition.offsets[:-1].view(column) + position
    return sources, partition.mask(padded_shape)


def padded_data_to_packed(data: Tensor, partition: RowPartition) -> Tensor:
    """Gather the valid slots of a padded tensor into packed rows.

    With one ragged dim this runs the ``nestbatch::padded_to_packed`` operator (a CUDA kernel on
    CUDA tensors), otherwise :func:`reference_padded_data_to_packed`.

    Parameters
    ----------
    data : Tensor
        ``(B, *padded_shape, *feature)``.
    partition : RowPartition
        The batch's partition. Its total must be known on the host or is read once (a sync).

    Returns
    -------
    Tensor
        ``(total, *feature)``, rows in sample order.
    """
    if partition.num_ragged_dims == 1:
        return kernels.call("padded_to_packed", data, partition.offsets, partition.total)
    return reference_padded_data_to_packed(data, partition)


def reference_padded_data_to_packed(data: Tensor, partition: RowPartition) -> Tensor:
    """:func:`padded_data_to_packed` in pure PyTorch, for any ``k`` (same arguments)."""
    return data[(partition.row_ids, *partition.ragged_index)]


def packed_to_padded(
    packed: Packed, padding_value: float = 0.0, max_shape: Sequence[int | None] | None = None
) -> Padded:
    """Convert a :class:`Packed` batch to a :class:`Padded` one.

    Parameters
    ----------
    packed : Packed
        The batch.
    padding_value : float, default 0
        Filler of the padded slots.
    max_shape : sequence of int, optional
        Size of the ragged dims of the result (default: the largest sample's). ``None`` / -1
        entries mean the maximum.

    Returns
    -------
    Padded
        Sharing ``packed``'s partition.
    """
    partition = packed.partition
    # The batch's own maximum needs no resolving, and one ragged dim goes straight to the
    # operator (the common case: fewer Python layers).
    shape = partition.max_shape if max_shape is None else resolve_padded_shape(partition, max_shape)
    if len(shape) == 1:  # (one size per ragged dim: num_ragged_dims, without a property frame)
        data = kernels.call(
            "packed_to_padded", packed.values, partition.offsets, shape[0], padding_value
        )
    else:
        data = packed_values_to_padded(packed.values, partition, shape, padding_value)
    return Padded.trusted(data, partition, padding_value)


def padded_to_packed(padded: Padded) -> Packed:
    """Convert a :class:`Padded` batch to a :class:`Packed` one (sharing its partition)."""
    partition = padded.partition
    if partition.num_ragged_dims == 1:  # (padded_data_to_packed's common case, inline)
        values = kernels.call("padded_to_packed", padded.data, partition.offsets, partition.total)
    else:
        values = reference_padded_data_to_packed(padded.data, partition)
    return Packed.trusted(values, partition)


def refill_padding(padded: Padded, padding_value: float) -> Padded:
    """The same batch with every padded slot set to ``padding_value`` (not in place)."""
    if padded.padding_value is not None and \
            filler_key(padded.padding_value) == filler_key(padding_value):
        return padded
    if padded.partition.num_ragged_dims == 1:
        data = kernels.call("fill_padding", padded.data, padded.partition.lengths, padding_value)
    else:
        mask = padded.mask.reshape(*padded.mask.shape, *([1] * len(padded.feature_shape)))
        data = padded.data.masked_fill(~mask, padding_value)
    return Padded.trusted(data, padded.partition, padding_value)

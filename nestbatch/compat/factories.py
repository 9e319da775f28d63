"""`nested` and `as_nested`: the two ways to make a :class:`~nestbatch.NestedBatch`.

As ``torch.tensor`` / ``torch.as_tensor``: :func:`nested` copies into a new leaf batch,
:func:`as_nested` keeps the given storage and autograd history where it can.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from nestbatch.batch import NestedBatch
from nestbatch.checks import check_tensor_sequence
from nestbatch.compat.torch_formats import from_nested_tensor, from_packed_sequence
from nestbatch.layouts import Layout, Packed, RowPartition, TensorList
from nestbatch.ops.structure import cat_samples


def nested(
    tensors: Sequence[Tensor],
    *,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
    requires_grad: bool = False,
    layout: Layout = Layout.PACKED,
    num_ragged_dims: int = 1,
) -> NestedBatch:
    """A new batch holding a copy of ``tensors`` (like ``torch.nested.nested_tensor``).

    Parameters
    ----------
    tensors : sequence of Tensor
        Samples of shapes ``(*ragged_shape_i, *feature_shape)`` with the same number of dims.
        A sample with no element is a zero-size sample whatever its shape or dtype
        (``torch.tensor([[]])`` beside ``(n, 4)`` samples is a ``(0, 4)`` sample).
    dtype, device : optional
        Convert every sample; required if the samples' dtypes or devices differ.
    requires_grad : bool, default False
        Make the copy a leaf that requires gradients.
    layout : Layout, default Layout.PACKED
        Layout to store the copy in (packed: one contiguous buffer).
    num_ragged_dims : int, default 1
        How many leading dims of every sample are ragged.

    Returns
    -------
    NestedBatch
        Detached from the inputs' autograd history. Samples that are batches of ragged rank
        ``r`` (the same feature shape and dtype) give a batch of ragged rank ``r + 1``: sample
        ``i`` is the batch ``tensors[i]``, its samples the rows of the new outermost level.
    """
    if isinstance(tensors, (list, tuple)) and tensors \
            and all(isinstance(t, NestedBatch) for t in tensors):
        batch = nest(list(tensors)).to(dtype=dtype or tensors[0].dtype,
                                        device=device or tensors[0].device).detach().clone()
        return batch.requires_grad_() if requires_grad else batch
    detached = [t.detach() for t in check_tensor_sequence(tensors)]
    samples = TensorList(detached, num_ragged_dims, dtype=dtype, device=device)
    batch = NestedBatch(samples).to(layout)
    if layout is Layout.LIST:
        batch = batch.clone()
    if requires_grad:
        batch.requires_grad_()
    return batch


def nest(batches: list[NestedBatch]) -> NestedBatch:
    """The batch of ragged rank ``r + 1`` whose sample ``i`` is ``batches[i]`` (each of ragged
    rank ``r``, one feature shape and dtype; shares nothing: their rows are joined).

    Raises
    ------
    ValueError
        For batches of other ragged ranks, feature shapes or dtypes, or a moved ragged dim.
    """
    first = batches[0]
    for i, b in enumerate(batches):
        if (b.partition.ragged_rank, b.num_ragged_dims, b.feature_shape, b.dtype, b.ragged_dim) \
                != (first.partition.ragged_rank, first.partition.ragged_rank,
                    first.feature_shape, first.dtype, 1):
            raise ValueError(
                f"tensors[{i}]: batches nest when they all have one ragged rank (rectangular "
                "samples ragged in several dims do not), one feature shape and one dtype, with "
                f"the ragged dim at dim 1; got ragged rank {b.partition.ragged_rank}, feature "
                f"shape {tuple(b.feature_shape)} and {b.dtype} beside "
                f"{first.partition.ragged_rank}, {tuple(first.feature_shape)} and {first.dtype}"
            )
    rows = cat_samples(batches)
    outer = RowPartition.from_host_lengths([b.batch_size for b in batches], rows.device)
    partition = RowPartition.nested([outer, *rows.partition.levels])
    return NestedBatch(Packed(rows.packed().values, partition=partition))


def as_nested(
    data: Any,
    *,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
    num_ragged_dims: int = 1,
) -> NestedBatch:
    """View ``data`` as a batch, keeping its storage and autograd history where possible.

    Parameters
    ----------
    data : NestedBatch, sequence of Tensor, PackedSequence, nested tensor, RaggedBatch or layout
        What to wrap. A list is kept as a list (no copy).
    dtype, device : optional
        Convert to these.
    num_ragged_dims : int, default 1
        Ragged dims of a list's samples.
    """
    batch = _wrap(data, num_ragged_dims, dtype, device)
    if dtype is not None or device is not None:
        batch = batch.to(device=device or batch.device, dtype=dtype or batch.dtype)
    return batch


def _wrap(data: Any, num_ragged_dims: int, dtype: Any, device: Any) -> NestedBatch:
    if isinstance(data, NestedBatch):
        return data
    if isinstance(data, (Packed, TensorList)) or type(data).__name__ == "Padded":
        return NestedBatch(data)
    if isinstance(data, torch.nn.utils.rnn.PackedSequence):
        return from_packed_sequence(data)
    if isinstance(data, Tensor) and data.is_nested:
        return from_nested_tensor(data)
    if type(data).__name__ == "RaggedBatch":
        return NestedBatch.from_ragged_batch(data)
    if isinstance(data, Sequence) and not isinstance(data, (str, bytes, Tensor)):
        return NestedBatch.from_list(
            list(check_tensor_sequence(data)), num_ragged_dims, dtype=dtype, device=device
        )
    raise TypeError(
        "as_nested takes a NestedBatch, a list of tensors, a PackedSequence, a nested tensor, a "
        f"RaggedBatch or a layout object, got {type(data).__name__}"
    )

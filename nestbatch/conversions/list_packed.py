"""Conversions between a list of tensors and the packed layout."""

from __future__ import annotations

import torch

from nestbatch.layouts import Packed, TensorList


def list_to_packed(tensor_list: TensorList) -> Packed:
    """Concatenate the samples' rows (their ragged dims flattened) into a :class:`Packed` batch.

    One copy; differentiable. The partition, with its host-side sizes, is shared.
    """
    feature = tuple(tensor_list.feature_shape)
    if tensor_list.batch_size == 0:
        values = torch.empty((0, *feature), dtype=tensor_list.dtype, device=tensor_list.device)
    elif tensor_list.num_ragged_dims == 1:
        values = torch.cat(tensor_list.tensors)  # samples are (rows, *feature) already
    else:
        # Row counts are explicit: with a zero-size feature, -1 would be ambiguous.
        rows = tensor_list.partition.host_lengths
        values = torch.cat([t.reshape(n, *feature) for t, n in zip(tensor_list.tensors, rows)])
    return Packed.trusted(values, tensor_list.partition)


def packed_to_list(packed: Packed) -> TensorList:
    """Split a :class:`Packed` batch into per-sample views of its ``values``.

    Needs the per-sample sizes on the host: reads them once (a sync) if only the device has them.
    """
    partition = packed.partition
    feature = tuple(packed.feature_shape)
    values = packed.values
    if values.requires_grad and torch.is_grad_enabled():
        # One view per sample (narrow): autograd refuses an in-place write to one of several
        # views one op returned (split's), which torch allows on a sample alone.
        starts = partition.host_offsets
        pieces = [values.narrow(0, a, b - a) for a, b in zip(starts, starts[1:])]
    else:
        pieces = values.split(list(partition.host_lengths))
    tensors = [
        piece.view(*shape, *feature) for piece, shape in zip(pieces, partition.host_shapes)
    ]
    return TensorList(
        tensors, partition.num_ragged_dims, feature_shape=feature, partition=partition,
        dtype=packed.dtype,  # (an empty list has no sample to tell it)
    )

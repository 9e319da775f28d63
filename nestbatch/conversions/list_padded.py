"""Conversions between a list of tensors and the padded layout."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from nestbatch.conversions.list_packed import list_to_packed
from nestbatch.conversions.packed_padded import packed_to_padded
from nestbatch.layouts import Padded, TensorList

#: On the CPU, lists of at least this many samples averaging at most
#: :data:`PACKED_ROUTE_SAMPLE_BYTES` go through the packed rows (one ``cat``, one conversion
#: that writes every padded element once) instead of ``pad_sequence``, whose C++ loop costs
#: about 2.5 us per sample. Measured on 2 cores, samples of 0.5-1 KB: the packed route is
#: 1.1x faster at B=64, 1.5-1.9x at B=256-4096; with 8 KB or more per sample ``pad_sequence``
#: is 1.0-2x faster.
PACKED_ROUTE_SAMPLES = 64
PACKED_ROUTE_SAMPLE_BYTES = 4096

_PAD_SEQUENCE = torch._C._nn.pad_sequence  # (sequences, batch_first, padding_value)


def list_to_padded(
    tensor_list: TensorList,
    padding_value: float = 0.0,
    max_shape: Sequence[int | None] | None = None,
) -> Padded:
    """Pad a list of samples into a :class:`Padded` batch.

    On a GPU this goes through the packed rows (one concatenation, one gather) rather than one
    copy kernel per sample, which is what makes it fast for many small samples. On the CPU, with
    one ragged dim, ``pad_sequence`` copies each sample once in a C++ loop, which is faster
    unless the samples are many and small (:data:`PACKED_ROUTE_SAMPLES`).
    """
    partition = tensor_list.partition
    if (
        max_shape is None
        and partition.num_ragged_dims == 1
        and partition.batch_size > 0
        and partition.device.type == "cpu"
        and type(padding_value) is not complex  # (pad_sequence takes a double)
        and float(padding_value) == padding_value
        and not _packed_route_pays(tensor_list)
    ):
        # pad_sequence's C++ function: its Python wrapper only checks and tuples the argument
        # (an ABC isinstance check and a JIT query, ~1.5 us of ~12 at B=4), done here already.
        data = _PAD_SEQUENCE(tuple(tensor_list.tensors), True, padding_value)
        return Padded.trusted(data, tensor_list.partition, padding_value)
    return packed_to_padded(list_to_packed(tensor_list), padding_value, max_shape)


def _packed_route_pays(tensor_list: TensorList) -> bool:
    """Whether a CPU list pads faster through its packed rows: many small samples (host sizes
    only are read)."""
    partition = tensor_list.partition
    if partition.batch_size < PACKED_ROUTE_SAMPLES:
        return False
    row_bytes = math.prod(tensor_list.feature_shape) * tensor_list.dtype.itemsize
    return partition.total * row_bytes <= PACKED_ROUTE_SAMPLE_BYTES * partition.batch_size


def padded_to_list(padded: Padded) -> TensorList:
    """Per-sample views into a :class:`Padded` batch's data, cropped to each sample's shape
    (the end of each row when the padding is on the left).

    Needs the per-sample shapes on the host: reads them once (a sync) if only the device has them.
    """
    partition, data = padded.partition, padded.data
    if padded.padding_side == "left":  # (one ragged dim)
        width = data.shape[1]
        tensors = [data[i, width - n :] for i, (n,) in enumerate(partition.host_shapes)]
    else:
        tensors = [data[(i, *map(slice, shape))] for i, shape in enumerate(partition.host_shapes)]
    return TensorList(
        tensors, partition.num_ragged_dims, feature_shape=padded.feature_shape,
        partition=partition, dtype=padded.dtype,  # (an empty list has no sample to tell it)
    )

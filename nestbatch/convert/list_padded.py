"""Conversions between a list of tensors and the padded layout."""

from __future__ import annotations

from collections.abc import Sequence

from torch.nn.utils.rnn import pad_sequence

from nestbatch.convert.list_packed import list_to_packed
from nestbatch.convert.packed_padded import packed_to_padded
from nestbatch.layouts import Padded, TensorList


def list_to_padded(
    tensor_list: TensorList,
    padding_value: float = 0.0,
    max_shape: Sequence[int | None] | None = None,
) -> Padded:
    """Pad a list of samples into a :class:`Padded` batch.

    On a GPU this goes through the packed rows (one concatenation, one gather) rather than one
    copy kernel per sample, which is what makes it fast for many small samples. On the CPU, with
    one ragged dim, ``pad_sequence`` copies each sample once in a C++ loop, which is faster still.
    """
    partition = tensor_list.partition
    if (
        max_shape is None
        and partition.num_ragged_dims == 1
        and partition.batch_size > 0
        and partition.device.type == "cpu"
    ):
        data = pad_sequence(
            list(tensor_list.tensors), batch_first=True, padding_value=padding_value
        )
        return Padded.trusted(data, tensor_list.partition, padding_value)
    return packed_to_padded(list_to_packed(tensor_list), padding_value, max_shape)


def padded_to_list(padded: Padded) -> TensorList:
    """Per-sample views into a :class:`Padded` batch's data, cropped to each sample's shape.

    Needs the per-sample shapes on the host: reads them once (a sync) if only the device has them.
    """
    partition = padded.partition
    tensors = []
    for i, shape in enumerate(partition.host_shapes):
        sample = padded.data[i]
        for d, size in enumerate(shape):
            sample = sample.narrow(d, 0, size)
        tensors.append(sample)
    return TensorList(
        tensors,
        partition.num_ragged_dims,
        feature_shape=padded.feature_shape,
        partition=partition,
    )

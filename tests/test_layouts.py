"""The layout objects and their shared, lazily derived metadata."""

from __future__ import annotations

import torch

from nestbatch.layouts import Packed, Padded, RowPartition, TensorList


def test_partition_derives_and_caches_metadata():
    partition = RowPartition.from_lengths(torch.tensor([4, 0, 3, 1, 0]))
    assert partition.offsets.tolist() == [0, 4, 4, 7, 8, 8]
    assert partition.row_ids.tolist() == [0, 0, 0, 0, 2, 2, 2, 3]
    assert partition.positions.tolist() == [0, 1, 2, 3, 0, 1, 2, 0]
    assert partition.max_shape == (4,) and partition.total == 8
    assert partition.offsets is partition.offsets and partition.row_ids is partition.row_ids
    assert partition.host_offsets == (0, 4, 4, 7, 8, 8)
    assert partition.mask().tolist()[1] == [False] * 4


def test_partition_with_two_ragged_dims():
    partition = RowPartition.from_shapes(torch.tensor([[2, 3], [1, 2]]))
    assert partition.lengths.tolist() == [6, 2]
    rows, cols = partition.ragged_index
    assert rows.tolist() == [0, 0, 0, 1, 1, 1, 0, 0]
    assert cols.tolist() == [0, 1, 2, 0, 1, 2, 0, 1]
    assert partition.mask((2, 4)).sum((1, 2)).tolist() == [6, 2]
    assert partition.max_shape == (2, 3)


def test_empty_partition():
    partition = RowPartition.from_host_shapes([], 2, torch.device("cpu"))
    assert partition.batch_size == 0 and partition.max_shape == (0, 0) and partition.total == 0
    assert partition.offsets.tolist() == [0] and partition.row_ids.numel() == 0


def test_layouts_share_the_partition_they_are_given():
    values = torch.arange(8.0)
    packed = Packed(values, torch.tensor([0, 4, 4, 7, 8]))
    assert packed.lengths.tolist() == [4, 0, 3, 1]
    assert packed.feature_shape == () and packed.dtype == torch.float32 and len(packed) == 4
    assert packed.partition.total == 8  # known from values, no device read
    padded = Padded(torch.zeros(4, 4), partition=packed.partition)
    assert padded.partition is packed.partition and padded.mask is padded.mask
    assert padded.padded_shape == (4,) and padded.feature_shape == ()
    tensor_list = TensorList([torch.zeros(2, 3)], feature_shape=(9,))
    assert tensor_list.feature_shape == (3,) and tensor_list[0].shape == (2, 3)
    assert TensorList([], feature_shape=(9,)).feature_shape == (9,)
    assert "Packed(batch_size=4" in repr(packed)


def test_partition_moves_devices_with_host_shapes():
    partition = RowPartition.from_host_shapes([(2,), (3,)], 1, torch.device("cpu"))
    moved = partition.to("meta")
    assert moved.device.type == "meta" and moved.host_shapes == ((2,), (3,))
    assert partition.to("cpu") is partition
    chosen = partition.select(torch.tensor([1]))
    assert chosen.host_shapes == ((3,),)

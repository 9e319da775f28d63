"""The layout objects and their shared, lazily derived metadata."""

from __future__ import annotations

import pytest
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


def test_partition_from_a_host_lengths_tensor_derives_what_from_host_lengths_does():
    lengths = [4, 0, 3, 1, 0, 7]
    listed = RowPartition.from_host_lengths(lengths, torch.device("cpu"))
    held = RowPartition.from_host_lengths_tensor(torch.tensor(lengths), torch.device("cpu"))
    assert held.knows_host_shapes and "host_lengths" not in held.__dict__
    assert held.total == 15 and held.max_shape == (7,)  # read from the tensor
    assert held.offsets.tolist() == listed.offsets.tolist()
    assert held.host_lengths == listed.host_lengths and held.host_shapes == listed.host_shapes
    assert held.lengths.tolist() == lengths
    assert held.select(torch.tensor([5, 0])).host_lengths == (7, 4)
    assert held.to("meta").host_lengths == listed.host_lengths
    empty = RowPartition.from_host_lengths_tensor(torch.zeros(0, dtype=torch.int64),
                                                  torch.device("cpu"))
    assert empty.total == 0 and empty.max_shape == (0,) and empty.offsets.tolist() == [0]


def test_partition_from_host_sizes_derives_what_from_host_lengths_does():
    # From the C pass's offsets bytes, as checked_host_sizes hands them over (empty batch
    # included); while fake tensors are made, the pass does not run and the sizes are read in
    # Python (the bytes could not become a fake tensor).
    from gpu_path import fake_cuda

    from nestbatch.checks import checked_host_sizes
    from nestbatch.kernels import host_library

    for lengths in ([4, 0, 3, 1, 0, 7], []):
        host = checked_host_sizes(lengths, "lengths")
        if host.offsets is None:
            pytest.skip(f"no C module: {host_library.status()}")
        made = RowPartition.from_host_sizes(host, torch.device("cpu"), host.largest + 2)
        listed = RowPartition.from_host_lengths(lengths, torch.device("cpu"), traceable=True,
                                                max_len=host.largest + 2, total=host.total)
        assert "offsets" in made.__dict__  # made now: a traced function reads them
        assert made.offsets.dtype == torch.int64
        assert made.offsets.tolist() == listed.offsets.tolist()
        assert made.host_lengths == listed.host_lengths and made.total == host.total
        assert made.max_shape == (host.largest + 2,) and made.knows_host_shapes
        with fake_cuda():  # a factory op only: the offsets are a fake copy on the device
            fake_host = checked_host_sizes(lengths, "lengths")
            assert fake_host.offsets is None and fake_host.sizes == host.sizes
            fake = RowPartition.from_host_sizes(fake_host, torch.device("cuda"), host.largest)
            assert fake.offsets.device.type == "cuda"
            assert fake.offsets.shape == (len(lengths) + 1,)


def test_partition_of_host_offsets_knows_whether_a_sample_is_empty():
    # Offsets in host memory are read without a sync: in Python for few, by tensor ops for many.
    for offsets, expected in (([0, 2, 2, 7], True), ([0, 3, 5, 7], False), ([0], False),
                              (list(range(200)), False), ([*range(100), 99, *range(100, 150)],
                                                            True)):
        for dtype in (torch.int64, torch.int32):
            partition = RowPartition.from_offsets(torch.tensor(offsets, dtype=dtype))
            assert not partition.knows_host_shapes
            assert partition.host_has_empty is expected
    on_meta = RowPartition.from_offsets(torch.tensor([0, 2, 2]).to("meta"))
    assert on_meta.host_has_empty is None  # (elsewhere: reading would be a sync)


def test_clamped_partition_cuts_every_longer_sample():
    for batch in (3, 100):  # lengths listed, then read into a host tensor (many samples)
        lengths = [(7 * b) % 11 for b in range(batch)]
        for make in (RowPartition.from_host_lengths,
                     lambda x, d: RowPartition.from_host_lengths_tensor(torch.tensor(x), d)):
            partition = make(lengths, torch.device("cpu"))
            clamped = partition.clamped(4)
            assert clamped.host_lengths == tuple(min(n, 4) for n in lengths)
            assert clamped.total == sum(min(n, 4) for n in lengths)
            assert clamped.max_shape == (max(min(n, 4) for n in lengths),)
            assert partition.clamped(11) is partition  # no sample is longer


def test_tensor_list_of_uniform_samples_matches_the_general_path():
    # Uniform samples (one dtype, device, number of dims and feature shape) skip normalizing
    # and converting; the result is the same as through the general path.
    samples = [torch.randn(n, 3, 2) for n in (2, 0, 5, 1)]
    for ragged_dims, shapes in ((1, ((2,), (0,), (5,), (1,))),
                                (2, ((2, 3), (0, 3), (5, 3), (1, 3)))):
        for kwargs in ({}, {"dtype": torch.float32, "device": "cpu"}):
            listed = TensorList(samples, ragged_dims, **kwargs)
            assert listed.partition.host_shapes == shapes
            assert listed.feature_shape == (3, 2)[ragged_dims - 1:]
            assert all(a is b for a, b in zip(listed.tensors, samples))  # kept as given
    converted = TensorList(samples, dtype=torch.float64)
    assert converted.dtype == torch.float64 and converted.tensors[0].dtype == torch.float64
    # Not uniform: an empty sample of another shape is normalized, a mismatch explained.
    mixed = TensorList([torch.randn(2, 4), torch.tensor([]), torch.randn(1, 4)])
    assert mixed.partition.host_shapes == ((2,), (0,), (1,)) and mixed.tensors[1].shape == (0, 4)
    with pytest.raises(ValueError, match="same feature shape"):
        TensorList([torch.randn(2, 4), torch.randn(1, 5)])
    with pytest.raises(TypeError, match="mixed dtypes"):
        TensorList([torch.randn(2, 4), torch.randn(1, 4).double()])
    with pytest.raises(TypeError, match=r"tensors\[1\]"):
        TensorList([torch.randn(2, 4), [1.0, 2.0]])

"""`NestedBatch`: constructors, lazy cached layouts, the tensor surface, host-side sizes."""

from __future__ import annotations

import itertools
import pickle

import pytest
import torch
from hypothesis import given
from ragged_strategies import (
    assert_same_samples,
    ragged_samples,
    reference_padded,
)

import nestbatch
from nestbatch import Layout, NestedBatch


def digits():
    return [torch.tensor(row, dtype=torch.int64) for row in ([3, 1, 4, 1], [], [5, 9, 2], [6], [])]


# ----------------------------------------------------------------------------- constructors
def test_tensorflow_factories_agree():
    values = torch.tensor([3, 1, 4, 1, 5, 9, 2, 6])
    expected = [[3, 1, 4, 1], [], [5, 9, 2], [6], []]
    batches = [
        NestedBatch.from_offsets(values, torch.tensor([0, 4, 4, 7, 8, 8])),
        NestedBatch.from_lengths(values, torch.tensor([4, 0, 3, 1, 0])),
        NestedBatch.from_lengths(values, [4, 0, 3, 1, 0]),
        NestedBatch.from_row_ids(values, torch.tensor([0, 0, 0, 0, 2, 2, 2, 3]), num_rows=5),
        NestedBatch.from_list(digits()),
        nestbatch.nested(digits()),
    ]
    for batch in batches:
        assert batch.tolist() == expected
        assert batch.offsets.tolist() == [0, 4, 4, 7, 8, 8]
        assert batch.lengths.tolist() == [4, 0, 3, 1, 0]
        assert batch.row_ids.tolist() == [0, 0, 0, 0, 2, 2, 2, 3]


def test_from_row_ids_without_num_rows_stops_at_last_row():
    batch = NestedBatch.from_row_ids(torch.arange(3.0), torch.tensor([0, 2, 2]))
    assert batch.lengths.tolist() == [1, 0, 2]


def test_from_padded_with_lengths_mask_and_shapes():
    data = torch.tensor([[1, 3, -1, -1], [2, -1, -1, -1], [4, 5, 8, 9]])
    expected = [[1, 3], [2], [4, 5, 8, 9]]
    by_lengths = NestedBatch.from_padded(data, torch.tensor([2, 1, 4]), padding_value=-1)
    by_list = NestedBatch.from_padded(data, [2, 1, 4])
    by_mask = NestedBatch.from_padded(data, mask=data != -1)
    by_shapes = NestedBatch.from_padded(data, shape_per_sample=torch.tensor([[2], [1], [4]]))
    for batch in (by_lengths, by_list, by_mask, by_shapes):
        assert batch.tolist() == expected
        assert batch.padded().data.tolist() == [[1, 3, 0, 0], [2, 0, 0, 0], [4, 5, 8, 9]]
    # The padded data is shared, not copied, and a known filler is not refilled.
    assert by_lengths.padded(-1).data is data
    assert by_list.partition.knows_host_shapes


def test_from_shapes_images_of_different_height_and_width():
    # kaolin's textures: (32, 32, 3) and (64, 16, 3)
    t0, t1 = torch.randn(32, 32, 3), torch.randn(64, 16, 3)
    values = torch.cat([t0.reshape(-1, 3), t1.reshape(-1, 3)])
    batch = NestedBatch.from_shapes(values, torch.tensor([[32, 32], [64, 16]]))
    assert batch.offsets.tolist() == [0, 1024, 2048]
    padded = batch.padded()
    assert padded.data.shape == (2, 64, 32, 3)
    assert torch.equal(padded.data[0, :32, :32], t0) and torch.equal(padded.data[1, :, :16], t1)
    assert padded.mask.shape == (2, 64, 32)
    assert_same_samples(batch.unbind(), [t0, t1])
    assert batch.padded(max_shape=(128, 128)).data.shape == (2, 128, 128, 3)


@given(ragged_samples())
def test_every_constructor_round_trips(case):
    samples, k = case
    reference = NestedBatch.from_list(samples, k)
    packed = reference.packed()
    padded = reference.padded()
    rebuilt = [NestedBatch.from_shapes(packed.values, reference.shape_per_sample)]
    shapes = reference.shape_per_sample
    rebuilt.append(NestedBatch.from_padded(padded.data, shape_per_sample=shapes))
    if k == 1:
        rebuilt += [
            NestedBatch.from_lengths(packed.values, reference.lengths),
            NestedBatch.from_offsets(packed.values, reference.offsets),
            NestedBatch.from_row_ids(packed.values, reference.row_ids, len(samples)),
            NestedBatch.from_padded(padded.data, reference.lengths),
            NestedBatch.from_padded(padded.data, mask=padded.mask),
        ]
    for batch in rebuilt:
        assert_same_samples(batch.unbind(), samples)
        assert torch.equal(batch.padded().data, padded.data)


def test_nested_copies_and_as_nested_keeps_history():
    a = torch.randn(3, 2, requires_grad=True)
    b = torch.randn(1, 2, requires_grad=True)
    copy = nestbatch.nested([a, b], requires_grad=True)
    assert copy.layout is Layout.PACKED and copy.requires_grad
    assert copy.values.grad_fn is None  # a new leaf
    view = nestbatch.as_nested([a, b])
    assert view.layout is Layout.LIST and view.unbind()[0] is a
    view.padded().data.sum().backward()
    assert torch.equal(a.grad, torch.ones_like(a))
    assert nestbatch.as_nested(view) is view
    assert nestbatch.as_nested([a, b], dtype=torch.float64).dtype == torch.float64
    for layout in Layout:
        assert nestbatch.nested([a, b], layout=layout).layout is layout


# ------------------------------------------------------------------------- lazy, cached layouts
def test_layouts_convert_once_and_are_cached():
    batch = nestbatch.nested(digits())
    assert batch.materialized_layouts == (Layout.PACKED,)
    padded = batch.padded()
    assert batch.padded() is padded
    assert batch.materialized_layouts == (Layout.PACKED, Layout.PADDED)
    assert batch.padded(-1) is batch.padded(-1) and batch.padded(-1) is not padded
    assert batch.padded(None) is padded  # any filler accepted
    assert batch.tensor_list() is batch.tensor_list()
    assert batch.packed() is batch.packed()
    as_padded = batch.to(Layout.PADDED)
    assert as_padded.layout is Layout.PADDED and as_padded.padded() is padded


def test_host_sizes_avoid_device_reads():
    # Meta tensors have no values: any read of device memory (what syncs a GPU) fails on them.
    samples = [torch.empty(n, 4, device="meta") for n in (3, 0, 5)]
    batch = nestbatch.as_nested(samples)
    padded = batch.padded()
    assert padded.data.shape == (3, 5, 4) and padded.data.device.type == "meta"
    packed = NestedBatch(padded).packed()
    assert packed.values.shape == (8, 4)
    assert NestedBatch.from_lengths(packed.values, [3, 0, 5], validate=False).padded().data.shape \
        == (3, 5, 4)
    assert NestedBatch.from_padded(padded.data, [3, 0, 5]).packed().values.shape == (8, 4)
    assert batch[:, :2].padded().data.shape == (3, 2, 4)
    assert batch[:, 1:].packed().values.shape == (6, 4)
    assert batch[1:].padded().data.shape == (2, 5, 4)
    assert NestedBatch.from_lengths(packed.values, torch.tensor([3, 0, 5], device="meta"),
                                    max_len=5, validate=False).padded().data.shape == (3, 5, 4)


def test_device_only_sizes_are_read_once(monkeypatch):
    values = torch.arange(6.0)
    batch = NestedBatch.from_offsets(values, torch.tensor([0, 2, 6]), validate=False)
    calls = []
    original = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda t: calls.append(1) or original(t))
    batch.padded()
    batch.unbind()
    batch.padded(-1)
    assert len(calls) <= 2  # max shape once, per-sample shapes once


# ----------------------------------------------------------------------------- tensor surface
def test_shape_has_a_ragged_size_at_the_ragged_dim_as_torch_nested():
    batch = nestbatch.nested([torch.randn(3, 4, 5), torch.randn(1, 4, 5)])
    shape = batch.shape
    assert isinstance(shape, nestbatch.NestedSize) and batch.size() == shape
    assert len(shape) == 4 and shape[0] == 2 and shape[2:] == (4, 5)
    assert repr(shape) == "NestedSize([2, j1, 4, 5])"
    ragged = batch.size(1)
    assert isinstance(ragged, nestbatch.RaggedSize) and ragged == shape[1] and ragged != 3
    assert ragged.sizes.tolist() == [3, 1]
    assert type(shape[-2:]) is torch.Size and shape[-2:] == torch.Size([4, 5])
    assert type(shape[:2]) is nestbatch.NestedSize
    # Equal for every batch of the same samples' sizes (same partition, or host sizes equal).
    assert (batch * 2).shape == shape
    assert nestbatch.nested([torch.randn(3, 4, 5), torch.randn(1, 4, 5)]).shape == shape
    assert nestbatch.nested([torch.randn(2, 4, 5), torch.randn(1, 4, 5)]).shape != shape
    for refuse in (int, range, lambda size: torch.zeros(2, size)):
        with pytest.raises(TypeError, match="RaggedSize|ragged dim"):
            refuse(ragged)
    moved = batch.transpose(1, 2)
    assert repr(moved.shape) == "NestedSize([2, 4, j1, 5])" and moved.size(2) == ragged
    images = nestbatch.nested([torch.randn(2, 3, 1), torch.randn(4, 1, 1)], num_ragged_dims=2)
    assert repr(images.shape) == "NestedSize([2, j1, j2, 1])"
    assert images.size(2).sizes.tolist() == [3, 1]


def test_a_reshape_takes_the_batch_s_own_ragged_size():
    batch = nestbatch.nested([torch.randn(3, 8), torch.randn(1, 8)])
    heads = batch.view(*batch.size()[:2], 2, 4)  # torch.nested's multi-head split
    assert heads.shape[2:] == (2, 4) and heads.shape[1] == batch.shape[1]
    torch.testing.assert_close(heads.unbind()[0], batch.unbind()[0].view(3, 2, 4))
    assert torch.equal(batch.reshape(batch.shape).values, batch.values)
    other = nestbatch.nested([torch.randn(2, 8), torch.randn(1, 8)])
    with pytest.raises(ValueError, match="not this batch's own"):
        batch.view(2, other.size(1), 2, 4)


def test_metadata_surface():
    batch = nestbatch.nested([torch.randn(3, 4, 5), torch.randn(1, 4, 5)])
    assert len(batch) == batch.batch_size == 2
    assert batch.dim() == batch.ndim == 4
    assert batch.feature_shape == (4, 5) and batch.num_ragged_dims == 1
    assert batch.size(0) == 2 and batch.size(2) == 4 and batch.size(-1) == 5
    with pytest.raises(IndexError):
        batch.size(4)
    assert batch.dtype == torch.float32 and batch.device.type == "cpu" and not batch.is_cuda
    assert batch.mask.tolist() == [[True, True, True], [True, False, False]]
    assert batch.max_shape == (3,)
    assert batch.values.shape == (4, 4, 5)


def test_to_dtype_device_detach_clone():
    a, b = torch.randn(3, 2), torch.randn(1, 2)
    batch = nestbatch.as_nested([a, b]).requires_grad_()
    assert batch.requires_grad
    as_double = batch.to(torch.float64)
    assert as_double.dtype == torch.float64 and as_double.layout is Layout.LIST
    assert batch.to("cpu") is batch and batch.cpu() is batch
    assert batch.to(dtype=torch.float32) is batch
    detached = batch.detach()
    assert not detached.requires_grad and detached.unbind()[0].data_ptr() == a.data_ptr()
    cloned = batch.clone()
    assert cloned.unbind()[0].data_ptr() != a.data_ptr()
    assert_same_samples(cloned.detach().unbind(), [a, b])
    packed = nestbatch.nested([a, b])
    assert packed.to(torch.int64).values.dtype == torch.int64
    padded = packed.to(Layout.PADDED)
    assert padded.to(torch.float64).padded(None).data.dtype == torch.float64


def test_requires_grad_and_grad():
    batch = nestbatch.nested([torch.randn(3), torch.randn(2)])
    stale = batch.padded()
    batch.requires_grad_()
    assert batch.padded() is not stale and batch.padded().data.requires_grad
    batch.padded().data.sum().backward()
    grad = batch.grad
    assert isinstance(grad, NestedBatch) and torch.equal(grad.values, torch.ones(5))
    assert nestbatch.nested([torch.randn(2)]).grad is None


def test_unbind_returns_views_like_torch_nested():
    batch = nestbatch.nested([torch.randn(2, 3), torch.randn(3, 3)])
    first = batch.unbind()[0]
    first.mul_(3)
    assert torch.equal(batch.values[:2], first)
    with pytest.raises(ValueError, match="dim 0"):
        batch.unbind(1)
    assert [t.shape for t in batch] == [(2, 3), (3, 3)]


def test_repr_shows_samples_and_metadata():
    text = repr(nestbatch.nested(digits()))
    assert text.startswith("NestedBatch([") and "tensor([3, 1, 4, 1])" in text
    assert "batch_size=5" in text and "layout=packed" in text
    assert "more" in repr(nestbatch.nested([torch.ones(1)] * 10))
    assert repr(nestbatch.nested([])).startswith("NestedBatch([], batch_size=0")


def test_pickle_round_trip():
    batch = nestbatch.nested(digits())
    batch.padded()
    clone = pickle.loads(pickle.dumps(batch))
    assert clone.materialized_layouts == (Layout.PACKED,)
    assert_same_samples(clone.unbind(), batch.unbind())


def test_with_values_and_map_values():
    batch = nestbatch.nested(digits())
    doubled = batch.map_values(lambda v: v * 2 + 1)
    assert doubled.tolist() == [[7, 3, 9, 3], [], [11, 19, 5], [13], []]
    assert doubled.partition is batch.partition
    with pytest.raises(ValueError, match="8 rows"):
        batch.with_values(torch.zeros(3))


@given(ragged_samples(dtypes=(torch.float32, torch.int32, torch.bool)))
def test_padded_of_batch_matches_reference(case):
    samples, k = case
    batch = NestedBatch.from_list(samples, k)
    expected = reference_padded(samples, k, 0, feature_shape=batch.feature_shape,
                                dtype=batch.dtype)
    assert torch.equal(batch.padded().data, expected)
    assert torch.equal(NestedBatch(batch.packed()).padded().data, expected)


@pytest.mark.parametrize("c_pass", [True, False])  # host_library.host_sizes, or Python alone
@pytest.mark.parametrize("count", [3, 200])  # below and above MANY_SIZES (read into C)
def test_many_host_lengths_are_checked_like_few(count, c_pass, monkeypatch):
    if not c_pass:
        monkeypatch.setattr("nestbatch.checks.host_sizes", lambda sizes: None)
    lengths = [i % 5 for i in range(count)]
    values = torch.randn(sum(lengths), 2)
    batch = NestedBatch.from_lengths(values, lengths)
    assert batch.lengths.tolist() == lengths
    assert batch.partition.max_shape == (max(lengths),)
    assert batch.offsets.tolist() == [0, *itertools.accumulate(lengths)]
    padded = NestedBatch.from_padded(batch.to_padded_tensor(), lengths)
    assert torch.equal(padded.packed().values, values)
    with pytest.raises(ValueError, match="non-negative"):
        NestedBatch.from_lengths(values, [-1] + lengths[1:])
    with pytest.raises(ValueError, match="add up to"):
        NestedBatch.from_lengths(values, [1] + lengths[1:])
    with pytest.raises(ValueError, match="max_len"):
        NestedBatch.from_lengths(values, lengths, max_len=max(lengths) - 1)
    with pytest.raises(TypeError, match="bool"):
        NestedBatch.from_lengths(values, [True] + lengths[1:])
    with pytest.raises(ValueError, match="int64|non-negative|add up"):
        NestedBatch.from_lengths(values, [2**70] + lengths[1:])
    with pytest.raises(ValueError, match="do not fit"):
        NestedBatch.from_padded(torch.zeros(count, max(lengths) - 1, 1), lengths)

"""The tensor protocol of a batch where torch (or torch.nested) defines it: ``to``'s arguments,
dtype and storage queries, type names, the ``*_like`` factories' devices, aliases, NumPy
interplay. Found by an audit of the front object against torch.nested and per-sample torch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from nestbatch import Layout, NestedBatch

LAYOUTS = (Layout.PACKED, Layout.PADDED, Layout.LIST)


def _batch(layout: Layout, dtype: torch.dtype = torch.float32) -> NestedBatch:
    samples = [torch.arange(6).reshape(3, 2), torch.zeros(0, 2), torch.arange(4).reshape(2, 2)]
    return NestedBatch.from_list([s.to(dtype) for s in samples]).to(layout)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("call", [
    lambda b: b.to("cpu", torch.float32, False, True),
    lambda b: b.to(torch.float32, False, True),
    lambda b: b.to(torch.zeros(1), False, True),
    lambda b: b.to(copy=True),
])
def test_to_with_copy_true_in_any_place_copies(layout, call):
    batch = _batch(layout)
    copied = call(batch)
    assert copied is not batch
    copied.add_(1)
    assert torch.equal(batch.to_padded_tensor(0.0), _batch(layout).to_padded_tensor(0.0))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_to_returns_the_batch_itself_when_nothing_changes_and_takes_another_batch(layout):
    batch = _batch(layout)
    assert batch.to("cpu") is batch and batch.to(torch.float32, False, False) is batch
    other = _batch(Layout.PACKED, torch.float64)
    assert batch.to(other).dtype == torch.float64


def test_to_of_a_batch_with_no_samples_changes_its_dtype():
    empty = NestedBatch.from_list([], dtype=torch.float32)
    assert empty.to(torch.float64).dtype == torch.float64
    assert empty.to(dtype=torch.int64).dtype == torch.int64
    assert empty.type_as(torch.zeros(1, dtype=torch.int32)).dtype == torch.int32


def test_to_with_a_memory_format_applies_it_to_the_stored_tensor():
    batch = NestedBatch.from_offsets(torch.randn(3, 3, 4, 5), [0, 1, 3])
    moved = batch.to(memory_format=torch.channels_last)
    assert moved.values.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(moved.values, batch.values)


@pytest.mark.parametrize("like", [torch.zeros_like, torch.ones_like, torch.empty_like,
                                  torch.rand_like, torch.randn_like])
def test_like_factories_report_the_device_they_were_asked_for(like):
    batch = NestedBatch.from_padded(torch.zeros(2, 3, 4), [3, 1])  # padded only
    made = like(batch, device="meta")
    assert made.device.type == "meta" and made.stored()[0].device.type == "meta"
    assert made.partition.device.type == "meta"


@pytest.mark.parametrize("filler", [0, 1.0, 1 + 2j, float("nan")])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_complex_batches_pad_with_any_filler(layout, filler):
    samples = [torch.randn(2, 3, dtype=torch.complex64), torch.randn(1, 3, dtype=torch.complex64)]
    padded = NestedBatch.from_list(samples).to(layout).to_padded_tensor(filler)
    assert torch.equal(padded[0], samples[0]) and torch.equal(padded[1, :1], samples[1])
    expected = torch.full((3,), filler, dtype=torch.complex64)
    torch.testing.assert_close(padded[1, 1], expected, equal_nan=True)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.float64, torch.int64, torch.uint8,
                                   torch.bool, torch.complex64])
def test_dtype_and_storage_queries_are_the_samples(layout, dtype):
    batch = _batch(layout, dtype)
    sample = batch.unbind()[0]
    for name in ("is_floating_point", "is_complex", "is_signed", "is_conj", "is_neg",
                 "is_inference", "get_device"):
        assert getattr(batch, name)() == getattr(sample, name)(), name
        assert getattr(torch, name)(batch) == getattr(sample, name)(), name
    assert batch.nelement() == batch.numel() == 10
    assert batch.ndimension() == batch.dim() == 3
    assert batch.is_cpu and batch.itemsize == sample.itemsize
    assert batch.nbytes == 10 * sample.itemsize
    assert batch.type() == sample.type()
    assert batch.type(torch.float64).dtype == torch.float64
    assert batch.type("torch.IntTensor").dtype == torch.int32
    assert torch.result_type(batch, 2.5) == torch.result_type(sample, 2.5)
    assert torch.result_type(batch, batch) == dtype


def test_is_same_size_compares_the_samples_shapes():
    batch = _batch(Layout.PACKED)
    assert torch.is_same_size(batch, _batch(Layout.PADDED) + 1)
    assert batch.is_same_size(_batch(Layout.LIST))
    assert not batch.is_same_size(NestedBatch.from_list([torch.zeros(1, 2)] * 3))
    assert not batch.is_same_size(batch.unsqueeze(-1))
    assert not batch.is_same_size(batch.transpose(1, 2))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_aliases_and_complex_casts_are_torchs_on_every_sample(layout):
    batch = _batch(layout) / 8
    samples = batch.unbind()
    for name in ("arccos", "arcsin", "arctan", "arcsinh", "fix", "i0", "isreal", "cfloat",
                 "cdouble", "resolve_conj", "resolve_neg"):
        got = getattr(batch, name)().unbind()
        assert all(torch.equal(g, getattr(s, name)()) for g, s in zip(got, samples)), name
    for func in (torch.special.expit, torch.special.ndtr, torch.special.i1, torch.special.entr,
                 torch.special.log_ndtr, torch.celu, torch.selu):
        got = func(batch).unbind()
        assert all(torch.equal(g, func(s)) for g, s in zip(got, samples)), func
    got = torch.threshold(batch, 0.2, -1.0).unbind()
    assert all(torch.equal(g, torch.threshold(s, 0.2, -1.0)) for g, s in zip(got, samples))
    assert torch.equal(torch.dropout(batch, 0.5, False).values, batch.values)
    assert torch.dropout(batch, 1.0, True).values.abs().sum() == 0
    adjoint = _batch(layout, torch.complex64).adjoint()
    for g, s in zip(adjoint.unbind(), _batch(layout, torch.complex64).unbind()):
        assert torch.equal(g, s.adjoint())


@pytest.mark.parametrize("layout", LAYOUTS)
def test_shift_operators_are_torchs_on_every_sample(layout):
    batch = _batch(layout, torch.int64)
    samples = [s.clone() for s in batch.unbind()]
    for got, expect in ((batch << 1, [s << 1 for s in samples]),
                        (batch >> 1, [s >> 1 for s in samples]),
                        (1 << batch, [1 << s for s in samples]),
                        (torch.bitwise_left_shift(batch, 2), [s << 2 for s in samples])):
        assert all(torch.equal(g, e) for g, e in zip(got.unbind(), expect))
    batch <<= 1
    assert all(torch.equal(g, s << 1) for g, s in zip(batch.unbind(), samples))


def test_in_asks_whether_any_element_equals_and_numpy_defers_to_the_batch():
    batch = _batch(Layout.PACKED)
    assert 5.0 in batch and 100.0 not in batch and torch.tensor(3.0) in batch
    with pytest.raises(RuntimeError, match="Tensor or scalar"):
        _ = "a" in batch
    with pytest.raises(TypeError, match="no single NumPy array"):
        np.asarray(batch)
    doubled = np.float64(2.0) * batch
    assert isinstance(doubled, NestedBatch)
    assert all(torch.equal(g, 2 * s) for g, s in zip(doubled.unbind(), batch.unbind()))
    assert isinstance(np.int64(1) + batch, NestedBatch)


def test_share_memory_moves_every_stored_tensor():
    for layout in LAYOUTS:
        batch = _batch(layout)
        assert batch.share_memory_() is batch and batch.is_shared()


def test_torch_load_rebuilds_a_saved_shape_with_its_default_weights_only():
    import io

    batch = _batch(Layout.PACKED)
    for shape in (batch.shape, batch.size(1)):
        buffer = io.BytesIO()
        torch.save(shape, buffer)
        buffer.seek(0)
        assert torch.load(buffer) == shape

"""Layout conversions against a per-sample loop; round trips; gradients."""

from __future__ import annotations

import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st
from ragged_strategies import (
    assert_same_samples,
    ragged_samples,
    reference_packed,
    reference_padded,
)
from torch.nn.utils.rnn import pad_sequence

from nestbatch import conversions as convert
from nestbatch.conversions import list_padded
from nestbatch.layouts import Packed, Padded, TensorList


def _layouts(samples, k):
    tensor_list = TensorList(samples, k)
    packed = convert.list_to_packed(tensor_list)
    return tensor_list, packed


@given(ragged_samples(), st.sampled_from([0.0, -1.0, 7.0]))
def test_list_packed_padded_list_round_trip(case, padding_value):
    samples, k = case
    assume(not (samples and samples[0].dtype == torch.uint8 and padding_value < 0))
    tensor_list, packed = _layouts(samples, k)
    padded = convert.packed_to_padded(packed, padding_value)
    back = convert.padded_to_list(convert.packed_to_padded(convert.padded_to_packed(padded)))
    assert_same_samples(back.tensors, samples)
    assert_same_samples(convert.packed_to_list(packed).tensors, samples)


@given(ragged_samples(), st.sampled_from([0.0, -1.0]))
def test_padded_matches_loop_reference(case, padding_value):
    samples, k = case
    assume(not (samples and samples[0].dtype == torch.uint8 and padding_value < 0))
    tensor_list, packed = _layouts(samples, k)
    expected = reference_padded(samples, k, padding_value, feature_shape=tensor_list.feature_shape,
                                dtype=tensor_list.dtype)
    for padded in (
        convert.packed_to_padded(packed, padding_value),
        convert.list_to_padded(tensor_list, padding_value),
    ):
        assert padded.data.dtype == tensor_list.dtype
        assert torch.equal(padded.data, expected)
        assert padded.padding_value == padding_value


@given(ragged_samples())
def test_packed_matches_loop_reference(case):
    samples, k = case
    tensor_list, packed = _layouts(samples, k)
    if samples:
        assert torch.equal(packed.values, reference_packed(samples, k))
    assert packed.values.shape == (sum(s.shape[:k].numel() for s in samples),
                                   *tensor_list.feature_shape)
    padded = convert.list_to_padded(tensor_list)
    assert torch.equal(convert.padded_to_packed(padded).values, packed.values)


@given(ragged_samples(dtypes=(torch.float32, torch.int64)), st.data())
def test_larger_max_shape(case, data):
    samples, k = case
    tensor_list, packed = _layouts(samples, k)
    largest = packed.partition.max_shape
    extra = data.draw(st.lists(st.integers(0, 3), min_size=k, max_size=k))
    target = [n + e for n, e in zip(largest, extra)]
    # kaolin's max_shape: None or -1 entries mean "use the maximum".
    request = [None if e == 0 and d % 2 else (-1 if e == 0 else n) for d, (n, e) in
               enumerate(zip(target, extra))]
    padded = convert.packed_to_padded(packed, 5, request)
    assert tuple(padded.padded_shape) == tuple(target)
    assert torch.equal(padded.data, reference_padded(samples, k, 5, target,
                                                     tensor_list.feature_shape, tensor_list.dtype))
    assert_same_samples(convert.padded_to_list(padded).tensors, samples)


def test_max_shape_smaller_than_largest_sample_is_refused():
    tensor_list, packed = _layouts([torch.ones(3), torch.ones(1)], 1)
    with pytest.raises(ValueError, match="smaller than the largest"):
        convert.packed_to_padded(packed, 0, [2])
    with pytest.raises(ValueError, match="one entry per ragged dim"):
        convert.packed_to_padded(packed, 0, [4, 4])


@given(ragged_samples(dtypes=(torch.float32,)))
def test_conversions_share_partition_and_keep_device_dtype(case):
    samples, k = case
    tensor_list, packed = _layouts(samples, k)
    padded = convert.packed_to_padded(packed)
    for layout in (packed, padded, convert.padded_to_packed(padded), convert.to_list(padded)):
        assert layout.partition is tensor_list.partition
        assert layout.dtype == torch.float32 and layout.device.type == "cpu"


def test_list_views_share_storage():
    tensor_list, packed = _layouts([torch.arange(3.0), torch.arange(2.0)], 1)
    views = convert.packed_to_list(packed).tensors
    assert views[1].data_ptr() == packed.values[3:].data_ptr()
    padded = convert.packed_to_padded(packed)
    assert convert.padded_to_list(padded).tensors[1].data_ptr() == padded.data[1].data_ptr()


def test_generic_entry_points():
    tensor_list, packed = _layouts([torch.arange(3.0), torch.arange(2.0)], 1)
    assert convert.to_packed(packed) is packed
    assert isinstance(convert.to_padded(tensor_list), Padded)
    assert isinstance(convert.to_packed(tensor_list), Packed)
    assert isinstance(convert.to_list(packed), TensorList)
    refilled = convert.to_padded(convert.to_padded(packed, 0.0), -1.0)
    assert refilled.data[1, 2] == -1


def test_refill_padding_reuses_when_filler_matches():
    tensor_list, packed = _layouts([torch.ones(2, 3), torch.ones(1, 3)], 1)
    padded = convert.packed_to_padded(packed, 0.0)
    assert convert.refill_padding(padded, 0.0) is padded
    refilled = convert.refill_padding(padded, 9.0)
    assert torch.equal(refilled.data[1, 1], torch.full((3,), 9.0))
    assert torch.equal(refilled.data[:, :1], padded.data[:, :1])


# --------------------------------------------------------------------------------- gradients
def _double_samples(shapes, feature=(2,)):
    generator = torch.Generator().manual_seed(0)
    return [torch.randn(*s, *feature, dtype=torch.float64, generator=generator,
                        requires_grad=True) for s in shapes]


@pytest.mark.parametrize("shapes,k", [
    ([(3,), (0,), (2,)], 1),
    ([(2, 3), (1, 1), (0, 2)], 2),
    ([], 1),
])
def test_gradcheck_every_conversion(shapes, k):
    samples = _double_samples(shapes)

    def list_to_padded(*tensors):
        return convert.list_to_padded(TensorList(list(tensors), k), -1.0).data

    def list_to_packed(*tensors):
        return convert.list_to_packed(TensorList(list(tensors), k)).values

    def padded_round_trip(*tensors):
        padded = convert.list_to_padded(TensorList(list(tensors), k), 3.0)
        return convert.padded_to_packed(padded).values

    def padded_to_list(*tensors):
        padded = convert.list_to_padded(TensorList(list(tensors), k))
        return tuple(convert.padded_to_list(padded).tensors)

    def packed_to_list(*tensors):
        packed = convert.list_to_packed(TensorList(list(tensors), k))
        return tuple(convert.packed_to_list(packed).tensors)

    if not samples:
        return
    for fn in (list_to_padded, list_to_packed, padded_round_trip, padded_to_list,
               packed_to_list):
        assert torch.autograd.gradcheck(fn, tuple(samples))


def test_padded_slots_get_zero_gradient():
    values = torch.randn(4, 2, dtype=torch.float64, requires_grad=True)
    packed = Packed(values, torch.tensor([0, 3, 3, 4]))
    padded = convert.packed_to_padded(packed, 0.0)
    padded.data.backward(torch.ones_like(padded.data))
    assert torch.equal(values.grad, torch.ones_like(values))
    # And the other way: gradient of packing puts zeros in the padded slots.
    data = torch.randn(3, 3, 2, dtype=torch.float64, requires_grad=True)
    packed = convert.padded_to_packed(Padded(data, torch.tensor([3, 0, 1])))
    packed.values.sum().backward()
    assert torch.equal(data.grad, Padded(data, torch.tensor([3, 0, 1])).mask[..., None]
                       .expand_as(data).double())


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
def test_list_to_padded_takes_either_cpu_route_with_the_same_result(dtype):
    # Many small samples go through the packed rows, few or large ones through pad_sequence.
    generator = torch.Generator().manual_seed(4)
    for batch, feature in ((list_padded.PACKED_ROUTE_SAMPLES, 3), (8, 3), (64, 2048)):
        lengths = torch.randint(0, 6, (batch,), generator=generator).tolist()
        samples = [(torch.randn(n, feature, generator=generator) * 4).to(dtype) for n in lengths]
        listed = TensorList(samples)
        assert list_padded._packed_route_pays(listed) == (feature == 3 and batch >= 64)
        filler = True if dtype == torch.bool else 7
        padded = list_padded.list_to_padded(listed, filler)
        expected = pad_sequence(samples, batch_first=True, padding_value=filler)
        assert padded.data.dtype == dtype and torch.equal(padded.data, expected)
        assert padded.padding_value == filler

"""Bad input gets a clear exception naming the argument and what was expected."""

from __future__ import annotations

import pytest
import torch

import nestbatch
from nestbatch import NestedBatch, Packed, Padded, TensorList


def test_samples_with_different_number_of_dims():
    with pytest.raises(ValueError, match="same number of dims: sample 0 has 2, sample 1 has 3"):
        nestbatch.nested([torch.randn(50, 128), torch.randn(3, 128, 64)])


def test_samples_with_different_feature_shapes():
    with pytest.raises(ValueError, match=r"same feature shape.*\(128,\).*\(64,\)"):
        nestbatch.nested([torch.randn(5, 128), torch.randn(3, 64)])


def test_fewer_dims_than_ragged_dims():
    with pytest.raises(ValueError, match="fewer than num_ragged_dims=2"):
        TensorList([torch.randn(5)], num_ragged_dims=2)


def test_mixed_dtypes_need_explicit_dtype():
    samples = [torch.ones(2), torch.ones(3, dtype=torch.float64)]
    with pytest.raises(TypeError, match="mixed dtypes.*pass dtype="):
        nestbatch.nested(samples)
    assert nestbatch.nested(samples, dtype=torch.float64).dtype == torch.float64


def test_mixed_devices_need_explicit_device():
    samples = [torch.ones(2), torch.ones(3, device="meta")]
    with pytest.raises(ValueError, match="mixed devices.*pass device="):
        nestbatch.nested(samples)
    assert nestbatch.as_nested(samples, device="meta").device.type == "meta"


def test_non_tensor_samples():
    with pytest.raises(TypeError, match=r"tensors\[1\] must be a tensor or \(nested lists of\) "
                       "numbers, got str"):
        nestbatch.nested([torch.ones(2), "ab"])
    with pytest.raises(TypeError, match=r"mixed dtypes.*pass dtype="):
        nestbatch.nested([torch.ones(2), [1, 2]])  # read as torch.as_tensor reads it: int64
    with pytest.raises(TypeError, match="list or tuple of tensors"):
        nestbatch.nested(torch.ones(3, 2))
    with pytest.raises(TypeError, match="as_nested takes"):
        nestbatch.as_nested(3)


@pytest.mark.parametrize("offsets,message", [
    ([0, 4, 2, 7], "non-decreasing"),
    ([1, 4, 7], "start at 0, got 1"),
    ([0, 4, 6], r"end at the number of values \(7\), got 6"),
    ([], "at least one entry"),
])
def test_bad_offsets(offsets, message):
    with pytest.raises(ValueError, match=message):
        NestedBatch.from_offsets(torch.arange(7.0), torch.tensor(offsets, dtype=torch.int64))


def test_float_offsets_and_lengths():
    with pytest.raises(TypeError, match="offsets must be an integer tensor.*float32"):
        Packed(torch.arange(4.0), torch.tensor([0.0, 4.0]))
    with pytest.raises(TypeError, match="lengths must be an integer tensor"):
        NestedBatch.from_lengths(torch.arange(4.0), torch.tensor([4.0]))
    with pytest.raises(TypeError, match="lengths must be an integer tensor"):
        Padded(torch.zeros(1, 4), torch.tensor([4.0]))


def test_negative_lengths():
    with pytest.raises(ValueError, match="lengths must be non-negative"):
        NestedBatch.from_lengths(torch.arange(4.0), torch.tensor([5, -1]))
    with pytest.raises(ValueError, match="lengths must be non-negative"):
        NestedBatch.from_padded(torch.zeros(2, 3), torch.tensor([1, -1]))
    with pytest.raises(ValueError, match="lengths must be non-negative"):
        NestedBatch.from_padded(torch.zeros(2, 3), [1, -1])


def test_lengths_that_do_not_match_values():
    with pytest.raises(ValueError, match="add up to 5 but values has 4 rows"):
        NestedBatch.from_lengths(torch.arange(4.0), [2, 3])
    with pytest.raises(ValueError, match="describes 6 rows but values has 4"):
        Packed(torch.arange(4.0), shape_per_sample=torch.tensor([[2, 3]]))


def test_lengths_that_do_not_fit_the_padded_data():
    with pytest.raises(ValueError, match="do not fit the padded data"):
        NestedBatch.from_padded(torch.zeros(2, 3), torch.tensor([1, 4]))
    with pytest.raises(ValueError, match="do not fit the padded data"):
        NestedBatch.from_padded(torch.zeros(2, 3), [1, 4])
    with pytest.raises(ValueError, match="has 3 entries"):
        NestedBatch.from_padded(torch.zeros(2, 3), [1, 1, 1])
    with pytest.raises(ValueError, match="has 3 entries"):  # a host tensor: read as host sizes
        NestedBatch.from_padded(torch.zeros(2, 3), torch.tensor([1, 1, 1]))


def test_lengths_tensors_that_do_not_fit_the_padded_data(monkeypatch):
    monkeypatch.setattr("nestbatch.checks.HOST_TENSOR_SIZES", 0)  # kept as a tensor
    with pytest.raises(ValueError, match="do not fit the padded data"):
        NestedBatch.from_padded(torch.zeros(2, 3), torch.tensor([1, 4]))
    with pytest.raises(ValueError, match="3 samples but data has batch size 2"):
        NestedBatch.from_padded(torch.zeros(2, 3), torch.tensor([1, 1, 1]))


def test_mask_that_is_not_a_prefix_mask():
    mask = torch.tensor([[True, False, True], [True, True, False]])
    with pytest.raises(ValueError, match=r"prefix mask.*rows \[0\]"):
        NestedBatch.from_padded(torch.zeros(2, 3), mask=mask)
    with pytest.raises(TypeError, match="mask must be a bool tensor"):
        NestedBatch.from_padded(torch.zeros(2, 3), mask=mask.int())
    with pytest.raises(ValueError, match="mask must have shape"):
        NestedBatch.from_padded(torch.zeros(2, 3), mask=mask[:, :2])


def test_row_ids_errors():
    with pytest.raises(ValueError, match="non-decreasing"):
        NestedBatch.from_row_ids(torch.arange(3.0), torch.tensor([1, 0, 1]))
    with pytest.raises(ValueError, match=r"\[0, num_rows=2\)"):
        NestedBatch.from_row_ids(torch.arange(3.0), torch.tensor([0, 1, 2]), num_rows=2)
    with pytest.raises(ValueError, match=r"shape \(3,\)"):
        NestedBatch.from_row_ids(torch.arange(3.0), torch.tensor([0, 1]))
    with pytest.raises(TypeError, match="row_ids must be an integer tensor"):
        NestedBatch.from_row_ids(torch.arange(3.0), torch.tensor([0.0, 1, 1]))


def test_constructor_argument_combinations():
    with pytest.raises(ValueError, match="exactly one of offsets"):
        Packed(torch.arange(3.0))
    with pytest.raises(ValueError, match="exactly one of lengths, mask"):
        NestedBatch.from_padded(torch.zeros(2, 3))
    with pytest.raises(TypeError, match="values must be a torch.Tensor"):
        Packed([1, 2], torch.tensor([0, 2]))
    with pytest.raises(TypeError, match="Packed, Padded or TensorList"):
        NestedBatch(torch.zeros(3))
    with pytest.raises(ValueError, match="at least one dim"):
        Packed(torch.tensor(1.0), torch.tensor([0, 1]))

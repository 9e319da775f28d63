"""A padding value is stored as ``torch.full`` stores it in the batch's dtype (``4.2`` is
``True`` for bool, ``-1`` is ``255`` for ``uint8``, ``2.5`` is ``2`` for integers, ``1e10`` is
``inf`` for float16), and where ``torch.full`` raises, so does every path (a ``ValueError`` naming
``padding_value``, the dtype and the value, also a ``RuntimeError`` as torch's): every layout the
batch is stored in, CPU and (fake) CUDA, the ``kernels`` functions and the RaggedBatch helpers."""

from __future__ import annotations

import pytest
import torch
from gpu_path import fake_cuda, real_values

import nestbatch as nb
from nestbatch import Layout, kernels
from nestbatch.kernels import torch_impl as reference

DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int32, torch.int64, torch.float16,
          torch.bfloat16, torch.float32, torch.float64]
VALUES = [0, 1, -1, 2, 4.2, -4.7, 2.5, -0.5, -0.0, 255, 256, -255, -256, 300, 2**31, -(2**63),
          2**63, 1e6, 1e10, 1e300, float("nan"), float("inf"), -float("inf"), True, False, 1 + 2j]


def _batch(dtype, layout, device="cpu"):
    samples = [torch.zeros(n, 2, device=device).to(dtype) for n in (3, 1, 2)]
    return nb.nested(samples).to(layout)


def _torch_full(value, dtype):
    try:
        return torch.full((), value, dtype=dtype)
    except (RuntimeError, OverflowError):
        return None


@pytest.mark.parametrize("layout", [Layout.LIST, Layout.PACKED, Layout.PADDED])
@pytest.mark.parametrize("dtype", DTYPES)
def test_fillers_are_stored_as_torch_full_stores_them(layout, dtype):
    for value in VALUES:
        expected = _torch_full(value, dtype)
        if expected is None:
            with pytest.raises((ValueError, RuntimeError), match="padding_value") as caught:
                _batch(dtype, layout).padded(value)
            assert isinstance(caught.value, ValueError) and isinstance(caught.value, RuntimeError)
            with pytest.raises(RuntimeError, match="padding_value"):
                _batch(dtype, layout).to_padded_tensor(value)
            continue
        for padded in (_batch(dtype, layout).padded(value).data,
                       _batch(dtype, layout).to_padded_tensor(value)):
            slot = padded[1, 2]  # sample 1 has one row: slot 2 is padding
            same = torch.equal(slot, expected.expand_as(slot)) or (
                expected.is_floating_point() and bool(expected.isnan()) and slot.isnan().all())
            assert same, (value, dtype, slot, expected)
            if expected.is_floating_point() and expected == 0:  # -0.0 keeps its sign
                assert torch.equal(slot.signbit(), expected.signbit().expand_as(slot))


def test_a_filler_that_is_not_a_number_is_a_type_error():
    with pytest.raises(TypeError, match="padding_value must be a number"):
        _batch(torch.int64, Layout.PACKED).padded("x")


@pytest.mark.parametrize("layout", [Layout.PACKED, Layout.PADDED])
def test_fillers_on_fake_cuda(layout):
    with fake_cuda():
        values = torch.zeros(6, 2, dtype=torch.uint8, device="cuda")
        batch = nb.NestedBatch.from_lengths(values, [3, 1, 2]).to(layout)
        with pytest.raises(RuntimeError, match=r"padding_value=300 .*torch.uint8"):
            batch.padded(300)
        assert real_values(batch.padded(-1).data)[1, 2].tolist() == [255, 255]


def test_kernels_cast_fillers_as_torch_and_match_the_reference():
    # The operators' functions keep torch's casting (5 is True for bool); only what torch
    # refuses raises. The CPU fast path (aten's jagged kernels) takes exact fillers only, so it
    # never differs from the reference.
    values = torch.arange(5, dtype=torch.uint8).view(5, 1)
    offsets = torch.tensor([0, 2, 5])
    for filler in (7, 2.5, 255):
        expected = reference.packed_to_padded(values, offsets, 4, filler)
        assert torch.equal(kernels.packed_to_padded(values, offsets, 4, filler), expected)
    with pytest.raises(RuntimeError, match="overflow"):
        kernels.packed_to_padded(values, offsets, 4, 300)
    with pytest.raises(TypeError, match="padding_value"):
        kernels.packed_to_padded(values, offsets, 4, "x")

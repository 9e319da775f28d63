"""A padding value the dtype cannot hold is a ValueError naming ``padding_value``, the dtype and
the value, on every path: every layout the batch is stored in, CPU and (fake) CUDA, the
``kernels`` functions and the RaggedBatch helpers."""

from __future__ import annotations

import pytest
import torch
from gpu_path import fake_cuda

import nestbatch as nb
from nestbatch import Layout, kernels
from nestbatch.kernels import torch_impl as reference

BAD = [
    (torch.uint8, -1), (torch.uint8, 256), (torch.int8, 2.5), (torch.int32, float("nan")),
    (torch.bool, 2), (torch.float16, 1e10), (torch.int64, "x"),
]
GOOD = [(torch.uint8, 255), (torch.int32, 7.0), (torch.bool, True), (torch.float16, -float("inf")),
        (torch.float32, float("nan")), (torch.int64, -(2**63))]


def _batch(dtype, layout, device="cpu"):
    samples = [torch.zeros(n, 2, device=device).to(dtype) for n in (3, 1, 2)]
    return nb.nested(samples).to(layout)


@pytest.mark.parametrize("layout", [Layout.LIST, Layout.PACKED, Layout.PADDED])
@pytest.mark.parametrize("dtype, value", BAD)
def test_bad_fillers_on_every_layout(layout, dtype, value):
    error = TypeError if isinstance(value, str) else ValueError
    with pytest.raises(error, match="padding_value"):
        _batch(dtype, layout).padded(value)
    with pytest.raises(error, match="padding_value"):
        _batch(dtype, layout).to_padded_tensor(value)


@pytest.mark.parametrize("layout", [Layout.PACKED, Layout.PADDED])
def test_bad_fillers_on_fake_cuda(layout):
    with fake_cuda():
        values = torch.zeros(6, 2, dtype=torch.uint8, device="cuda")
        batch = nb.NestedBatch.from_lengths(values, [3, 1, 2]).to(layout)
        with pytest.raises(ValueError, match=r"padding_value=-1 .*torch.uint8"):
            batch.padded(-1)


@pytest.mark.parametrize("layout", [Layout.LIST, Layout.PACKED, Layout.PADDED])
@pytest.mark.parametrize("dtype, value", GOOD)
def test_good_fillers_are_written_exactly(layout, dtype, value):
    padded = _batch(dtype, layout).padded(value).data
    expected = torch.tensor(value, dtype=dtype)
    slot = padded[1, 2]  # sample 1 has one row: slot 2 is padding
    assert torch.equal(slot, expected.expand_as(slot)) or (
        expected.is_floating_point() and torch.isnan(expected) and torch.isnan(slot).all()
    )


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

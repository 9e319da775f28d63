"""A padding value the dtype cannot hold is a ValueError naming ``padding_value``, the dtype and
the value, on every path: every layout the batch is stored in, CPU and (fake) CUDA, the
``kernels`` functions and the RaggedBatch helpers."""

from __future__ import annotations

import pytest
import torch
from gpu_path import fake_cuda

import nestbatch as nb
from nestbatch import Layout, RaggedBatch, kernels

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
        _batch(dtype, layout).to_padded(value)


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


def test_kernels_and_helpers_check_their_fillers():
    values = torch.arange(5, dtype=torch.uint8).view(5, 1)
    offsets = torch.tensor([0, 2, 5])
    with pytest.raises(ValueError, match="padding_value=-1"):
        kernels.packed_to_padded(values, offsets, 4, -1)
    with pytest.raises(ValueError, match="value=300"):
        kernels.fill_padding(values.view(1, 5, 1), torch.tensor([2]), 300)
    data = torch.zeros(2, 4, dtype=torch.uint8)
    indices = RaggedBatch(torch.zeros(2, 3, dtype=torch.int64), sample_sizes=torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="filler_value=-1"):
        nb.batched_indexing_access(data, indices, filler_value=-1)
    with pytest.raises(ValueError, match="filler_value=2.5"):
        nb.batched_inverse_indexing_access(data[:, :3], indices, 4, filler_value=2.5)

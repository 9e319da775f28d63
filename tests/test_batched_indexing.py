"""Tests of the tensor-level primitives in ``nestbatch.compat.batched_indexing``."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nestbatch.compat import batched_indexing as bi

SETTINGS = settings(max_examples=50, deadline=None)


@st.composite
def gather_case(draw):
    """Random ``(data (B, N, *D), indices (B, M), sizes (B,))`` with in-range valid indices."""
    batch = draw(st.integers(0, 4))
    num_entries = draw(st.integers(0, 5))
    width = draw(st.integers(0, 4))
    feature = tuple(draw(st.lists(st.integers(1, 3), max_size=2)))
    dtype = draw(st.sampled_from([torch.float32, torch.float64, torch.int32, torch.int64]))
    index_dtype = draw(st.sampled_from([torch.int32, torch.int64]))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    data = (torch.randn((batch, num_entries) + feature, generator=gen) * 10).to(dtype)
    max_size = width if num_entries > 0 else 0
    sizes = torch.randint(0, max_size + 1, (batch,), generator=gen)
    # Padded slots hold garbage (even out of range) to show they are never read.
    indices = torch.randint(-7, 9, (batch, width), generator=gen)
    if num_entries > 0:
        valid = torch.randint(0, num_entries, (batch, width), generator=gen)
        slot = torch.arange(width) < sizes.unsqueeze(1)
        indices = torch.where(slot, valid, indices)
    return data, indices.to(index_dtype), sizes.to(index_dtype)


def _ref_access(data, indices, sizes, filler):
    out = torch.full(
        (indices.shape[0], indices.shape[1]) + data.shape[2:], filler, dtype=data.dtype
    )
    for b in range(indices.shape[0]):
        for j in range(int(sizes[b])):
            out[b, j] = data[b, int(indices[b, j])]
    return out


@SETTINGS
@given(gather_case(), st.sampled_from([0, -1, 3]))
def test_indexing_access_matches_loop(case, filler):
    data, indices, sizes = case
    out = bi.indexing_access(data, indices, sizes, filler)
    assert torch.equal(out, _ref_access(data, indices, sizes, filler))


def _unique_case(case):
    """Make the valid indices of every sample unique (required for writes)."""
    data, indices, sizes = case
    num_entries = data.shape[1]
    indices = indices.clone()
    for b in range(indices.shape[0]):
        size = min(int(sizes[b]), num_entries)
        sizes[b] = size
        perm = torch.randperm(num_entries)[:size]
        indices[b, :size] = perm.to(indices.dtype)
    return data, indices, sizes


@SETTINGS
@given(gather_case())
def test_indexing_write_and_inverse_match_loop(case):
    into, indices, sizes = _unique_case(case)
    to_write = torch.arange(
        indices.shape[0] * indices.shape[1] * int(torch.tensor(into.shape[2:]).prod())
    ).reshape((indices.shape[0], indices.shape[1]) + into.shape[2:])
    to_write = to_write.to(into.dtype) + 100
    out = bi.indexing_write(to_write, indices, sizes, into)
    expected = into.clone()
    inverse = torch.full_like(into, -5)
    for b in range(indices.shape[0]):
        for j in range(int(sizes[b])):
            expected[b, int(indices[b, j])] = to_write[b, j]
            inverse[b, int(indices[b, j])] = to_write[b, j]
    assert torch.equal(out, expected)
    got = bi.inverse_indexing_access(to_write, indices, sizes, into.shape[1], -5)
    assert torch.equal(got, inverse)


@SETTINGS
@given(gather_case())
def test_index_mapping_matches_loop(case):
    source, src_idx, sizes = case
    target = torch.zeros_like(source) - 1
    _, tgt_idx, tgt_sizes = _unique_case((target, src_idx.clone(), sizes.clone()))
    sizes = torch.minimum(sizes, tgt_sizes)
    out = bi.index_mapping(source, src_idx, tgt_idx, sizes, target)
    expected = target.clone()
    for b in range(sizes.shape[0]):
        for j in range(int(sizes[b])):
            expected[b, int(tgt_idx[b, j])] = source[b, int(src_idx[b, j])]
    assert torch.equal(out, expected)


@SETTINGS
@given(st.integers(0, 4), st.integers(0, 6), st.integers(0, 2**31 - 1))
def test_mask_indices_roundtrip_and_compaction(batch, num_entries, seed):
    gen = torch.Generator().manual_seed(seed)
    mask = torch.rand((batch, num_entries), generator=gen) < 0.5
    indices, counts = bi.mask_to_indices(mask)
    assert indices.dtype == torch.int64 and counts.dtype == torch.int64
    max_count = int(mask.sum(1).max()) if batch else 0
    assert indices.shape == (batch, max_count)
    for b in range(batch):
        expected = torch.nonzero(mask[b]).flatten()
        assert int(counts[b]) == expected.numel()
        assert torch.equal(indices[b, : expected.numel()], expected)
        assert torch.all(indices[b, expected.numel() :] == 0)
    assert torch.equal(bi.indices_to_mask(indices, counts, num_entries), mask)
    data = torch.randn((batch, num_entries, 2), generator=gen)
    out, counts2 = bi.bool_compaction(data, mask)
    assert torch.equal(counts2, counts)
    for b in range(batch):
        c = int(counts[b])
        assert torch.equal(out[b, :c], data[b][mask[b]])
        assert torch.all(out[b, c:] == 0)


@SETTINGS
@given(gather_case(), st.sampled_from([0, 7]))
def test_fill_padding(case, value):
    data, _, sizes = case
    sizes = sizes.clamp(max=data.shape[1])
    out = bi.fill_padding(data, sizes, value)
    expected = data.clone()
    for b in range(data.shape[0]):
        expected[b, int(sizes[b]) :] = value
    assert torch.equal(out, expected)


def test_inputs_not_modified_and_bool_data():
    data = torch.tensor([[True, False, True]])
    indices = torch.tensor([[2, 0]])
    sizes = torch.tensor([1])
    before = data.clone()
    assert torch.equal(
        bi.indexing_access(data, indices, sizes, False), torch.tensor([[True, False]])
    )
    out = bi.indexing_write(torch.tensor([[False, True]]), indices, sizes, data)
    assert torch.equal(out, torch.tensor([[True, False, False]]))
    assert torch.equal(data, before)


def test_gradcheck_primitives():
    gen = torch.Generator().manual_seed(0)
    data = torch.randn(3, 4, 2, dtype=torch.float64, generator=gen, requires_grad=True)
    indices = torch.tensor([[1, 1, 3], [0, 2, 9], [5, 5, 5]])  # duplicates; padded garbage
    sizes = torch.tensor([3, 2, 0])
    into = torch.randn(3, 4, 2, dtype=torch.float64, generator=gen, requires_grad=True)
    values = torch.randn(3, 3, 2, dtype=torch.float64, generator=gen, requires_grad=True)
    unique = torch.tensor([[1, 0, 3], [0, 2, 9], [5, 5, 5]])
    assert torch.autograd.gradcheck(lambda d: bi.indexing_access(d, indices, sizes, 0.5), (data,))
    assert torch.autograd.gradcheck(
        lambda v, i: bi.indexing_write(v, unique, sizes, i), (values, into)
    )
    assert torch.autograd.gradcheck(
        lambda v: bi.inverse_indexing_access(v, unique, sizes, 5, 1.0), (values,)
    )
    assert torch.autograd.gradcheck(
        lambda s, t: bi.index_mapping(s, indices, unique, sizes, t), (data, into)
    )
    mask = torch.tensor([[True, False, True, True], [False] * 4, [True] * 4])
    assert torch.autograd.gradcheck(lambda d: bi.bool_compaction(d, mask)[0], (data,))
    assert torch.autograd.gradcheck(lambda d: bi.fill_padding(d, sizes, 3.0), (data,))


def test_access_gradient_counts_duplicates_and_ignores_padding():
    data = torch.zeros(2, 4, dtype=torch.float64, requires_grad=True)
    indices = torch.tensor([[1, 1, 3], [0, 2, 2]])
    sizes = torch.tensor([3, 1])
    bi.indexing_access(data, indices, sizes, 0).sum().backward()
    assert torch.equal(data.grad, torch.tensor([[0.0, 2, 0, 1], [1, 0, 0, 0]], dtype=torch.float64))


def test_write_gradient_of_overwritten_target_is_zero():
    into = torch.zeros(1, 3, dtype=torch.float64, requires_grad=True)
    values = torch.zeros(1, 2, dtype=torch.float64, requires_grad=True)
    bi.indexing_write(values, torch.tensor([[2, 0]]), torch.tensor([1]), into).sum().backward()
    assert torch.equal(into.grad, torch.tensor([[1.0, 1, 0]], dtype=torch.float64))
    assert torch.equal(values.grad, torch.tensor([[1.0, 0]], dtype=torch.float64))

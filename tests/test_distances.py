"""``F.cosine_similarity`` and ``F.pairwise_distance`` (and their modules) on batches: torch's on
every sample, over a feature dim (a batch) and over the ragged dim (one value per sample)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import nestbatch
from nestbatch import Layout, NestedBatch

LAYOUTS = (Layout.PACKED, Layout.PADDED, Layout.LIST)


def _pair(lengths, features, dtype=torch.float64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    make = lambda: [torch.randn(n, *features, generator=gen, dtype=dtype)  # noqa: E731
                    for n in lengths]
    return make(), make()


def _sample(result, i):
    return result.unbind()[i] if isinstance(result, NestedBatch) else result[i]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 4), min_size=1, max_size=4), st.integers(1, 3),
       st.sampled_from(LAYOUTS), st.integers(0, 2**16))
def test_cosine_similarity_over_every_dim_is_torchs_per_sample(lengths, width, layout, seed):
    s1, s2 = _pair(lengths, (width, 2), seed=seed)
    a = NestedBatch.from_list(s1).to(layout)
    b = NestedBatch.from_list(s2).to(layout)
    for dim in (1, 2, 3, -1):
        got = F.cosine_similarity(a, b, dim=dim)
        for i, (x, y) in enumerate(zip(s1, s2)):
            expected = F.cosine_similarity(x, y, dim=dim - 1 if dim > 0 else dim)
            torch.testing.assert_close(_sample(got, i), expected)


def test_cosine_similarity_with_a_dense_operand_and_a_moved_ragged_dim():
    s1, s2 = _pair([3, 1, 4], (5,))
    a, b = nestbatch.nested(s1), nestbatch.nested(s2)
    w = torch.randn(5, dtype=torch.float64)
    got = F.cosine_similarity(a, w, dim=-1)
    for i, x in enumerate(s1):
        torch.testing.assert_close(got.unbind()[i], F.cosine_similarity(x, w, dim=-1))
    moved = F.cosine_similarity(a.transpose(1, 2), b.transpose(1, 2), dim=2)  # (the ragged dim)
    for i, (x, y) in enumerate(zip(s1, s2)):
        torch.testing.assert_close(moved[i], F.cosine_similarity(x.T, y.T, dim=1))


def test_cosine_similarity_clamps_zero_norms_and_casts_integers_as_torch():
    zeros = nestbatch.nested([torch.zeros(2, 3), torch.zeros(1, 3)])
    assert torch.equal(F.cosine_similarity(zeros, zeros, dim=2).values, torch.zeros(3))
    ints = nestbatch.nested([torch.tensor([[1, 2]]), torch.tensor([[3, 0], [1, 1]])])
    floats = ints.float()
    got = F.cosine_similarity(ints, floats, dim=-1)
    assert got.dtype == torch.float32
    with pytest.raises(RuntimeError, match="floating point"):
        F.cosine_similarity(ints, ints, dim=-1)


def test_pairwise_distance_is_torchs_per_sample():
    s1, s2 = _pair([3, 0, 2], (4,))
    a, b = nestbatch.nested(s1), nestbatch.nested(s2)
    for p, keepdim in ((2.0, False), (1.0, True), (float("inf"), False)):
        got = F.pairwise_distance(a, b, p=p, keepdim=keepdim)
        for i, (x, y) in enumerate(zip(s1, s2)):
            expected = F.pairwise_distance(x, y, p=p, keepdim=keepdim)
            torch.testing.assert_close(got.unbind()[i], expected)
    # the last dim ragged: one distance per sample
    moved = F.pairwise_distance(a.transpose(1, 2), b.transpose(1, 2))
    for i, (x, y) in enumerate(zip(s1, s2)):
        torch.testing.assert_close(moved[i], F.pairwise_distance(x.T, y.T))


def test_the_modules_and_gradients():
    s1, s2 = _pair([3, 2], (4,))
    a, b = nestbatch.nested(s1), nestbatch.nested(s2)
    assert torch.nn.CosineSimilarity(dim=2)(a, b).shape == (2, a.size(1))
    assert torch.nn.PairwiseDistance()(a, b).shape == (2, a.size(1))
    values = a.values.clone().requires_grad_()
    for dim in (1, 2):
        assert torch.autograd.gradcheck(
            lambda v, d=dim: _dense(F.cosine_similarity(a.with_values(v), b, dim=d)), (values,))
    assert torch.autograd.gradcheck(
        lambda v: F.pairwise_distance(a.with_values(v), b).values, (values,))


def _dense(result):
    return result.values if isinstance(result, NestedBatch) else result


def test_cosine_similarity_over_a_ragged_dim_moved_to_the_last_of_four():
    s1, s2 = _pair([2, 4], (3, 2))
    a = nestbatch.nested(s1).permute(0, 2, 3, 1)  # (B, 3, 2, j)
    b = nestbatch.nested(s2).permute(0, 2, 3, 1)
    got = F.cosine_similarity(a, b, dim=3)
    for i, (x, y) in enumerate(zip(s1, s2)):
        torch.testing.assert_close(got[i], F.cosine_similarity(x, y, dim=0))


def test_cosine_similarity_compiles_in_one_graph():
    batch = NestedBatch.from_lengths(torch.randn(4, 4), [1, 3])
    compiled = torch.compile(lambda b: F.cosine_similarity(b, b, dim=2), backend="eager",
                             fullgraph=True)
    torch.testing.assert_close(compiled(batch).values, F.cosine_similarity(batch, batch,
                                                                           dim=2).values)

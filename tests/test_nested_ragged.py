"""Nested raggedness against the TF ragged guide (seeds/003) and per-row loops."""

from __future__ import annotations

import pytest
import torch

import nestbatch as nb
from nestbatch import NestedBatch

GUIDE_VALUES = torch.arange(10, 20)
GUIDE_SPLITS = ([0, 1, 1, 5], [0, 3, 3, 5, 9, 10])
GUIDE_LIST = [[[10, 11, 12]], [], [[], [13, 14], [15, 16, 17, 18], [19]]]


def test_the_guides_example():
    rt = NestedBatch.from_nested_row_splits(GUIDE_VALUES, GUIDE_SPLITS)
    assert isinstance(rt, NestedBatch) and rt.ragged_rank == 2 and len(rt) == 3
    assert rt.tolist() == GUIDE_LIST == rt.to_list()
    assert [s.tolist() for s in rt.nested_row_splits] == [list(s) for s in GUIDE_SPLITS]
    assert [s.tolist() for s in rt.nested_row_lengths()] == [[1, 0, 4], [3, 0, 2, 4, 1]]
    assert torch.equal(rt.flat_values, GUIDE_VALUES)
    # One level down: the rows of the outermost level (TF's rt.values).
    assert rt.values.tolist() == [[10, 11, 12], [], [13, 14], [15, 16, 17, 18], [19]]
    same = NestedBatch.from_nested_row_lengths(GUIDE_VALUES, ([1, 0, 4], [3, 0, 2, 4, 1]))
    assert same.tolist() == GUIDE_LIST
    # TF's rt[i] and slices.
    assert rt[2].tolist() == GUIDE_LIST[2] and rt[-3].tolist() == GUIDE_LIST[0]
    assert rt[1:].tolist() == GUIDE_LIST[1:] and rt[:0].tolist() == []


def _reference_to_tensor(nested, default):
    depth_max = [len(nested), max((len(d) for d in nested), default=0)]
    width = max((len(s) for d in nested for s in d), default=0)
    out = torch.full((depth_max[0], depth_max[1], width), default)
    for i, d in enumerate(nested):
        for j, s in enumerate(d):
            out[i, j, : len(s)] = torch.tensor(s, dtype=out.dtype)
    return out


def test_to_tensor_pads_every_ragged_dim_to_its_maximum():
    rt = NestedBatch.from_nested_row_splits(GUIDE_VALUES, GUIDE_SPLITS)
    assert torch.equal(rt.to_tensor(-1), _reference_to_tensor(GUIDE_LIST, -1))
    assert torch.equal(rt.to_padded_tensor(0), _reference_to_tensor(GUIDE_LIST, 0))


@pytest.mark.parametrize("name", ["sum", "mean", "amax", "amin"])
def test_reductions_over_the_innermost_ragged_dim(name):
    gen = torch.Generator().manual_seed(1)
    values = torch.randn(10, 3, generator=gen, dtype=torch.float64)
    rt = NestedBatch.from_nested_row_splits(values, GUIDE_SPLITS)
    reduced = getattr(torch, name)(rt, dim=2)
    assert isinstance(reduced, NestedBatch) and reduced.lengths.tolist() == [1, 0, 4]
    method = getattr(rt, name)(2)
    torch.testing.assert_close(method.values, reduced.values, equal_nan=True)
    rows = values.split([3, 0, 2, 4, 1])
    for got, row in zip(reduced.values, rows):
        if len(row):
            torch.testing.assert_close(got, getattr(torch, name)(row, 0))
    with pytest.raises(ValueError, match="dim 0"):
        torch.sum(rt, dim=0)


def test_ragged_rank_three_and_gradients():
    values = torch.randn(6, 2, dtype=torch.float64, requires_grad=True)
    rt = NestedBatch.from_nested_row_lengths(values, ([2, 1], [1, 2, 0], [2, 1, 3]))
    assert rt.ragged_rank == 3 and rt.values.ragged_rank == 2
    assert rt.to_tensor(0.0).shape == (2, 2, 2, 3, 2)
    assert rt.sum(3).ragged_rank == 2
    assert rt[0].ragged_rank == 2 and rt[1].tolist() == [[]]
    torch.autograd.gradcheck(
        lambda v: NestedBatch.from_nested_row_lengths(
            v, ([2, 1], [1, 2, 0], [2, 1, 3])).to_tensor(0.0), (values,))


def test_validation_at_every_level_as_tfs():
    with pytest.raises(ValueError):
        NestedBatch.from_nested_row_splits(GUIDE_VALUES, ([1, 1, 5], [0, 3, 3, 5, 9, 10]))
    with pytest.raises(ValueError):
        NestedBatch.from_nested_row_splits(GUIDE_VALUES, ([0, 1, 1, 4], [0, 3, 3, 5, 9, 10]))
    with pytest.raises(ValueError):
        NestedBatch.from_nested_row_splits(GUIDE_VALUES, ([0, 1, 1, 5], [0, 3, 2, 5, 9, 10]))
    with pytest.raises(ValueError):
        NestedBatch.from_nested_row_splits(GUIDE_VALUES, ([0, 1, 1, 5], [0, 3, 3, 5, 9, 11]))
    with pytest.raises(TypeError):
        NestedBatch.from_nested_row_splits(GUIDE_VALUES, ([0.0, 1.0], [0, 10]))
    with pytest.raises(TypeError):
        NestedBatch.from_nested_row_lengths(GUIDE_VALUES, torch.tensor([10]))
    with pytest.raises(ValueError):
        NestedBatch.from_nested_row_lengths(GUIDE_VALUES, ([1, 0, 4], [3, 0, 2, 4, -1]))


def test_one_level_is_an_ordinary_batch_with_the_tf_names():
    rt = NestedBatch.from_nested_row_splits(torch.arange(7), ([0, 4, 4, 6, 7],))
    assert type(rt) is NestedBatch and rt.ragged_rank == 1
    assert rt.tolist() == [[0, 1, 2, 3], [], [4, 5], [6]]
    assert torch.equal(rt.flat_values, torch.arange(7))
    assert rt.nested_row_splits[0].tolist() == [0, 4, 4, 6, 7]
    assert rt.nested_row_lengths()[0].tolist() == [4, 0, 2, 1]
    images = nb.nested([torch.ones(2, 3)], num_ragged_dims=2)
    with pytest.raises(ValueError, match="nested row splits"):
        _ = images.nested_row_splits

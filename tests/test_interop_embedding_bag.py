"""nn.EmbeddingBag / F.embedding_bag on a NestedBatch of indices, against cat + offsets."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import nestbatch

SENTENCES = [torch.tensor([0, 3, 1]), torch.tensor([5, 1, 2, 4]), torch.tensor([3, 2])]


def _manual(sentences):
    data = torch.cat(sentences)
    offsets = torch.tensor([0] + [len(x) for x in sentences[:-1]]).cumsum(0)
    return data, offsets


@pytest.mark.parametrize("mode", ["mean", "sum", "max"])
def test_module_matches_manual_offsets(mode):
    torch.manual_seed(0)
    bag = nn.EmbeddingBag(10, 3, mode=mode)
    data, offsets = _manual(SENTENCES)
    assert torch.equal(bag(nestbatch.nested(SENTENCES)), bag(data, offsets))


@pytest.mark.parametrize("mode", ["mean", "sum", "max"])
def test_functional_with_empty_bags(mode):
    weight = torch.randn(10, 4, dtype=torch.float64)
    sentences = [torch.tensor([1, 2]), torch.tensor([], dtype=torch.long), torch.tensor([7])]
    data, offsets = _manual(sentences)
    ours = F.embedding_bag(nestbatch.nested(sentences), weight, mode=mode, padding_idx=2)
    assert torch.equal(ours, F.embedding_bag(data, weight, offsets, mode=mode, padding_idx=2))


def test_per_sample_weights_as_nested_batch_and_gradients():
    weight = torch.randn(10, 3, dtype=torch.float64, requires_grad=True)
    scores = [torch.rand(len(s), dtype=torch.float64) for s in SENTENCES]
    data, offsets = _manual(SENTENCES)
    ours = F.embedding_bag(
        nestbatch.nested(SENTENCES), weight, mode="sum",
        per_sample_weights=nestbatch.nested(scores),
    )
    ref = F.embedding_bag(data, weight, offsets, mode="sum", per_sample_weights=torch.cat(scores))
    assert torch.equal(ours, ref)
    torch.autograd.gradcheck(
        lambda w: F.embedding_bag(nestbatch.nested(SENTENCES), w, mode="mean"), (weight,)
    )


def test_argument_errors():
    weight = torch.randn(10, 3)
    batch = nestbatch.nested(SENTENCES)
    with pytest.raises(ValueError, match="offsets"):
        F.embedding_bag(batch, weight, torch.tensor([0, 3, 7]))
    with pytest.raises(ValueError, match="feature"):
        F.embedding_bag(nestbatch.nested([torch.ones(2, 2, dtype=torch.long)]), weight)
    with pytest.raises(ValueError, match="structure"):
        F.embedding_bag(batch, weight, mode="sum", per_sample_weights=nestbatch.nested(
            [torch.ones(3)]))


def test_refuses_weights_of_other_lengths_and_two_ragged_dims():
    # Weights of lengths [1, 2] on indices of lengths [2, 1] (the same total) were applied by
    # position; indices ragged in two dims were pooled per sample.
    weight = torch.randn(10, 3)
    indices = nestbatch.nested([torch.tensor([1, 2]), torch.tensor([3])])
    weights = nestbatch.nested([torch.tensor([0.5]), torch.tensor([1.0, 2.0])])
    with pytest.raises(ValueError, match="same row structure"):
        F.embedding_bag(indices, weight, mode="sum", per_sample_weights=weights)
    grid = nestbatch.nested([torch.ones(2, 2, dtype=torch.long),
                             torch.ones(1, 3, dtype=torch.long)], num_ragged_dims=2)
    with pytest.raises(ValueError, match="one ragged dim"):
        F.embedding_bag(grid, weight)

"""``F.batch_norm`` / ``nn.BatchNorm*d`` of a batch with channels at dim 1 and a ragged spatial
dim: torch's batch norm of all the samples' elements together (padding excluded), running
statistics included."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import nestbatch
from nestbatch import Layout, NestedBatch


def _samples(lengths, *features, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(n, *features, generator=gen, dtype=torch.float64) for n in lengths]


@pytest.mark.parametrize("layout", (Layout.PACKED, Layout.PADDED, Layout.LIST))
@pytest.mark.parametrize("training", (True, False))
def test_batch_norm_1d_over_a_ragged_length_is_torchs_over_all_elements(layout, training):
    samples = _samples([4, 1, 0, 6], 3)
    batch = NestedBatch.from_list(samples).to(layout).transpose(1, 2)  # (B, C, j)
    ours, theirs = torch.nn.BatchNorm1d(3).double(), torch.nn.BatchNorm1d(3).double()
    with torch.no_grad():
        ours.running_mean.fill_(0.5)
        ours.weight.uniform_(0.5, 1.5)
    theirs.load_state_dict(ours.state_dict())
    ours.train(training)
    theirs.train(training)
    got = ours(batch)
    joined = torch.cat([s.T for s in samples], 1).unsqueeze(0)  # (1, C, sum L)
    expected = theirs(joined)[0]
    torch.testing.assert_close(torch.cat(got.unbind(), 1), expected)
    torch.testing.assert_close(ours.running_mean, theirs.running_mean)
    torch.testing.assert_close(ours.running_var, theirs.running_var)
    assert got.ragged_dim == 2 and [t.shape for t in got.unbind()] == [s.T.shape for s in samples]


def test_batch_norm_2d_with_a_ragged_height_and_sizes_on_the_device():
    samples = _samples([2, 5], 3, 4)  # (H_i, C, W) stored, presented (C, H_i, W)
    values = torch.cat(samples)
    batch = NestedBatch.from_offsets(values, torch.tensor([0, 2, 7])).permute(0, 2, 1, 3)
    got = F.batch_norm(batch, None, None, training=True)
    joined = torch.cat([s.permute(1, 0, 2) for s in samples], 1).unsqueeze(0)
    expected = F.batch_norm(joined, None, None, training=True)[0]
    torch.testing.assert_close(torch.cat(got.unbind(), 1), expected)


def test_batch_norm_gradient_and_refusal():
    samples = _samples([3, 2], 2)
    lengths = [3, 2]
    weight = torch.rand(2, dtype=torch.float64, requires_grad=True)

    def normed(values, w):
        batch = NestedBatch.from_lengths(values, lengths).transpose(1, 2)
        return F.batch_norm(batch, None, None, w, None, training=True).values

    values = torch.cat(samples).requires_grad_()
    assert torch.autograd.gradcheck(normed, (values, weight))
    with pytest.raises(ValueError, match="channels"):
        torch.nn.BatchNorm1d(2).double()(nestbatch.nested(samples))  # (dim 1 ragged)

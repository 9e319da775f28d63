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


@pytest.mark.parametrize("layout", (Layout.PACKED, Layout.PADDED))
@pytest.mark.parametrize("func, kwargs", [
    (F.group_norm, {"num_groups": 2}), (F.group_norm, {"num_groups": 4}),
    (F.instance_norm, {}),
])
def test_group_and_instance_norm_normalize_every_sample_as_torch(layout, func, kwargs):
    samples = _samples([5, 2, 7], 4, 3)  # (L_i, C, W) stored, presented (C, L_i, W)
    batch = NestedBatch.from_list(samples).to(layout).transpose(1, 2)
    weight, bias = torch.rand(4, dtype=torch.float64), torch.rand(4, dtype=torch.float64)
    got = func(batch, weight=weight, bias=bias, **kwargs)
    for sample, expected in zip(got.unbind(), samples):
        torch.testing.assert_close(
            sample, func(expected.transpose(0, 1).unsqueeze(0), weight=weight, bias=bias,
                         **kwargs)[0])


def test_instance_norm_running_statistics_as_torchs():
    samples = _samples([5, 5, 5], 4)
    batch = nestbatch.nested(samples).transpose(1, 2)
    dense = torch.stack([s.T for s in samples])
    ours = torch.nn.InstanceNorm1d(4, track_running_stats=True).double()
    theirs = torch.nn.InstanceNorm1d(4, track_running_stats=True).double()
    torch.testing.assert_close(torch.stack(ours(batch).unbind()), theirs(dense))
    torch.testing.assert_close(ours.running_mean, theirs.running_mean)
    torch.testing.assert_close(ours.running_var, theirs.running_var)
    ours.eval()
    theirs.eval()
    torch.testing.assert_close(torch.stack(ours(batch).unbind()), theirs(dense))
    # samples of different lengths: each one's mean and unbiased variance, averaged
    ragged = _samples([5, 2, 7], 4, seed=1)
    mean, var = torch.zeros(4, dtype=torch.float64), torch.ones(4, dtype=torch.float64)
    F.instance_norm(nestbatch.nested(ragged).transpose(1, 2), mean, var, momentum=0.5)
    torch.testing.assert_close(mean, 0.5 * torch.stack([s.mean(0) for s in ragged]).mean(0))
    torch.testing.assert_close(
        var, 0.5 + 0.5 * torch.stack([s.var(0) for s in ragged]).mean(0))


def test_a_sample_too_small_raises_as_torch_and_gradients_flow():
    one = nestbatch.nested([torch.randn(1, 4), torch.randn(3, 4)]).transpose(1, 2)
    with pytest.raises(ValueError, match="more than 1 spatial element"):
        F.instance_norm(one)
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        F.group_norm(nestbatch.nested([torch.randn(1, 1), torch.randn(3, 1)]).transpose(1, 2), 1)
    with pytest.raises(RuntimeError, match="divisible by num_groups"):
        F.group_norm(one, 3)
    with pytest.raises(ValueError, match="channels"):
        F.group_norm(nestbatch.nested([torch.randn(3, 4)]), 2)
    values = torch.randn(7, 4, dtype=torch.float64, requires_grad=True)
    for func, extra in ((F.group_norm, (2,)), (F.instance_norm, ())):
        assert torch.autograd.gradcheck(lambda v, f=func, e=extra: f(
            NestedBatch.from_lengths(v, [4, 3]).transpose(1, 2), *e).values, (values,))

"""PackedSequence in and out, against torch.nn.utils.rnn's own packing."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from ragged_strategies import assert_same_samples, ragged_samples
from torch.nn.utils.rnn import (
    pack_padded_sequence,
    pack_sequence,
    pad_packed_sequence,
    pad_sequence,
)

import nestbatch
from nestbatch import NestedBatch


def _samples(lengths, feature=(2,), dtype=torch.float64):
    gen = torch.Generator().manual_seed(sum(lengths) + len(lengths))
    return [torch.randn(n, *feature, generator=gen, dtype=dtype) for n in lengths]


@pytest.mark.parametrize("lengths", [[3, 5, 1, 5], [1], [4, 4, 4], [2, 7]])
def test_to_packed_sequence_matches_pack_sequence(lengths):
    samples = _samples(lengths)
    ours = nestbatch.to_packed_sequence(nestbatch.nested(samples))
    ref = pack_sequence(samples, enforce_sorted=False)
    assert torch.equal(ours.data, ref.data)
    assert torch.equal(ours.batch_sizes, ref.batch_sizes)
    assert torch.equal(ours.sorted_indices, ref.sorted_indices)
    assert torch.equal(ours.unsorted_indices, ref.unsorted_indices)


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("enforce_sorted", [True, False])
def test_from_packed_sequence_keeps_sample_order(batch_first, enforce_sorted):
    lengths = [5, 4, 2, 1] if enforce_sorted else [2, 5, 1, 4]
    samples = _samples(lengths, feature=(3, 2))
    padded = pad_sequence(samples, batch_first=batch_first)
    ps = pack_padded_sequence(
        padded, torch.tensor(lengths), batch_first=batch_first, enforce_sorted=enforce_sorted
    )
    batch = nestbatch.from_packed_sequence(ps)
    assert_same_samples(batch.unbind(), samples)
    assert batch.partition.knows_host_shapes  # lengths from the CPU batch_sizes: no sync later
    assert_same_samples(nestbatch.as_nested(ps).unbind(), samples)


@given(ragged_samples(num_ragged_dims=1, min_batch=1, dtypes=(torch.float32, torch.int64)))
def test_round_trip(case):
    samples, _ = case
    samples = [s for s in samples if len(s)] or [torch.ones(1, 2)]
    batch = NestedBatch.from_list(samples)
    back = nestbatch.from_packed_sequence(nestbatch.to_packed_sequence(batch))
    assert_same_samples(back.unbind(), samples)
    padded, lengths = pad_packed_sequence(nestbatch.to_packed_sequence(batch), batch_first=True)
    assert lengths.tolist() == [len(s) for s in samples]


def test_zero_length_and_multi_ragged_refused():
    with pytest.raises(ValueError, match="zero-length"):
        nestbatch.to_packed_sequence(nestbatch.nested([torch.ones(2, 1), torch.ones(0, 1)]))
    with pytest.raises(ValueError, match="one ragged dim"):
        nestbatch.to_packed_sequence(nestbatch.nested([torch.ones(2, 3, 1)], num_ragged_dims=2))
    with pytest.raises(TypeError, match="PackedSequence"):
        nestbatch.from_packed_sequence(torch.ones(3))


def test_gradients_flow_both_ways():
    samples = _samples([3, 1, 2])
    values = torch.cat(samples).requires_grad_()
    batch = NestedBatch.from_lengths(values, [3, 1, 2])
    torch.autograd.gradcheck(
        lambda v: nestbatch.from_packed_sequence(
            nestbatch.to_packed_sequence(NestedBatch.from_lengths(v, [3, 1, 2]))
        ).values,
        (values,),
    )
    ps = nestbatch.to_packed_sequence(batch)
    (ps.data * torch.arange(ps.data.numel()).view_as(ps.data)).sum().backward()
    expected = torch.zeros_like(ps.data)
    expected.view(-1)[:] = torch.arange(ps.data.numel(), dtype=ps.data.dtype)
    assert torch.equal(values.grad, expected[_inverse_order(ps)])


def _inverse_order(ps):
    # The PackedSequence row of every packed (sample-order) row, by unpacking an index tensor.
    index = torch.arange(ps.data.shape[0])
    unpacked = nestbatch.from_packed_sequence(ps._replace(data=index))
    return unpacked.values


def test_from_packed_sequence_refuses_increasing_batch_sizes():
    # batch_sizes [2, 3, 3] gave 2 samples and dropped rows; pad_packed_sequence refuses it.
    bad = torch.nn.utils.rnn.PackedSequence(torch.randn(8, 2), torch.tensor([2, 3, 3]))
    with pytest.raises(ValueError, match="must not increase"):
        nestbatch.from_packed_sequence(bad)

"""Left padding against ``pad_sequence(..., padding_side="left")``, and every op on a batch
stored left-padded against the same batch stored packed."""

from __future__ import annotations

import io
import pickle

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.nn.utils.rnn import pad_sequence

import nestbatch as nb
from nestbatch import NestedBatch


@st.composite
def sample_lists(draw):
    dtype = draw(st.sampled_from([torch.float32, torch.float64, torch.int64, torch.bool]))
    count = draw(st.integers(0, 5))
    feature = draw(st.sampled_from([(), (2,), (2, 3)]))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    lengths = [draw(st.integers(0, 6)) for _ in range(count)]
    return [(torch.randn(n, *feature, generator=gen) * 5).to(dtype) for n in lengths], feature


@given(sample_lists(), st.booleans())
def test_padded_left_matches_pad_sequence_and_comes_back(case, non_contiguous):
    samples, feature = case
    if not samples:
        return
    batch = nb.nested(samples)
    if non_contiguous:
        batch = batch.with_values(batch.values.unsqueeze(-1).expand(*batch.values.shape, 2)[..., 0])
    filler = 1 if samples[0].dtype == torch.bool else -1
    left = batch.padded(filler, padding_side="left")
    expected = pad_sequence(samples, batch_first=True, padding_value=filler, padding_side="left")
    assert left.padding_side == "left" and torch.equal(left.data, expected)
    lengths = torch.tensor([len(s) for s in samples])
    width = expected.shape[1]
    assert torch.equal(left.mask, torch.arange(width) >= width - lengths[:, None])
    for given_sizes in ([len(s) for s in samples], lengths, None):
        if given_sizes is None:
            back = NestedBatch.from_padded(expected, mask=left.mask, padding_side="left")
        else:
            back = NestedBatch.from_padded(expected, given_sizes, padding_side="left")
        assert all(torch.equal(a, b) for a, b in zip(back.unbind(), samples))
        assert torch.equal(back.values, batch.values)
        assert torch.equal(back.padded(filler).data,
                           pad_sequence(samples, batch_first=True, padding_value=filler))
    assert torch.equal(batch.to_padded_tensor(filler, padding_side="left"), expected)


def _pair():
    gen = torch.Generator().manual_seed(0)
    samples = [torch.randn(n, 3, generator=gen, dtype=torch.float64) for n in (2, 0, 4, 1)]
    left = pad_sequence(samples, batch_first=True, padding_side="left")
    stored_left = NestedBatch.from_padded(left, [2, 0, 4, 1], padding_side="left")
    return stored_left, nb.nested(samples), samples


def test_every_op_on_a_left_padded_batch_equals_the_packed_batch():
    left, packed, samples = _pair()
    assert left.layout is nb.Layout.PADDED and left.padded(None, padding_side="left") is not None
    same = torch.testing.assert_close
    for name in ("sum", "mean", "amax", "amin"):
        same(getattr(torch, name)(left, dim=1), getattr(torch, name)(packed, dim=1),
             equal_nan=True)
    same(torch.softmax(left, dim=1).values, torch.softmax(packed, dim=1).values)
    same(torch.exp(left).values, torch.exp(packed).values)
    same((left + left).values, (packed + packed).values)
    same(left[:, :1].values, packed[:, :1].values)
    same(left[:, -1:].values, packed[:, -1:].values)
    same(left[torch.tensor([2, 0])].values, packed[torch.tensor([2, 0])].values)
    assert torch.equal(left[2], samples[2]) and left.tolist() == packed.tolist()
    same(left.to_padded_tensor(0.0), packed.to_padded_tensor(0.0))
    clone = left.clone()
    assert clone.padded(None, padding_side="left").padding_side == "left"
    clone.add_(1.0)  # in place, into the left-padded storage
    same(clone.values, packed.values + 1)
    back = pickle.loads(pickle.dumps(left))
    same(back.values, packed.values)
    buffer = io.BytesIO()
    torch.save(left, buffer)
    buffer.seek(0)
    same(torch.load(buffer).values, packed.values)


def test_left_padding_is_differentiable():
    values = torch.randn(7, 2, dtype=torch.float64, requires_grad=True)

    def to_left(v):
        return NestedBatch.from_lengths(v, [3, 0, 4]).padded(0.0, padding_side="left").data

    assert torch.autograd.gradcheck(to_left, (values,))
    data = torch.randn(3, 4, 2, dtype=torch.float64, requires_grad=True)

    def from_left(d):
        return NestedBatch.from_padded(d, [3, 0, 4], padding_side="left").values

    assert torch.autograd.gradcheck(from_left, (data,))


def test_left_padding_errors():
    images = nb.nested([torch.ones(2, 3)], num_ragged_dims=2)
    with pytest.raises(ValueError, match="one ragged dim"):
        images.padded(0.0, padding_side="left")
    with pytest.raises(ValueError, match="padding_side"):
        nb.nested([torch.ones(2)]).padded(0.0, padding_side="top")
    not_suffix = torch.tensor([[True, False, True]])
    with pytest.raises(ValueError):
        NestedBatch.from_padded(torch.ones(1, 3), mask=not_suffix, padding_side="left")
    with pytest.raises(ValueError, match="padding_side"):
        NestedBatch.from_padded(torch.ones(1, 3), [2], padding_side="up")

"""Integer tensors at the batch and the ragged dim (``b[samples, positions]``, read and
written) and ``index_put_`` / ``index_put`` (``accumulate`` included): torch's on every sample,
and torch.nested's ``index_put_``."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import nestbatch
from nestbatch import Layout, NestedBatch

LAYOUTS = (Layout.PACKED, Layout.PADDED, Layout.LIST)


def _samples(lengths, features=(2,), dtype=torch.float64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(n, *features, generator=gen, dtype=dtype) for n in lengths]


def _builds(samples):
    """The batch built in several ways: packed, padded with junk padding, a list, and with
    sizes only in a tensor."""
    values = torch.cat(samples)
    offsets = torch.tensor([0, *torch.tensor([len(s) for s in samples]).cumsum(0).tolist()])
    padded = torch.nn.utils.rnn.pad_sequence(samples, batch_first=True, padding_value=float("nan"))
    yield "packed", nestbatch.nested(samples)
    yield "padded", NestedBatch.from_padded(padded, [len(s) for s in samples])
    yield "list", NestedBatch.from_list(samples).to(Layout.LIST)
    yield "device sizes", NestedBatch.from_offsets(values, offsets)


@st.composite
def pairs(draw):
    lengths = draw(st.lists(st.integers(0, 4), min_size=1, max_size=4))
    if not any(lengths):
        lengths[0] = 1
    present = [b for b, n in enumerate(lengths) if n]
    count = draw(st.integers(0, 5))
    samples, positions = [], []
    for _ in range(count):
        b = draw(st.sampled_from(present))
        samples.append(draw(st.sampled_from([b, b - len(lengths)])))
        positions.append(draw(st.integers(-lengths[b], lengths[b] - 1)))
    return lengths, samples, positions


@settings(max_examples=40, deadline=None)
@given(pairs(), st.integers(0, 2**16))
def test_paired_indices_read_the_elements_torch_reads(drawn, seed):
    lengths, samples, positions = drawn
    s = _samples(lengths, seed=seed)
    i0, i1 = torch.tensor(samples, dtype=torch.long), torch.tensor(positions, dtype=torch.long)
    expected = torch.stack([s[b][p] for b, p in zip(samples, positions)]) if samples \
        else torch.empty(0, 2, dtype=torch.float64)
    for where, batch in _builds(s):
        assert torch.equal(batch[i0, i1], expected), where
        assert torch.equal(batch[i0, i1, 1], expected[:, 1]), where
        assert torch.equal(batch[samples, positions], expected), where


@settings(max_examples=40, deadline=None)
@given(pairs(), st.booleans(), st.integers(0, 2**16))
def test_index_put_writes_or_adds_as_torch_on_every_sample(drawn, accumulate, seed):
    lengths, samples, positions = drawn
    s = _samples(lengths, seed=seed)
    values = torch.arange(len(samples) * 2, dtype=torch.float64).view(-1, 2)
    expected = [t.clone() for t in s]
    for k, (b, p) in enumerate(zip(samples, positions)):
        if accumulate:
            expected[b][p] += values[k]
        elif (b % len(lengths), p % lengths[b % len(lengths)]) not in {
                (c % len(lengths), q % lengths[c % len(lengths)])
                for c, q in zip(samples[k + 1:], positions[k + 1:])}:
            expected[b][p] = values[k]  # (a later duplicate wins: not checked)
    index = (torch.tensor(samples, dtype=torch.long), torch.tensor(positions, dtype=torch.long))
    for where, batch in _builds(s):
        result = batch.index_put_(index, values, accumulate=accumulate)
        assert result is batch
        for got, want, before in zip(batch.unbind(), expected, s):
            if accumulate:
                torch.testing.assert_close(got, want, msg=where)
            else:  # (duplicates: torch leaves which write wins open)
                kept = torch.isclose(got, want) | torch.isclose(got, before)
                assert bool(kept.all()), where
        assert torch.equal(batch.padded().data[batch.padded().mask],
                           torch.cat(batch.unbind())), where  # (every layout sees it)


def test_index_put_out_of_place_and_whole_samples():
    s = _samples([3, 2])
    batch = nestbatch.nested(s)
    out = torch.index_put(batch, (torch.tensor([1]), torch.tensor([0])), torch.tensor([7.0, 8.0],
                                                                                      dtype=torch.float64))
    assert out.unbind()[1][0].tolist() == [7.0, 8.0]
    assert torch.equal(batch.unbind()[1], s[1])  # (the input is left alone)
    twice = batch.clone()
    twice.index_put_((torch.tensor([1, 1]),), torch.tensor(1.0, dtype=torch.float64),
                     accumulate=True)
    assert torch.equal(twice.unbind()[1], s[1] + 2)  # (each duplicate sample adds)
    masked = batch.clone()
    masked.index_put_((batch > 0,), torch.tensor(0.0, dtype=torch.float64))
    assert all(bool((t <= 0).all()) for t in masked.unbind())
    added = batch.clone()
    added.index_put_((batch > 0,), torch.tensor(1.0, dtype=torch.float64), accumulate=True)
    for got, sample in zip(added.unbind(), s):
        assert torch.equal(got, torch.where(sample > 0, sample + 1, sample))


def test_index_put_matches_torch_nested():
    s = [torch.arange(6.0).view(3, 2), torch.arange(4.0).view(2, 2) + 10]
    njt = torch.nested.nested_tensor(s, layout=torch.jagged)
    batch = nestbatch.nested(s)
    index = (torch.tensor([0, 1]), torch.tensor([2, 1]))
    njt.index_put_(index, torch.tensor([5.0, 6.0]))
    batch.index_put_(index, torch.tensor([5.0, 6.0]))
    for ours, theirs in zip(batch.unbind(), njt.unbind()):
        assert torch.equal(ours, theirs)


@pytest.mark.parametrize("index, message", [
    ((torch.tensor([0, 2]), torch.tensor([0, 0])), "index 2 is out of bounds for dimension 0"),
    ((torch.tensor([-3]), torch.tensor([0])), "index -3 is out of bounds for dimension 0"),
    ((torch.tensor([1]), torch.tensor([2])), "index 2 is out of bounds for dimension 1 with "
     "size 2 \\(sample 1\\)"),
    ((torch.tensor([0]), torch.tensor([-4])), "index -4 is out of bounds for dimension 1"),
])
def test_an_index_outside_its_sample_raises_index_error(index, message):
    for _, batch in _builds(_samples([3, 2])):
        with pytest.raises(IndexError, match=message):
            batch[index]
        with pytest.raises(IndexError, match=message):
            batch.index_put_(index, torch.tensor(0.0, dtype=torch.float64))


def test_index_put_gradient_reaches_the_values():
    batch = nestbatch.nested(_samples([3, 2]))
    index = (torch.tensor([0, 1]), torch.tensor([1, 0]))

    def put(v):
        return torch.index_put(batch, index, v).packed().values

    v = torch.randn(2, 2, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(put, (v,))
    assert torch.autograd.gradcheck(lambda values: NestedBatch.from_lengths(
        values, [3, 2])[index[0], index[1]],
        (torch.randn(5, 2, dtype=torch.float64, requires_grad=True),))


def test_index_tensors_on_feature_dims_are_refused_and_dtypes_must_match():
    # (the audit's findings: a feature index tensor broadcast with the pair in torch, not here)
    batch = nestbatch.nested(_samples([3, 2]))
    with pytest.raises(TypeError, match="feature dims accept ints, slices and None"):
        batch[[0, 1], [0, 1], [1, 0]]
    with pytest.raises(TypeError, match="feature dims accept ints, slices and None"):
        batch.index_put_((torch.tensor([0, 1]), torch.tensor([0, 1]), torch.tensor([1, 0])),
                         torch.tensor([-1.0, -2.0], dtype=torch.float64))
    with pytest.raises(RuntimeError, match="dtypes match, got Double for the destination and "
                                           "Float for the source"):
        batch.index_put_((torch.tensor([0]), torch.tensor([1])), torch.tensor([5.0, 5.0]))
    batch.index_put_((batch > 0,), torch.tensor(0.0))  # (a mask's 0-d value is cast, as torch)
    assert all(bool((t <= 0).all()) for t in batch.unbind())


def test_pairs_over_a_moved_ragged_dim_read_as_torch():
    samples = [torch.arange(6.0).view(3, 2), torch.arange(10.0, 14.0).view(2, 2)]
    moved = nestbatch.nested(samples).transpose(1, 2)  # (B, 2, j)
    expected = torch.stack([samples[0].T[:, 0], samples[1].T[:, 1]])
    assert torch.equal(moved[[0, 1], :, [0, 1]], expected)
    assert torch.equal(moved[[0, 1], 1, [2, 1]], torch.tensor([5.0, 13.0]))


def test_compiled_index_errors_and_index_put_keep_their_types():
    # (a read inside an f-string made dynamo join an int into the message: a TypeError)
    batch = NestedBatch.from_lengths(torch.randn(4, 4), [1, 3])

    def read(x):
        return x[torch.tensor([0]), torch.tensor([1])]

    with pytest.raises(IndexError, match="index 1 is out of bounds for dimension 1"):
        torch.compile(read, backend="eager", dynamic=True)(batch)

    def put(x):
        return x.clone().index_put_((torch.tensor([0]), torch.tensor([0])), torch.tensor(1.0))

    assert torch.compile(put, backend="eager")(batch).tolist()[0] == [[1.0] * 4]

"""nn.RNN / LSTM / GRU called on a NestedBatch, against the same module on a PackedSequence."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pack_sequence, pad_packed_sequence

import nestbatch
from nestbatch import NestedBatch


def _sentences(lengths, features=5, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(n, features, generator=gen) for n in lengths]


def _reference(module, samples, hx):
    out, h = module(pack_sequence(samples, enforce_sorted=False), hx)
    padded, _ = pad_packed_sequence(out, batch_first=True)
    return [padded[i, : len(s)] for i, s in enumerate(samples)], h


def _states_close(a, b):
    if isinstance(a, tuple):
        return all(torch.allclose(x, y, atol=1e-6) for x, y in zip(a, b))
    return torch.allclose(a, b, atol=1e-6)


@pytest.mark.parametrize(
    "make",
    [
        lambda batch_first: nn.RNN(5, 3, num_layers=2, batch_first=batch_first),
        lambda batch_first: nn.RNN(5, 3, nonlinearity="relu", batch_first=batch_first),
        lambda batch_first: nn.GRU(5, 4, bidirectional=True, batch_first=batch_first),
        lambda batch_first: nn.LSTM(5, 4, num_layers=2, batch_first=batch_first),
        lambda batch_first: nn.LSTM(5, 4, proj_size=2, bidirectional=True,
                                    batch_first=batch_first),
    ],
)
@pytest.mark.parametrize("with_h0", [False, True])
@pytest.mark.parametrize("batch_first", [True, False])
def test_rnn_on_nested_batch_matches_packed_sequence(make, with_h0, batch_first):
    # A batch of sequences is consumed the same way whatever the module's batch_first is.
    torch.manual_seed(0)
    module = nestbatch.accept_nested_batches(make(batch_first))
    samples = _sentences([3, 4, 2, 4])
    hx = None
    if with_h0:
        layers = module.num_layers * (2 if module.bidirectional else 1)
        h_size = module.proj_size or module.hidden_size
        hx = torch.randn(layers, 4, h_size)
        if isinstance(module, nn.LSTM):
            hx = (hx, torch.randn(layers, 4, module.hidden_size))
    out, h = module(nestbatch.nested(samples), hx)
    ref_out, ref_h = _reference(module, samples, hx)
    assert isinstance(out, NestedBatch)
    assert out.lengths.tolist() == [3, 4, 2, 4]
    for got, want in zip(out.unbind(), ref_out):
        assert torch.allclose(got, want, atol=1e-6)
    assert _states_close(h, ref_h)


@pytest.mark.parametrize("cls", [nn.RNN, nn.GRU, nn.LSTM])
def test_zero_length_samples_keep_their_initial_state(cls):
    torch.manual_seed(1)
    module = cls(5, 3, batch_first=True)
    samples = _sentences([3, 0, 2, 0], seed=1)
    h0 = torch.randn(1, 4, 3)
    hx = (h0, torch.randn(1, 4, 3)) if cls is nn.LSTM else h0
    out, h = module(nestbatch.nested(samples), hx)
    assert out.lengths.tolist() == [3, 0, 2, 0]
    states = h if isinstance(h, tuple) else (h,)
    initial = hx if isinstance(hx, tuple) else (hx,)
    for final, start in zip(states, initial):
        assert torch.equal(final[:, [1, 3]], start[:, [1, 3]])
    kept = [0, 2]
    sub_hx = tuple(s[:, kept] for s in initial)
    ref_out, ref_h = _reference(module, [samples[i] for i in kept], sub_hx if cls is nn.LSTM
                                else sub_hx[0])
    assert torch.allclose(out.unbind()[2], ref_out[1], atol=1e-6)
    ref_states = ref_h if isinstance(ref_h, tuple) else (ref_h,)
    for final, ref in zip(states, ref_states):
        assert torch.allclose(final[:, kept], ref, atol=1e-6)


def test_all_empty_and_default_state_is_zero():
    module = nn.GRU(5, 3, batch_first=True, bidirectional=True)
    out, h = module(nestbatch.nested([torch.zeros(0, 5), torch.zeros(0, 5)]))
    assert out.lengths.tolist() == [0, 0] and out.feature_shape == (6,)
    assert torch.equal(h, torch.zeros(2, 2, 3))
    out, h = module(nestbatch.nested([torch.randn(2, 5), torch.zeros(0, 5)]))
    assert torch.equal(h[:, 1], torch.zeros(2, 3))


def test_gradients_match_packed_sequence():
    torch.manual_seed(2)
    module = nn.LSTM(5, 3, batch_first=True).double()
    samples = [s.double() for s in _sentences([3, 1, 0, 2], seed=2)]
    values = torch.cat(samples).requires_grad_()
    out, (h, _) = module(NestedBatch.from_lengths(values, [3, 1, 0, 2]))
    (out.values.sum() + h.sum()).backward()
    ref_values = values.detach().clone().requires_grad_()
    kept = [ref_values[0:3], ref_values[3:4], ref_values[4:6]]
    ref_out, (ref_h, _) = module(pack_sequence(kept, enforce_sorted=False))
    (ref_out.data.sum() + ref_h.sum()).backward()
    assert torch.allclose(values.grad, ref_values.grad)
    torch.autograd.gradcheck(
        lambda v: module(NestedBatch.from_lengths(v, [3, 1, 0, 2]))[0].values, (values,)
    )


def test_seed_004_walkthrough():
    # The RNN walk-through of the NestedTensor RFC: EmbeddingBag-style sentences, a 2-layer RNN
    # with h0, the output as a nested batch, padded with 0, and an NLL loss with ignore index.
    torch.manual_seed(0)
    sentences = [torch.tensor([0, 3, 1]), torch.tensor([5, 1, 2, 4]), torch.tensor([3, 2])]
    embeddings = [s.unsqueeze(1).repeat(1, 5).float() for s in sentences]
    rnn = nn.RNN(5, 3, 2)
    h0 = torch.randn(2, 3, 3)
    nt = nestbatch.nested(embeddings)

    ps = nestbatch.to_packed_sequence(nt)
    output, hn = rnn(ps, h0)
    ref_output, ref_hn = rnn(pack_sequence(embeddings, enforce_sorted=False), h0)
    assert torch.equal(output.data, ref_output.data) and torch.equal(hn, ref_hn)

    output_nt = nestbatch.as_nested(output)
    padded_output = output_nt.to_padded_tensor(0)
    ref_padded, _ = pad_packed_sequence(ref_output, batch_first=True)
    assert padded_output.shape == (3, 4, 3)
    assert torch.equal(padded_output, ref_padded)

    # The same through the batch directly, with the seed's time-major module and a batch_first
    # copy: a NestedBatch is a batch of sequences either way.
    direct, direct_hn = nestbatch.accept_nested_batches(rnn)(nt, h0)
    assert torch.allclose(direct.to_padded_tensor(0), padded_output)
    assert torch.allclose(direct_hn, hn)
    rnn_bf = nn.RNN(5, 3, 2, batch_first=True)
    rnn_bf.load_state_dict(rnn.state_dict())
    direct, direct_hn = rnn_bf(nt, h0)
    assert torch.allclose(direct.to_padded_tensor(0), padded_output)
    assert torch.allclose(direct_hn, hn)

    targets = torch.tensor([1, 2, 1, -100, 2, 1, 1, 2, 1, 1, -100, -100])
    loss = nn.NLLLoss()(padded_output.reshape(-1, 3), targets)
    manual = -sum(
        padded_output.reshape(-1, 3)[i, t] for i, t in enumerate(targets.tolist()) if t != -100
    ) / 9
    assert torch.allclose(loss, manual)


def test_refuses_multi_ragged_input():
    module = nn.RNN(1, 2, batch_first=True)
    images = nestbatch.nested([torch.ones(2, 3)], num_ragged_dims=2)
    with pytest.raises((ValueError, RuntimeError)):
        module(images)


def test_ragged_size_is_still_refused_outside_time_major_rnns():
    batch = nestbatch.nested(_sentences([2, 3]))
    with pytest.raises(TypeError, match="accept_nested_batches"):
        int(batch.size(1))


def test_time_major_modules_take_batches_once_told_and_never_by_who_asks():
    """``size(1)`` answers the same whoever calls it; a time-major module gets the batch as a
    view through its forward pre-hook, registered once by ``accept_nested_batches``."""
    torch.manual_seed(0)
    samples = _sentences([2, 0, 3])
    batch = nestbatch.nested(samples)
    plain = nn.GRU(5, 4)
    with pytest.raises(TypeError, match="RaggedSize"):  # torch's zeros(size(1), ...) refuses it
        plain(batch)
    model = nn.Sequential(nn.GRU(5, 4))
    assert nestbatch.accept_nested_batches(model) is model
    nestbatch.accept_nested_batches(model)  # idempotent: one hook per module
    assert len(model[0]._forward_pre_hooks) == 1
    out, h = model[0](batch)
    kept = [s for s in samples if len(s)]
    ref_out, ref_h = _reference(model[0], kept, None)
    assert out.lengths.tolist() == [2, 0, 3] and h.shape == (1, 3, 4)
    assert torch.allclose(out.unbind()[2], ref_out[1], atol=1e-6)
    assert torch.equal(h[:, 1], torch.zeros(1, 4))  # the empty sample keeps its initial state
    assert isinstance(batch.size(1), nestbatch.RaggedSize)
    with pytest.raises(TypeError, match="torch.nn.Module"):
        nestbatch.accept_nested_batches(batch)

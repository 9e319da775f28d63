"""``F.pad`` (and its other spellings, and the padding modules) on a NestedBatch against torch's
``F.pad(sample.unsqueeze(0), ...)[0]`` of every sample: torch on the dense tensor of the batch's
shape, restricted to the sample."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn.utils.rnn import pad_sequence

import nestbatch
from nestbatch import NestedBatch

settings_ = settings(deadline=None)  # (examples: the profile's, tests/conftest.py)
MODES = ("constant", "reflect", "replicate", "circular")


# ================================================================================ building
def _rows(lengths, feature, dtype, seed, strided=False):
    """Samples ``(L_i, *feature)`` (stored order) of small exact values; every other row of a
    larger tensor when ``strided`` (non-contiguous)."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for n in lengths:
        big = torch.randint(-20, 20, (2 * n if strided else n, *feature), generator=gen)
        if dtype == torch.bool:
            rows = big > 0
        else:
            rows = big.to(dtype) / 4 if dtype.is_floating_point else big.to(dtype)
        out.append(rows[::2] if strided else rows)
    return out


def _stored(rows, feature, dtype, how):
    """A batch of ``rows``: built packed (``"packed"``), padded with junk in the padding
    (``"padded"``), or packed with its sizes only in a device tensor (``"device"``)."""
    if how == "padded":
        lengths = [r.shape[0] for r in rows]
        data = pad_sequence(rows, batch_first=True) if rows else torch.zeros(0, 0, *feature,
                                                                             dtype=dtype)
        mask = torch.arange(data.shape[1])[None, :] < torch.tensor(lengths, dtype=torch.long
                                                                   ).reshape(-1, 1)
        junk = torch.ones_like(data) if dtype == torch.bool else torch.full_like(data, 99)
        data = torch.where(mask.reshape(*mask.shape, *(1,) * len(feature)), data, junk)
        return NestedBatch.from_padded(data, lengths)
    values = torch.cat(rows) if rows else torch.zeros(0, *feature, dtype=dtype)
    offsets = torch.tensor([0, *(sum(r.shape[0] for r in rows[:i + 1]) for i in range(len(rows)))])
    if how == "device":
        return NestedBatch.from_offsets(values, offsets)
    return NestedBatch.from_lengths(values, [r.shape[0] for r in rows])


def _batch(lengths, feature=(3,), dtype=torch.float64, how="packed", ragged_dim=1, seed=0,
           strided=False):
    """The batch with the ragged dim at logical ``ragged_dim``, and its logical samples."""
    rows = _rows(lengths, feature, dtype, seed, strided)
    batch = _stored(rows, feature, dtype, how).movedim(1, ragged_dim)
    return batch, [r.movedim(0, ragged_dim - 1) for r in rows]


def _reference(func, sample, *args, **kwargs):
    """torch's result for one sample with the batch dim kept, or the exception it raised."""
    try:
        return func(sample.unsqueeze(0).contiguous(), *args, **kwargs)[0]
    except Exception as error:  # noqa: BLE001  (the type is what is compared)
        return error


def _wraps_past_the_crop(sample, pad, mode):
    """Whether circular ``pad`` crops a dim of ``sample`` on one side and wraps the other side
    around more than the elements left: torch's kernel then fails with an overlap error, or
    reads uninitialized memory; nestbatch refuses it with a RuntimeError."""
    if mode != "circular":
        return False
    for i in range(len(pad) // 2):
        left, right = pad[2 * i], pad[2 * i + 1]
        size = sample.shape[sample.dim() - 1 - i]
        kept = size - max(-left, 0) - max(-right, 0)
        if max(left, right) > kept and size + left + right != 0:  # (an empty result is fine)
            return True
    return False


def _check(batch, samples, *args, func=F.pad, **kwargs):
    """``func`` of the batch against ``func`` of every sample: the same samples bit for bit,
    or the first sample's error type where torch raises for some sample."""
    expected = [_reference(func, s, *args, **kwargs) for s in samples]
    if func is F.pad and len(args) > 1:
        expected = [RuntimeError() if isinstance(e, torch.Tensor)
                    and _wraps_past_the_crop(s, args[0], args[1]) else e
                    for s, e in zip(samples, expected)]
    raised = next((e for e in expected if isinstance(e, Exception)), None)
    if raised is not None:
        with pytest.raises(type(raised)):
            func(batch, *args, **kwargs)
        return None
    try:
        out = func(batch, *args, **kwargs)
    except RuntimeError:  # (no sample: torch's argument checks only)
        assert not samples
        return None
    got = out.unbind()
    assert len(got) == len(samples) and out.ragged_dim == batch.ragged_dim
    assert out.dtype == batch.dtype
    for a, e in zip(got, expected):
        assert a.shape == e.shape and a.dtype == e.dtype, (a.shape, e.shape)
        torch.testing.assert_close(a, e, rtol=0, atol=0, equal_nan=True)
    return out


# ============================================================================== hypothesis
lengths_ = st.lists(st.integers(0, 6), min_size=0, max_size=4)
hows = st.sampled_from(["packed", "padded", "device"])
pads_ = st.integers(-3, 3)


@settings_
@given(lengths_, hows, st.booleans(), st.sampled_from(MODES), st.data())
def test_float_batches_every_mode(lengths, how, strided, mode, data):
    feature = data.draw(st.sampled_from([(), (3,), (2, 3)]))
    ragged_dim = data.draw(st.integers(1, 1 + len(feature)))
    dtype = data.draw(st.sampled_from([torch.float32, torch.float64]))
    batch, samples = _batch(lengths, feature, dtype, how, ragged_dim, len(lengths), strided)
    npad = data.draw(st.integers(1, min(3, batch.dim() - 1)))
    pad = tuple(data.draw(st.lists(pads_, min_size=2 * npad, max_size=2 * npad)))
    _check(batch, samples, pad, mode)


@settings_
@given(lengths_, hows, st.data())
def test_constant_mode_dtypes_and_fillers(lengths, how, data):
    dtype = data.draw(st.sampled_from([torch.float32, torch.float64, torch.int64, torch.bool]))
    feature = data.draw(st.sampled_from([(2,), (2, 3)]))
    ragged_dim = data.draw(st.integers(1, 1 + len(feature)))
    batch, samples = _batch(lengths, feature, dtype, how, ragged_dim, len(lengths))
    npad = data.draw(st.integers(1, batch.dim() - 1))
    pad = tuple(data.draw(st.lists(pads_, min_size=2 * npad, max_size=2 * npad)))
    value = data.draw(st.sampled_from([None, 0.0, 2.5, -1.0, math.nan, math.inf, -math.inf]))
    _check(batch, samples, pad, "constant", value)


@settings_
@given(lengths_, st.sampled_from(MODES), st.data())
def test_circular_and_int_batches_over_the_ragged_dim(lengths, mode, data):
    dtype = data.draw(st.sampled_from([torch.int64, torch.bool]))
    batch, samples = _batch(lengths, (2,), dtype, "packed", 2, len(lengths))
    pad = (data.draw(pads_), data.draw(pads_))
    _check(batch, samples, pad, mode)


# ============================================================================== by hand
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("how", ["packed", "padded", "device"])
def test_ragged_dim_of_sequences(mode, how):
    """Samples ``(C, L_i)`` padded along ``L_i``: every sample grows by left + right."""
    batch, samples = _batch([4, 2, 5], (3,), how=how, ragged_dim=2)
    out = F.pad(batch, (1, 1), mode)
    assert out.partition.knows_host_shapes == (how != "device")  # (host sizes stay there)
    assert out.lengths.tolist() == [6, 4, 7]
    _check(batch, samples, (1, 1), mode)
    _check(batch, samples, (-1, 1), mode)
    _check(batch, samples, (1, -1), mode)
    _check(batch, samples, (1, 1, 2, 0), mode)  # (C and L_i)


def test_ragged_dim_first_pads_like_a_feature_dim_pair():
    """Samples ``(L_i, D)``: ``(0, 0, 1, 2)`` pads ``L_i``; ``(1, 2)`` pads ``D``."""
    batch, samples = _batch([3, 0, 5], (4,))
    assert _check(batch, samples, (0, 0, 1, 2), "constant", 7.0).lengths.tolist() == [6, 3, 8]
    assert _check(batch, samples, (1, 2), "constant", -1.0).shape[2] == 7
    _check(batch, samples, (0, 0, -1, 0))  # (crops every sample by one; torch's error for 0)


def test_empty_batch_and_zero_length_samples():
    batch, samples = _batch([], (3,), ragged_dim=2)
    assert F.pad(batch, (1, 2), "reflect").batch_size == 0
    batch, samples = _batch([0, 0], (3,), ragged_dim=2)
    assert _check(batch, samples, (1, 2)).lengths.tolist() == [3, 3]
    _check(batch, samples, (0, 0), "circular")
    with pytest.raises(RuntimeError, match="non-zero dimensions"):
        F.pad(batch, (1, 1), "reflect")


def test_one_sample_and_non_contiguous_input():
    batch, samples = _batch([5], (3, 2), strided=True, ragged_dim=3)
    for mode in MODES:
        _check(batch, samples, (2, 1, 1, 0), mode)


def test_every_spelling():
    batch, samples = _batch([4, 2, 5], (3,), ragged_dim=2)
    _check(batch, samples, (1, 2), func=torch._C._nn.pad, mode="reflect")
    _check(batch, samples, (1, 2), 5, func=torch.constant_pad_nd)
    _check(batch, samples, (1, 1), 2, func=torch._C._nn._pad_enum)  # (circular)
    _check(batch, samples, (1, 1), func=torch._C._nn.reflection_pad1d)
    _check(batch, samples, (1, 1), func=torch._C._nn.replication_pad1d)
    _check(batch, samples, (1, 2), func=torch._C._nn._pad_circular)
    _check(batch, samples, (1, 1, 1, 1), func=torch._C._nn.replication_pad2d)
    _check(batch, samples, (1, 1, 1, 1), func=torch._C._nn.reflection_pad2d)
    four, samples4 = _batch([4, 3], (2, 3), ragged_dim=2)
    _check(four, samples4, (1, 1, 1, 1, 1, 1), func=torch._C._nn.replication_pad3d)
    _check(four, samples4, (1, 1, 1, 1, 1, 1), func=torch._C._nn.reflection_pad3d)
    out = F.pad(input=batch, pad=(1, 1), mode="replicate")
    assert out.lengths.tolist() == [6, 4, 7]


@pytest.mark.parametrize("module", [
    nn.ConstantPad1d((2, 1), 3.5), nn.ReflectionPad1d(1), nn.ReplicationPad1d((0, 3)),
    nn.CircularPad1d((1, 2)), nn.ZeroPad2d((1, 0, 2, 1)), nn.ReflectionPad2d((1, 1, 1, 0)),
])
def test_padding_modules(module):
    batch, samples = _batch([4, 2, 5], (3,), ragged_dim=2)
    _check(batch, samples, func=lambda x: module(x))


@pytest.mark.parametrize("padding_mode", ["reflect", "replicate", "circular", "zeros"])
def test_conv1d_with_a_padding_mode(padding_mode):
    torch.manual_seed(0)
    conv = nn.Conv1d(3, 4, 3, padding=1, padding_mode=padding_mode).double()
    batch, samples = _batch([4, 2, 5], (3,), ragged_dim=2)
    out = conv(batch)
    for got, sample in zip(out.unbind(), samples):
        torch.testing.assert_close(got, conv(sample.unsqueeze(0))[0])


def test_several_ragged_dims():
    """Samples ``(H_i, W_i, C)``: either ragged dim, both, and the feature dim."""
    rows = _rows([2, 3, 1], (4, 2), torch.float64, 0)
    samples = [r[:, : w] for r, w in zip(rows, (3, 1, 4))]
    batch = nestbatch.nested(samples, num_ragged_dims=2)
    for mode in ("constant", "replicate", "circular"):
        _check(batch, samples, (0, 0, 1, 2), mode) if mode == "constant" else None
        _check(batch, samples, (1, 0, 0, 1), mode)
    out = _check(batch, samples, (1, -1, 2, 0, 1, 1), "constant", 9.0)
    assert out.partition.host_shapes == ((4, 5), (5, 3), (3, 6))
    _check(batch, samples, (0, 0, 1, 1, -1, 1), "constant")
    _check(batch, samples, (1, 1), "reflect")  # (the feature dim: a 2-d padding needs 4)


def test_ragged_rank_two_is_refused():
    batch = NestedBatch.from_nested_row_lengths(torch.arange(6.0), ([2, 1], [1, 2, 3]))
    with pytest.raises(TypeError, match="ragged rank"):
        F.pad(batch, (1, 1))


# ================================================================================ errors
def test_padding_the_batch_dim_is_refused():
    batch, samples = _batch([4, 2], (3,))
    with pytest.raises(ValueError, match="dim 0"):
        F.pad(batch, (0, 0, 0, 0, 1, 0))
    _check(batch, samples, (1, 0, 0, 0, 0, 0))  # (zero padding of dim 0: accepted, as torch)


@pytest.mark.parametrize("args, error", [
    (((3, 3), "reflect"), RuntimeError),  # (not below the second sample's size, 2)
    (((1, 1), "reflect", 1.0), RuntimeError),  # (a value for a mode that takes none)
    (((1, 1, 1, 1, 1, 1), "reflect"), NotImplementedError),  # (rank 3 takes 2 or 4)
    (((1,),), RuntimeError),
    (((1, 1), "foo"), NotImplementedError),
    (((1.0, 1),), TypeError),
    (((-3, 0),), RuntimeError),  # (the second sample below size 0)
    (((-2, -1), "replicate"), RuntimeError),
    (((3, 0), "circular"), RuntimeError),  # (wraps the second sample more than once)
    (((1, 1, 1, 1, 1, 1, 1, 1),), RuntimeError),  # (longer than twice the rank)
])
def test_errors_are_torchs(args, error):
    batch, samples = _batch([4, 2, 5], (3,), ragged_dim=2)
    expected = _reference(F.pad, samples[1], *args)
    assert type(expected) is error
    with pytest.raises(error):
        F.pad(batch, *args)


def test_per_mode_builtins_check_the_rank():
    """torch's ``reflection_pad1d`` takes 2-d / 3-d tensors (its meta kernel does not check)."""
    batch, samples = _batch([2, 3], (2, 3))
    for func in (torch._C._nn.reflection_pad1d, torch._C._nn.replication_pad1d):
        assert isinstance(_reference(func, samples[0], (1, 1)), RuntimeError)
        with pytest.raises(RuntimeError, match="pads 1-d"):
            func(batch, (1, 1))
    with pytest.raises(RuntimeError, match="pads 2-d"):
        torch._C._nn.reflection_pad2d(batch, (1, 1))


def test_first_offending_sample_is_named():
    batch, _ = _batch([4, 2, 1, 5], (3,), ragged_dim=2)
    with pytest.raises(RuntimeError, match=r"\[1, 3, 2\]"):
        F.pad(batch, (2, 0), "reflect")


def test_circular_crop_on_one_side_and_wrap_on_the_other_is_refused():
    """torch's own kernel fails with an overlap error or reads uninitialized memory here."""
    batch, samples = _batch([4, 2, 5], (3,), ragged_dim=2)
    _check(batch, samples, (1, -1), "circular")  # (one element left, one wrapped: fine)
    with pytest.raises(RuntimeError, match="wrap around"):
        F.pad(batch, (2, -1), "circular")


def test_dtypes_the_kernel_lacks():
    batch, samples = _batch([3, 2], (3,), torch.bool, ragged_dim=2)
    for mode in ("reflect", "replicate"):
        with pytest.raises(NotImplementedError):
            F.pad(batch, (1, 1), mode)
    _check(batch, samples, (1, 1), "circular")


def test_fill_values_torch_cannot_convert():
    batch, samples = _batch([3, 2], (3,), torch.int64, ragged_dim=2)
    for value in (math.nan, math.inf):
        with pytest.raises(RuntimeError):
            F.pad(batch, (1, 0), value=value)
    _check(batch, samples, (-1, 0), value=math.nan)  # (a crop fills nothing)
    _check(batch, samples, (1, 1), value=2.7)  # (truncated, as torch's fill)


# ============================================================================== autograd
@pytest.mark.parametrize("mode", MODES)
def test_gradcheck(mode):
    lengths = [4, 3, 5]
    values = torch.randn(sum(lengths), 3, dtype=torch.float64, requires_grad=True)

    def over_ragged(v):
        x = NestedBatch.from_lengths(v, lengths).transpose(1, 2)
        return F.pad(x, (2, -1), mode).values

    def over_features(v):
        return F.pad(NestedBatch.from_lengths(v, lengths), (1, 2), mode).values

    assert torch.autograd.gradcheck(over_ragged, (values,))
    assert torch.autograd.gradcheck(over_features, (values,))

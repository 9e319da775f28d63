"""Convolutions and pooling on a NestedBatch against the same torch function run on every
sample alone (and against torch.nested for its semantics: the ragged dim first)."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn.utils.rnn import pad_sequence

import nestbatch
from nestbatch import Layout, NestedBatch

settings_ = settings(deadline=None)  # (examples: the profile's, tests/conftest.py)
pytestmark = pytest.mark.filterwarnings("ignore:Using padding='same'")
FLOATS = (torch.float32, torch.float64)
HALF = (torch.float16, torch.bfloat16)


# ================================================================================ building
def _rows(lengths, feature, dtype, seed, strided):
    """Samples ``(L_i, *feature)`` (stored order), small exact values; every other row of a
    larger tensor when ``strided`` (non-contiguous)."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for n in lengths:
        big = torch.randint(-20, 20, (2 * n if strided else n, *feature), generator=gen)
        rows = big.to(dtype) / 4
        out.append(rows[::2] if strided else rows)
    return out


def _stored(rows, layout, feature):
    """A batch of ``rows`` built packed, or built padded with ``from_padded``."""
    if layout is Layout.PADDED:
        lengths = [r.shape[0] for r in rows]
        data = pad_sequence(rows, batch_first=True) if rows else torch.zeros(0, 0, *feature)
        return NestedBatch.from_padded(data, lengths)
    if not rows:
        return NestedBatch.from_lengths(torch.zeros(0, *feature), [])
    return nestbatch.nested(rows)


def _over(rows, layout, feature, ragged_dim):
    """The batch of ``rows`` with the ragged dim moved to logical ``ragged_dim``, and the
    logical samples (the references)."""
    batch = _stored(rows, layout, feature).movedim(1, ragged_dim)
    return batch, [r.movedim(0, ragged_dim - 1) for r in rows]


def _run(func, x, *args, **kwargs):
    """``func``'s result, or the exception it raised."""
    try:
        return func(x, *args, **kwargs)
    except Exception as error:  # noqa: BLE001  (the type is what is compared)
        return error


def _check(batch, samples, func, *args, exact=False, tol=None, **kwargs):
    """``func`` of the batch against ``func`` of every sample: the same samples, or an error
    of the same type where torch raises for some sample."""
    if not samples:  # parameters torch refuses are refused for no sample too, as a tensor's
        out = _run(func, batch, *args, **kwargs)
        outs = out if isinstance(out, tuple | RuntimeError) else (out,)
        assert isinstance(out, RuntimeError) or all(o.batch_size == 0 for o in outs)
        return
    # (Copies with the usual strides: torch's bfloat16 CPU convolution crashes on a sample
    # whose size-1 dim has an odd stride, as a transposed sample of one position has.)
    expected = [_run(func, s.clone(memory_format=torch.contiguous_format), *args, **kwargs)
                for s in samples]
    raised = next((e for e in expected if isinstance(e, Exception)), None)
    if raised is not None:
        with pytest.raises(type(raised)):
            func(batch, *args, **kwargs)
        return
    out = func(batch, *args, **kwargs)
    outs = out if isinstance(out, tuple) else (out,)
    for k, part in enumerate(outs):
        got = part.unbind()
        assert len(got) == len(samples)
        for a, e in zip(got, expected):
            e = e[k] if isinstance(e, tuple) else e
            assert a.shape == e.shape and a.dtype == e.dtype, (a.shape, e.shape)
            if exact:
                torch.testing.assert_close(a, e, rtol=0, atol=0, equal_nan=True)
            else:
                torch.testing.assert_close(a, e, equal_nan=True, **(tol or {}))


lengths_ = st.lists(st.integers(0, 9), min_size=0, max_size=4)
long_lengths = st.lists(st.integers(4, 9), min_size=1, max_size=4)
layouts = st.sampled_from([Layout.PACKED, Layout.PADDED])


def _tol(dtype):
    return {"rtol": 2e-2, "atol": 5e-2} if dtype in HALF else None


# ============================================================== over the ragged dim: conv1d
@settings_
@given(lengths_, layouts, st.booleans(), st.sampled_from(FLOATS + HALF), st.data())
def test_conv1d_over_the_ragged_dim(lengths, layout, strided, dtype, data):
    groups = data.draw(st.sampled_from([1, 2]))
    c_in, c_out = 2 * groups, 2 * groups
    kernel = data.draw(st.integers(1, 3))
    stride = data.draw(st.integers(1, 3))
    padding = data.draw(st.sampled_from([0, 1, 2, "same", "valid"]))
    dilation = data.draw(st.integers(1, 2))
    gen = torch.Generator().manual_seed(len(lengths))
    weight = (torch.randn(c_out, c_in // groups, kernel, generator=gen) / 2).to(dtype)
    bias = data.draw(st.sampled_from([None, torch.randn(c_out, generator=gen).to(dtype)]))
    rows = _rows(lengths, (c_in,), dtype, sum(lengths), strided)
    batch, samples = _over(rows, layout, (c_in,), 2)
    _check(batch, samples, F.conv1d, weight, bias, stride, padding, dilation, groups,
           tol=_tol(dtype))


@settings_
@given(long_lengths, layouts, st.data())
def test_conv_transpose1d_over_the_ragged_dim(lengths, layout, data):
    kernel, stride = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 3))
    padding = data.draw(st.integers(0, 2))
    output_padding = data.draw(st.integers(0, 1))
    weight = torch.randn(2, 3, kernel, generator=torch.Generator().manual_seed(kernel))
    rows = _rows(lengths, (2,), torch.float64, len(lengths), False)
    batch, samples = _over(rows, layout, (2,), 2)
    _check(batch, samples, F.conv_transpose1d, weight, None, stride, padding, output_padding)


# ============================================================== over the ragged dim: pooling
def _special(rows, seed):
    """``rows`` with NaN, +inf and -inf here and there (floats)."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for r in rows:
        r = r.clone()
        pick = torch.randint(0, 8, r.shape, generator=gen)
        r[pick == 0] = float("nan")
        r[pick == 1] = float("inf")
        r[pick == 2] = float("-inf")
        out.append(r)
    return out


pool_args = st.fixed_dictionaries({
    "kernel_size": st.integers(1, 4),
    "stride": st.sampled_from([None, 1, 2, 3]),
    "padding": st.integers(0, 2),
    "ceil_mode": st.booleans(),
})


@settings_
@given(lengths_, layouts, st.booleans(), st.sampled_from(FLOATS + HALF), pool_args,
       st.integers(1, 2), st.booleans(), st.booleans())
def test_max_pool1d_over_the_ragged_dim(lengths, layout, strided, dtype, kw, dilation,
                                        indices, special):
    rows = _rows(lengths, (3,), dtype, sum(lengths), strided)
    rows = _special(rows, len(lengths)) if special else rows
    batch, samples = _over(rows, layout, (3,), 2)
    _check(batch, samples, F.max_pool1d, dilation=dilation, return_indices=indices,
           exact=True, **kw)


@settings_
@given(lengths_, layouts, st.booleans(), st.sampled_from(FLOATS + HALF), pool_args,
       st.booleans(), st.booleans())
def test_avg_pool1d_over_the_ragged_dim(lengths, layout, strided, dtype, kw, include_pad,
                                        special):
    rows = _rows(lengths, (3,), dtype, sum(lengths), strided)
    rows = _special(rows, len(lengths)) if special else rows
    batch, samples = _over(rows, layout, (3,), 2)
    _check(batch, samples, F.avg_pool1d, count_include_pad=include_pad, exact=True, **kw)


def test_pooling_is_exact_and_integers_pool_as_torch():
    rows = _rows([5, 9, 2], (2,), torch.float32, 1, False)
    batch, samples = _over(rows, Layout.PACKED, (2,), 2)
    _check(batch, samples, F.avg_pool1d, 3, 2, 1, True, False, exact=True)
    ints = [r.to(torch.int64) * 4 for r in rows]
    batch, samples = _over(ints, Layout.PACKED, (2,), 2)
    _check(batch, samples, F.avg_pool1d, 3, 2, 1, True, exact=True)
    _check(batch, samples, F.max_pool1d, 2, return_indices=True, exact=True)
    _check(batch, samples, F.max_pool1d, 2)  # torch has no such kernel: NotImplementedError


# ========================================================================= 2-d over a ragged dim
@settings_
@given(lengths_, layouts, st.sampled_from([2, 3]), st.data())
def test_2d_over_a_ragged_spatial_dim(lengths, layout, ragged_dim, data):
    rows = _rows(lengths, (2, 5), torch.float64, sum(lengths), data.draw(st.booleans()))
    if data.draw(st.booleans()):
        rows = _special(rows, len(lengths))
    batch, samples = _over(rows, layout, (2, 5), ragged_dim)
    kernel = (data.draw(st.integers(1, 3)), data.draw(st.integers(1, 3)))
    stride = (data.draw(st.integers(1, 2)), data.draw(st.integers(1, 2)))
    padding = (data.draw(st.integers(0, 1)), data.draw(st.integers(0, 1)))
    ceil = data.draw(st.booleans())
    weight = torch.randn(3, 2, *kernel, generator=torch.Generator().manual_seed(1),
                         dtype=torch.float64)
    if not any(torch.isnan(r).any() for r in rows):
        _check(batch, samples, F.conv2d, weight, None, stride, padding)
    _check(batch, samples, F.max_pool2d, kernel, stride, padding, ceil_mode=ceil,
           return_indices=ragged_dim == 2, exact=True)
    _check(batch, samples, F.avg_pool2d, kernel, stride, padding, ceil,
           data.draw(st.booleans()), data.draw(st.sampled_from([None, 3])), exact=True)


def test_3d_and_batched_samples():
    # Samples (M, C, L_i): the samples' own batch dim is regular, the length ragged.
    rows = _rows([4, 6, 3], (2, 3), torch.float64, 2, False)  # stored (L_i, M, C)
    batch, samples = _over(rows, Layout.PACKED, (2, 3), 3)
    weight = torch.randn(4, 3, 2, dtype=torch.float64)
    _check(batch, samples, F.conv1d, weight, padding=1)
    _check(batch, samples, F.max_pool1d, 2, return_indices=True, exact=True)
    _check(batch, samples, F.avg_pool1d, 3, 1, 1, count_include_pad=False)
    rows = _rows([4, 6], (2, 3, 4), torch.float64, 3, False)  # stored (L_i, C, H, W)
    batch, samples = _over(rows, Layout.PADDED, (2, 3, 4), 3)  # ragged H: (C, D, L_i, W)
    _check(batch, samples, F.conv3d, torch.randn(2, 2, 2, 2, 2, dtype=torch.float64))
    _check(batch, samples, F.max_pool3d, 2, 1, 1, exact=True)
    _check(batch, samples, F.avg_pool3d, (2, 3, 2), 2, 1, True, False)


# ===================================================== the ragged dim first (torch.nested's)
def _njt_samples(lengths, seed):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(n, 3, 7, generator=gen, dtype=torch.float64) for n in lengths]


@settings_
@given(st.lists(st.integers(0, 4), min_size=1, max_size=4), layouts, st.integers(1, 3),
       st.integers(0, 2))
def test_ragged_dim_first_as_torch_nested(lengths, layout, kernel, padding):
    samples = _njt_samples(lengths, sum(lengths))
    batch = _stored(samples, layout, (3, 7))
    weight = torch.randn(4, 3, kernel, dtype=torch.float64)
    bias = torch.randn(4, dtype=torch.float64)
    _check(batch, samples, F.conv1d, weight, bias, 1, padding)
    _check(batch, samples, F.conv_transpose1d, weight.transpose(0, 1), bias[:4], 2)
    _check(batch, samples, F.max_pool1d, kernel, return_indices=True, exact=True)
    _check(batch, samples, F.avg_pool1d, kernel, 1, padding // 2, exact=True)
    if all(n > 0 for n in lengths):  # (torch.nested's constructor)
        njt = torch.nested.nested_tensor(samples, layout=torch.jagged)
        expected = F.conv1d(njt, weight, bias, 1, padding)
        out = F.conv1d(batch, weight, bias, 1, padding)
        torch.testing.assert_close(out.values, expected.values())
        assert [t.shape for t in out.unbind()] == [t.shape for t in expected.unbind()]


def test_pooling_over_ragged_channels():
    # (B, j, L): every sample an unbatched (C=n_i, L) input; channels pool alone.
    rows = _rows([3, 1, 4], (6,), torch.float32, 4, False)
    batch = _stored(rows, Layout.PACKED, (6,))
    _check(batch, rows, F.max_pool1d, 2, return_indices=True, exact=True)
    _check(batch, rows, F.avg_pool1d, 3, 2, 1, True, exact=True)
    # (B, M, j, L): the ragged dim is the channel dim of batched samples.
    rows = _rows([3, 2], (2, 6), torch.float32, 5, False)
    batch, samples = _over(rows, Layout.PADDED, (2, 6), 2)
    _check(batch, samples, F.max_pool1d, 3, exact=True)
    # A sample of no channel is refused by torch, and so here; an empty batch is not.
    rows = _rows([3, 0], (6,), torch.float32, 4, False)
    _check(_stored(rows, Layout.PACKED, (6,)), rows, F.max_pool1d, 2)
    empty = F.avg_pool1d(_stored([], Layout.PACKED, (6,)), 2)
    assert empty.batch_size == 0 and empty.shape[-1] == 3


# ============================================================================== edges
def test_short_and_empty_samples_raise_as_torch():
    w = torch.randn(4, 3, 3)
    for lengths in ([5, 2, 6], [5, 0, 6], [0]):
        batch, samples = _over(_rows(lengths, (3,), torch.float32, 0, False),
                               Layout.PACKED, (3,), 2)
        for func, args in ((F.conv1d, (w,)), (F.max_pool1d, (3,)), (F.avg_pool1d, (3,))):
            with pytest.raises(RuntimeError):
                func(batch, *args)
        if 0 in lengths:  # (a transposed convolution takes any length but 0)
            with pytest.raises(RuntimeError, match="zero batch"):
                F.conv_transpose1d(batch, w.transpose(0, 1))
    batch, _ = _over(_rows([5, 6], (3,), torch.float32, 0, False), Layout.PACKED, (3,), 2)
    with pytest.raises(RuntimeError, match="at most half"):
        F.max_pool1d(batch, 2, padding=2)
    with pytest.raises(RuntimeError, match="divisor"):
        F.avg_pool2d(batch.unsqueeze(2), 1, divisor_override=0)


def test_empty_batch_and_one_sample():
    batch, _ = _over([], Layout.PACKED, (3,), 2)
    out = F.conv1d(batch, torch.randn(5, 3, 3), padding=1)
    assert out.batch_size == 0 and out.shape[1] == 5
    assert F.max_pool1d(batch, 2, return_indices=True)[1].dtype == torch.int64
    batch, samples = _over(_rows([7], (3,), torch.float32, 0, False), Layout.PADDED, (3,), 2)
    _check(batch, samples, F.conv1d, torch.randn(2, 3, 3), None, 2, 1)


def test_sizes_known_only_on_the_device():
    values = torch.randn(15, 3)
    offsets = torch.tensor([0, 4, 11, 15])
    samples = [values[a:b].T for a, b in zip(offsets[:-1], offsets[1:])]
    for validate in (True, False):  # (the longest known, or nothing known on the host)
        batch = NestedBatch.from_offsets(values, offsets, validate=validate).transpose(1, 2)
        assert not batch.partition.knows_host_shapes
        _check(batch, samples, F.conv1d, torch.randn(2, 3, 2), None, 2, 1)
        _check(batch, samples, F.avg_pool1d, 3, 2, 1, True, False)
        too_short = NestedBatch.from_offsets(values, offsets, validate=validate)
        with pytest.raises(RuntimeError):
            F.max_pool1d(too_short.transpose(1, 2), 5)


def test_left_padded_and_wider_stored_batches():
    rows = _rows([4, 7, 2], (3,), torch.float32, 3, False)
    samples = [r.T for r in rows]
    data = torch.zeros(3, 9, 3)
    for i, r in enumerate(rows):
        data[i, 9 - len(r):] = r
    left = NestedBatch.from_padded(data, [4, 7, 2], padding_side="left").transpose(1, 2)
    # Stored wider than its longest sample, with padding that is not zero.
    wide = NestedBatch.from_padded(torch.stack(
        [F.pad(r, (0, 0, 0, 9 - len(r)), value=5.0) for r in rows]), [4, 7, 2]).transpose(1, 2)
    for batch in (left, wide):
        _check(batch, samples, F.conv1d, torch.randn(2, 3, 2), None, 1, 1)
        _check(batch, samples, F.max_pool1d, 2, 1, 1, exact=True)
        _check(batch, samples, F.avg_pool1d, 2, 1, 1, True, False, exact=True)


def test_modules_and_a_stack_of_layers():
    torch.manual_seed(0)
    rows = _rows([9, 16, 12], (4,), torch.float32, 7, True)
    batch, samples = _over(rows, Layout.PACKED, (4,), 2)
    model = nn.Sequential(nn.Conv1d(4, 6, 3, padding=1, groups=2), nn.ReLU(),
                          nn.MaxPool1d(2, ceil_mode=True), nn.Conv1d(6, 6, 3, stride=2),
                          nn.AvgPool1d(2, padding=1, count_include_pad=False))
    out = model(batch)
    for a, s in zip(out.unbind(), samples):
        torch.testing.assert_close(a, model(s))
    pooled = out.sum(2)  # over the ragged dim: a dense (B, C)
    torch.testing.assert_close(pooled, torch.stack([model(s).sum(1) for s in samples]))
    # The sequence model's way: (B, j, C) -> conv over j -> back -> Linear, and a gradient.
    seq = _stored(rows, Layout.PACKED, (4,))
    conv, linear = nn.Conv1d(4, 5, 3, padding=1), nn.Linear(5, 2)
    y = linear(conv(seq.transpose(1, 2)).transpose(1, 2))
    for a, s in zip(y.unbind(), rows):
        torch.testing.assert_close(a, linear(conv(s.T).T))
    y.values.sum().backward()
    weight_grad = conv.weight.grad.clone()
    conv.weight.grad = None
    sum(linear(conv(s.T).T).sum() for s in rows).backward()
    torch.testing.assert_close(weight_grad, conv.weight.grad)
    o, i = nn.MaxPool1d(3, return_indices=True)(batch)
    for a, b, s in zip(o.unbind(), i.unbind(), samples):
        ro, ri = nn.MaxPool1d(3, return_indices=True)(s)
        assert torch.equal(a, ro) and torch.equal(b, ri)


def test_every_spelling_dispatches():
    batch, samples = _over(_rows([5, 8], (3,), torch.float64, 0, False), Layout.PACKED, (3,), 2)
    w = torch.randn(2, 3, 2, dtype=torch.float64)
    for func, args in ((torch.conv1d, (w,)), (torch.max_pool1d, (2,)),
                       (torch.max_pool1d_with_indices, (2,)), (F.max_pool1d_with_indices, (2,)),
                       (torch.avg_pool1d, (2,))):
        _check(batch, samples, func, *args, exact=func is not torch.conv1d)
    out = torch.conv1d(input=batch, weight=w, stride=2)
    torch.testing.assert_close(out.unbind()[1], F.conv1d(samples[1], w, stride=2))


# ============================================================================== refusals
def test_refusals_name_what_is_unsupported():
    rows = _rows([3, 5], (3,), torch.float32, 0, False)
    batch = _stored(rows, Layout.PACKED, (3,))  # (B, j, C): the channels ragged for conv1d
    with pytest.raises(ValueError, match="channel dim"):
        F.conv1d(batch, torch.randn(2, 3, 1))
    with pytest.raises(ValueError, match="samples of 2 dims"):
        F.conv1d(batch.unsqueeze(-1).unsqueeze(-1), torch.randn(2, 3, 1))
    two = NestedBatch.from_list([torch.randn(2, 3, 4), torch.randn(1, 2, 4)], 2)
    with pytest.raises(ValueError, match="2 ragged dims"):
        F.max_pool1d(two, 2)
    ragged_w, _ = _over(_rows([4, 5], (2, 3), torch.float32, 0, False), Layout.PACKED,
                        (2, 3), 3)  # (B, C, H, j)
    with pytest.raises(ValueError, match="return_indices"):
        F.max_pool2d(ragged_w, 2, return_indices=True)
    with pytest.raises(RuntimeError):  # a weight of the wrong channels, as torch
        F.conv1d(batch.transpose(1, 2), torch.randn(2, 4, 1))
    with pytest.raises(TypeError, match="out="):
        torch.conv1d(batch.transpose(1, 2), torch.randn(2, 3, 1), out=torch.empty(0))


# ============================================================================== autograd
def _leaf(lengths, feature, seed):
    gen = torch.Generator().manual_seed(seed)
    total = sum(lengths)
    return torch.randn(total, *feature, generator=gen, dtype=torch.float64,
                       requires_grad=True)


def test_gradcheck_conv1d_over_the_ragged_dim():
    lengths = [4, 7, 3]
    values = _leaf(lengths, (2,), 0)
    weight = torch.randn(4, 2, 3, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(4, dtype=torch.float64, requires_grad=True)

    def f(v, w, b):
        x = NestedBatch.from_lengths(v, lengths).transpose(1, 2)
        return F.conv1d(x, w, b, stride=2, padding=1).values

    assert torch.autograd.gradcheck(f, (values, weight, bias))


def test_gradcheck_pools_over_the_ragged_dim():
    lengths = [5, 2, 8]
    values = _leaf(lengths, (2,), 1)

    def pool(v, fn, **kw):
        x = NestedBatch.from_padded(pad_sequence(list(v.split(lengths)), batch_first=True),
                                    lengths).transpose(1, 2)
        return fn(x, **kw).values

    assert torch.autograd.gradcheck(
        lambda v: pool(v, F.max_pool1d, kernel_size=3, stride=2, padding=1, ceil_mode=True),
        (values,))
    assert torch.autograd.gradcheck(
        lambda v: pool(v, F.avg_pool1d, kernel_size=3, stride=2, padding=1, ceil_mode=True,
                       count_include_pad=False), (values,))


def test_gradcheck_ragged_dim_first():
    lengths = [2, 0, 3]
    values = _leaf(lengths, (2, 5), 2)
    weight = torch.randn(3, 2, 2, dtype=torch.float64, requires_grad=True)

    def f(v, w):
        return F.conv1d(NestedBatch.from_lengths(v, lengths), w, padding=1).values

    assert torch.autograd.gradcheck(f, (values, weight))


def test_avg_pool3d_refuses_what_torch_refuses_for_a_sample():
    # (the audit's findings: an input dim shorter than the kernel, whatever the padding, and
    # a dtype torch's kernel lacks on the own-divisor route)
    short = [torch.randn(1, 5, 1, 5), torch.randn(1, 5, 4, 5)]
    batch = NestedBatch.from_list([t.movedim(2, 0) for t in short]).movedim(1, 3)
    with pytest.raises(RuntimeError, match="smaller than kernel size"):
        F.avg_pool3d(batch, 4, 3, 2)
    half = [torch.randn(2, 2, 2, 3).half(), torch.randn(2, 2, 6, 3).half()]
    batch = NestedBatch.from_list([t.movedim(2, 0) for t in half]).movedim(1, 3)
    with pytest.raises(NotImplementedError):
        F.avg_pool3d(batch, 2, 1, 1, count_include_pad=False)

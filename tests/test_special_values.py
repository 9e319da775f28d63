"""Special values, dtypes and in-place forms that gave silent wrong results or crashes (issue 25).

One test per reported case, each against the same op on every sample alone (torch's answer), on
both layouts and with sizes given on the host and on the device. The broad search for more such
cases is ``tests/test_differential.py``; the syncs are audited in ``tests/test_gpu_audit.py``.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F

import nestbatch as nb
from nestbatch import Layout, NestedBatch
from nestbatch.ops.registry import dispatch, registered_functions

INF, NAN = math.inf, math.nan


def _builds(samples: list[torch.Tensor]) -> list[NestedBatch]:
    """The batch of ``samples`` packed and padded, with host and with device sizes (offsets and
    shapes held in tensors: a 1-d lengths tensor in host memory is read as host sizes)."""
    lengths = [s.shape[0] for s in samples]
    values = torch.cat(samples)
    width = max(lengths) + 1  # padded wider than the longest sample, as a loader might
    data = torch.zeros(len(samples), width, *samples[0].shape[1:], dtype=samples[0].dtype)
    for i, s in enumerate(samples):
        data[i, : len(s)] = s
    return [
        NestedBatch.from_lengths(values, lengths),
        NestedBatch.from_offsets(values, torch.tensor([0, *itertools.accumulate(lengths)])),
        NestedBatch.from_padded(data, lengths),
        NestedBatch.from_padded(data, shape_per_sample=torch.tensor(lengths)[:, None]),
        nb.nested(samples).to(Layout.PADDED),
    ]


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal values and dtypes, NaN equal to NaN."""
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
        torch.where(a.isnan(), 0, a) if a.is_floating_point() else a,
        torch.where(b.isnan(), 0, b) if b.is_floating_point() else b,
    ) and (not a.is_floating_point() or torch.equal(a.isnan(), b.isnan()))


def _per_sample(fn, samples):
    return torch.stack([fn(s) for s in samples])


def test_nansum_keeps_infinities():
    samples = [torch.tensor([1.0, INF, NAN]), torch.tensor([-INF, 2.0]), torch.tensor([NAN])]
    expected = _per_sample(lambda s: torch.nansum(s, 0), samples)
    for b in _builds(samples):
        assert _same(torch.nansum(b, dim=1), expected), b.layout


@pytest.mark.parametrize("name", ["argmax", "argmin"])
def test_arg_reductions_point_at_the_first_nan(name):
    samples = [torch.tensor([1.0, NAN, 3.0, NAN]), torch.tensor([NAN, 2.0]), torch.tensor([5.0])]
    expected = _per_sample(lambda s: getattr(torch, name)(s, 0), samples)
    for b in _builds(samples):
        assert torch.equal(getattr(torch, name)(b, dim=1), expected), b.layout
        pair = (torch.max if name == "argmax" else torch.min)(b, dim=1)
        assert torch.equal(pair.indices, expected), b.layout


@pytest.mark.parametrize("name", ["amax", "amin", "argmax", "argmin"])
def test_padding_never_beats_infinities(name):
    samples = [torch.tensor([-INF]), torch.tensor([-INF, -INF, 0.0]), torch.tensor([INF]),
               torch.tensor([INF, INF])]
    expected = _per_sample(lambda s: getattr(torch, name)(s, 0), samples)
    for b in _builds(samples):
        assert _same(getattr(torch, name)(b, dim=1), expected), b.layout


def test_empty_samples_keep_the_documented_extremes_beside_infinities():
    samples = [torch.tensor([-INF]), torch.zeros(0), torch.tensor([INF])]
    lowest, highest = torch.finfo(torch.float32).min, torch.finfo(torch.float32).max
    for b in _builds(samples):
        assert torch.equal(torch.amax(b, dim=1), torch.tensor([-INF, lowest, INF]))
        assert torch.equal(torch.amin(b, dim=1), torch.tensor([-INF, highest, INF]))
        assert torch.equal(torch.argmax(b, dim=1), torch.tensor([0, -1, 0]))


@pytest.mark.parametrize("dtype", [torch.bool, torch.int64])
def test_logsumexp_of_integers_and_bools(dtype):
    samples = [torch.zeros(0, dtype=dtype), torch.tensor([1], dtype=dtype),
               torch.tensor([1, 0, 1], dtype=dtype)]
    expected = _per_sample(lambda s: torch.logsumexp(s, 0), samples)
    assert expected.dtype == torch.float32
    for b in _builds(samples):
        assert torch.allclose(torch.logsumexp(b, dim=1), expected), b.layout
        assert torch.logsumexp(b, dim=1).dtype == torch.float32


def test_to_padded_tensor_is_the_tightest_padding():
    for lengths in ([2, 3], torch.tensor([2, 3])):
        b = NestedBatch.from_padded(torch.arange(10.0).view(2, 5, 1), lengths)
        assert b.to_padded_tensor().shape == (2, 3, 1)
        assert torch.equal(b.to_padded_tensor(-1).squeeze(-1),
                           torch.tensor([[0.0, 1.0, -1.0], [5.0, 6.0, 7.0]]))
        assert b.to_padded_tensor(0, (2, 4, 1)).shape == (2, 4, 1)
    nt = torch.nested.nested_tensor([torch.zeros(2, 1), torch.zeros(3, 1)], layout=torch.jagged)
    assert nt.to_padded_tensor(0.0).shape == (2, 3, 1)  # torch.nested's answer


@pytest.mark.parametrize("op", ["+=", "-=", "*=", "/="])
def test_inplace_operator_with_a_dense_left_operand_raises(op):
    b = nb.nested([torch.ones(1, 3), torch.ones(2, 3)])
    d = torch.ones(3)
    with pytest.raises(RuntimeError, match="cannot hold"):
        exec(f"d {op} b", {}, {"d": d, "b": b})
    assert torch.equal(d, torch.ones(3))


@pytest.mark.parametrize("name", ["mean", "var", "std"])
def test_mean_var_std_of_integers_raise_on_every_layout(name):
    samples = [torch.tensor([1, 2]), torch.tensor([3])]
    with pytest.raises(RuntimeError):
        getattr(torch, name)(samples[0], 0)
    for b in _builds(samples):
        with pytest.raises(RuntimeError):
            getattr(torch, name)(b, dim=1)
    expected = _per_sample(lambda s: torch.mean(s, 0, dtype=torch.float64), samples)
    for b in _builds(samples):
        assert torch.equal(torch.mean(b, dim=1, dtype=torch.float64), expected)


@pytest.mark.parametrize("name", ["argmax", "argmin"])
def test_arg_reductions_of_bools_raise_on_every_layout(name):
    samples = [torch.tensor([True, False]), torch.tensor([True])]
    with pytest.raises(RuntimeError, match="bool"):
        getattr(torch, name)(samples[0], 0)
    for b in _builds(samples):
        with pytest.raises(RuntimeError, match="bool"):
            getattr(torch, name)(b, dim=1)


@pytest.mark.parametrize("func", [torch.max, torch.min])
def test_max_min_with_dim_of_bools(func):
    samples = [torch.tensor([False, True, True]), torch.tensor([True]), torch.tensor([False])]
    values = _per_sample(lambda s: func(s, 0).values, samples)
    indices = _per_sample(lambda s: func(s, 0).indices, samples)
    for b in _builds(samples):
        out = func(b, dim=1)
        assert torch.equal(out.values, values) and torch.equal(out.indices, indices), b.layout


def test_prod_over_a_feature_dim():
    samples = [torch.randn(2, 3, 4), torch.randn(1, 3, 4)]
    b = nb.nested(samples)
    for dim in (-1, 2, 3):
        out = torch.prod(b, dim=dim)
        for got, s in zip(out.unbind(), samples):
            assert torch.allclose(got, torch.prod(s, dim - 1 if dim > 0 else dim))
    out = torch.prod(b, dim=-1, keepdim=True, dtype=torch.float64)
    assert out.dtype == torch.float64 and out.feature_shape == (3, 1)


def test_registry_holds_functions_only():
    funcs = registered_functions()
    assert all(callable(f) and not isinstance(f, torch.dtype) for f in funcs)
    b = nb.nested([torch.ones(2, 3), torch.ones(1, 3)])
    out = dispatch(torch.Tensor.__itruediv__, (), (b, 2), {})
    assert out is b and torch.equal(b.values, torch.full((3, 3), 0.5))
    assert torch.equal(b.real.values, b.values)  # the property is served by torch.real


def test_attention_with_keys_and_values_padded_to_different_widths():
    torch.manual_seed(0)
    data = torch.randn(2, 5, 4)
    data[0, 2:] = data[1, 3:] = 0.0
    x = NestedBatch.from_padded(data, [2, 3], padding_value=0.0)  # a loader padded to 5
    proj = torch.nn.Linear(4, 4)
    q, k, v = proj(x), proj(x), x
    assert k.layout is Layout.PACKED and v.layout is Layout.PADDED
    out = F.scaled_dot_product_attention(q, k, v)
    for got, qs, ks, vs in zip(out.unbind(), q.unbind(), k.unbind(), v.unbind()):
        assert torch.allclose(got, F.scaled_dot_product_attention(qs, ks, vs), atol=1e-6)


@pytest.mark.parametrize("index", [slice(0, None), slice(None, None, 1), slice(0, None, 1)])
def test_whole_slices_with_device_lengths(index):
    samples = [torch.arange(2.0), torch.arange(3.0)]
    for b in _builds(samples):
        out = b[:, index]
        assert [t.tolist() for t in out.unbind()] == [s.tolist() for s in samples]


def test_zero_and_fill_in_place():
    for b in _builds([torch.arange(2.0), torch.arange(3.0), torch.zeros(0)]):
        stored = b.to_padded_tensor(-7)  # a cached padded layout with a known filler
        assert b.fill_(4.0) is b
        assert [t.tolist() for t in b.unbind()] == [[4.0, 4.0], [4.0] * 3, []]
        b.fill_(torch.tensor(2.0))
        assert torch.equal(b.values, torch.full((5,), 2.0))
        assert b.zero_() is b and torch.equal(b.values, torch.zeros(5))
        assert stored.shape == (3, 3)


def test_inplace_ops_write_the_stored_layout_and_keep_the_padding():
    samples = [torch.tensor([1.0, 2.0]), torch.tensor([3.0])]
    padded = NestedBatch.from_padded(torch.tensor([[1.0, 2.0], [3.0, -1.0]]), [2, 1],
                                     padding_value=-1.0)
    padded.exp_()
    assert torch.equal(padded.padded(-1.0).data[1, 1], torch.tensor(-1.0))  # padding kept
    assert all(torch.allclose(t, s.exp()) for t, s in zip(padded.unbind(), samples))
    packed = NestedBatch.from_lengths(torch.tensor([1.0, 2.0, 3.0]), [2, 1])
    view = packed[0]
    packed.add_(packed).mul_(torch.tensor(3.0))
    assert torch.equal(view, torch.tensor([6.0, 12.0]))  # a view of the stored rows
    with pytest.raises(RuntimeError, match="can't be cast"):
        NestedBatch.from_lengths(torch.tensor([1, 2]), [2]).add_(0.5)


def test_local_indices_takes_the_batch_packed_indices_returns():
    verts = nb.nested([torch.randn(3, 3), torch.randn(4, 3)])
    faces = nb.nested([torch.tensor([[0, 1, 2]]), torch.tensor([[0, 1, 3], [1, 2, 3]])])
    shifted = nb.packed_indices(faces, into=verts)
    back = nb.local_indices(shifted, faces, into=verts)
    assert torch.equal(back.values, faces.values)
    assert torch.equal(nb.local_indices(shifted.values, faces, into=verts).values, faces.values)
    other = nb.nested([torch.tensor([[0, 1, 2]] * 2), torch.tensor([[0, 1, 3]])])
    with pytest.raises(ValueError, match="same row structure"):
        nb.local_indices(other, faces, into=verts)


def test_rnn_with_empty_samples_matches_per_sample():
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(3, 4, batch_first=True)
    samples = [torch.randn(2, 3), torch.zeros(0, 3), torch.randn(4, 3), torch.randn(1, 3)]
    for b in (nb.nested(samples), NestedBatch.from_lengths(torch.cat(samples),
                                                           torch.tensor([2, 0, 4, 1]))):
        out, (h, c) = lstm(b)
        for i, s in enumerate(samples):
            if len(s) == 0:
                assert out[i].shape == (0, 4) and torch.equal(h[:, i], torch.zeros(1, 4))
                continue
            ref, (hr, cr) = lstm(s[None])
            assert torch.allclose(out[i], ref[0], atol=1e-6)
            assert torch.allclose(h[:, i], hr[:, 0], atol=1e-6)
            assert torch.allclose(c[:, i], cr[:, 0], atol=1e-6)


def test_from_packed_sequence_with_device_style_indices_keeps_order():
    samples = [torch.randn(2, 3), torch.randn(4, 3), torch.randn(1, 3)]
    seq = torch.nn.utils.rnn.pack_sequence(samples, enforce_sorted=False)
    for unsorted in (seq.unsorted_indices, None):
        if unsorted is None:
            seq = torch.nn.utils.rnn.pack_sequence(sorted(samples, key=len, reverse=True))
            expected = sorted(samples, key=len, reverse=True)
        else:
            expected = samples
        b = nb.from_packed_sequence(seq)
        assert all(torch.equal(a, e) for a, e in zip(b.unbind(), expected))


def test_reflected_operators_keep_python_scalars_exact():
    b = nb.nested([torch.tensor([0.0], dtype=torch.float64),
                   torch.tensor([0.3, 2.0], dtype=torch.float64)])
    ops = [lambda x: 1.7976931348623157e308 + x, lambda x: 0.1 - x, lambda x: 0.1 * x,
           lambda x: 0.1 / x, lambda x: 7.1 // x, lambda x: 7.1 % x, lambda x: 0.1 ** x]
    for op in ops:
        for got, sample in zip(op(b).unbind(), b.unbind()):
            assert _same(got, op(sample))


def test_integer_division_never_divides_by_the_padding():
    samples = [torch.tensor([1, 2]), torch.tensor([3])]
    for b in _builds(samples):
        for op in (lambda x: 3 // x, lambda x: 3 % x,
                   lambda x: torch.fmod(torch.tensor(6), x),
                   lambda x: torch.remainder(torch.tensor(6), x)):
            assert [t.tolist() for t in op(b).unbind()] == [op(s).tolist() for s in samples]
        target = b.clone()
        target.floor_divide_(nb.nested(samples))
        target %= nb.nested(samples)
        assert [t.tolist() for t in target.unbind()] == [[0, 1], [1]]


def test_negative_zero_and_large_integer_fillers():
    b = nb.nested([torch.tensor([1.0]), torch.tensor([1.0, 2.0])]).to(Layout.PADDED)
    assert torch.signbit(b.padded(-0.0).data[0, 1])
    assert not torch.signbit(b.padded(0.0).data[0, 1])
    assert torch.signbit(b.to_padded_tensor(-0.0, output_size=[2, 3])[0, 2])
    stored = NestedBatch.from_padded(torch.tensor([[1.0, -0.0], [1.0, 2.0]]), [1, 2],
                                     padding_value=-0.0)
    assert not torch.signbit(stored.padded(0.0).data[0, 1])
    top = 2**63 - 1
    for ints in (nb.nested([torch.tensor([2]), torch.tensor([2, 2, 2])]),
                 NestedBatch.from_list([torch.tensor([[2]]), torch.tensor([[0]])])):
        for layout in (Layout.PACKED, Layout.PADDED, Layout.LIST):
            padded = ints.to(layout).padded(top).data
            assert padded.flatten()[1].item() == top or padded.numel() == 2


def test_empty_batches_keep_their_dtype_in_every_layout():
    for dtype in (torch.int64, torch.bool, torch.float16):
        b = NestedBatch.from_lengths(torch.zeros(0, dtype=dtype), [])
        assert {b.to(layout).dtype for layout in Layout} == {dtype}


def test_inplace_ops_follow_torch_rules_on_every_layout():
    samples = [torch.tensor([1.0, 2.0]), torch.tensor([3.0])]
    for b in (NestedBatch.from_list(samples), *_builds(samples)):
        with pytest.raises(RuntimeError, match="Double"):
            b.float_power_(2)


@pytest.mark.parametrize("values", [[3.3895e38, -3.3895e38], [0.0, 3.3895e38],
                                    [1.1754943508222875e-38, -0.0]])
def test_half_precision_variance_neither_overflows_nor_underflows(values):
    sample = torch.tensor(values, dtype=torch.bfloat16)
    for b in _builds([sample, sample[:1]]):
        for name in ("var", "std"):
            got = getattr(torch, name)(b, dim=1)[0]
            assert _same(got, getattr(torch, name)(sample, 0))


@pytest.mark.parametrize("how", ["var", "std"])
def test_variance_of_values_spanning_the_range_is_inf_as_torch_gives(how):
    """The first-element shift would overflow (-max - max) and give NaN: such samples are not
    shifted, on packed rows and on padded data alike (found by the differential suite)."""
    big = torch.finfo(torch.float64).max
    samples = [torch.tensor(s, dtype=torch.float64) for s in ([big, -big], [1.0, 2.0, 4.0], [])]
    reduce = getattr(torch, how)
    expected = [reduce(s).item() if len(s) else float("nan") for s in samples]
    for b in _builds(samples):
        got = reduce(b, dim=1).tolist()
        assert got[0] == expected[0] == float("inf")
        assert got[1] == pytest.approx(expected[1]) and math.isnan(got[2])


@pytest.mark.parametrize("how", ["amin", "amax"])
@pytest.mark.parametrize("keepdim", [False, True])
def test_extremes_over_ragged_and_feature_dims_keep_torchs_first_zero(how, keepdim):
    """Of equal extremes (0.0 and -0.0) torch keeps the first in row-major order: every row's
    feature dims before the next row. Reduced rows first, the -0.0 of a later row won (found by
    the differential suite)."""
    sign = 1.0 if how == "amin" else -1.0
    rows = sign * torch.tensor([[[1.0, 0.0], [0.0, 0.0]], [[1.0, 0.0], [0.0, 0.0]],
                                [[-0.0, 0.0], [0.0, 0.0]]])
    samples = [rows, rows.flip(0), rows[:1]]
    reduce = getattr(torch, how)
    for dims in ((1, 2), (1, 3), (1, 2, 3)):
        inner = tuple(d - 1 for d in dims)
        expected = torch.stack([reduce(s, dim=inner, keepdim=keepdim) for s in samples])
        for b in _builds(samples):
            got = reduce(b, dim=dims, keepdim=keepdim)
            assert got.shape == expected.shape
            assert torch.equal(got, expected) and torch.equal(got.signbit(), expected.signbit())


# ------------------------------------------------------------------------------------------
# Ops outside the differential suite's families, audited with special values (session 16):
# whole-sample norms, prelu with one weight per channel, attention rows that attend to nothing.

def _bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """:func:`_same`, and the sign of every zero too."""
    return _same(a, b) and torch.equal(a.signbit(), b.signbit())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_whole_sample_rms_norm_takes_torchs_default_eps(dtype):
    """torch's default is the epsilon of its compute dtype: float32's for half precision, which
    moves float16 / bfloat16 results (0.7739 against torch's 0.7744 with the dtype's own)."""
    samples = [torch.tensor(s, dtype=dtype) for s in ([[0.5, 0.0, 1.0]], [[1e-3, -2e-3, 0.0],
                                                                         [4.0, 0.5, -0.0]])]
    for b in _builds(samples):
        for got, s in zip(F.rms_norm(b, b.shape[1:]).unbind(), samples):
            assert torch.allclose(got.float(), F.rms_norm(s, s.shape).float(), rtol=1e-2)
            assert torch.equal(got, F.rms_norm(s, s.shape)) or dtype == torch.float32


def test_whole_sample_layer_norm_never_gives_negative_zero():
    """torch's kernel adds its (zero) bias last, so -0.0 comes out as 0.0."""
    samples = [torch.tensor(s) for s in ([[1.0, -1.0, -0.0]], [[-0.0, -0.0, -0.0]] * 2,
                                         [[2.0, 2.0, 2.0]])]
    for b in _builds(samples):
        for got, s in zip(F.layer_norm(b, b.shape[1:]).unbind(), samples):
            assert _bits(got, F.layer_norm(s, s.shape))


@pytest.mark.parametrize("dtype, big", [(torch.float32, 1e20), (torch.float64, 1e160)])
def test_whole_sample_layer_norm_overflows_where_torch_does(dtype, big):
    """torch's kernel takes the variance as E[x^2] - E[x]^2: where the squares overflow, its
    result is NaN, or 0 where only E[x^2] does (a two-pass variance gave 0 for all three)."""
    samples = [torch.tensor(s, dtype=dtype) for s in ([[big, big, 1.0]], [[big / 5] * 3],
                                                      [[big, -big, 0.0]], [[1.0, 2.0, 4.0]])]
    for b in _builds(samples):
        for got, s in zip(F.layer_norm(b, b.shape[1:]).unbind(), samples):
            expected = F.layer_norm(s, s.shape)
            assert _same(got, expected) or torch.allclose(got, expected), (got, expected)


@pytest.mark.parametrize("norm", [F.layer_norm, F.rms_norm])
def test_whole_sample_norms_of_integers_raise_and_of_no_rows_are_empty(norm):
    for dtype in (torch.int64, torch.int32, torch.bool):
        b = NestedBatch.from_list([torch.ones(2, 3, dtype=dtype), torch.ones(1, 3, dtype=dtype)])
        with pytest.raises(NotImplementedError):
            norm(torch.ones(2, 3, dtype=dtype), (2, 3), eps=1e-6)  # torch's answer
        with pytest.raises(NotImplementedError):
            norm(b, b.shape[1:], eps=1e-6)
    empty = NestedBatch.from_list([torch.zeros(0, 3), torch.zeros(0, 3)])
    out = norm(empty, empty.shape[1:])
    assert out.values.shape == (0, 3) and out.batch_size == 2


def test_prelu_weights_per_channel_follow_each_samples_dim_1():
    """torch's channels are dim 1 of its input: of every sample here, whatever dim of the
    stored values that is (the ragged dim moved last, or features before it)."""
    torch.manual_seed(0)
    weight = torch.tensor([0.5, -2.0, 0.25])
    cases = [
        [torch.randn(n, 3) for n in (2, 0, 4)],  # (L, C): C is the first feature dim
        [torch.randn(n, 3, 2) for n in (1, 3)],  # (L, C, H)
    ]
    for samples in cases:
        for got, s in zip(F.prelu(NestedBatch.from_list(samples), weight).unbind(), samples):
            assert _bits(got, F.prelu(s, weight))
    # Samples (2, 3, L): the ragged dim last, the channels (3) its second feature dim.
    samples = [torch.randn(2, 3, n) for n in (4, 1)]
    b = NestedBatch.from_list([s.permute(2, 0, 1) for s in samples]).permute(0, 2, 3, 1)
    assert b.ragged_dim == 3
    for got, s in zip(F.prelu(b, weight).unbind(), samples):
        assert _bits(got, F.prelu(s, weight))
    assert _bits(F.prelu(b, weight[:1]).values, F.prelu(b.values, weight[:1]))  # one weight
    leaves = (b.values.double().requires_grad_(), weight.double().requires_grad_())
    assert torch.autograd.gradcheck(lambda v, w: F.prelu(b.with_values(v), w).values, leaves)


def test_prelu_weights_per_channel_refuse_a_ragged_channel_dim():
    weight = torch.tensor([0.5, -2.0])
    two_ragged = NestedBatch.from_list([torch.randn(1, 2, 2), torch.randn(2, 1, 2)], 2)
    moved = NestedBatch.from_list([torch.randn(2, 2), torch.randn(1, 2)]).transpose(1, 2)
    for b in (two_ragged, moved):
        with pytest.raises(ValueError, match="dim 1 of each sample"):
            F.prelu(b, weight)
    with pytest.raises(RuntimeError, match="channel size"):  # torch's own error
        F.prelu(NestedBatch.from_list([torch.randn(2, 4)]), weight)
    with pytest.raises(RuntimeError, match="channel size"):  # 1-d samples: one channel
        F.prelu(NestedBatch.from_list([torch.randn(3)]), weight)


def test_attention_rows_that_attend_to_nothing_are_zero_weights_times_the_values():
    """torch computes a fully masked row as zero weights times the values: NaN in a column
    with NaN or an infinity, zeros elsewhere (and for a sample with no keys)."""
    q = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    k = torch.tensor([[1.0, 1.0], [2.0, -1.0]])
    v = torch.tensor([[NAN, 5.0, -1.0], [1.0, -INF, -2.0]])
    m = torch.tensor([[False, False], [True, False], [False, False]])
    samples = [(q, k, v, m), (q[:2], k[:1], v[:1], m[:2, :1]), (q[:1], k[:0], v[:0], m[:1, :0])]
    queries, keys, values, masks = zip(*samples)
    queries, keys, values = (NestedBatch.from_list(list(x)) for x in (queries, keys, values))
    masks = NestedBatch.from_list(list(masks), 2)  # samples (Lq_i, Lk_i)
    out = F.scaled_dot_product_attention(queries, keys, values, attn_mask=masks)
    for got, (qs, ks, vs, ms) in zip(out.unbind(), samples):
        expected = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=ms)
        assert _same(got, expected), (got, expected)
    # The padded slots of the result are still its declared filler, zeros.
    padded = out.padded(None)
    assert torch.equal(padded.data.masked_fill(padded.mask[..., None], 0.0),
                       torch.zeros_like(padded.data))


@pytest.mark.parametrize("op", [torch.sqrt, torch.log, torch.rsqrt, lambda t: t ** 0.5])
@pytest.mark.parametrize("inplace", [False, True])
def test_padding_takes_no_gradient_through_elementwise_ops(op, inplace):
    """An op on padded data gives the padding 0 times its derivative there: NaN where that is
    infinite (sqrt of a zero filler), which reached the layer that made the data."""
    torch.manual_seed(0)
    lengths = [2, 3]
    lin = torch.nn.Linear(2, 2).double()
    x = torch.rand(2, 3, 2, dtype=torch.float64) + 1
    keep = (torch.arange(3)[None, :, None] < torch.tensor(lengths)[:, None, None])
    b = NestedBatch.from_padded(lin(x).abs() * keep, lengths)  # zero padding
    if inplace:
        name = {torch.sqrt: "sqrt_", torch.log: "log_", torch.rsqrt: "rsqrt_"}.get(op)
        if name is None:
            pytest.skip("no in-place form")
        getattr(b, name)()
        out = b
    else:
        out = op(b)
    out.sum(1).sum().backward()
    got = lin.weight.grad.clone()
    lin.zero_grad()
    sum(op(lin(x[i, :n]).abs()).sum() for i, n in enumerate(lengths)).backward()
    assert torch.allclose(got, lin.weight.grad)


# Gradients at special values and ties, against torch's on every sample alone (session 16).
def _sample_grads(batch_fn, sample_fn, samples, upstream=1.0):
    """The gradients of ``upstream * batch_fn(batch).sum()`` for every construction of the
    batch that keeps the samples' graph (``nested`` copies them, as ``torch.nested``'s
    constructor), and of the same through ``sample_fn`` on every sample alone."""
    leaves = [s.detach().clone().requires_grad_() for s in samples]
    expected = torch.autograd.grad(upstream * sum(sample_fn(s).sum() for s in leaves), leaves)
    results = []
    for index in range(len(_builds(samples)) - 1):
        leaves = [s.detach().clone().requires_grad_() for s in samples]
        out = batch_fn(_builds(leaves)[index])
        out = out.values if isinstance(out, NestedBatch) else out
        results.append(torch.autograd.grad(upstream * out.sum(), leaves))
    return expected, results


def _assert_grads(expected, results):
    for got in results:
        for g, e in zip(got, expected):
            assert _same(g, e) or torch.allclose(g, e, equal_nan=True), (g, e)


@pytest.mark.parametrize("name", ["amax", "amin"])
@pytest.mark.parametrize("upstream", [1.0, -1.0])
@pytest.mark.parametrize("dims, inner", [(1, 0), ((1, 2), (0, 1))])
def test_extremes_split_the_gradient_among_ties_as_torch(name, upstream, dims, inner):
    """torch.segment_reduce's backward split ties only for a positive gradient; a padded amax
    shared it with padding tying at -inf; over rows and features the ties of each stage were
    weighted apart."""
    sign = 1.0 if name == "amax" else -1.0
    samples = [sign * torch.tensor(s, dtype=torch.float64) for s in (
        [[2.0, 1.0], [2.0, 1.0]], [[-INF, 3.0]], [[3.0, 3.0], [3.0, 0.0], [1.0, 3.0]],
        [[NAN, 1.0], [1.0, 1.0]])]
    samples[1] = torch.tensor([[-INF * sign, 3.0 * sign]], dtype=torch.float64)
    reduce = getattr(torch, name)
    _assert_grads(*_sample_grads(lambda b: reduce(b, dim=dims), lambda s: reduce(s, dim=inner),
                                 samples, upstream))


@pytest.mark.parametrize("func", [torch.max, torch.min])
def test_max_with_dim_sends_the_gradient_to_its_index(func):
    samples = [torch.tensor(s, dtype=torch.float64) for s in ([[3.0, 1.0], [3.0, 0.0]],
                                                              [[0.0, 3.0], [5.0, 3.0]])]
    _assert_grads(*_sample_grads(lambda b: func(b, 1).values,
                                 lambda s: func(s, 0).values, samples))
    _assert_grads(*_sample_grads(lambda b: func(b, 2, keepdim=True).values,
                                 lambda s: func(s, 1, keepdim=True).values, samples))


def test_std_of_equal_values_has_gradient_zero():
    samples = [torch.tensor(s, dtype=torch.float64) for s in ([[1.0, 2.0], [1.0, 3.0]],
                                                              [[4.0, 4.0]] * 3)]
    _assert_grads(*_sample_grads(lambda b: b.std(1), lambda s: s.std(0), samples))


def test_logsumexp_over_rows_and_features_of_minus_inf_has_gradient_zero():
    samples = [torch.tensor(s, dtype=torch.float64) for s in ([[-INF, 1.0], [-INF, 2.0]],
                                                              [[-INF, -INF]], [[0.5, -INF]])]
    _assert_grads(*_sample_grads(lambda b: torch.logsumexp(b, (1, 2)),
                                 lambda s: torch.logsumexp(s, (0, 1)), samples))


@pytest.mark.parametrize("func", [torch.any, torch.all])
@pytest.mark.parametrize("dims, inner", [(1, 0), ((1, 2), (0, 1))])
def test_any_all_of_uint8_are_uint8_as_torch(func, dims, inner):
    samples = [torch.tensor([[0, 2], [0, 0]], dtype=torch.uint8),
               torch.tensor([[1, 0]], dtype=torch.uint8)]
    expected = _per_sample(lambda s: func(s, inner), samples)
    for b in _builds(samples):
        assert _same(func(b, dims), expected)


def test_merged_level_extreme_gives_the_padding_no_gradient():
    values = torch.tensor([-INF, -INF, 1.0], dtype=torch.float64, requires_grad=True)
    docs = NestedBatch.from_nested_row_splits(values, ([0, 2], [0, 2, 3]))  # [-inf, -inf], [1]
    (grad,) = torch.autograd.grad(docs.amax(1).packed().values.sum(), values)
    assert grad.tolist() == [0.0, 1.0, 1.0]


@pytest.mark.parametrize("layout", [None, Layout.PADDED])
@pytest.mark.parametrize("lengths", [[2, 0, 4, 1], [2, 3, 2]])
def test_gradcheck_of_extremes_without_ties(layout, lengths):
    torch.manual_seed(0)
    values = torch.randn(7, 3, dtype=torch.float64, requires_grad=True)

    def extremes(v):
        b = NestedBatch.from_lengths(v, lengths)
        b = b.to(layout) if layout is not None else b
        if 0 in lengths or 1 in lengths:  # (empty samples included: finite results only)
            return b.amax(1), b.amin((1, 2)), torch.max(b, 1).values
        return b.std(1), torch.logsumexp(b, (1, 2)), b.prod(1)

    assert torch.autograd.gradcheck(extremes, (values,))


def test_prod_gradient_is_torchs_for_each_sample_alone():
    """torch's product gradient is result / x where the tensor holds no zero, the product of
    the others elsewhere: per sample here, on every layout (a NaN element got 1 from
    segment_reduce's, and a padded product took the other rule when another sample held 0)."""
    samples = [torch.tensor(s, dtype=torch.float64) for s in (
        [[NAN, 2.0], [1.0, 3.0]], [[0.0, 2.0], [4.0, 0.0]], [[0.0, 5.0], [0.0, 1.0]],
        [[2.0, -0.5]], [[INF, 2.0], [3.0, 1.0]])]
    _assert_grads(*_sample_grads(lambda b: b.prod(1), lambda s: s.prod(0), samples))


@pytest.mark.parametrize("op", ["addcmul_", "addcdiv_", "hypot_", "div_", "pow_", "atan2_",
                                "xlogy_", "mul_"])
def test_padding_of_a_batch_operand_takes_no_gradient_in_place(op):
    """An in-place op with a padded batch operand ran over that operand's raw padding (NaN
    here), whose gradient came out 0 times NaN."""
    torch.manual_seed(0)
    lengths = [3, 1]
    data = torch.rand(2, 3, 2, dtype=torch.float64) + 1
    data[1, 1:] = NAN
    data.requires_grad_()
    b = NestedBatch.from_padded(data, lengths)
    u = b * 1.0
    operands = (b, b) if op in ("addcmul_", "addcdiv_") else (b,)
    getattr(u, op)(*operands)
    assert u.layout is Layout.PADDED
    (grad,) = torch.autograd.grad(sum(s.sum() for s in u.unbind()), data)
    assert torch.equal(grad[1, 1:], torch.zeros_like(grad[1, 1:]))
    for i, n in enumerate(lengths):
        sample = data[i, :n].detach().requires_grad_()
        inner = sample * 1.0
        getattr(inner, op)(*((sample,) * len(operands)))
        (expected,) = torch.autograd.grad(inner.sum(), sample)
        assert torch.allclose(grad[i, :n], expected)

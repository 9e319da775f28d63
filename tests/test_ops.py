"""Ops on NestedBatch against the same torch op run on every sample alone."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from ragged_strategies import ragged_samples

import nestbatch
from nestbatch import Layout, NestedBatch
from nestbatch.ops import segment

FLOATS = (torch.float32, torch.float64)
settings_ = settings(max_examples=25, deadline=None)


def _batch(samples, k, layout):
    return nestbatch.nested(samples, layout=layout, num_ragged_dims=k) if samples else \
        NestedBatch.from_list(samples, k)


def _close(actual, expected):
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        assert a.shape == e.shape, (a.shape, e.shape)
        torch.testing.assert_close(a, e, equal_nan=True)


layouts = st.sampled_from([Layout.PACKED, Layout.PADDED, Layout.LIST])


# ------------------------------------------------------------------------------- elementwise
UNARY = [torch.abs, torch.neg, torch.exp, torch.sigmoid, torch.tanh, torch.relu, F.gelu, F.silu,
         torch.sgn, torch.logical_not, lambda x: x.clamp(-1, 1), lambda x: -x, abs,
         lambda x: x * 2 + 1, lambda x: 3 - x, lambda x: x ** 2, lambda x: 2 / (x.abs() + 1),
         lambda x: x > 0, lambda x: torch.where(x > 0, x, 0.0), lambda x: x.masked_fill(x < 0, 7)]


@settings_
@given(ragged_samples(dtypes=FLOATS, max_batch=4), layouts, st.sampled_from(range(len(UNARY))))
def test_unary_matches_per_sample(drawn, layout, which):
    samples, k = drawn
    op = UNARY[which]
    out = op(_batch(samples, k, layout))
    _close(out.unbind(), [op(s) for s in samples])


@settings_
@given(ragged_samples(dtypes=FLOATS, max_batch=4), st.sampled_from(
    [torch.add, torch.sub, torch.mul, torch.div, torch.maximum, torch.eq, torch.lt, torch.pow]))
def test_binary_two_batches(drawn, op):
    samples, k = drawn
    x = _batch(samples, k, Layout.PACKED)
    y = _batch([s.abs() + 1 for s in samples], k, Layout.PADDED)
    _close(op(x, y).unbind(), [op(s, s.abs() + 1) for s in samples])


def test_operators_and_inplace():
    a, b = torch.arange(4.0), torch.arange(2.0)
    x = NestedBatch.from_list([a, b])
    _close((x + x).unbind(), [a + a, b + b])
    _close((1 - x).unbind(), [1 - a, 1 - b])
    _close((2 ** x).unbind(), [2 ** a, 2 ** b])
    _close((~(x > 1)).unbind(), [~(a > 1), ~(b > 1)])
    x += 1  # in place on the stored list: the samples (the caller's tensors) see it
    assert x.layout is Layout.LIST and torch.equal(a, torch.arange(4.0) + 1)
    assert {x: 1}[x] == 1  # hashable by identity
    p = nestbatch.nested([torch.ones(3), torch.ones(1)], layout=Layout.PADDED)
    p.mul_(3)
    assert p.materialized_layouts == (Layout.PADDED,)
    _close(p.unbind(), [torch.full((3,), 3.0), torch.full((1,), 3.0)])
    with pytest.raises(RuntimeError, match="can't be cast"):
        nestbatch.nested([torch.arange(3)]).add_(0.5)


# ------------------------------------------------------------------------------- broadcasting
def test_tf_broadcasting_examples():
    x = nestbatch.nested([torch.tensor([1, 2]), torch.tensor([3])])
    assert (x + 3).tolist() == [[4, 5], [6]]
    x = nestbatch.nested([torch.tensor([10, 87, 12]), torch.tensor([19, 53]),
                          torch.tensor([12, 32])])
    y = torch.tensor([[1000], [2000], [3000]])
    assert (x + y).tolist() == [[1010, 1087, 1012], [2019, 2053], [3012, 3032]]
    x = nestbatch.nested([torch.tensor([[1, 2], [3, 4], [5, 6]]), torch.tensor([[7, 8]])])
    assert (x + torch.tensor([[10]])).tolist() == [[[11, 12], [13, 14], [15, 16]], [[17, 18]]]
    x = nestbatch.nested([torch.tensor([[1], [2]]), torch.tensor([[5]])])
    assert (x + torch.tensor([10, 20, 30])).tolist() == [[[11, 21, 31], [12, 22, 32]],
                                                            [[15, 25, 35]]]


def test_tf_non_broadcastable():
    x = nestbatch.nested([torch.tensor([1, 2]), torch.tensor([3, 4, 5, 6]), torch.tensor([7])])
    with pytest.raises(ValueError, match="ragged dim 1"):
        x + torch.arange(12).view(3, 4)
    y = nestbatch.nested([torch.tensor([10, 20]), torch.tensor([30, 40]), torch.tensor([50])])
    with pytest.raises(ValueError, match="same row structure.*lengths=\\[2, 4, 1\\]"):
        x + y
    a = nestbatch.nested([torch.zeros(3, 2), torch.zeros(2, 2)])
    b = nestbatch.nested([torch.zeros(3, 3), torch.zeros(2, 3)])
    with pytest.raises(ValueError, match="Unable to broadcast"):
        a + b


def test_map_values_tf_example():
    digits = nestbatch.nested([torch.tensor(v, dtype=torch.long)
                               for v in ([3, 1, 4, 1], [], [5, 9, 2], [6], [])])
    assert digits.map_values(lambda v: v * 2 + 1).tolist() == [[7, 3, 9, 3], [], [11, 19, 5],
                                                                  [13], []]
    assert torch.tile(digits, (1, 2)).tolist() == [[3, 1, 4, 1, 3, 1, 4, 1], [],
                                                       [5, 9, 2, 5, 9, 2], [6, 6], []]
    extra = torch.tensor([[5, 3]])
    assert torch.cat([digits, extra], 0).tolist()[-1] == [5, 3]
    mean = digits.double().mean(1)
    torch.testing.assert_close(mean, torch.tensor([2.25, math.nan, 16 / 3, 6.0, math.nan],
                                                  dtype=torch.float64), equal_nan=True)


# ------------------------------------------------------------------------------- reductions
REDUCTIONS = ["sum", "mean", "prod", "amax", "amin", "logsumexp", "var", "std", "count_nonzero",
              "any", "all", "argmax", "argmin"]
EMPTY = {"sum": 0, "prod": 1, "count_nonzero": 0, "any": False, "all": True, "argmax": -1,
         "argmin": -1, "logsumexp": -math.inf, "mean": math.nan, "var": math.nan,
         "std": math.nan}


def _reference(name, sample, dims):
    if sample.shape[0] == 0 or 0 in sample.shape[: len(dims)]:
        shape = sample.shape[len(dims):]
        if name in ("amax", "amin"):
            info = torch.finfo(sample.dtype)
            return torch.full(shape, info.min if name == "amax" else info.max, dtype=sample.dtype)
        dtype = {"count_nonzero": torch.int64, "any": torch.bool, "all": torch.bool,
                 "argmax": torch.int64, "argmin": torch.int64}.get(name, sample.dtype)
        return torch.full(shape, EMPTY[name], dtype=dtype)
    if name in ("argmax", "argmin"):
        return getattr(torch, name)(sample.flatten(0, len(dims) - 1), 0)
    if name in ("any", "all", "prod"):
        return getattr(torch, name)(sample.flatten(0, len(dims) - 1), 0)
    return getattr(torch, name)(sample, dims)


@pytest.fixture(params=["torch", "scatter"])
def backend(request):
    if request.param == "scatter" and not segment.scatter_available():
        pytest.skip("torch-scatter is not installed")
    previous = segment.set_segment_backend(request.param)
    yield request.param
    segment.set_segment_backend(previous)


@pytest.mark.parametrize("name", REDUCTIONS)
@pytest.mark.parametrize("layout", [Layout.PACKED, Layout.PADDED])
def test_ragged_reductions(name, layout, backend):
    gen = torch.Generator().manual_seed(0)
    for k in (1, 2):
        shapes = [(3, 2)[:k], (0, 1)[:k], (1, 4)[:k], (2, 0)[:k]]
        samples = [torch.randn(*s, 3, generator=gen, dtype=torch.float64) for s in shapes]
        if k == 2 and name in ("argmax", "argmin"):
            continue
        x = nestbatch.nested(samples, layout=layout, num_ragged_dims=k)
        dims = tuple(range(1, k + 1))
        out = getattr(x, name)(dims) if k > 1 else getattr(torch, name)(x, 1)
        expected = torch.stack([_reference(name, s, tuple(range(k))) for s in samples])
        torch.testing.assert_close(out, expected, equal_nan=True)


@settings_
@given(ragged_samples(num_ragged_dims=1, feature_dims=1, dtypes=(torch.float64,)),
       st.sampled_from(["sum", "mean", "amax", "logsumexp", "var"]))
def test_layouts_agree_and_feature_reductions(drawn, name):
    samples, k = drawn
    packed = nestbatch.nested(samples)
    padded = nestbatch.nested(samples, layout=Layout.PADDED)
    torch.testing.assert_close(getattr(torch, name)(packed, 1), getattr(torch, name)(padded, 1),
                               equal_nan=True)
    per_feature = getattr(torch, name)(packed, -1)
    _close(per_feature.unbind(), [getattr(torch, name)(s, -1) for s in samples])


def test_reduction_edge_cases():
    x = nestbatch.nested([torch.ones(2, 3), torch.ones(0, 3)])
    torch.testing.assert_close(x.sum((1, 2)), torch.tensor([6.0, 0.0]))
    assert x.sum().item() == 6.0
    assert x.sum(1, keepdim=True).shape == (2, 1, 3)
    values, index = torch.max(x, 1)
    assert index.tolist() == [[0, 0, 0], [-1, -1, -1]]
    with pytest.raises(ValueError, match="dim 0"):
        x.sum(0)
    y = nestbatch.nested([torch.ones(2, 2)], num_ragged_dims=2)
    with pytest.raises(ValueError, match="all ragged dims"):
        y.sum(1)


@pytest.mark.parametrize("layout", [Layout.PACKED, Layout.PADDED])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_reductions_accumulate_in_float32(dtype, layout, backend):
    # torch.segment_reduce accumulates in the values' dtype: a bfloat16 sum of 4096 values
    # near 0.5 came out 256, and a long sample's softmax added up to 10. As torch's: sums,
    # means, variances computed in float32 and rounded once (the same bits as the per-sample
    # op), logsumexp and softmax within a rounding or two.
    gen = torch.Generator().manual_seed(7)

    def batch(lengths, k=1):
        samples = [(torch.rand(*(n,) * k, 3, generator=gen) * 3).to(dtype) for n in lengths]
        return samples, nestbatch.nested(samples, layout=layout, num_ragged_dims=k)

    # k=1 mostly short samples: padding costs, so softmax takes the segment path when packed
    for k, lengths in ((1, (4096, 0, 2, 1, 300, *[1] * 16)), (2, (64, 0, 3, 1))):
        samples, x = batch(lengths, k)
        for name in ("sum", "mean", "var", "std"):
            out = getattr(x, name)(tuple(range(1, k + 1)))
            assert out.dtype == dtype
            for got, sample in zip(out, samples):
                if sample.numel() > 3:
                    assert torch.equal(got, getattr(sample, name)(tuple(range(k)))), name
    samples, x = batch((4096, 0, 2, 1, 300, *[1] * 16))
    for name in ("sum", "mean"):  # over the ragged and the feature dim: still one rounding
        for got, sample in zip(getattr(x, name)((1, 2)), samples):
            if len(sample):
                assert torch.equal(got, getattr(sample, name)((0, 1))), name
    tolerance = {"rtol": 2 * torch.finfo(dtype).eps, "atol": 0.0}
    for got, sample in zip(torch.logsumexp(x, 1), samples):
        if len(sample):
            torch.testing.assert_close(got, torch.logsumexp(sample, 0), **tolerance)
    for fn in (F.softmax, F.log_softmax):
        for got, sample in zip(fn(x, dim=1).unbind(), samples):
            torch.testing.assert_close(got, fn(sample, dim=0), **tolerance)


@pytest.mark.parametrize("layout", [Layout.PACKED, Layout.PADDED])
@pytest.mark.parametrize("log", [False, True])
def test_softmax_over_ragged_dim(layout, log):
    samples = [torch.randn(4, 2), torch.randn(0, 2), torch.randn(1, 2)]
    x = nestbatch.nested(samples, layout=layout)
    fn = F.log_softmax if log else F.softmax
    _close(fn(x, dim=1).unbind(), [fn(s, dim=0) for s in samples])
    _close(fn(x, dim=-1).unbind(), [fn(s, dim=-1) for s in samples])
    y = nestbatch.nested([torch.randn(2, 3), torch.randn(3, 1)], num_ragged_dims=2)
    _close(y.softmax(2).unbind(), [s.softmax(1) for s in y.unbind()])


# ------------------------------------------------------------------------------- nn layers
def test_nn_layers_per_sample():
    torch.manual_seed(0)
    samples = [torch.randn(n, 4) for n in (3, 0, 5)]
    x = nestbatch.nested(samples)
    for module in (torch.nn.Linear(4, 6), torch.nn.LayerNorm(4), torch.nn.GELU(),
                   torch.nn.ReLU(), torch.nn.Dropout(0.0), torch.nn.SiLU(), torch.nn.Tanh()):
        _close(module(x).unbind(), [module(s) for s in samples])
    drop = torch.nn.Dropout(0.5)(x).values
    assert bool(((drop == 0) | torch.isclose(drop, 2 * x.values)).all())
    emb = torch.nn.Embedding(10, 3)
    ids = nestbatch.nested([torch.tensor([1, 2]), torch.tensor([], dtype=torch.long)])
    _close(emb(ids).unbind(), [emb(t) for t in ids.unbind()])
    with pytest.raises(ValueError, match="ragged"):
        F.layer_norm(x, (5, 4))


@pytest.mark.parametrize("heads", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_per_sample(heads, causal):
    torch.manual_seed(0)
    feat = (2, 4) if heads else (4,)
    lq, lk = (3, 1, 2, 2), (2, 4, 0, 2)
    q = [torch.randn(n, *feat) for n in lq]
    k = [torch.randn(n, *feat) for n in lk]
    v = [torch.randn(n, *feat) for n in lk]
    qb, kb, vb = (nestbatch.nested(x) for x in (q, k, v))
    if heads:  # torch.nested's recipe: (B, j, H, E) -> (B, H, j, E), attend, and back
        qb, kb, vb = (b.transpose(1, 2) for b in (qb, kb, vb))
    out = F.scaled_dot_product_attention(qb, kb, vb, is_causal=causal)
    if heads:
        out = out.transpose(1, 2)
    def alone(a, b, c):
        if heads:
            a, b, c = (t.transpose(0, 1) for t in (a, b, c))
        r = F.scaled_dot_product_attention(a, b, c, is_causal=causal)
        if b.shape[-2] == 0:
            r = torch.zeros_like(r)
        return r.transpose(0, 1) if heads else r
    _close(out.unbind(), [alone(*t) for t in zip(q, k, v)])


def test_matmul():
    a = [torch.randn(3, 2), torch.randn(0, 2), torch.randn(2, 2)]
    w = torch.randn(2, 5)
    _close((nestbatch.nested(a) @ w).unbind(), [s @ w for s in a])
    left = nestbatch.nested([torch.randn(2, 3), torch.randn(4, 1)], num_ragged_dims=2)
    right = nestbatch.nested([torch.randn(3, 5), torch.randn(1, 5)])
    _close(torch.bmm(left, right).unbind(), [p @ r for p, r in zip(left.unbind(),
                                                                      right.unbind())])


# ------------------------------------------------------------------------------- shape/structure
def test_shape_ops():
    samples = [torch.randn(2, 3, 4), torch.randn(0, 3, 4), torch.randn(1, 3, 4)]
    x = nestbatch.nested(samples)
    _close(x.reshape(-1, -1, 12).unbind(), [s.reshape(-1, 12) for s in samples])
    _close(x.view(3, -1, 4, 3).unbind(), [s.view(-1, 4, 3) for s in samples])
    _close(x.transpose(2, 3).unbind(), [s.transpose(1, 2) for s in samples])
    _close(torch.select(x, 2, 1).unbind(), [s.select(1, 1) for s in samples])
    _close(list(torch.unbind(x)), samples)
    assert torch.equal(torch.zeros_like(x).values, torch.zeros_like(x.values))
    assert torch.randn_like(x).partition is x.partition
    with pytest.raises(ValueError, match="ragged dim 1"):
        x.reshape(3, 4, 12)
    moved = x.transpose(1, 2)  # the ragged dim moves, as torch.nested jagged's _ragged_idx
    assert moved.ragged_dim == 2
    _close(moved.unbind(), [s.transpose(0, 1) for s in samples])
    with pytest.raises(ValueError, match="must stay in place"):
        x.transpose(0, 1)
    y = nestbatch.nested([torch.randn(2, 3), torch.randn(3, 3)])
    torch.testing.assert_close(torch.select(y, 1, -1), torch.stack([s[-1] for s in y.unbind()]))


def test_structure_ops():
    a = nestbatch.nested([torch.tensor([1, 2]), torch.tensor([3])])
    b = nestbatch.nested([torch.tensor([4]), torch.tensor([], dtype=torch.long)])
    assert torch.cat([a, b]).tolist() == [[1, 2], [3], [4], []]
    assert torch.cat([a, b], 1).tolist() == [[1, 2, 4], [3]]
    assert torch.stack([a, a * 10], -1).tolist() == [[[1, 10], [2, 20]], [[3, 30]]]
    assert torch.tile(a, (2, 1)).tolist() == [[1, 2], [3], [1, 2], [3]]
    assert a.repeat(1, 3).tolist() == [[1, 2, 1, 2, 1, 2], [3, 3, 3]]


# ------------------------------------------------------------------------------- gradients
GRAD_OPS = [
    lambda x: (x * x + 1).values, lambda x: x.exp().sum(1), lambda x: x.mean(1),
    lambda x: torch.logsumexp(x, 1), lambda x: x.var(1, correction=0), lambda x: x.amax(1),
    lambda x: F.softmax(x, 1).values, lambda x: F.log_softmax(x, 1).values,
    lambda x: x.prod(1), lambda x: (x.tanh() / (x.abs() + 1)).values,
    lambda x: torch.cat([x, x], 1).values, lambda x: torch.tile(x, (1, 2)).values,
    lambda x: F.layer_norm(x, (3,)).values, lambda x: (x @ torch.ones(3, 2,
                                                        dtype=torch.float64)).values,
    lambda x: F.prelu(x, torch.tensor([0.5, -2.0, 0.25], dtype=torch.float64)).values,
    lambda x: F.rms_norm(x, x.shape[1:]).values,
]


@pytest.mark.parametrize("which", range(len(GRAD_OPS)))
@pytest.mark.parametrize("layout", [Layout.PACKED, Layout.PADDED])
def test_gradcheck(which, layout):
    gen = torch.Generator().manual_seed(which)
    values = torch.randn(6, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    lengths = [2, 3, 1]

    def fn(v):
        x = NestedBatch.from_lengths(v, lengths)
        if layout is Layout.PADDED:
            x = x.to(Layout.PADDED)
        return GRAD_OPS[which](x)

    assert torch.autograd.gradcheck(fn, (values,))


def test_gradcheck_sdpa():
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(4, 2, generator=gen, dtype=torch.float64, requires_grad=True)

    def fn(v):
        x = NestedBatch.from_lengths(v, [3, 1])
        return F.scaled_dot_product_attention(x, x, x).values

    assert torch.autograd.gradcheck(fn, (q,))


@pytest.mark.parametrize("layout", (Layout.PACKED, Layout.PADDED))
def test_softmin_is_torchs_per_sample(layout):
    samples = [torch.randn(2, 3), torch.randn(4, 3), torch.randn(0, 3)]
    batch = NestedBatch.from_list(samples).to(layout)
    for dim in (1, 2, -1):
        got = F.softmin(batch, dim=dim)
        for sample, expected in zip(got.unbind(), samples):
            assert torch.equal(sample, F.softmin(expected, dim=dim - 1 if dim > 0 else dim))
    assert F.softmin(batch, 1, dtype=torch.float64).dtype == torch.float64
    assert torch.nn.Softmin(dim=1)(batch).shape == batch.shape
    with pytest.raises(ValueError, match="explicit dim"):
        F.softmin(batch)

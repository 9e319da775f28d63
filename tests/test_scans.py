"""Cumulative scans (``cumsum``, ``cumprod``, ``logcumsumexp``, ``cummax``, ``cummin`` and the
in-place ``cumsum_`` / ``cumprod_``) against the same torch function run on every sample alone.

Every route runs torch's own scan over each sample's elements in the sample's order, so values
and indices are compared bit for bit (NaN equal to NaN, the sign of zeros included); gradients
with ``gradcheck`` and against the per-sample gradients.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from ragged_strategies import ragged_samples, reference_padded

import nestbatch
from nestbatch import Layout, NestedBatch
from nestbatch.errors import NestedIndexError, NestedTypeError, NestedValueError

SCANS = ("cumsum", "cumprod", "logcumsumexp", "cummax", "cummin")
DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int64, torch.bool)
INF, NAN = math.inf, math.nan


# =========================================================================== helpers
def _sample_dim(dim: int) -> int:
    """Batch dim ``dim`` (not 0) as a dim of one sample."""
    return dim - 1 if dim > 0 else dim


def _call(name: str, x, dim: int, spelling: str = "function", **kwargs):
    if spelling == "method":
        return getattr(x, name)(dim, **kwargs)
    return getattr(torch, name)(x, dim, **kwargs)


def _pieces(result) -> list:
    """A scan's result as a list of tensors (or of batches): one, or values then indices."""
    return list(result) if isinstance(result, tuple) else [result]


def _assert_same(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Bit-for-bit equality: shape, dtype, values (NaN equal to NaN) and the sign of zeros."""
    torch.testing.assert_close(actual, expected, rtol=0, atol=0, equal_nan=True)
    if expected.is_floating_point():
        assert torch.equal(actual.signbit(), expected.signbit())


def _assert_per_sample(out, name: str, samples: list[torch.Tensor], dim: int,
                       **kwargs) -> None:
    """``out`` is ``name`` of every sample alone along ``dim``, bit for bit."""
    expected = [_pieces(getattr(torch, name)(s, _sample_dim(dim), **kwargs)) for s in samples]
    pieces = _pieces(out)
    assert all(isinstance(p, NestedBatch) for p in pieces)
    assert len(pieces) == (2 if name in ("cummax", "cummin") else 1)
    for which, piece in enumerate(pieces):
        got = piece.unbind()
        assert len(got) == len(samples)
        for g, e in zip(got, expected):
            _assert_same(g, e[which])


def _specials(dtype: torch.dtype) -> list:
    if dtype == torch.bool:
        return [True, False]
    if not dtype.is_floating_point:
        info = torch.iinfo(dtype)
        return [info.min, info.max, 0, -1]
    info = torch.finfo(dtype)
    return [NAN, INF, -INF, -0.0, 0.0, info.min, info.max, info.tiny]


def _with_specials(samples: list[torch.Tensor], seed: int) -> list[torch.Tensor]:
    """``samples`` with about a third of their elements replaced by special values of their
    dtype (NaN, infinities, -0.0, the dtype's extremes)."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for s in samples:
        table = torch.tensor(_specials(s.dtype), dtype=s.dtype)
        pick = torch.randint(0, len(table), s.shape, generator=gen)
        hit = torch.rand(s.shape, generator=gen) < 0.35
        out.append(torch.where(hit, table[pick], s))
    return out


def _build(samples: list[torch.Tensor], k: int, how: str, seed: int = 0) -> NestedBatch:
    """The batch of ``samples`` built packed, padded (``from_padded``, padding that holds junk:
    NaN, an infinity or 7, which must reach no result), as a list, or packed over
    non-contiguous values."""
    if how == "padded":
        dtype = samples[0].dtype
        junk = True if dtype == torch.bool else (
            [NAN, -INF, INF, 7.0][seed % 4] if dtype.is_floating_point else 7)
        data = reference_padded(samples, k, junk)
        if k == 1:
            return NestedBatch.from_padded(data, [s.shape[0] for s in samples])
        sizes = torch.tensor([list(s.shape[:k]) for s in samples])
        return NestedBatch.from_padded(data, shape_per_sample=sizes)
    if how == "list":
        return nestbatch.nested(samples, layout=Layout.LIST, num_ragged_dims=k)
    batch = nestbatch.nested(samples, num_ragged_dims=k)
    if how == "strided":
        values = batch.values
        strided = torch.stack([values, values], -1)[..., 0]  # same values, every other element
        assert not strided.is_contiguous() or strided.numel() <= 1
        return batch.with_values(strided)
    return batch


def _dims(ndim: int) -> list[int]:
    """Every dim of a batch but the batch's, positive and negative."""
    return [*range(1, ndim), *range(-ndim + 1, 0)]


# =========================================================================== the fuzz
@settings(max_examples=200, deadline=None)
@given(
    drawn=ragged_samples(dtypes=DTYPES, min_batch=1, max_batch=4, max_len=4),
    name=st.sampled_from(SCANS),
    how=st.sampled_from(["packed", "padded", "list", "strided"]),
    spelling=st.sampled_from(["function", "method"]),
    specials=st.booleans(),
    dtype=st.sampled_from([None, None, torch.float64, torch.int64]),
    seed=st.integers(0, 2**16),
    data=st.data(),
)
def test_every_scan_matches_per_sample(drawn, name, how, spelling, specials, dtype, seed, data):
    samples, k = drawn
    if specials:
        samples = _with_specials(samples, seed)
    batch = _build(samples, k, how, seed)
    dim = data.draw(st.sampled_from(_dims(batch.dim())), label="dim")
    kwargs = {"dtype": dtype} if name in ("cumsum", "cumprod") and dtype is not None else {}
    try:
        expected = [getattr(torch, name)(s, _sample_dim(dim), **kwargs) for s in samples]
    except RuntimeError:  # torch refuses the dtype (logcumsumexp of integers): so does a batch
        with pytest.raises(RuntimeError):
            _call(name, batch, dim, spelling, **kwargs)
        return
    assert expected is not None
    out = _call(name, batch, dim, spelling, **kwargs)
    _assert_per_sample(out, name, samples, dim, **kwargs)


@pytest.mark.parametrize("name", SCANS)
@pytest.mark.parametrize("how", ["packed", "padded"])
def test_empty_batch_and_empty_samples(name, how):
    for dtype in (torch.float32, torch.int64):
        values = torch.empty(0, 3, dtype=dtype)
        empty = NestedBatch.from_lengths(values, [])
        if how == "padded":
            empty = NestedBatch.from_padded(torch.empty(0, 0, 3, dtype=dtype), [])
        samples = [torch.empty(0, 3, dtype=dtype), torch.empty(0, 3, dtype=dtype)]
        hollow = _build(samples, 1, how)
        if name == "logcumsumexp" and dtype == torch.int64:
            for batch in (empty, hollow):  # (torch refuses integers, even of no element)
                with pytest.raises(RuntimeError):
                    getattr(torch, name)(batch, 1)
            continue
        for dim in (1, 2, -1):
            out = getattr(torch, name)(empty, dim)
            for piece, like in zip(_pieces(out), _pieces(getattr(torch, name)(values, 0))):
                assert piece.batch_size == 0 and piece.dtype == like.dtype
                assert piece.feature_shape == (3,)
            _assert_per_sample(getattr(torch, name)(hollow, dim), name, samples, dim)


def test_one_sample_and_integer_promotion():
    sample = torch.tensor([[3, -1], [2, 5], [0, 4]], dtype=torch.int32)
    batch = nestbatch.nested([sample])
    for name in ("cumsum", "cumprod"):
        out = getattr(torch, name)(batch, 1)
        assert out.dtype == torch.int64  # as torch's sums and products of integers
        _assert_per_sample(out, name, [sample], 1)
        _assert_per_sample(getattr(batch, name)(-1, dtype=torch.float16), name, [sample], -1,
                           dtype=torch.float16)
    flags = nestbatch.nested([torch.tensor([True, False, True]), torch.tensor([False])])
    assert flags.cumsum(1).dtype == torch.int64
    _assert_per_sample(flags.cummax(1), "cummax", list(flags.unbind()), 1)


# =========================================================================== special values
def test_cummax_and_cummin_follow_torch_on_nan_ties_and_signed_zeros():
    samples = [torch.tensor([1.0, 1.0, NAN, 2.0, NAN, 3.0]), torch.tensor([0.0, -0.0, 0.0]),
               torch.tensor([-INF, -INF, INF, INF]), torch.tensor([NAN]), torch.tensor([]),
               torch.tensor([5.0, -INF, 5.0, NAN, NAN])]
    for how in ("packed", "padded", "list"):
        for seed in range(4):  # (the padded build puts NaN, -inf, inf, then 7 in the padding)
            batch = _build(samples, 1, how, seed)
            for name in SCANS:
                _assert_per_sample(getattr(torch, name)(batch, 1), name, samples, 1)


def test_extremes_of_every_dtype_overflow_as_torch():
    for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.int64):
        info = torch.finfo(dtype) if dtype.is_floating_point else torch.iinfo(dtype)
        samples = [torch.tensor([info.max, info.max, info.min], dtype=dtype),
                   torch.tensor([info.min, -1, 2], dtype=dtype), torch.tensor([], dtype=dtype)]
        for how in ("packed", "padded"):
            batch = _build(samples, 1, how)
            for name in ("cumsum", "cumprod", "cummax", "cummin"):
                _assert_per_sample(getattr(torch, name)(batch, 1), name, samples, 1)


def test_device_sizes_give_the_same_bits():
    gen = torch.Generator().manual_seed(3)
    samples = [torch.randn(n, 2, generator=gen) for n in (4, 0, 1, 3)]
    values = torch.cat(samples)
    batch = NestedBatch.from_offsets(values, torch.tensor([0, 4, 4, 5, 8]))
    for name in SCANS:
        for dim in (1, 2):
            _assert_per_sample(getattr(torch, name)(batch, dim), name, samples, dim)


# =========================================================================== other structures
@pytest.mark.parametrize("how", ["packed", "padded"])
def test_a_moved_ragged_dim_is_read_logically(how):
    gen = torch.Generator().manual_seed(1)
    stored = [torch.randn(n, 3, 2, generator=gen) for n in (2, 0, 4)]
    moved = _build(stored, 1, how).transpose(1, 2)  # (B, 3, j, 2): ragged at logical dim 2
    assert moved.ragged_dim == 2
    samples = [s.transpose(0, 1) for s in stored]
    for name in SCANS:
        for dim in _dims(moved.dim()):
            out = getattr(torch, name)(moved, dim)
            assert all(p.ragged_dim == 2 for p in _pieces(out))
            _assert_per_sample(out, name, samples, dim)


def test_several_ragged_dims_scan_each_of_them():
    gen = torch.Generator().manual_seed(2)
    samples = [torch.randn(h, w, 2, generator=gen) for h, w in ((2, 3), (0, 1), (3, 1), (1, 0))]
    sizes = torch.tensor([list(s.shape[:2]) for s in samples])
    packed = NestedBatch.from_shapes(torch.cat([s.reshape(-1, 2) for s in samples]), sizes)
    for batch in (packed, _build(samples, 2, "padded")):
        for name in SCANS:
            for dim in (1, 2, 3, -1, -2, -3):
                _assert_per_sample(getattr(torch, name)(batch, dim), name, samples, dim)


def _documents(dtype: torch.dtype = torch.float64) -> NestedBatch:
    gen = torch.Generator().manual_seed(4)
    flat = torch.randn(10, 2, generator=gen, dtype=dtype)
    return NestedBatch.from_nested_row_splits(flat, ([0, 1, 1, 5], [0, 3, 3, 5, 9, 10]))


def test_nested_raggedness_scans_features_and_the_innermost_rows():
    docs = _documents()
    flat, splits = docs.packed().values, [0, 3, 3, 5, 9, 10]
    rows = [flat[a:b] for a, b in zip(splits[:-1], splits[1:])]  # every innermost row
    for name in SCANS:
        for dim, row_dim in ((2, 0), (-2, 0), (3, 1), (-1, 1)):
            out = _pieces(getattr(torch, name)(docs, dim))
            expected = [_pieces(getattr(torch, name)(r, row_dim)) for r in rows]
            for which, piece in enumerate(out):
                assert piece.partition.ragged_rank == 2
                _assert_same(piece.packed().values, torch.cat([e[which] for e in expected]))
        with pytest.raises(NestedValueError, match="innermost ragged dim"):
            getattr(torch, name)(docs, 1)


# =========================================================================== autograd
def _lengths_batch(values: torch.Tensor, how: str, lengths=(3, 0, 1, 4)) -> NestedBatch:
    batch = NestedBatch.from_lengths(values, list(lengths))
    if how == "padded":  # a batch stored padded, built differentiably from the values
        batch = NestedBatch.from_padded(batch.padded(NAN).data, list(lengths))
    return batch


@pytest.mark.parametrize("how", ["packed", "padded"])
@pytest.mark.parametrize("name, zeros", [("cumsum", False), ("cumprod", False),
                                         ("cumprod", True), ("logcumsumexp", False),
                                         ("cummax", False), ("cummin", False)])
def test_gradients_pass_gradcheck_and_match_per_sample(name, zeros, how):
    gen = torch.Generator().manual_seed(5)
    values = torch.rand(8, 2, generator=gen, dtype=torch.float64) + 0.5
    if zeros:
        values[[0, 2, 6], [0, 1, 1]] = 0.0
    values.requires_grad_(True)

    def scanned(v: torch.Tensor, dim: int) -> torch.Tensor:
        return _pieces(getattr(torch, name)(_lengths_batch(v, how), dim))[0].packed().values

    for dim in (1, 2):
        assert torch.autograd.gradcheck(lambda v, d=dim: scanned(v, d), (values,))
        weights = torch.randn(8, 2, generator=gen, dtype=torch.float64)
        (grad,) = torch.autograd.grad((scanned(values, dim) * weights).sum(), values)
        samples = values.split([3, 0, 1, 4])
        expected = [_pieces(getattr(torch, name)(s, dim - 1))[0] for s in samples]
        (reference,) = torch.autograd.grad((torch.cat(expected) * weights).sum(), values)
        torch.testing.assert_close(grad, reference)


def test_the_padding_takes_no_gradient():
    """A batch stored padded with huge junk in the padding (a product over it overflows): the
    padding holds the neutral element while autograd records, so the gradient of what made
    the padded data is the per-sample one (junk would give 0 * inf, NaN)."""
    data = torch.tensor([[3.0, 2.0, 1e300, 1e300], [5.0, 1e300, 1e300, 1e300]],
                        dtype=torch.float64)
    weight = torch.tensor(2.0, dtype=torch.float64, requires_grad=True)
    for name in ("cumsum", "cumprod", "logcumsumexp"):
        batch = NestedBatch.from_padded(data * weight, [2, 1])
        (grad,) = torch.autograd.grad(getattr(torch, name)(batch, 1).values.sum(), weight)
        samples = [data[0, :2] * weight, data[1, :1] * weight]
        total = sum(getattr(torch, name)(s, 0).sum() for s in samples)
        (expected,) = torch.autograd.grad(total, weight)
        torch.testing.assert_close(grad, expected)


# =========================================================================== in place
@pytest.mark.parametrize("name", ["cumsum", "cumprod"])
@pytest.mark.parametrize("how", ["packed", "padded", "list"])
def test_inplace_scans_write_the_stored_layout(name, how):
    gen = torch.Generator().manual_seed(6)
    samples = [torch.randint(-3, 4, (n, 2), generator=gen).to(torch.float32) for n in (3, 0, 2)]
    for dim in (1, 2, -1):
        batch = _build([s.clone() for s in samples], 1, how)
        view = batch[0]  # a view of the stored data: it sees the write
        stored, stale = batch.layout, batch.padded(-1.0)  # another layout, cached before
        assert getattr(batch, name + "_")(dim) is batch
        assert batch.layout is stored
        _assert_per_sample(batch, name, samples, dim)
        assert batch.padded(-1.0) is not stale
        _assert_same(batch.padded(-1.0).data, reference_padded(
            [getattr(torch, name)(s, _sample_dim(dim)) for s in samples], 1, -1.0))
        if how != "list":  # (a list batch's samples are the caller's tensors: seen too)
            _assert_same(view, getattr(torch, name)(samples[0], _sample_dim(dim)))


def test_inplace_scans_keep_the_dtype_as_torch():
    samples = [torch.tensor([2**30, 2**30, 5], dtype=torch.int32),
               torch.tensor([7], dtype=torch.int32)]
    for how in ("packed", "padded"):
        batch = _build([s.clone() for s in samples], 1, how)
        batch.cumsum_(1)  # wraps in int32, as torch's in-place sum
        assert batch.dtype == torch.int32
        for got, s in zip(batch.unbind(), samples):
            _assert_same(got, s.clone().cumsum_(0))
    with pytest.raises(RuntimeError, match="dtype"):
        _build(samples, 1, "packed").cumsum_(1, dtype=torch.int64)
    flags = nestbatch.nested([torch.tensor([True, False])])
    with pytest.raises(RuntimeError):  # as torch's: no in-place sum of bools
        flags.cumsum_(1)


def test_inplace_scans_of_a_moved_ragged_dim_and_through_autograd():
    gen = torch.Generator().manual_seed(7)
    stored = [torch.randn(n, 3, generator=gen, dtype=torch.float64) for n in (2, 4)]
    moved = nestbatch.nested([s.clone() for s in stored]).transpose(1, 2)  # (B, 3, j)
    moved.cumprod_(2)
    _assert_per_sample(moved, "cumprod", [s.T for s in stored], 2)
    leaf = torch.randn(6, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    batch = NestedBatch.from_lengths(leaf * 1, [2, 4])
    batch.cumsum_(1)
    (grad,) = torch.autograd.grad(batch.values.pow(2).sum(), leaf)
    expected = torch.cat([s.cumsum(0) for s in leaf.split([2, 4])])
    (reference,) = torch.autograd.grad(expected.pow(2).sum(), leaf)
    torch.testing.assert_close(grad, reference)


# =========================================================================== arguments, errors
def test_arguments_by_keyword_and_by_numpy_name():
    batch = nestbatch.nested([torch.arange(4.0).view(2, 2), torch.ones(1, 2)])
    expected = torch.cumsum(batch, 1).values
    for out in (torch.cumsum(input=batch, dim=1), batch.cumsum(dim=1), batch.cumsum(axis=1),
                torch.cumsum(batch, 1, out=None)):
        _assert_same(out.values, expected)
    pair = batch.cummax(dim=-1)
    assert isinstance(pair, torch.return_types.cummax)
    _assert_same(pair.indices.values, torch.cummax(batch.values, -1).indices)


@pytest.mark.parametrize("name", SCANS)
def test_errors(name):
    batch = nestbatch.nested([torch.ones(2, 3), torch.ones(1, 3)])
    func = getattr(torch, name)
    with pytest.raises(NestedValueError, match="dim 0 .the batch"):
        func(batch, 0)
    with pytest.raises(NestedValueError, match="dim 0 .the batch"):
        func(batch, -3)
    for dim in (3, -4):  # out of range, as torch: an IndexError
        with pytest.raises(IndexError):
            func(batch, dim)
        with pytest.raises(NestedIndexError):
            getattr(batch, name)(dim)
    out = (torch.empty(0), torch.empty(0, dtype=torch.int64)) if name in ("cummax", "cummin") \
        else torch.empty(0)
    with pytest.raises(NestedTypeError, match="out= cannot hold"):
        func(batch, 1, out=out)
    with pytest.raises(TypeError, match="dim"):  # (torch's own argument parser)
        func(batch)
    with pytest.raises(TypeError, match="one dim"):
        getattr(batch, name)(1, dim=1)
    # (torch < 2.13's argument parser refuses an unknown keyword before the batch sees it)
    unexpected = "unexpected keyword|invalid combination of arguments"
    with pytest.raises(TypeError, match=unexpected):
        func(batch, 1, keepdim=True)
    if name not in ("cumsum", "cumprod"):
        with pytest.raises(TypeError, match=unexpected):
            func(batch, 1, dtype=torch.float64)
    for error in (NestedValueError, NestedIndexError, NestedTypeError):
        assert issubclass(error, RuntimeError)  # (every error of a torch function on a batch)

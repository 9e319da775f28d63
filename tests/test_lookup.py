"""Value lookups and counts (:mod:`nestbatch.ops.lookup`) against torch: lookups against the
same function run on every sample alone, counts against torch's function of every element
(``torch.cat([s.flatten() for s in b.unbind()])``), exact equality throughout.

Batches are built packed, and padded (``NestedBatch.from_padded``) with junk in the padding
that would change every count it reached. Gradients are not checked: none of these functions is
differentiable in torch (``histc``, ``bincount``, ``histogram``, ``unique``, ``one_hot``,
``isin``, ``bucketize``, ``searchsorted`` give integers or counts).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from ragged_strategies import ragged_samples

import nestbatch
from nestbatch import NestedBatch

pytestmark = pytest.mark.filterwarnings("ignore:torch.searchsorted.*non-contiguous")
settings_ = settings(max_examples=30, deadline=None)
FLOATS = (torch.float32, torch.float64)
INTS = (torch.int64, torch.int32)
JUNK = {torch.float32: float("nan"), torch.float64: 1e300, torch.int64: 123456,
        torch.int32: -77, torch.bool: True}
SPECIALS = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0])


# ================================================================================== helpers
def build(samples: list[torch.Tensor], k: int, padded: bool,
          dtype: torch.dtype = torch.float32, feature: tuple[int, ...] = ()) -> NestedBatch:
    """The samples as a batch built packed, or padded with junk in the padding (no sample:
    an empty batch of ``dtype`` and ``feature`` dims)."""
    if not samples:
        return NestedBatch.from_lengths(torch.empty(0, *feature, dtype=dtype), [])
    if not padded:
        return nestbatch.nested(samples, num_ragged_dims=k)
    feature = samples[0].shape[k:]
    widest = [max(s.shape[d] for s in samples) for d in range(k)]
    data = torch.full((len(samples), *widest, *feature), JUNK[samples[0].dtype],
                      dtype=samples[0].dtype)
    for i, sample in enumerate(samples):
        data[(i, *(slice(0, n) for n in sample.shape[:k]))] = sample
    if k == 1:
        return NestedBatch.from_padded(data, [s.shape[0] for s in samples])
    shapes = torch.tensor([list(s.shape[:k]) for s in samples])
    return NestedBatch.from_padded(data, shape_per_sample=shapes)


def flat(samples: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    """The reference order of every element: the samples flattened one after another."""
    return torch.cat([s.flatten() for s in samples]) if samples else torch.empty(0, dtype=dtype)


def with_specials(samples: list[torch.Tensor], seed: int) -> list[torch.Tensor]:
    """Float samples with some elements NaN, +-inf or -0.0."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for s in samples:
        s = s.clone()
        pick = torch.rand(s.shape, generator=gen) < 0.3
        which = torch.randint(0, len(SPECIALS), s.shape, generator=gen)
        out.append(torch.where(pick, SPECIALS.to(s.dtype)[which], s))
    return out


def assert_samples(batch: NestedBatch, expected: list[torch.Tensor]) -> None:
    got = batch.unbind()
    assert len(got) == len(expected)
    for a, e in zip(got, expected):
        assert a.dtype == e.dtype and a.shape == e.shape, (a.dtype, e.dtype, a.shape, e.shape)
        assert torch.equal(a, e)


def assert_same(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    torch.testing.assert_close(actual, expected, rtol=0, atol=0, equal_nan=True)


def float_samples(**kw):
    return ragged_samples(dtypes=FLOATS, **kw)


# ================================================================================== lookups
@settings_
@given(ragged_samples(dtypes=(torch.int64,)), st.booleans(), st.sampled_from([-1, 200]))
def test_one_hot_matches_every_sample(drawn, padded, num_classes):
    samples, k = drawn
    samples = [s.abs() for s in samples]
    b = build(samples, k, padded, torch.int64)
    every = flat(samples, torch.int64)
    if num_classes == -1 and every.numel() == 0:
        with pytest.raises(RuntimeError, match="Can not infer"):
            F.one_hot(b)
        return
    classes = int(every.max()) + 1 if num_classes == -1 else num_classes
    out = F.one_hot(b, num_classes)
    assert out.dim() == b.dim() + 1 and out.feature_shape[-1] == classes
    assert_samples(out, [F.one_hot(s, classes) for s in samples])


@settings_
@given(ragged_samples(dtypes=(*FLOATS, *INTS)), st.booleans(), st.booleans(), st.booleans(),
       st.integers(0, 99))
def test_isin_batch_elements(drawn, padded, invert, specials, seed):
    samples, k = drawn
    if specials and samples and samples[0].is_floating_point():
        samples = with_specials(samples, seed)
    test = torch.tensor([0.25, -3.0, 5.0, float("inf"), float("nan")])
    test = test if not samples or samples[0].is_floating_point() else test[:3].long()
    out = torch.isin(build(samples, k, padded), test, invert=invert)
    assert_samples(out, [torch.isin(s, test, invert=invert) for s in samples])


@settings_
@given(ragged_samples(dtypes=INTS), st.booleans(), st.booleans())
def test_isin_batch_test_elements(drawn, padded, assume_unique):
    samples, k = drawn
    dtype = samples[0].dtype if samples else torch.float32
    b = build(samples, k, padded, dtype)
    elements = torch.arange(-10, 10).to(dtype)
    test = flat(samples, dtype)
    if assume_unique:  # (torch's assume_unique is a promise about both operands)
        samples_unique = [test.unique()] if test.numel() else []
        b, test = build(samples_unique, 1, padded, dtype), test.unique()
    expected = torch.isin(elements, test, assume_unique=assume_unique)
    assert_same(torch.isin(elements, b, assume_unique=assume_unique), expected)
    out = torch.empty(0, dtype=torch.bool)  # (a dense result takes out=, as torch's)
    torch.isin(elements, b, assume_unique=assume_unique, out=out)
    assert_same(out, expected)


@settings_
@given(ragged_samples(dtypes=(*FLOATS, *INTS)), st.booleans(), st.booleans(), st.booleans(),
       st.integers(0, 99))
def test_bucketize_matches_every_sample(drawn, padded, right, out_int32, seed):
    samples, k = drawn
    if samples and samples[0].is_floating_point():
        samples = with_specials(samples, seed)
    boundaries = torch.tensor([-float("inf"), -2.0, 0.0, 0.0, 3.5, float("inf")])
    if samples and not samples[0].is_floating_point():
        boundaries = torch.tensor([-5, 0, 0, 7]).to(samples[0].dtype)
    out = torch.bucketize(build(samples, k, padded), boundaries, right=right,
                          out_int32=out_int32)
    assert_samples(out, [torch.bucketize(s, boundaries, right=right, out_int32=out_int32)
                         for s in samples])


@settings_
@given(float_samples(), st.booleans(), st.sampled_from(["left", "right"]), st.booleans(),
       st.integers(0, 99))
def test_searchsorted_in_one_dense_sequence(drawn, padded, side, sorter, seed):
    samples, k = drawn
    samples = with_specials(samples, seed)
    dtype = samples[0].dtype if samples else torch.float32
    sequence = torch.tensor([3.0, -1.0, float("inf"), 0.0, 0.5], dtype=dtype)
    kwargs = {"side": side}
    if sorter:
        kwargs["sorter"] = sequence.argsort()
    else:
        sequence = sequence.sort().values
    out = torch.searchsorted(sequence, build(samples, k, padded, dtype), **kwargs)
    assert_samples(out, [torch.searchsorted(sequence, s, **kwargs) for s in samples])


@settings_
@given(ragged_samples(dtypes=(*FLOATS, torch.int64), feature_dims=1, num_ragged_dims=1),
       st.booleans(), st.booleans(), st.booleans())
def test_searchsorted_per_row_sequences(drawn, padded, right, sorter):
    """A batch ``(B, j, M)`` as the sequences: every row its own, values ``(B, j, N)``."""
    samples, k = drawn
    values = [(s[..., :1] * 2 + 1).repeat(1, 2) for s in samples]  # (L_i, 2)
    sequences = samples if sorter else [s.sort(-1).values for s in samples]
    kwargs = {"right": right, "out_int32": right}
    dtype = samples[0].dtype if samples else torch.float32
    seq_batch = build(sequences, 1, padded, dtype, (1,))
    val_batch = build(values, 1, not padded, dtype, (2,))
    if sorter:
        sorters = [torch.sort(s, dim=-1, stable=True).indices for s in samples]
        kwargs["sorter"] = build(sorters, 1, padded, torch.int64, (1,))
        expected = [torch.searchsorted(s, v, sorter=o, right=right, out_int32=right)
                    for s, v, o in zip(sequences, values, sorters)]
    else:
        expected = [torch.searchsorted(s, v, **kwargs) for s, v in zip(sequences, values)]
    assert_samples(torch.searchsorted(seq_batch, val_batch, **kwargs), expected)


def test_lookups_with_the_ragged_dim_moved_and_nested():
    gen = torch.Generator().manual_seed(0)
    samples = [torch.randint(0, 5, (n, 3), generator=gen) for n in (2, 0, 4)]
    b = nestbatch.nested(samples).transpose(1, 2)  # (B, 3, j)
    assert b.ragged_dim == 2
    assert_samples(F.one_hot(b, 6), [F.one_hot(s.T, 6) for s in samples])
    assert_samples(torch.isin(b, torch.tensor([1, 4])),
                   [torch.isin(s.T, torch.tensor([1, 4])) for s in samples])
    bounds = torch.tensor([1, 3])
    assert_samples(torch.bucketize(b, bounds), [torch.bucketize(s.T, bounds) for s in samples])
    # sequences (3, L_i) of a moved ragged dim: the last dim is ragged, refused
    with pytest.raises(ValueError, match="last dim.*ragged"):
        torch.searchsorted(b.float(), b.float())
    # sequences (L_i, 3) presented as (B, 1, j, 3): rows along a feature last dim
    seq = nestbatch.nested([s.sort(-1).values.float() for s in samples]).unsqueeze(1)
    assert seq.ragged_dim == 2
    out = torch.searchsorted(seq, seq)
    assert_samples(out, [torch.searchsorted(s, s) for s in seq.unbind()])
    nested = NestedBatch.from_nested_row_splits(torch.arange(10), ([0, 1, 1, 5],
                                                                   [0, 3, 3, 5, 9, 10]))
    hot = F.one_hot(nested, 10)
    assert hot.ragged_rank == 2
    assert hot.tolist() == [[F.one_hot(torch.tensor(r, dtype=torch.long), 10).tolist()
                             for r in sample] for sample in nested.tolist()]
    assert torch.bucketize(nested, torch.tensor([4])).tolist() == [
        [[int(x > 4) for x in r] for r in sample] for sample in nested.tolist()]
    # rows (..., M) of a nested batch: the innermost packed rows pair up
    rows = torch.tensor([[1.0, 2.0, 4.0], [0.0, 0.0, 3.0], [5.0, 6.0, 7.0], [1.0, 1.0, 1.0]])
    splits = ([0, 1, 2], [0, 3, 4])
    seq = NestedBatch.from_nested_row_splits(rows, splits)
    found = torch.searchsorted(seq, NestedBatch.from_nested_row_splits(rows[:, :2] + 0.5,
                                                                       splits))
    assert found.ragged_rank == 2
    assert torch.equal(found.flat_values, torch.searchsorted(rows, rows[:, :2] + 0.5))


# =================================================================================== counts
@settings_
@given(float_samples(), st.booleans(), st.integers(1, 7), st.booleans(), st.integers(0, 99))
def test_histc_of_every_element(drawn, padded, bins, data_range, seed):
    samples, k = drawn
    if seed % 3 == 0:  # infinities make torch's data range fail; NaN is left out by torch
        samples = [torch.where(s > 5, float("nan"), s) for s in samples]
    dtype = samples[0].dtype if samples else torch.float32
    lo, hi = (0, 0) if data_range else (-2.5, 4.0)
    b = build(samples, k, padded, dtype)
    try:
        expected = torch.histc(flat(samples, dtype), bins, lo, hi)
    except RuntimeError as error:  # (NaN in a range read from the data: torch refuses it)
        with pytest.raises(type(error), match="not finite"):
            torch.histc(b, bins, lo, hi)
        return
    assert_same(torch.histc(b, bins, lo, hi), expected)
    assert_same(b.histc(bins=bins, min=lo, max=hi), expected)
    out = torch.empty(0, dtype=dtype)
    torch.histc(b, bins, lo, hi, out=out)
    assert_same(out, expected)


@settings_
@given(ragged_samples(dtypes=INTS, feature_dims=0, num_ragged_dims=1), st.booleans(),
       st.sampled_from([0, 3, 300]), st.sampled_from([None, torch.float32, torch.float64]))
def test_bincount_of_every_element(drawn, padded, minlength, weight_dtype):
    samples, _ = drawn
    samples = [s.abs() for s in samples]
    dtype = samples[0].dtype if samples else torch.int64
    b = build(samples, 1, padded, dtype)
    every = flat(samples, dtype)
    if weight_dtype is None:
        assert_same(torch.bincount(b, minlength=minlength),
                    torch.bincount(every, minlength=minlength))
        return
    weights = [s.to(weight_dtype) / 3 for s in samples]
    wb = build(weights, 1, not padded, weight_dtype)
    expected = torch.bincount(every, flat(weights, weight_dtype), minlength)
    assert_same(torch.bincount(b, wb, minlength), expected)
    assert_same(b.bincount(weights=wb, minlength=minlength), expected)


@settings_
@given(float_samples(), st.booleans(), st.sampled_from(["int", "edges", "range"]),
       st.booleans(), st.booleans())
def test_histogram_of_every_element(drawn, padded, bins, weighted, density):
    samples, k = drawn
    dtype = samples[0].dtype if samples else torch.float32
    b = build(samples, k, padded, dtype)
    args, kwargs = {"int": ((4,), {}), "edges": ((torch.tensor([-3.0, 0.0, 0.5, 9.0],
                                                               dtype=dtype),), {}),
                    "range": ((3,), {"range": (-1.0, 2.0)})}[bins]
    if weighted:
        weights = [s.abs() / 7 for s in samples]
        kwargs = {**kwargs, "weight": build(weights, k, not padded, dtype)}
        reference_kwargs = {**kwargs, "weight": flat(weights, dtype)}
    else:
        reference_kwargs = kwargs
    expected = torch.histogram(flat(samples, dtype), *args, density=density,
                               **reference_kwargs)
    got = torch.histogram(b, *args, density=density, **kwargs)
    assert type(got) is type(expected)
    assert_same(got.hist, expected.hist)
    assert_same(got.bin_edges, expected.bin_edges)
    method = b.histogram(*args, density=density, **kwargs)
    assert_same(method.hist, expected.hist)


@settings_
@given(ragged_samples(dtypes=(*FLOATS, *INTS, torch.bool)), st.booleans(), st.booleans(),
       st.booleans(), st.booleans(), st.integers(0, 99))
def test_unique_of_every_element(drawn, padded, sorted_, inverse, counts, seed):
    samples, k = drawn
    dtype = samples[0].dtype if samples else torch.float32
    if samples and dtype.is_floating_point:
        samples = with_specials(samples, seed)
    b = build(samples, k, padded, dtype)
    expected = torch.unique(flat(samples, dtype), sorted=sorted_, return_inverse=inverse,
                            return_counts=counts)
    for got in (torch.unique(b, sorted=sorted_, return_inverse=inverse, return_counts=counts),
                b.unique(sorted_, inverse, counts)):
        _check_unique(got, expected, samples, inverse)


@settings_
@given(ragged_samples(dtypes=(*FLOATS, torch.int64)), st.booleans(), st.booleans(),
       st.booleans())
def test_unique_consecutive_of_every_element(drawn, padded, inverse, counts):
    """Runs continue across samples, as in torch's flattened tensor."""
    samples, k = drawn
    dtype = samples[0].dtype if samples else torch.float32
    samples = [(s > 0).to(dtype) for s in samples]  # (long runs of equal values)
    b = build(samples, k, padded, dtype)
    expected = torch.unique_consecutive(flat(samples, dtype), return_inverse=inverse,
                                        return_counts=counts)
    for got in (torch.unique_consecutive(b, return_inverse=inverse, return_counts=counts),
                b.unique_consecutive(return_inverse=inverse, return_counts=counts)):
        _check_unique(got, expected, samples, inverse)


def _check_unique(got, expected, samples, inverse):
    got = got if isinstance(got, tuple) else (got,)
    expected = expected if isinstance(expected, tuple) else (expected,)
    assert len(got) == len(expected)
    assert_same(got[0], expected[0])
    for a, e in zip(got[2 if inverse else 1:], expected[2 if inverse else 1:]):
        assert_same(a, e)
    if inverse:
        pieces = expected[1].split([s.numel() for s in samples])
        assert_samples(got[1], [p.view(s.shape) for p, s in zip(pieces, samples)])


def test_unique_along_a_feature_dim():
    samples = [torch.tensor([[1, 2, 1, 1], [3, 4, 3, 3]]), torch.tensor([[1, 2, 1, 5]])]
    b = nestbatch.nested(samples)
    dense = torch.cat(samples)  # (the slices along dim 2 hold every sample's elements)
    for func in (torch.unique, torch.unique_consecutive):
        values, inverse, counts = func(b, return_inverse=True, return_counts=True, dim=2)
        expected = func(dense, return_inverse=True, return_counts=True, dim=1)
        assert_samples(values, list(expected[0].split([2, 1])))
        assert_same(inverse, expected[1])
        assert_same(counts, expected[2])
        assert_samples(func(b, dim=-1), list(expected[0].split([2, 1])))


@pytest.mark.parametrize("padded", [False, True])
def test_counts_with_the_ragged_dim_moved(padded):
    """A moved ragged dim: every element in the samples' logical order (``(3, L_i)``)."""
    gen = torch.Generator().manual_seed(3)
    stored = [torch.randint(0, 4, (n, 3), generator=gen).double() for n in (2, 0, 5, 1)]
    b = build(stored, 1, padded).transpose(1, 2)
    samples = [s.T for s in stored]
    every = flat(samples, torch.float64)
    assert_same(torch.histc(b, 5), torch.histc(every, 5))
    weights = b * 0.1 + 0.3
    expected = torch.histogram(every, 3, weight=every * 0.1 + 0.3)
    assert_same(torch.histogram(b, 3, weight=weights).hist, expected.hist)
    for func in (torch.unique, torch.unique_consecutive):
        got = func(b, return_inverse=True, return_counts=True)
        _check_unique(got, func(every, return_inverse=True, return_counts=True), samples, True)
    ints = b.long()[:, 0]  # (B, j): the ragged dim back at dim 1
    assert_same(torch.bincount(ints), torch.bincount(flat([s[0] for s in samples],
                                                          torch.int64).long()))
    with pytest.raises(ValueError, match="feature dim of a batch with its ragged dims in"):
        torch.unique(b, dim=1)


def test_counts_of_nested_and_non_contiguous_batches():
    nested = NestedBatch.from_nested_row_splits(torch.tensor([3, 1, 1, 0, 2, 2, 2, 9, 1, 1]),
                                                ([0, 1, 1, 5], [0, 3, 3, 5, 9, 10]))
    every = torch.tensor([v for sample in nested.tolist() for row in sample for v in row])
    assert_same(torch.unique_consecutive(nested), torch.unique_consecutive(every))
    values, inverse = torch.unique(nested, return_inverse=True)
    assert_same(values, torch.unique(every))
    assert inverse.ragged_rank == 2 and torch.equal(values[inverse.flat_values], every)
    assert_same(torch.histc(nested.float(), 4), torch.histc(every.float(), 4))
    rows = NestedBatch.from_nested_row_splits(torch.tensor([[1, 2, 1], [0, 3, 0], [1, 2, 1]]),
                                              ([0, 1, 2], [0, 2, 3]))
    slices, where = torch.unique(rows, dim=-1, return_inverse=True)
    dense = torch.unique(rows.flat_values, dim=1, return_inverse=True)
    assert torch.equal(slices.flat_values, dense[0]) and torch.equal(where, dense[1])
    with pytest.raises(RuntimeError, match="1-d"):  # (samples of two dims, as torch)
        torch.bincount(nested)
    big = torch.arange(24.0).view(6, 4) % 5
    strided = big[:, ::2]  # non-contiguous packed values
    b = NestedBatch.from_lengths(strided, [4, 2])
    assert not b.values.is_contiguous()
    assert_same(torch.histc(b, 5), torch.histc(strided.flatten(), 5))
    assert_same(torch.unique(b), torch.unique(strided))
    assert_samples(torch.bucketize(b, torch.tensor([1.0, 3.0])),
                   list(torch.bucketize(strided, torch.tensor([1.0, 3.0])).split([4, 2])))


# =================================================================================== errors
def test_errors_are_torchs():
    ints = nestbatch.nested([torch.tensor([1, 2]), torch.tensor([0])])
    floats = ints.double()
    with pytest.raises(RuntimeError, match="LongTensor"):
        F.one_hot(floats)
    with pytest.raises(RuntimeError, match="non-negative"):
        F.one_hot(ints - 3)
    with pytest.raises(NotImplementedError):
        torch.histc(ints)
    with pytest.raises(NotImplementedError):
        torch.bincount(floats)
    with pytest.raises(RuntimeError, match="non-negative"):
        torch.bincount(ints - 2)
    with pytest.raises(RuntimeError, match="1-d"):
        torch.bincount(nestbatch.nested([torch.zeros(2, 3, dtype=torch.long)]))
    with pytest.raises(RuntimeError, match="Bool"):
        torch.isin(ints > 0, torch.tensor([True]))
    with pytest.raises(IndexError):
        torch.unique(ints, dim=5)


def test_refusals_say_why():
    ints = nestbatch.nested([torch.tensor([1, 2]), torch.tensor([0])])
    with pytest.raises(ValueError, match="ambiguous"):
        torch.isin(ints, ints)
    with pytest.raises(ValueError, match="1-d dense boundaries"):
        torch.bucketize(torch.tensor([1]), ints)
    with pytest.raises(TypeError, match="out="):
        torch.bucketize(ints, torch.tensor([1]), out=torch.empty(0, dtype=torch.long))
    with pytest.raises(ValueError, match="last dim.*ragged"):
        torch.searchsorted(ints, ints)
    rows = nestbatch.nested([torch.ones(2, 3), torch.ones(1, 3)])
    with pytest.raises(ValueError, match="values as a NestedBatch"):
        torch.searchsorted(rows, torch.ones(2, 1))
    with pytest.raises(ValueError, match="same row structure"):
        torch.searchsorted(rows, nestbatch.nested([torch.ones(1, 3), torch.ones(1, 3)]))
    with pytest.raises(ValueError, match="1-d dense sorted_sequence"):
        torch.searchsorted(torch.ones(2, 3), ints.float())
    with pytest.raises(ValueError, match="weights as a NestedBatch"):
        torch.bincount(ints, torch.ones(3))
    with pytest.raises(ValueError, match="weights as a NestedBatch"):
        torch.histogram(ints.float(), 2, weight=torch.ones(3))
    for dim in (0, 1):
        with pytest.raises(ValueError, match=f"dim {dim} is the"):
            torch.unique(rows, dim=dim)
    assert isinstance(pytest.raises(ValueError, torch.isin, ints, ints).value, RuntimeError)

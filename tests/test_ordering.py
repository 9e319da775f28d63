"""Ordering ops (sort, argsort, msort, topk, kthvalue, flip, roll, diff) against the same torch op
run on every sample alone, bit for bit.

Batches are drawn with one or two ragged dims, empty samples, one sample or none, every dim
(negative ones too), six dtypes, special values with ties, packed / padded / device-sized /
non-contiguous storage and a moved ragged dim. Where torch leaves the order of equal values open
(``topk``, ``kthvalue``) the values are compared exactly and every index must point at an equal
value (exactly torch's where the sample has no ties); ``sort`` is exact for ``stable=False``
too, since torch's CPU sort is stable up to 16 elements and the samples here are shorter.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from ragged_strategies import (
    bits,
    build_batch,
    ragged_samples,
    same_values,
    value_pool,
)

import nestbatch
from nestbatch import NestedBatch
from nestbatch.ops import ordering

DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int64, torch.bool)
BUILDS = ("packed", "padded", "device", "strided")
fast = settings(deadline=None)  # (examples: the profile's, 30 by default)


# =========================================================================== building batches

def _with_values(samples: list[torch.Tensor], pool: list | None, seed: int) -> list:
    if pool is None:
        return samples
    gen = torch.Generator().manual_seed(seed)
    table = torch.tensor(pool, dtype=samples[0].dtype)
    return [table[torch.randint(len(pool), s.shape, generator=gen)] for s in samples]


def build(samples: list[torch.Tensor], k: int, how: str) -> NestedBatch:
    """The batch of ``samples`` stored as ``how`` says, a padded one's filler declared."""
    return build_batch(samples, k, how, declare_filler=True)


@st.composite
def cases(draw: st.DrawFn, dtypes=DTYPES, k: int | None = None
          ) -> tuple[NestedBatch, list[torch.Tensor]]:
    """A batch and its samples in logical order."""
    samples, k = draw(ragged_samples(num_ragged_dims=k, dtypes=dtypes, max_batch=4, max_len=5))
    if samples:
        mode = draw(st.sampled_from(["plain", "ties", "special"]))
        pool = value_pool(samples[0].dtype, mode)
        samples = _with_values(samples, pool, draw(st.integers(0, 99)))
    batch = build(samples, k, draw(st.sampled_from(BUILDS)))
    if k == 1 and samples and samples[0].dim() > 1 and draw(st.booleans()):
        batch = batch.transpose(1, 2)  # the ragged dim moved to logical dim 2
        samples = [s.transpose(0, 1) for s in samples]
    return batch, samples


def any_dim(batch: NestedBatch) -> st.SearchStrategy[int]:
    return st.integers(-batch.dim(), batch.dim() - 1)


# =========================================================================== comparing

def assert_exact(actual: list[torch.Tensor], expected: list[torch.Tensor]) -> None:
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        assert a.shape == e.shape and a.dtype == e.dtype, (a.shape, e.shape, a.dtype, e.dtype)
        assert torch.equal(bits(a), bits(e)), (a, e)



def has_ties(sample: torch.Tensor, dim: int) -> bool:
    """Whether two elements of a line along ``dim`` are equal (two NaN count as equal)."""
    if sample.dim() == 0 or sample.shape[dim] < 2:
        return False
    ordered = sample.long().sort(dim).values if sample.dtype == torch.bool else \
        sample.sort(dim).values
    first = ordered.narrow(dim, 0, ordered.shape[dim] - 1)
    second = ordered.narrow(dim, 1, ordered.shape[dim] - 1)
    equal = first == second
    if first.is_floating_point():
        equal |= first.isnan() & second.isnan()
    return bool(equal.any())


def assert_selected(actual, expected, sample: torch.Tensor, dim: int, distinct: bool) -> None:
    """``(values, indices)`` of a selection, against torch's on ``sample`` along ``dim``."""
    assert same_values(actual[0], expected[0]), (actual, expected)
    assert actual[1].dtype == torch.int64 and actual[1].shape == expected[1].shape
    picked = torch.take_along_dim(sample, actual[1], dim) if sample.dim() else sample
    assert same_values(picked, actual[0])
    if distinct and actual[1].numel():
        ordered = actual[1].sort(dim).values
        assert bool((ordered.diff(dim=dim) != 0).all())
    if not has_ties(sample, dim):
        assert torch.equal(actual[1], expected[1])


def outcome(fn):
    """``(result, None)`` or ``(None, the exception)``."""
    try:
        return fn(), None
    except Exception as error:  # noqa: BLE001 (compared with torch's)
        return None, error


def per_sample(fn, samples: list[torch.Tensor]):
    """torch's results on every sample, or the first exception it raises."""
    return outcome(lambda: [fn(s) for s in samples])


def assert_same_error(ours: Exception | None, theirs: Exception | None) -> bool:
    """Whether an exception was expected; when it was, ours has torch's type."""
    if theirs is None:
        assert ours is None, ours
        return False
    assert isinstance(ours, type(theirs)), (ours, theirs)
    return True


def pieces(result) -> list[torch.Tensor]:
    """The samples of a batch, or the rows of a dense result."""
    return list(result.unbind()) if isinstance(result, NestedBatch) else list(result.unbind(0))


# =========================================================================== sort, argsort
@fast
@given(st.data(), cases(), st.booleans(), st.sampled_from([None, False, True]),
       st.sampled_from(["function", "method", "argsort"]))
def test_sort_and_argsort_match_every_sample(data, case, descending, stable, spelling):
    batch, samples = case
    dim = data.draw(any_dim(batch))
    options = {} if stable is None else {"stable": stable}
    # (torch takes dim and descending by keyword beside stable)
    if spelling == "argsort":
        ours = outcome(lambda: torch.argsort(batch, dim=dim, descending=descending, **options))
    elif spelling == "method" and stable is None:
        ours = outcome(lambda: batch.sort(dim, descending))
    elif spelling == "method":
        ours = outcome(lambda: batch.sort(dim=dim, descending=descending, stable=stable))
    else:
        ours = outcome(lambda: torch.sort(batch, dim=dim, descending=descending, **options))
    if dim % batch.dim() == 0:
        assert isinstance(ours[1], ValueError) and isinstance(ours[1], RuntimeError)
        return
    d = dim % batch.dim() - 1
    expected, error = per_sample(lambda s: torch.sort(s, dim=d, descending=descending,
                                                      stable=bool(stable)), samples)
    if assert_same_error(ours[1], error):
        return
    if spelling == "argsort":
        assert_exact(ours[0].unbind(), [e.indices for e in expected])
        return
    assert type(ours[0]) is torch.return_types.sort
    assert_exact(ours[0].values.unbind(), [e.values for e in expected])
    assert_exact(ours[0].indices.unbind(), [e.indices for e in expected])


def test_sort_follows_torch_for_nan_infinities_zeros_and_ties():
    samples = [torch.tensor([2.0, math.nan, -0.0, math.inf, 0.0, -math.inf, 2.0, math.nan]),
               torch.tensor([]), torch.tensor([0.0, -0.0, 0.0])]
    for how in ("packed", "padded", "device"):
        batch = build(samples, 1, how)
        for descending in (False, True):
            out = torch.sort(batch, dim=1, descending=descending, stable=True)
            expected = [torch.sort(s, dim=0, descending=descending, stable=True) for s in samples]
            assert_exact(out.values.unbind(), [e.values for e in expected])
            assert_exact(out.indices.unbind(), [e.indices for e in expected])


@pytest.mark.parametrize("ratio", [0, 10**9])  # the packed rows' two sorts, the padded sort
@pytest.mark.parametrize("how", ["packed", "padded", "device"])
def test_both_ways_of_sorting_give_torchs_order(monkeypatch, ratio, how):
    monkeypatch.setattr(ordering, "SORT_PADDING_RATIO", ratio)
    gen = torch.Generator().manual_seed(2)
    pool = torch.tensor([math.nan, -math.inf, -1.0, -0.0, 0.0, 2.0, math.inf])
    samples = [pool[torch.randint(7, (n, 2), generator=gen)] for n in (9, 0, 1, 30, 4)]
    batch = build(samples, 1, how)
    for descending in (False, True):
        out = torch.sort(batch, dim=1, descending=descending, stable=True)
        expected = [torch.sort(s, dim=0, descending=descending, stable=True) for s in samples]
        assert_exact(out.values.unbind(), [e.values for e in expected])
        assert_exact(out.indices.unbind(), [e.indices for e in expected])
        top = torch.topk(batch.narrow(-1, 0, 1), 0, 1, largest=descending)
        assert top.values.shape == (5, 0, 1)
    kth = torch.kthvalue(build([s for s in samples if len(s)], 1, how), 1, 1)
    assert same_values(kth.values, torch.stack([torch.kthvalue(s, 1, 0).values
                                                for s in samples if len(s)]))


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool, torch.float16])
@pytest.mark.parametrize("ratio", [0, 10**9])
def test_both_ways_of_sorting_integers_and_bools(monkeypatch, ratio, dtype):
    monkeypatch.setattr(ordering, "SORT_PADDING_RATIO", ratio)
    extremes = [0, 1] if dtype == torch.bool else [-1, 0, 1] if dtype.is_floating_point else \
        [torch.iinfo(dtype).min, torch.iinfo(dtype).max, 0]
    pool = torch.tensor(extremes, dtype=dtype)
    gen = torch.Generator().manual_seed(4)
    samples = [pool[torch.randint(len(extremes), (n,), generator=gen)] for n in (5, 1, 20)]
    batch = build(samples, 1, "packed")
    for descending in (False, True):
        out = torch.sort(batch, dim=1, descending=descending, stable=True)
        expected = [torch.sort(s, dim=0, descending=descending, stable=True) for s in samples]
        assert_exact(out.values.unbind(), [e.values for e in expected])
        assert_exact(out.indices.unbind(), [e.indices for e in expected])


@pytest.mark.parametrize("how", ["packed", "padded", "device"])
def test_two_ragged_dims_along_either(how):
    gen = torch.Generator().manual_seed(5)
    shapes = [(3, 2), (1, 4), (0, 2), (2, 0), (4, 3)]
    samples = [torch.randint(0, 4, (*shape, 2), generator=gen).double() for shape in shapes]
    batch = build(samples, 2, how)
    for dim in (1, 2):
        d = dim - 1
        out = torch.sort(batch, dim=dim, descending=True, stable=True)
        expected = [torch.sort(s, dim=d, descending=True, stable=True) for s in samples]
        assert_exact(out.values.unbind(), [e.values for e in expected])
        assert_exact(out.indices.unbind(), [e.indices for e in expected])
        assert_exact(torch.diff(batch, 2, dim).unbind(), [torch.diff(s, 2, d) for s in samples])
        assert_exact(batch.flip(dim).unbind(), [s.flip(d) for s in samples])
        assert_exact(batch.roll(-2, dim).unbind(), [s.roll(-2, d) for s in samples])
        with pytest.raises(IndexError):  # (a sample with size 0 there)
            batch.kthvalue(1, dim)
    full = build([s for s in samples if s.numel()], 2, how)  # every size at least 1
    kept = [s for s in samples if s.numel()]
    for dim, keepdim in itertools.product((1, 2), (False, True)):
        out = full.kthvalue(1, dim, keepdim)
        for got, index, s in zip(out.values.unbind(), out.indices.unbind(), kept):
            want = torch.kthvalue(s, 1, dim - 1, True)
            if not keepdim:
                got, index = got.unsqueeze(dim - 1), index.unsqueeze(dim - 1)
            assert_selected((got, index), want, s, dim - 1, distinct=False)
        top = torch.topk(full, 1, dim, largest=False)
        for got, s in zip(top.values.unbind(), kept):
            assert same_values(got, torch.topk(s, 1, dim - 1, largest=False).values)


def test_long_samples_sort_stably():
    """Past 16 elements torch's unstable CPU sort reorders ties; a stable sort is exact."""
    gen = torch.Generator().manual_seed(1)
    samples = [torch.randint(0, 3, (n, 2), generator=gen).double() for n in (40, 0, 23)]
    batch = build(samples, 1, "packed")
    out = torch.sort(batch, dim=1, descending=True, stable=True)
    expected = [torch.sort(s, dim=0, descending=True, stable=True) for s in samples]
    assert_exact(out.indices.unbind(), [e.indices for e in expected])
    assert_exact(torch.argsort(batch, dim=1, stable=True).unbind(),
                 [torch.argsort(s, dim=0, stable=True) for s in samples])


# =========================================================================== topk, kthvalue
@fast
@given(st.data(), cases(), st.integers(-1, 6), st.booleans(), st.booleans())
def test_topk_matches_every_sample(data, case, k, largest, sorted_):
    batch, samples = case
    dim = data.draw(any_dim(batch))
    ours = outcome(lambda: torch.topk(batch, k, dim, largest, sorted_))
    if dim % batch.dim() == 0:
        assert isinstance(ours[1], ValueError)
        return
    d = dim % batch.dim() - 1
    # (sorted=True for torch: its order of an unsorted result is its own)
    expected, error = per_sample(lambda s: torch.topk(s, k, d, largest, True), samples)
    if k < 0 and not samples:  # (no result has a negative size, samples or not)
        error = RuntimeError()
    if assert_same_error(ours[1], error):
        return
    result = ours[0]
    assert type(result) is torch.return_types.topk
    values, indices = pieces(result.values), pieces(result.indices)
    assert len(values) == len(samples)
    for sample, v, i, e in zip(samples, values, indices, expected):
        assert_selected((v, i), e, sample, d, distinct=True)


@fast
@given(st.data(), cases(), st.integers(0, 6), st.booleans())
def test_kthvalue_matches_every_sample(data, case, k, keepdim):
    batch, samples = case
    dim = data.draw(any_dim(batch))
    ours = outcome(lambda: batch.kthvalue(k, dim, keepdim))
    if dim % batch.dim() == 0:
        assert isinstance(ours[1], ValueError)
        return
    d = dim % batch.dim() - 1
    expected, error = per_sample(lambda s: torch.kthvalue(s, k, d, keepdim), samples)
    if assert_same_error(ours[1], error):
        return
    result = ours[0]
    assert type(result) is torch.return_types.kthvalue
    values, indices = pieces(result.values), pieces(result.indices)
    assert len(values) == len(samples)
    for sample, v, i, e in zip(samples, values, indices, expected):
        index = i if keepdim else i.unsqueeze(d)
        assert_selected((v if keepdim else v.unsqueeze(d), index),
                        (e.values if keepdim else e.values.unsqueeze(d),
                         e.indices if keepdim else e.indices.unsqueeze(d)),
                        sample, d, distinct=False)


def test_selection_over_the_ragged_dim_is_dense():
    samples = [torch.tensor([[1.0, 5.0], [3.0, 2.0], [0.0, 9.0]]), torch.tensor([[4.0, 4.0]])]
    batch = build(samples, 1, "padded")
    top = torch.topk(batch, 1, dim=1)
    assert isinstance(top.values, torch.Tensor) and top.values.shape == (2, 1, 2)
    assert torch.equal(top.values, torch.stack([torch.topk(s, 1, 0).values for s in samples]))
    kth = torch.kthvalue(batch, 1, dim=1, keepdim=True)
    assert torch.equal(kth.indices, torch.stack([torch.kthvalue(s, 1, 0, True).indices
                                                 for s in samples]))
    moved = batch.transpose(1, 2)  # samples (2, L_i): the k at logical dim 2
    assert torch.topk(moved, 1, dim=2).values.shape == (2, 2, 1)
    assert torch.kthvalue(moved, 1, dim=2, keepdim=True).values.shape == (2, 2, 1)


def test_topk_and_kthvalue_raise_torch_errors_for_the_first_short_sample():
    batch = nestbatch.nested([torch.tensor([1.0, 2.0, 3.0]), torch.zeros(0), torch.ones(1)])
    with pytest.raises(RuntimeError, match="selected index k out of range"):
        torch.topk(batch, 2, dim=1)
    with pytest.raises(RuntimeError, match="selected index k out of range"):
        torch.topk(batch, -1, dim=1)
    with pytest.raises(RuntimeError, match="selected number k out of range") as error:
        torch.kthvalue(batch, 4, 1)  # sample 0 fails first, as in a loop over the samples
    assert not isinstance(error.value, IndexError)
    with pytest.raises(IndexError, match="non-zero size"):
        torch.kthvalue(batch, 1, 1)  # sample 1 is empty
    device_sized = build([torch.ones(2), torch.ones(1)], 1, "device")
    with pytest.raises(RuntimeError, match="out of range"):
        device_sized.topk(2, dim=1)  # (the sizes read from their tensor)
    bools = nestbatch.nested([torch.tensor([True, False])])
    with pytest.raises(RuntimeError, match="bool"):
        torch.topk(bools, 1, 1)
    with pytest.raises(NotImplementedError):
        torch.kthvalue(bools, 1, 1)
    with pytest.raises(TypeError):
        torch.topk(batch, 1.0, 1)
    with pytest.raises(TypeError):
        torch.kthvalue(batch, True, 1)


def test_no_sample_raises_nothing():
    empty = NestedBatch.from_lengths(torch.empty(0, 3), [])
    assert torch.topk(empty, 4, dim=1).values.shape == (0, 4, 3)
    assert torch.kthvalue(empty, 4, dim=1).values.shape == (0, 3)
    assert torch.kthvalue(empty, 4, dim=1, keepdim=True).indices.shape == (0, 1, 3)
    for op in (lambda b: b.sort(1).values, lambda b: b.flip(0, 1, 2), lambda b: b.roll(1),
               lambda b: b.roll((1, 2, 1), (0, 1, 2)), lambda b: b.diff(2, 1),
               lambda b: b.diff(1, 2), lambda b: b.argsort(-1)):
        out = op(empty)
        assert out.batch_size == 0 and out.feature_shape[-1:] in ((3,), (2,))


# =========================================================================== flip, roll
@fast
@given(st.data(), cases(), st.sampled_from(["function", "method", "varargs"]))
def test_flip_matches_every_sample(data, case, spelling):
    batch, samples = case
    n = batch.dim()
    dims = data.draw(st.lists(st.integers(-n, n - 1), max_size=3,
                              unique_by=lambda d: d % n))
    if spelling == "function":
        out = torch.flip(batch, dims)
    elif spelling == "method":
        out = batch.flip(dims)
    else:
        out = batch.flip(*dims) if dims else batch.flip(dims)
    inner = [d % n - 1 for d in dims if d % n]
    expected = [s.flip(inner) for s in samples]
    if any(d % n == 0 for d in dims):
        expected = expected[::-1]
    assert out.ragged_dim == batch.ragged_dim
    assert_exact(out.unbind(), expected)


@fast
@given(st.data(), cases(), st.integers(-7, 7))
def test_roll_matches_every_sample(data, case, first):
    batch, samples = case
    n = batch.dim()
    pairs = data.draw(st.lists(st.tuples(st.integers(-7, 7), st.integers(-n, n - 1)),
                               min_size=1, max_size=3))
    shifts, dims = tuple(p[0] for p in pairs), tuple(p[1] for p in pairs)
    rolled = [torch.roll(s, [t for t, d in pairs if d % n],
                         [d % n - 1 for t, d in pairs if d % n]) if any(d % n for d in dims)
              else s.clone() for s in samples]
    rotate = sum(t for t, d in pairs if d % n == 0)
    if samples and rotate:
        rotate %= len(samples)
        rolled = rolled[-rotate:] + rolled[:-rotate] if rotate else rolled
    assert_exact(torch.roll(batch, shifts, dims).unbind(), rolled)
    if len(pairs) == 1:  # an int shift along an int dim, as a method
        assert_exact(batch.roll(shifts[0], dims[0]).unbind(), rolled)


def _roll_all(samples: list[torch.Tensor], shift: int) -> list[torch.Tensor]:
    """torch's roll with no dims of the samples as one tensor: all elements, in order."""
    if not samples:
        return []
    flat = torch.roll(torch.cat([s.reshape(-1) for s in samples]), shift)
    parts = flat.split([s.numel() for s in samples])
    return [p.view(s.shape) for p, s in zip(parts, samples)]


@fast
@given(cases(), st.integers(-9, 9))
def test_roll_without_dims_rolls_the_whole_batch(case, shift):
    batch, samples = case
    if batch.ragged_dim != 1:
        with pytest.raises(ValueError, match="transpose the ragged dim back"):
            torch.roll(batch, shift)
        return
    assert_exact(torch.roll(batch, shift).unbind(), _roll_all(samples, shift))
    assert_exact(batch.roll([shift]).unbind(), _roll_all(samples, shift))


def test_dense_equal_lengths_flip_and_roll_as_the_dense_tensor():
    dense = torch.arange(24.0).view(3, 4, 2)
    batch = NestedBatch.from_padded(dense, [4, 4, 4])
    for out, want in ((torch.flip(batch, (0, 1)), torch.flip(dense, (0, 1))),
                      (torch.roll(batch, (1, -1), (0, 1)), torch.roll(dense, (1, -1), (0, 1))),
                      (torch.roll(batch, 5), torch.roll(dense, 5)),
                      (torch.fliplr(batch), torch.fliplr(dense)),
                      (torch.flipud(batch), torch.flipud(dense))):
        assert torch.equal(out.to_padded_tensor(), want)


def test_flip_and_roll_return_copies():
    values = torch.arange(5.0)
    batch = NestedBatch.from_lengths(values, [2, 3])
    for out in (batch.flip(()), batch.roll(0, 1), batch.roll(1, 0), batch.flip((0,)),
                batch.diff(0)):
        out.values.add_(1)
    assert torch.equal(values, torch.arange(5.0))


# =========================================================================== diff
@fast
@given(st.data(), cases(), st.integers(0, 6))
def test_diff_matches_every_sample(data, case, n):
    batch, samples = case
    dim = data.draw(any_dim(batch))
    ours = outcome(lambda: torch.diff(batch, n, dim))
    if dim % batch.dim() == 0:
        assert isinstance(ours[1], ValueError)
        return
    d = dim % batch.dim() - 1
    expected, error = per_sample(lambda s: torch.diff(s, n, d), samples)
    if assert_same_error(ours[1], error):
        return
    assert ours[0].ragged_dim == batch.ragged_dim
    assert_exact(ours[0].unbind(), expected)


@pytest.mark.parametrize("how", ["packed", "padded", "device"])
def test_diff_with_prepend_and_append_is_torch_cat_then_diff(how):
    gen = torch.Generator().manual_seed(3)
    samples = [torch.randint(-9, 9, (n, 2), generator=gen) for n in (3, 0, 1, 4)]
    batch = build(samples, 1, how)
    head = build([torch.full((m, 2), 2) for m in (1, 2, 0, 1)], 1, "packed")
    tail = torch.full((4, 2, 2), 0.5)  # dense: two rows after every sample
    for n in (0, 1, 3):
        out = torch.diff(batch, n, 1, prepend=head, append=tail)
        expected = [torch.diff(s, n, 0, prepend=h, append=t)
                    for s, h, t in zip(samples, head.unbind(), tail)]
        assert_exact(out.unbind(), expected)
    rows = build([torch.ones(n, 1, dtype=torch.int64) for n in (3, 0, 1, 4)], 1, "packed")
    out = batch.diff(1, -1, rows)  # along the feature dim: a batch of the same rows
    assert_exact(out.unbind(), [torch.diff(s, 1, -1, r) for s, r in zip(samples, rows.unbind())])
    with pytest.raises(RuntimeError):
        torch.diff(batch, 1, 1, prepend=build([torch.ones(1, 3)] * 4, 1, "packed"))


# =========================================================================== errors
def test_ops_across_samples_raise_a_clear_error():
    batch = nestbatch.nested([torch.ones(2, 3), torch.ones(1, 3)])
    for call in (lambda: torch.sort(batch, 0), lambda: torch.argsort(batch, 0),
                 lambda: batch.msort(), lambda: torch.msort(batch),
                 lambda: torch.topk(batch, 1, 0), lambda: batch.kthvalue(1, -3),
                 lambda: torch.diff(batch, 1, 0)):
        with pytest.raises(ValueError, match=r"over dim 0 \(the batch\).*\.values") as error:
            call()
        assert isinstance(error.value, RuntimeError)


def test_argument_errors_are_torchs():
    batch = nestbatch.nested([torch.ones(2, 3), torch.ones(1, 3)])
    with pytest.raises(RuntimeError, match="appears multiple times"):
        torch.flip(batch, (1, -2))
    with pytest.raises(TypeError):
        torch.flip(batch, 1)
    with pytest.raises(TypeError, match="tuple of ints"):
        batch.flip(dims=1)
    with pytest.raises(TypeError, match="dims"):
        batch.flip()
    assert_exact(batch.flip(dims=[2]).unbind(), [s.flip(1) for s in batch.unbind()])
    for call in (lambda: batch.topk(1.0), lambda: batch.diff(1.5), lambda: batch.roll(1.5),
                 lambda: batch.roll((1, 1.0), (0, 1))):
        with pytest.raises(TypeError, match="must be int"):
            call()
    with pytest.raises(RuntimeError, match="must align"):
        torch.roll(batch, (1, 2))
    with pytest.raises(RuntimeError, match="must align"):
        torch.roll(batch, (1, 2), (1,))
    with pytest.raises(RuntimeError, match="`shifts` required"):
        torch.roll(batch, (), ())
    with pytest.raises(RuntimeError, match="order must be non-negative"):
        torch.diff(batch, -1, 1)
    with pytest.raises(TypeError):
        torch.diff(batch, 1.0, 1)
    with pytest.raises(IndexError):
        torch.sort(batch, 3)
    with pytest.raises(RuntimeError, match="complex"):
        torch.sort(nestbatch.nested([torch.ones(2, dtype=torch.complex64)]), 1)


def test_nested_raggedness_is_refused_by_name():
    nested = NestedBatch.from_nested_row_lengths(torch.arange(10.0), ([1, 0, 4], [3, 0, 2, 4, 1]))
    for call in (lambda: torch.sort(nested, 2), lambda: nested.flip(1), lambda: nested.roll(1),
                 lambda: nested.diff(), lambda: nested.topk(1)):
        with pytest.raises(TypeError, match="ragged rank 2"):
            call()


# =========================================================================== autograd
def _packed_function(lengths, op, k: int = 1):
    """``op`` of the batch over float64 rows, as a function of those rows (its packed or dense
    result)."""
    def fn(values):
        if k == 1:
            batch = NestedBatch.from_lengths(values, lengths)
        else:
            batch = NestedBatch.from_shapes(values, torch.tensor(lengths))
        out = op(batch)
        return out.values if isinstance(out, NestedBatch) else out
    return fn


@pytest.mark.parametrize("op", [
    lambda b: torch.sort(b, 1).values, lambda b: torch.sort(b, -1, True).values,
    lambda b: torch.topk(b, 1, 1).values, lambda b: torch.topk(b, 2, -1).values,
    lambda b: torch.kthvalue(b, 1, 1).values, lambda b: torch.kthvalue(b, 2, 2, True).values,
    lambda b: torch.flip(b, (0, 1, 2)), lambda b: torch.roll(b, (2, 1), (1, 0)),
    lambda b: torch.roll(b, 3), lambda b: torch.diff(b, 2, 1), lambda b: torch.diff(b, 1, 2),
])
@pytest.mark.parametrize("ratio", [0, 10**9])  # sorting the packed rows, the padded data
def test_gradients_flow(monkeypatch, op, ratio):
    monkeypatch.setattr(ordering, "SORT_PADDING_RATIO", ratio)
    values = torch.randperm(18, generator=torch.Generator().manual_seed(0)).double().view(9, 2)
    values.requires_grad_(True)
    assert torch.autograd.gradcheck(_packed_function([4, 2, 3], op), (values,))


@pytest.mark.parametrize("op", [
    lambda b: torch.sort(b, 2).values, lambda b: torch.flip(b, (1, 2)),
    lambda b: torch.roll(b, (1, 1), (1, 2)), lambda b: torch.diff(b, 1, 1),
    lambda b: torch.topk(b, 1, 1).values, lambda b: torch.kthvalue(b, 1, 2).values,
])
def test_gradients_flow_with_two_ragged_dims(op):
    values = torch.randperm(10, generator=torch.Generator().manual_seed(1)).double()
    values.requires_grad_(True)
    assert torch.autograd.gradcheck(_packed_function([(2, 3), (2, 2)], op, k=2), (values,))

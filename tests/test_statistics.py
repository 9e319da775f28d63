"""Order statistics and paired reductions (median, nanmedian, quantile, nanquantile, mode,
aminmax, var_mean, std_mean) against the same torch function run on every sample alone.

Batches are drawn with empty samples, one sample or none, every dim (negative ones too), five
dtypes, special values (NaN, +-inf, -0.0) and ties, stored packed, padded with junk in the
padding, with device-only sizes, as a strided view, and with a moved ragged dim. Values are
compared bit for bit where the route computes what torch computes (median, quantile, mode,
aminmax up to the sign of tied zeros), indices exactly where the sample has no ties (else they
must point at an equal value), var_mean / std_mean to rounding.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from ragged_strategies import (
    bits,
    ragged_samples,
    same_values,
    value_pool,
)
from ragged_strategies import build_batch as build

import nestbatch
from nestbatch import NestedBatch

fast = settings(deadline=None, max_examples=40)
DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int64)
BUILDS = ("packed", "padded", "device", "strided")


# =========================================================================== building batches

@st.composite
def cases(draw: st.DrawFn, dtypes=DTYPES, k: int | None = 1, modes=("plain", "ties", "special")
          ) -> tuple[NestedBatch, list[torch.Tensor]]:
    """A batch and its samples in logical order."""
    samples, k = draw(ragged_samples(num_ragged_dims=k, dtypes=dtypes, max_batch=4, max_len=6))
    if samples:
        pool = value_pool(samples[0].dtype, draw(st.sampled_from(modes)))
        if pool is not None:
            gen = torch.Generator().manual_seed(draw(st.integers(0, 99)))
            table = torch.tensor(pool, dtype=samples[0].dtype)
            samples = [table[torch.randint(len(pool), s.shape, generator=gen)] for s in samples]
    batch = build(samples, k, draw(st.sampled_from(BUILDS)))
    if k == 1 and samples and samples[0].dim() > 1 and draw(st.booleans()):
        batch = batch.transpose(1, 2)
        samples = [s.transpose(0, 1) for s in samples]
    return batch, samples


def any_dim(batch: NestedBatch) -> st.SearchStrategy[int]:
    """Every dim but the batch's, negative ones too."""
    return st.sampled_from([d for d in range(-batch.dim(), batch.dim()) if d % batch.dim()])


# =========================================================================== comparing


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.allclose(
        a.double(), b.double(), rtol=1e-2 if a.element_size() == 2 else 1e-5, atol=1e-6,
        equal_nan=True)


def per_sample(result) -> list:
    """A batched result as one entry per sample (a tuple of them for a pair)."""
    if isinstance(result, tuple):
        return list(zip(*(per_sample(r) for r in result)))
    return list(result.unbind()) if isinstance(result, NestedBatch) else list(result.unbind(0))


def outcome(fn: Callable):
    try:
        return fn(), None
    except Exception as error:  # noqa: BLE001 (compared with torch's)
        return None, error


def reference(fn: Callable, samples: list[torch.Tensor]):
    """``fn`` of every sample in turn, or the exception of the first that raises."""
    out = []
    for s in samples:
        result, error = outcome(lambda s=s: fn(s))
        if error is not None:
            return None, error
        out.append(result)
    return out, None


def compare(op: Callable, fn: Callable, batch: NestedBatch, samples: list[torch.Tensor],
            check: Callable) -> None:
    """``op(batch)`` against ``fn`` of every sample: the same exception type, or ``check(actual,
    expected, sample)`` for every sample."""
    expected, error = reference(fn, samples)
    actual, got = outcome(lambda: op(batch))
    if error is not None:
        assert isinstance(got, type(error)), (got, error)
        return
    assert got is None, got
    if not samples:
        return
    for a, e, s in zip(per_sample(actual), expected, samples, strict=True):
        check(a, e, s)


def exact(a, e, s) -> None:
    assert a.shape == e.shape and a.dtype == e.dtype, (a.shape, e.shape, a.dtype, e.dtype)
    assert torch.equal(bits(a), bits(e)), (a, e)


def has_ties(sample: torch.Tensor, dim: int) -> bool:
    """Two equal elements (two NaN count as equal) in a line along ``dim``."""
    if sample.dim() == 0 or sample.shape[dim] < 2:
        return False
    ordered = sample.sort(dim).values
    n = ordered.shape[dim]
    first, second = ordered.narrow(dim, 0, n - 1), ordered.narrow(dim, 1, n - 1)
    equal = first == second
    if first.is_floating_point():
        equal |= first.isnan() & second.isnan()
    return bool(equal.any())


def selected(dim: int) -> Callable:
    """Check of a ``(values, indices)`` pair along a sample's ``dim``."""
    def check(a, e, s) -> None:
        exact(a[0], e[0], s)
        assert a[1].dtype == torch.int64 and a[1].shape == e[1].shape
        index = a[1] if a[1].dim() == s.dim() else a[1].unsqueeze(dim)
        picked = torch.take_along_dim(s, index, dim)
        assert same_values(picked, a[0].reshape(picked.shape)), (s, a)
        if not has_ties(s, dim):
            assert torch.equal(a[1], e[1]), (s, a, e)
    return check


def sample_dim(batch: NestedBatch, dim: int) -> int:
    return dim % batch.dim() - 1


# =========================================================================== median, nanmedian
@fast
@given(st.data(), st.sampled_from(["median", "nanmedian"]), st.booleans())
def test_median_matches_torch_per_sample(data, name, keepdim):
    batch, samples = data.draw(cases(k=None))
    dim = data.draw(any_dim(batch))
    d = sample_dim(batch, dim)
    func = getattr(torch, name)
    if batch.num_ragged_dims > 1 and d < batch.num_ragged_dims:
        with pytest.raises(ValueError, match="ragged dims"):
            func(batch, dim)
        return
    compare(lambda b: func(b, dim, keepdim), lambda s: func(s, d, keepdim), batch, samples,
            selected(d))
    compare(lambda b: getattr(b, name)(dim=dim, keepdim=keepdim),
            lambda s: func(s, d, keepdim), batch, samples, selected(d))


@fast
@given(cases(k=None), st.sampled_from(["median", "nanmedian"]))
def test_median_without_dim_is_over_all_elements(case, name):
    batch, samples = case
    flat = torch.cat([s.flatten() for s in samples]) if samples else torch.empty(0)
    expected, error = outcome(lambda: getattr(torch, name)(flat.to(batch.dtype)))
    actual, got = outcome(lambda: getattr(batch, name)())
    if error is not None:
        assert isinstance(got, type(error))
    else:
        exact(actual, expected, None)


def test_median_over_the_ragged_dim_is_dense_and_keeps_the_dim():
    b = nestbatch.nested([torch.tensor([[3.0, 1.0], [1.0, 5.0], [2.0, 2.0]]),
                          torch.tensor([[4.0, 0.0]])])
    out = torch.median(b, 1)
    assert type(out) is torch.return_types.median
    assert torch.equal(out.values, torch.tensor([[2.0, 2.0], [4.0, 0.0]]))
    assert torch.equal(out.indices, torch.tensor([[2, 2], [0, 0]]))
    kept = torch.median(b, 1, keepdim=True)
    assert kept.values.shape == (2, 1, 2)
    moved = torch.median(b.transpose(1, 2), 2, keepdim=True)
    assert moved.values.shape == (2, 2, 1) and torch.equal(moved.values[..., 0], out.values)


# =========================================================================== quantile
@fast
@given(st.data(), st.sampled_from(["quantile", "nanquantile"]), st.booleans(),
       st.sampled_from(["linear", "lower", "higher", "midpoint", "nearest"]))
def test_quantile_matches_torch_per_sample(data, name, keepdim, interpolation):
    batch, samples = data.draw(cases(dtypes=(torch.float32, torch.float64), k=None))
    dim = data.draw(any_dim(batch))
    d = sample_dim(batch, dim)
    q = data.draw(st.sampled_from([0.0, 0.25, 0.5, 1 / 3, 1.0, "tensor"]))
    if q == "tensor":
        q = torch.tensor([0.1, 0.5, 0.9, 1.0], dtype=batch.dtype)
    func = getattr(torch, name)
    if batch.num_ragged_dims > 1 and (d < batch.num_ragged_dims or isinstance(q, torch.Tensor)):
        if samples and all(s.numel() for s in samples):
            with pytest.raises(ValueError):
                func(batch, q, dim)
        return

    def call(x, dim_):
        return func(x, q, dim_, keepdim, interpolation=interpolation)

    compare(lambda b: call(b, dim), lambda s: call(s, d), batch, samples, exact)
    if samples:  # no dim: over every element of every sample
        flat = torch.cat([s.flatten() for s in samples])
        expected, error = outcome(lambda: func(flat, q, interpolation=interpolation))
        actual, got = outcome(lambda: func(batch, q, interpolation=interpolation))
        if error is not None:
            assert isinstance(got, type(error))
        else:
            exact(actual, expected, None)


def test_quantile_shapes_and_keepdim():
    b = nestbatch.nested([torch.arange(6.0).view(3, 2), torch.arange(4.0).view(2, 2)])
    q = torch.tensor([0.25, 0.75])
    assert torch.quantile(b, 0.5, 1).shape == (2, 2)
    assert torch.quantile(b, q, 1).shape == (2, 2, 2)  # (B, Q, F)
    assert torch.quantile(b, q, 1, keepdim=True).shape == (2, 2, 1, 2)
    over_features = torch.quantile(b, q, -1)
    assert over_features.ragged_dim == 2 and over_features.unbind()[0].shape == (2, 3)
    assert torch.quantile(b, q, keepdim=True).shape == (2, 1, 1, 1)
    assert torch.equal(b.quantile(q), torch.quantile(torch.cat([torch.arange(6.0),
                                                                torch.arange(4.0)]), q))


# =========================================================================== mode
@fast
@given(st.data(), st.booleans())
def test_mode_matches_torch_per_sample(data, keepdim):
    # (NaN apart: torch's CPU mode of a sample with NaN is not well defined; below.)
    batch, samples = data.draw(cases(dtypes=(*DTYPES, torch.bool), k=None,
                                     modes=("plain", "ties")))
    dim = data.draw(any_dim(batch))
    d = sample_dim(batch, dim)
    if batch.num_ragged_dims > 1 and d < batch.num_ragged_dims:
        with pytest.raises(ValueError, match="ragged dims"):
            torch.mode(batch, dim)
        return

    def check(a, e, s) -> None:  # samples of up to 16 elements: torch's index is exact
        exact(a[0], e[0], s)
        assert torch.equal(a[1], e[1]), (s, a, e)

    compare(lambda b: torch.mode(b, dim, keepdim), lambda s: torch.mode(s, d, keepdim), batch,
            samples, check)


def test_mode_counts_every_nan_once_and_sorts_it_last():
    nan = math.nan
    b = nestbatch.nested([torch.tensor([nan, nan, 1.0]), torch.tensor([nan, nan]),
                          torch.tensor([2.0, nan, 2.0, 1.0, 1.0]), torch.tensor([-0.0, 0.0])])
    out = torch.mode(b, 1)
    assert torch.equal(out.values[[0, 2]], torch.tensor([1.0, 1.0]))
    assert out.values[1].isnan() and out.indices[1] == 0
    assert torch.equal(out.indices, torch.tensor([2, 0, 4, 1]))
    assert torch.equal(bits(out.values[3:]), bits(torch.tensor([0.0])))  # the last occurrence
    assert torch.mode(b).values.shape == (4,)  # (dim=-1: the ragged dim here)


# =========================================================================== aminmax
@fast
@given(st.data(), st.booleans())
def test_aminmax_matches_torch_per_sample(data, keepdim):
    batch, samples = data.draw(cases(dtypes=(*DTYPES, torch.bool), k=None))
    dim = data.draw(any_dim(batch))
    d = sample_dim(batch, dim)
    if batch.num_ragged_dims > 1 and d < batch.num_ragged_dims:
        with pytest.raises(ValueError):
            torch.aminmax(batch, dim=dim)
        return

    def check(a, e, s) -> None:  # (the sign of tied zeros is torch's kernel's own)
        assert same_values(a[0], e[0]) and same_values(a[1], e[1]), (s, a, e)

    compare(lambda b: torch.aminmax(b, dim=dim, keepdim=keepdim),
            lambda s: torch.aminmax(s, dim=d, keepdim=keepdim), batch, samples, check)
    flat = torch.cat([s.flatten() for s in samples]) if samples else \
        torch.empty(0, dtype=batch.dtype)
    expected, error = outcome(lambda: torch.aminmax(flat))
    actual, got = outcome(lambda: batch.aminmax())
    if error is not None:
        assert isinstance(got, type(error))
    else:
        assert type(actual) is torch.return_types.aminmax
        assert same_values(actual.min, expected.min) and same_values(actual.max, expected.max)


# =========================================================================== var_mean, std_mean
@fast
@given(st.data(), st.sampled_from(["var_mean", "std_mean"]), st.booleans(),
       st.sampled_from([0, 1, 2]))
def test_var_mean_matches_torch_per_sample(data, name, keepdim, correction):
    batch, samples = data.draw(cases(dtypes=(torch.float32, torch.float64), k=None,
                                     modes=("plain", "ties")))
    dim = data.draw(any_dim(batch))
    d = sample_dim(batch, dim)
    func = getattr(torch, name)
    if batch.num_ragged_dims > 1 and d < batch.num_ragged_dims:
        with pytest.raises(ValueError):
            func(batch, dim)
        return

    def check(a, e, s) -> None:
        assert close(a[0], e[0]) and close(a[1], e[1]), (s, a, e)

    with warnings.catch_warnings():  # (torch warns of no degrees of freedom)
        warnings.simplefilter("ignore")
        compare(lambda b: func(b, dim, correction=correction, keepdim=keepdim),
                lambda s: func(s, d, correction=correction, keepdim=keepdim), batch, samples,
                check)
        if samples:
            flat = torch.cat([s.flatten() for s in samples])
            actual, expected = func(batch, unbiased=False), func(flat, unbiased=False)
            assert close(actual[0], expected[0]) and close(actual[1], expected[1])


def test_var_mean_spellings():
    b = nestbatch.nested([torch.tensor([1.0, 2.0, 4.0]), torch.tensor([3.0, 5.0])])
    var, mean = torch.var_mean(b, 1)
    assert torch.allclose(var, torch.tensor([7 / 3, 2.0])) and torch.allclose(
        mean, torch.tensor([7 / 3, 4.0]))
    assert torch.allclose(torch.var_mean(b, 1, False)[0], torch.tensor([14 / 9, 1.0]))
    assert torch.allclose(torch.std_mean(b, 1, correction=0)[0], torch.tensor([14 / 9, 1.0]).sqrt())
    assert torch.var_mean(b, 1, keepdim=True)[1].shape == (2, 1)
    flat = torch.tensor([1.0, 2.0, 4.0, 3.0, 5.0])
    assert torch.allclose(torch.var_mean(b, False)[0], flat.var(unbiased=False))


# =========================================================================== errors
def test_refusals_and_torch_errors():
    b = nestbatch.nested([torch.tensor([[1.0, 2.0]]), torch.zeros(0, 2), torch.ones(2, 2)])
    for call in (lambda: torch.median(b, 0), lambda: torch.quantile(b, 0.5, 0),
                 lambda: torch.mode(b, 0), lambda: torch.aminmax(b, dim=0),
                 lambda: torch.var_mean(b, 0)):
        with pytest.raises(ValueError, match="dim 0"):
            call()
    for call in (lambda: torch.median(b, 1), lambda: torch.nanmedian(b, 1),
                 lambda: torch.mode(b, 1), lambda: torch.aminmax(b, dim=1)):
        with pytest.raises(IndexError, match="sample 1"):
            call()
    with pytest.raises(RuntimeError, match="non-empty.*sample 1"):
        torch.quantile(b, 0.5, 1)
    with pytest.raises(RuntimeError, match="non-empty"):
        torch.quantile(b, 0.5, -1)  # (torch's check of the sample, whatever the dim)
    assert torch.median(b, -1).values.unbind()[1].shape == (0,)
    ints = b.long()
    with pytest.raises(RuntimeError, match="float or double"):
        torch.quantile(b[[0, 2]].long(), 0.5, 1)
    with pytest.raises(RuntimeError, match="var_mean only support"):
        torch.var_mean(ints, 1)
    with pytest.raises(NotImplementedError):
        torch.median(b[[0, 2]].bool(), 1)
    with pytest.raises(RuntimeError, match=r"range \[0, 1\]"):
        torch.quantile(b[[0, 2]], 1.5, 1)
    with pytest.raises(RuntimeError, match="same dtype"):
        torch.quantile(b[[0, 2]], torch.tensor([0.5], dtype=torch.float64), 1)
    with pytest.raises(RuntimeError, match="interpolation"):
        torch.quantile(b[[0, 2]], 0.5, 1, interpolation="cubic")
    with pytest.raises(TypeError):
        torch.median(b, dim=None)
    with pytest.raises(TypeError):
        torch.aminmax(b, 1)
    two = NestedBatch.from_list([torch.ones(2, 3, 4), torch.ones(1, 2, 4)], 2)
    with pytest.raises(ValueError, match="ragged dims"):
        torch.median(two, 1)
    assert torch.median(two, -1).values.unbind()[0].shape == (2, 3)
    assert torch.median(two) == 1
    with pytest.raises(ValueError, match="several ragged dims"):
        torch.quantile(two, torch.tensor([0.5]), -1)


def test_empty_sample_read_from_device_sizes():
    values = torch.arange(5.0).view(5, 1)
    b = NestedBatch.from_offsets(values, torch.tensor([0, 2, 2, 5]))
    with pytest.raises(IndexError, match="sample 1"):
        torch.median(b, 1)
    fine = NestedBatch.from_offsets(values, torch.tensor([0, 2, 5]))
    assert torch.equal(torch.median(fine, 1).values, torch.tensor([[0.0], [3.0]]))


def test_out_arguments():
    b = nestbatch.nested([torch.tensor([3.0, 1.0, 2.0]), torch.tensor([5.0])])
    values, indices = torch.empty(0), torch.empty(0, dtype=torch.int64)
    torch.median(b, 1, out=(values, indices))
    assert torch.equal(values, torch.tensor([2.0, 5.0])) and torch.equal(indices,
                                                                          torch.tensor([2, 0]))
    out = torch.empty(2)
    torch.quantile(b, 0.5, 1, out=out)
    assert torch.equal(out, torch.tensor([2.0, 5.0]))
    with pytest.raises(TypeError):
        torch.median(b.unsqueeze(-1), -1, out=(values, indices))


def test_nested_ragged_rank_is_refused():
    nested = NestedBatch.from_nested_row_lengths(torch.arange(6.0), [[2, 1], [1, 2, 3]])
    assert nested.ragged_rank == 2
    with pytest.raises(TypeError, match="ragged rank"):
        torch.median(nested, 1)


# =========================================================================== autograd
def _batch_of(values: torch.Tensor, transpose: bool = False) -> NestedBatch:
    b = NestedBatch.from_lengths(values, [3, 2, 3])
    return b.transpose(1, 2) if transpose else b


def _torch_differentiates_aminmax() -> bool:
    try:
        torch.aminmax(torch.ones(2, dtype=torch.float64, requires_grad=True))[0].backward()
    except RuntimeError:
        return False
    return True


@pytest.mark.parametrize("layout", ["packed", "padded"])
def test_gradients(layout):
    gen = torch.Generator().manual_seed(0)
    values = torch.randn(8, 2, dtype=torch.float64, generator=gen, requires_grad=True)

    def wrap(v):
        b = _batch_of(v)
        if layout == "padded":
            b = NestedBatch.from_padded(b.padded(0.0).data, [3, 2, 3])
        return b

    q = torch.tensor([0.2, 0.5], dtype=torch.float64)
    calls = {
        "median": lambda v: torch.median(wrap(v), 1).values,
        "median feature": lambda v: torch.median(wrap(v), -1).values.values,
        "nanmedian": lambda v: torch.nanmedian(wrap(v), 1).values,
        "median all": lambda v: torch.median(wrap(v)),
        "quantile": lambda v: torch.quantile(wrap(v), q, 1),
        "nanquantile midpoint": lambda v: torch.nanquantile(wrap(v), 0.3, 1,
                                                            interpolation="midpoint"),
        "quantile all": lambda v: torch.quantile(wrap(v), q),
        "mode": lambda v: torch.mode(wrap(v), 1).values,
        "aminmax": lambda v: torch.aminmax(wrap(v), dim=1),
        "aminmax all": lambda v: torch.aminmax(wrap(v)),
        "var_mean": lambda v: torch.var_mean(wrap(v), 1),
        "std_mean": lambda v: torch.std_mean(wrap(v), 1, correction=0),
        "var_mean feature": lambda v: tuple(t.values for t in torch.var_mean(wrap(v), -1)),
    }
    if not _torch_differentiates_aminmax():  # (torch < 2.12: aten::aminmax has no derivative)
        del calls["aminmax all"]
    for name, call in calls.items():
        assert torch.autograd.gradcheck(call, (values,)), name
    moved = torch.randn(8, 2, dtype=torch.float64, generator=gen, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda v: torch.median(_batch_of(v, True), 2).values, (moved,))
    assert torch.autograd.gradcheck(lambda v: torch.quantile(_batch_of(v, True), q), (moved,))


def test_var_mean_over_features_and_all_elements_is_torchs_kernel():
    # (the audit's finding: an infinity made torch's one-pass mean NaN, the composed one inf)
    samples = [torch.tensor([[1.0, 2.0], [float("inf"), 3.0]]), torch.tensor([[4.0, 5.0]])]
    batch = nestbatch.nested(samples)
    flat = torch.cat([s.flatten() for s in samples])
    for func in (torch.var_mean, torch.std_mean):
        for got, want in zip(func(batch), func(flat)):
            torch.testing.assert_close(got, want, equal_nan=True)
        spread, mean = func(batch, 2)
        for sample, s, m in zip(samples, spread.unbind(), mean.unbind()):
            want_s, want_m = func(sample, 1)
            torch.testing.assert_close(s, want_s, equal_nan=True)
            torch.testing.assert_close(m, want_m, equal_nan=True)

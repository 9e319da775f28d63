"""Differential fuzz (issue #25): every registered reduction, softmax, elementwise op, selection
and conversion against the same torch op applied to each sample on its own.

A hypothesis strategy draws a batch (0-5 samples, zero-length ones included, one or two ragged
dims, 0-2 feature dims, float16 / bfloat16 / float32 / float64 / int64 / bool, values drawn so
that NaN, +-inf, -0.0, the dtype's min and max, 0, 1 and small integers are frequent, whole
samples of one special value, sometimes non-contiguous samples) and builds it every way a user
does (:func:`constructions`): ``nested(...).to(PACKED)`` / ``.to(PADDED)``, ``from_list``,
``from_lengths`` / ``from_offsets`` / ``from_shapes`` with host or device sizes, and
``from_padded`` with host or device sizes over data whose padding holds a drawn junk value
(declared as ``padding_value`` or not).

The rule checked for every op, every construction:

* where torch refuses a sample (raises), nestbatch raises too (torch's exception type, or
  ``TypeError`` / ``ValueError`` / ``RuntimeError``);
* otherwise nestbatch returns torch's per-sample results: same dtype, same shape, same values,
  NaN equal to NaN, and -0.0 told from 0.0 wherever torch itself is deterministic about the sign
  (a reduction's zero sign is only compared where reducing the sample in reverse order gives
  the same sign);
* an empty sample, where torch refuses to reduce it (``amax``, ``argmax``, ``max(dim)``, ...),
  gets the result the reductions module documents (TensorFlow's): ``amax`` / ``max`` the dtype's
  lowest finite value, ``amin`` / ``min`` the highest, ``argmax`` / ``argmin`` and the indices
  -1.

Where the comparison is not bit for bit, it is because torch itself gives different bits for the
same mathematical result, measured on this machine with torch 2.13:

* elementwise kernels give an element different bits with its position in the tensor
  (torch's vectorized body against its scalar tail: 1 ulp for exp2 / sinh / rsqrt / pow /
  atan2 ..., 0.0 or -0.0 for ``maximum(0.0, -0.0)``, nan or 0 for ``fmod(max, tiny)``, inf or
  2.2e38 for bfloat16 ``sinh(-89)``): an element may instead equal, exactly, torch's result for
  the whole batch at once (the same op on the packed rows, or on the padded data);
* sum / nansum / mean / prod / logsumexp accumulate: where reversing the order of the reduced
  elements, or (sums) adding them one after another in row-major order, changes torch's own
  result (overflow: ``max + max - max``; rounding), the result
  depends on an accumulation order nestbatch need not share, and is not compared; sums and
  means are compared within ``n * eps * sum(|x|)``, the rounding bound of adding ``n``
  numbers in any order (torch's ``sum`` over two dims of a ``(2, 3, 3, 2)`` float32 sample is
  1 ulp away from adding its rows in order); prod is exact (for float16 / bfloat16 either
  torch's CPU result, which rounds every multiplication, or the product accumulated in float32
  and rounded once, torch's on CUDA and nestbatch's);
* logsumexp adds exps computed with that position dependence: compared to 4 ulps of
  ``max(|result|, 1)`` (its error is absolute), exactly for NaN / inf / zero;
* softmax / log_softmax: torch's last-dim kernel, its strided kernel and a wider (padded) input
  give different bits (43% of random float32 rows); compared to a few ulps of the result's scale;
* var / std: a two-pass formula and torch's kernel differ in the last bits (41% of random
  float32 samples), and torch's own kernel differs with the layout near the overflow threshold
  (three -max float32 give inf as a ``(3,)`` tensor, 0.0 as ``(3, 2)``): compared to 8 ulps of
  torch's result for the sample in any of three layouts;
* a reduction over several dims (two ragged dims, or ragged and feature dims) accumulates in an
  order torch does not fix either (``torch.sum(x, (0, 1))`` differs from
  ``torch.sum(torch.sum(x, 0), 0)`` in 29% of random float32 cases, and with
  ``[[max, -max], [max, -max]]`` it is 0 against nan): the result must equal torch's one-shot
  result or torch's result dim by dim in the order nestbatch documents (ragged dims first,
  accumulated in float32 for half precision and rounded once);
* float-to-integer casts of NaN, +-inf or out-of-range values are undefined behaviour in C++
  (torch documents it), so those elements of ``.long()`` / ``.int()`` / ``.short()`` /
  ``.char()`` / ``.byte()`` are not compared.

Everything else is exact. Every test collects all mismatches of one example (op, construction,
what differed) and fails once with the list. ``HYPOTHESIS_PROFILE=thorough`` runs 500 examples
per test.
"""

from __future__ import annotations

import itertools
import math
import operator
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import Tensor

import nestbatch as nb
from nestbatch import Layout, NestedBatch
from nestbatch.ops.elementwise import (
    BINARY,
    DUNDERS,
    INPLACE_DUNDERS,
    INTEGER_BINARY,
    SPECIAL_BINARY,
    SPECIAL_UNARY,
    UNARY,
)
from nestbatch.ops.registry import lookup, registered_functions

#: On every fuzz test: the examples are large by design (the thorough profile keeps the health
#: checks the default one suppresses).
fuzz = settings(deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int64, torch.bool)
NAN, INF = float("nan"), float("inf")
ALLOWED_REFUSALS = (TypeError, ValueError, RuntimeError)


# ====================================================================================== values
def special_values(dtype: torch.dtype) -> list:
    """The values the fuzz draws often: the ones reductions and kernels get wrong."""
    if dtype == torch.bool:
        return [False, True]
    if dtype.is_floating_point:
        info = torch.finfo(dtype)
        return [0.0, 1.0, -1.0, -0.0, NAN, INF, -INF, info.max, info.min, info.tiny, 2.0, -2.0,
                0.5, 3.0]
    info = torch.iinfo(dtype)
    return [0, 1, -1, 2, -2, 3, info.max, info.min]


def elements(dtype: torch.dtype) -> st.SearchStrategy:
    """One element: a special value, a small integer, or any value (in float32's range)."""
    if dtype == torch.bool:
        return st.booleans()
    specials = st.sampled_from(special_values(dtype))
    if dtype.is_floating_point:
        return st.one_of(specials, st.integers(-4, 4).map(float),
                         st.floats(-100, 100, allow_nan=False, width=32))
    info = torch.iinfo(dtype)
    return st.one_of(specials, st.integers(-5, 5), st.integers(info.min, info.max))


def tensor_of(values: Sequence, dtype: torch.dtype) -> Tensor:
    """A 1-d tensor of ``dtype`` holding ``values`` (Python numbers), rounded once."""
    if dtype == torch.bool:
        return torch.tensor(list(values), dtype=torch.bool)
    if dtype.is_floating_point:
        return torch.tensor(list(values), dtype=torch.float64).to(dtype)
    return torch.tensor(list(values), dtype=torch.int64).to(dtype)


# ======================================================================================= cases
@dataclass
class Case:
    """A batch as its samples: ``shapes[i]`` ragged sizes, ``values[i]`` flat elements."""

    dtype: torch.dtype
    k: int
    feature: tuple[int, ...]
    shapes: list[tuple[int, ...]]
    values: list[list]
    strided: str  # "no", "rows" (every other row of a bigger tensor) or "features" (transposed)
    filler: Any  # what the padded slots of from_padded's data hold
    declare_filler: bool  # whether from_padded is told (padding_value=filler)

    @property
    def batch_size(self) -> int:
        return len(self.shapes)

    def sample(self, i: int) -> Tensor:
        """A fresh copy of sample ``i`` (non-contiguous if the case says so)."""
        shape = (*self.shapes[i], *self.feature)
        dense = tensor_of(self.values[i], self.dtype).reshape(shape)
        if self.strided == "rows":
            big = torch.zeros((2 * shape[0], *shape[1:]), dtype=self.dtype)
            big[::2] = dense
            return big[::2]
        if self.strided == "features" and len(shape) >= 2:
            return dense.transpose(-1, -2).contiguous().transpose(-1, -2)
        return dense

    def samples(self) -> list[Tensor]:
        return [self.sample(i) for i in range(self.batch_size)]

    def dummy(self) -> Tensor:
        """An empty sample: what the per-sample op is checked on for an empty batch."""
        return torch.zeros((0,) * self.k + self.feature, dtype=self.dtype)

    def probe(self) -> Tensor:
        """A sample of one element of ones: whether torch refuses the op for this dtype."""
        return torch.ones((1,) * self.k + self.feature, dtype=self.dtype)

    @property
    def all_empty(self) -> bool:
        return all(math.prod(shape) == 0 for shape in self.shapes)

    def reference_samples(self) -> list[Tensor]:
        """The samples, or one empty sample standing in for an empty batch."""
        return self.samples() if self.shapes else [self.dummy()]

    def values_tensor(self) -> Tensor:
        rows = [s.reshape(-1, *self.feature) for s in self.samples()]
        if not rows:
            return torch.zeros((0, *self.feature), dtype=self.dtype)
        return torch.cat(rows)

    def split_packed(self, rows: Tensor) -> list[Tensor]:
        """Per-sample parts of a result over the packed rows ``(total, *f)``."""
        out, start = [], 0
        for shape in self.shapes:
            n = math.prod(shape)
            out.append(rows[start:start + n].reshape(*shape, *rows.shape[1:]))
            start += n
        return out

    def split_padded(self, data: Tensor) -> list[Tensor]:
        """Per-sample parts of a result over the padded data ``(B, *widths, *f)``."""
        return [data[(i, *(slice(0, n) for n in shape))] for i, shape in enumerate(self.shapes)]

    def padded_data(self) -> Tensor:
        widths = [max((s[d] for s in self.shapes), default=0) for d in range(self.k)]
        data = torch.full((self.batch_size, *widths, *self.feature), self.filler,
                          dtype=self.dtype)
        for i, sample in enumerate(self.samples()):
            data[(i, *(slice(0, n) for n in sample.shape[: self.k]))] = sample
        return data

    def __repr__(self) -> str:
        shown = [s.tolist() for s in self.samples()]
        return (f"Case(dtype={self.dtype}, k={self.k}, feature={self.feature}, "
                f"shapes={self.shapes}, samples={shown}, strided={self.strided!r}, "
                f"filler={self.filler!r}, declare_filler={self.declare_filler})")


def _declared(case: Case) -> dict:
    if not case.declare_filler:
        return {}
    value = float(case.filler)
    if value != case.filler and not math.isnan(value):
        return {}  # an int64 extreme is no float: nothing true to declare
    return {"padding_value": value}


def constructions(case: Case) -> list[tuple[str, Callable[[Case], NestedBatch]]]:
    """Every way of building ``case`` the fuzz checks: (name, builder). Both layouts, sizes on
    the host and in a tensor ("device"), and the list layout."""
    k = case.k

    def lengths(c: Case) -> list[int]:
        return [math.prod(shape) for shape in c.shapes]

    def shapes_tensor(c: Case) -> Tensor:
        return torch.tensor(c.shapes, dtype=torch.int64).reshape(c.batch_size, c.k)

    found: list[tuple[str, Callable[[Case], NestedBatch]]] = []
    # From the samples (an empty batch has no samples to tell the feature shape).
    if case.batch_size or (not case.feature and k == 1):
        def from_samples(c: Case, layout: Layout) -> NestedBatch:
            batch = nb.nested(c.samples(), num_ragged_dims=k, dtype=c.dtype)
            return batch.to(layout)

        found += [
            ("nested>packed", lambda c: from_samples(c, Layout.PACKED)),
            ("nested>padded", lambda c: from_samples(c, Layout.PADDED)),
        ]
        if case.batch_size:
            found.append(("from_list", lambda c: NestedBatch.from_list(c.samples(), k)))
    if k == 1:
        found += [
            ("from_lengths(host)", lambda c: NestedBatch.from_lengths(c.values_tensor(),
                                                                      lengths(c))),
            ("from_lengths(device)", lambda c: NestedBatch.from_lengths(
                c.values_tensor(), torch.tensor(lengths(c), dtype=torch.int64))),
            ("from_offsets(device)", lambda c: NestedBatch.from_offsets(
                c.values_tensor(), torch.tensor([0, *itertools.accumulate(lengths(c))]))),
            ("from_padded(host)", lambda c: NestedBatch.from_padded(
                c.padded_data(), lengths(c), **_declared(c))),
            ("from_padded(device)", lambda c: NestedBatch.from_padded(
                c.padded_data(), torch.tensor(lengths(c), dtype=torch.int64), **_declared(c))),
        ]
    else:
        found += [
            ("from_shapes(device)", lambda c: NestedBatch.from_shapes(c.values_tensor(),
                                                                      shapes_tensor(c))),
            ("from_padded(device)", lambda c: NestedBatch.from_padded(
                c.padded_data(), shape_per_sample=shapes_tensor(c), **_declared(c))),
        ]
    return found


@st.composite
def sample_values(draw: st.DrawFn, dtype: torch.dtype, count: int) -> list:
    """``count`` elements; a quarter of the samples are one special value throughout (NaN
    only, -inf only, max only, ...)."""
    if draw(st.integers(0, 3)) == 0:
        return [draw(st.sampled_from(special_values(dtype)))] * count
    return draw(st.lists(elements(dtype), min_size=count, max_size=count))


@st.composite
def cases(draw: st.DrawFn, *, k: int | None = None, dtypes: Sequence[torch.dtype] = DTYPES,
          min_features: int = 0, max_batch: int = 5) -> Case:
    k = draw(st.integers(1, 2)) if k is None else k
    nf = draw(st.integers(min_features, 2))
    feature = tuple(draw(st.lists(st.integers(1, 3), min_size=nf, max_size=nf)))
    batch = draw(st.integers(0, max_batch))
    longest = 5 if k == 1 else 3
    shapes = [tuple(draw(st.lists(st.integers(0, longest), min_size=k, max_size=k)))
              for _ in range(batch)]
    dtype = draw(st.sampled_from(list(dtypes)))
    size = math.prod(feature)
    values = [draw(sample_values(dtype, math.prod(shape) * size)) for shape in shapes]
    strided = draw(st.sampled_from(["no", "rows", "features"]))
    filler = draw(st.sampled_from(special_values(dtype)))
    return Case(dtype, k, feature, shapes, values, strided, filler, draw(st.booleans()))


def twin(draw: st.DrawFn, case: Case, dtype: torch.dtype | None = None) -> Case:
    """Another case of the same structure (values drawn afresh, maybe another dtype)."""
    dtype = case.dtype if dtype is None else dtype
    size = math.prod(case.feature)
    values = [draw(sample_values(dtype, math.prod(shape) * size)) for shape in case.shapes]
    filler = draw(st.sampled_from(special_values(dtype)))
    return Case(dtype, case.k, case.feature, case.shapes, values, case.strided, filler,
                case.declare_filler)


# ================================================================================== outcomes
class Raised:
    """An op that raised (torch's or nestbatch's)."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def __repr__(self) -> str:
        return f"raised {type(self.exc).__name__}: {str(self.exc).splitlines()[0][:160]}"


def outcome(fn: Callable[[], Any]) -> Any:
    """``fn()``, or :class:`Raised` with its exception (warnings silenced)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - any refusal is an outcome to compare
            return Raised(exc)


class Failures:
    """The mismatches of one example, raised together at the end."""

    def __init__(self, case: Any) -> None:
        self.case = case
        self.items: list[tuple[tuple, str]] = []

    def add(self, family: str, op: str, where: str, what: str, detail: str = "") -> None:
        self.items.append(((family, op, where, what), detail))

    def check(self) -> None:
        if self.items:
            lines = [f"{' | '.join(key)}: {detail}" for key, detail in self.items[:40]]
            more = len(self.items) - 40
            if more > 0:
                lines.append(f"... and {more} more")
            raise AssertionError(f"{len(self.items)} mismatches for {self.case!r}:\n"
                                 + "\n".join(lines))


def allowed_refusals(torch_errors: Sequence[Raised]) -> tuple[type, ...]:
    return (*ALLOWED_REFUSALS, *(type(r.exc) for r in torch_errors))


# ================================================================================ comparison
def ulp(e: Tensor, dtype: torch.dtype) -> Tensor:
    """The spacing of ``dtype`` at ``|e|`` (in float64)."""
    info = torch.finfo(dtype)
    mag = e.abs().clamp_min(info.tiny)
    return info.eps * torch.exp2(torch.floor(torch.log2(mag)))


def match_mask(actual: Tensor, expected: Tensor, *, ulps: float = 0, scale: Tensor | None = None
               ) -> Tensor:
    """Elementwise: equal (NaN == NaN, zeros of either sign), or for finite floats within
    ``ulps`` ulps of ``expected`` (or of ``scale``); complex: both parts so."""
    if expected.dtype.is_complex:
        return (match_mask(actual.real, expected.real, ulps=ulps)
                & match_mask(actual.imag, expected.imag, ulps=ulps))
    if not expected.dtype.is_floating_point:
        return actual == expected
    a, e = actual.double(), expected.double()
    same = (a == e) | (a.isnan() & e.isnan())
    if ulps:
        size = ulp(e if scale is None else scale.double(), expected.dtype)
        same |= a.isfinite() & e.isfinite() & ((a - e).abs() <= ulps * size)
    return same


def describe(t: Any) -> str:
    if isinstance(t, Tensor):
        return f"{t.tolist()} ({t.dtype}, shape {tuple(t.shape)})"
    return repr(t)


def compare(actual: Any, alternatives: Sequence[Tensor], *, ulps: float = 0,
            scale: Tensor | None = None, zero_sign: Tensor | None = None,
            ignore: Tensor | None = None) -> str | None:
    """None if ``actual`` matches the expected tensor (any of ``alternatives``, elementwise),
    else what differs. ``zero_sign``: where a zero's sign must match (default: everywhere);
    ``ignore``: elements not compared."""
    expected = alternatives[0]
    if not isinstance(actual, Tensor):
        return f"got {type(actual).__name__} {actual!r}, torch gives a tensor {describe(expected)}"
    if actual.dtype != expected.dtype:
        return f"dtype {actual.dtype}, torch gives {expected.dtype}: {describe(actual)}"
    if actual.shape != expected.shape:
        return f"shape {tuple(actual.shape)}, torch gives {tuple(expected.shape)}"
    ok = torch.zeros(expected.shape, dtype=torch.bool)
    for alt in alternatives:
        same = match_mask(actual, alt, ulps=ulps, scale=scale)
        if expected.dtype.is_floating_point:
            zeros = (actual == 0) & (alt == 0)
            if zero_sign is not None:
                zeros &= zero_sign
            same &= ~zeros | (actual.signbit() == alt.signbit())
        ok |= same
    if ignore is not None:
        ok |= ignore
    if bool(ok.all()):
        return None
    where = (~ok).nonzero()[0].tolist()
    return (f"got {describe(actual)}, torch gives {describe(expected)}"
            + (f" (alternatives {[describe(a) for a in alternatives[1:]]})"
               if len(alternatives) > 1 else "")
            + f"; first difference at {where}")


def same_zero_sign(tensors: Sequence[Tensor]) -> Tensor:
    """Where every tensor is a zero of one sign (or not a zero): a sign torch is sure of."""
    first = tensors[0]
    agree = torch.ones(first.shape, dtype=torch.bool)
    for t in tensors[1:]:
        agree &= ~((first == 0) & (t == 0)) | (first.signbit() == t.signbit())
    return agree


# ================================================================== batch results per sample
def check_batch_result(fails: Failures, family: str, op: str, where: str, got: Any,
                       expected: list[Any], case: Case, *, ulps: float = 0,
                       scales: list[Tensor | None] | None = None,
                       ignores: list[Tensor | None] | None = None,
                       zero_signs: list[Tensor | None] | None = None,
                       num_ragged_dims: int | None = None,
                       alternatives: list[list[Tensor]] | None = None) -> None:
    """``got``, a batch, against the per-sample torch results ``expected`` (tensors; one
    standing for the dtype and feature shape when the batch is empty), or elementwise
    ``alternatives[i]`` (other torch results for sample ``i``)."""
    if not isinstance(got, NestedBatch):
        fails.add(family, op, where, "not a batch", f"got {type(got).__name__}: {got!r}")
        return
    k = case.k if num_ragged_dims is None else num_ragged_dims
    meta = expected[0]
    if got.dtype != meta.dtype:
        fails.add(family, op, where, "dtype", f"batch dtype {got.dtype}, torch gives {meta.dtype}")
        return
    if tuple(got.feature_shape) != tuple(meta.shape[k:]):
        fails.add(family, op, where, "feature shape",
                  f"{tuple(got.feature_shape)}, torch gives {tuple(meta.shape[k:])}")
        return
    if got.batch_size != case.batch_size:
        fails.add(family, op, where, "batch size", f"{got.batch_size} != {case.batch_size}")
        return
    samples = outcome(got.unbind)
    if isinstance(samples, Raised):
        fails.add(family, op, where, "unbind of the result raised", repr(samples))
        return
    for i, (actual, wanted) in enumerate(zip(samples, expected)):
        extra = [] if alternatives is None else alternatives[i]
        problem = compare(actual, [wanted, *extra], ulps=ulps,
                          scale=None if scales is None else scales[i],
                          ignore=None if ignores is None else ignores[i],
                          zero_sign=None if zero_signs is None else zero_signs[i])
        if problem:
            fails.add(family, op, where, "values", f"sample {i}: {problem}")
            return


def check_outcomes(fails: Failures, family: str, op: str, case: Case,
                   expected: list[Any], run: Callable[[str, Callable], Any],
                   check: Callable[[str, Any], None],
                   probe: Callable[[], Any] | None = None) -> None:
    """For every construction: a refusal where torch refuses a sample, else ``check``.

    ``probe`` runs the op on one-element samples: when every sample is empty, torch accepts
    them all, and refuses the probe (``softmax`` of int64, ``x // 0``: torch's check needs an
    element), the batch may refuse too."""
    refused = [e for e in expected if isinstance(e, Raised)]
    may_refuse = ()
    if not refused and case.all_empty and probe is not None:
        tried = outcome(probe)
        if isinstance(tried, Raised):
            may_refuse = (*ALLOWED_REFUSALS, type(tried.exc))
    for where, build in constructions(case):
        got = outcome(lambda where=where, build=build: run(where, build))
        if may_refuse and isinstance(got, Raised) and isinstance(got.exc, may_refuse):
            continue
        if refused:
            if not isinstance(got, Raised):
                fails.add(family, op, where, "accepted what torch refuses",
                          f"torch: {refused[0]!r}; nestbatch returned {summary(got)}")
            elif not isinstance(got.exc, allowed_refusals(refused)):
                fails.add(family, op, where, "refused with another exception type",
                          f"torch: {refused[0]!r}; nestbatch: {got!r}")
        elif isinstance(got, Raised):
            fails.add(family, op, where, "refused what torch accepts", repr(got))
        else:
            check(where, got)


def summary(x: Any) -> str:
    if isinstance(x, NestedBatch):
        return f"a batch of {x.dtype}"
    if isinstance(x, Tensor):
        return describe(x)
    return repr(x)[:200]


# ================================================================================ reductions
LOWEST, HIGHEST = "lowest", "highest"


def documented_empty(kind: Any, dtype: torch.dtype) -> Any:
    """The result the reductions module documents for an empty sample."""
    if kind in (LOWEST, HIGHEST):
        if dtype == torch.bool:
            return kind == HIGHEST
        info = torch.finfo(dtype) if dtype.is_floating_point else torch.iinfo(dtype)
        return info.min if kind == LOWEST else info.max
    return kind


@dataclass(frozen=True)
class Reduction:
    """A registered reduction: its torch function, what it documents for an empty sample
    where torch raises, and how exactly it is compared."""

    name: str
    empty: Any = None  # LOWEST / HIGHEST / -1: documented, where torch refuses an empty sample
    pair: bool = False  # max / min with a dim: (values, indices)
    tuple_dims: bool = True  # whether torch takes a tuple of dims
    composable: bool = True  # nestbatch reduces ragged and feature dims together
    accumulates: bool = False  # float result depends on the accumulation order
    ulps: float = 0
    arg: bool = False  # result is an index

    def call(self, x: Any, dim: Any, keepdim: bool | None, extra: dict) -> Any:
        func = getattr(torch, self.name)
        if isinstance(x, NestedBatch) and isinstance(dim, tuple) and not self.tuple_dims:
            # torch.prod's argument parser takes one dim; the batch's method takes several
            # (documented: compared with torch.prod dim by dim)
            func = getattr(NestedBatch, self.name)
        if dim is None:
            return func(x, **extra)
        if keepdim is None:
            return func(x, dim, **extra)
        return func(x, dim, keepdim=keepdim, **extra)


REDUCTIONS = (
    Reduction("sum", accumulates=True, ulps=1),
    Reduction("nansum", accumulates=True, ulps=1),
    Reduction("mean", accumulates=True, ulps=1),
    Reduction("prod", tuple_dims=False, accumulates=True),
    Reduction("amax", empty=LOWEST),
    Reduction("amin", empty=HIGHEST),
    Reduction("argmax", empty=-1, composable=False, arg=True, tuple_dims=False),
    Reduction("argmin", empty=-1, composable=False, arg=True, tuple_dims=False),
    Reduction("logsumexp", accumulates=True, ulps=4),
    Reduction("count_nonzero"),
    Reduction("any"),
    Reduction("all"),
    Reduction("var", composable=False, ulps=8),
    Reduction("std", composable=False, ulps=8),
    Reduction("max", empty=LOWEST, pair=True, composable=False, tuple_dims=False),
    Reduction("min", empty=HIGHEST, pair=True, composable=False, tuple_dims=False),
)
_WIDE = {torch.float16: torch.float32, torch.bfloat16: torch.float32}


def _dim_arg(dims: tuple[int, ...]) -> int | tuple[int, ...]:
    return dims[0] if len(dims) == 1 else dims


def reduction_extras(red: Reduction, draw: st.DrawFn) -> dict:
    if red.name in ("var", "std"):
        correction = draw(st.sampled_from([None, 0, 1, 2]))
        return {} if correction is None else {"correction": correction}
    return {}


def _keep_shape(out: Tensor, sample: Tensor, dims: tuple[int, ...], keepdim: bool | None
                ) -> Tensor:
    """``out`` (reduced without keepdim) viewed with the reduced dims kept, if asked."""
    if not keepdim:
        return out
    shape = [1 if d in dims else n for d, n in enumerate(sample.shape)]
    return out.reshape(shape)


def sample_reduction(red: Reduction, sample: Tensor, dims: tuple[int, ...] | None,
                     keepdim: bool | None, extra: dict, ragged: tuple[int, ...]) -> Any:
    """The expected result for one sample: :class:`Raised`, or a dict with the ``values``
    alternatives (the first is torch's own), the ``indices`` of a pair, and ``zero_sign``.

    ``dims`` are the sample's reduced dims (None: every dim), ``ragged`` those that are
    ragged in the batch."""
    dim_arg = None if dims is None else _dim_arg(dims)
    if dims is not None and len(dims) > 1 and not red.tuple_dims:
        direct: Any = Raised(TypeError("torch takes one dim"))
    else:
        direct = outcome(lambda: red.call(sample, dim_arg, keepdim, extra))
    reduced = range(sample.dim()) if dims is None else dims
    empty = any(sample.shape[d] == 0 for d in reduced)
    if isinstance(direct, Raised):
        if empty and red.empty is not None:
            # torch refuses an empty sample: the documented result, in the shape and dtype of
            # the same reduction of a sample with one element there.
            shape = [1 if d in reduced else n for d, n in enumerate(sample.shape)]
            probe = outcome(lambda: red.call(torch.zeros(shape, dtype=sample.dtype), dim_arg,
                                             keepdim, extra))
            if isinstance(probe, Raised):
                return probe
            if red.pair:
                values, indices = probe
                return {"values": [values.fill_(documented_empty(red.empty, sample.dtype))],
                        "indices": indices.fill_(-1)}
            return {"values": [probe.fill_(documented_empty(red.empty, sample.dtype))]}
        if not (dims is not None and len(dims) > 1 and red.accumulates):
            return direct
    alternatives: list[Tensor] = []
    indices = None
    if not isinstance(direct, Raised):
        if red.pair:
            values, indices = direct
            alternatives.append(values)
        else:
            alternatives.append(direct)
    if dims is not None and len(dims) > 1 and red.accumulates:
        chained = outcome(lambda: _chained(red, sample, dims, keepdim, extra, ragged))
        if isinstance(chained, Raised):
            return direct if isinstance(direct, Raised) else {"values": alternatives}
        alternatives.append(chained)
    if (red.name == "prod" and sample.dtype in _WIDE and dims is not None
            and not isinstance(direct, Raised)):
        # torch's CPU product of half precision rounds every multiplication; nestbatch's (as
        # torch's on CUDA) accumulates in float32 and rounds once.
        wide = outcome(lambda: _chained(red, sample, dims, keepdim, extra, ragged))
        alternatives += [] if isinstance(wide, Raised) else [wide]
    if red.name in ("var", "std") and dims is not None and not isinstance(direct, Raised):
        layouts = outcome(lambda: _variance_layouts(red, sample, dims, keepdim, extra))
        alternatives += [] if isinstance(layouts, Raised) else layouts
    signs = alternatives[:]
    ignore = scale = None
    if alternatives[0].dtype.is_floating_point and not red.arg:
        flip = sample.flip(tuple(reduced))
        if isinstance(direct, Raised):  # (prod over several dims: torch's dim by dim)
            flipped = outcome(lambda: _chained(red, flip, dims, keepdim, extra, ragged))
        else:
            flipped = outcome(lambda: red.call(flip, dim_arg, keepdim, extra))
        if not isinstance(flipped, Raised):
            flipped = flipped[0] if red.pair else flipped
            signs.append(flipped)
        if red.name == "logsumexp":
            scale = alternatives[0].double().abs().nan_to_num(1.0).clamp(1.0, 1e300)
        if red.name in SUMS:
            scale = summation_scale(red, sample, tuple(reduced), keepdim)
        if red.accumulates and not isinstance(flipped, Raised):
            # Where reversing the order of the reduced elements changes torch's own result
            # (overflow: max + max - max; rounding), the result depends on the accumulation
            # order, which nestbatch need not share: not compared.
            ignore = ~match_mask(flipped, alternatives[0], ulps=red.ulps, scale=scale)
            if red.name in SUMS:  # and where adding them one after another changes it
                in_order = in_order_sum(red, sample, tuple(reduced), keepdim)
                ignore |= ~match_mask(in_order, alternatives[0], ulps=red.ulps, scale=scale)
    return {"values": alternatives, "indices": indices, "zero_sign": same_zero_sign(signs),
            "ignore": ignore, "scale": scale}


#: Reductions compared to the error bound of floating-point summation (see summation_scale).
SUMS = ("sum", "nansum", "mean")


def in_order_sum(red: Reduction, sample: Tensor, dims: tuple[int, ...],
                 keepdim: bool | None) -> Tensor:
    """The reduced elements added one after another in row-major order (as segment sums of
    packed rows add them; half precision in float32, rounded once): with an overflow on the
    way (``[[max, 0], [max, inf]]`` over both dims is nan this way, inf in torch's order) the
    result depends on the order."""
    x = sample.float() if sample.dtype in _WIDE else sample
    if red.name == "nansum":
        x = x.masked_fill(x.isnan(), 0)
    moved = x.movedim(dims, tuple(range(len(dims))))
    rows = moved.reshape(math.prod(moved.shape[:len(dims)]), *moved.shape[len(dims):])
    # One add at a time (cumsum would not do: on the CPU it accumulates float32 in float64,
    # where [max, max, -inf] of bfloat16 gives -inf instead of float32's nan).
    total = rows.sum(0) if not rows.shape[0] else rows[0]
    for row in rows[1:]:
        total = total + row
    if red.name == "mean":
        total = total / rows.shape[0]
    if keepdim:
        total = total.reshape([1 if d in dims else n for d, n in enumerate(sample.shape)])
    return total.to(sample.dtype)


def summation_scale(red: Reduction, sample: Tensor, dims: tuple[int, ...],
                    keepdim: bool | None) -> Tensor:
    """``n * sum(|x|)`` over the reduced elements (``/ n`` for mean): with ``ulps=1`` this is
    the textbook bound on the rounding error of adding ``n`` numbers in any order, within
    which torch's own kernels differ (``torch.sum(x, (0, 1))`` of a ``(2, 3, 3, 2)`` float32
    sample is 1 ulp away from adding its rows in order)."""
    mags = sample.double().abs().nan_to_num(nan=0.0)
    count = max(math.prod(sample.shape[d] for d in dims), 1)
    total = mags.sum(dims, keepdim=bool(keepdim)) if dims else mags
    return total if red.name == "mean" else total * count


def _chained(red: Reduction, sample: Tensor, dims: tuple[int, ...], keepdim: bool | None,
             extra: dict, ragged: tuple[int, ...]) -> Tensor:
    """The reduction dim by dim as nestbatch documents it: the ragged dims first (one
    reduction of their flattened rows), then the feature dims; half precision accumulated in
    float32 and rounded once."""
    dtype = sample.dtype
    x = sample.to(_WIDE[dtype]) if dtype in _WIDE else sample
    func = getattr(torch, red.name)
    second = torch.sum if red.name == "count_nonzero" else func
    features = [d for d in dims if d not in ragged]
    if ragged:
        k = len(ragged)
        rows = x.reshape(-1, *x.shape[k:])
        x = func(rows, 0)
        features = [d - k for d in features]
    for d in sorted(features, reverse=True):
        x = second(x, d)
    if red.name in ("sum", "nansum", "mean", "prod", "logsumexp") and dtype in _WIDE:
        x = x.to(dtype)
    return _keep_shape(x, sample, dims, keepdim)


def _variance_layouts(red: Reduction, sample: Tensor, dims: tuple[int, ...],
                      keepdim: bool | None, extra: dict) -> list[Tensor]:
    """torch's var / std of the same elements laid out three other ways: torch's kernels differ
    with the layout near the overflow threshold (``torch.var`` of three -max float32 is inf
    as a ``(3,)`` or ``(3, 1)`` tensor and 0.0 as ``(3, 2)``; of ``[0, -max, max, 0, ...]``
    float64 inf as a ``(9,)`` tensor and nan as a column of ``(9, 3)``): the reduced elements
    last and contiguous, first with every other column doubled, and each output's elements
    alone as a 1-d tensor."""
    func = getattr(torch, red.name)
    rest = [d for d in range(sample.dim()) if d not in dims]
    moved = sample.permute(*rest, *dims)
    shape = moved.shape[: len(rest)]
    flat = moved.reshape(*shape, -1)
    inner = func(flat.contiguous(), -1, **extra)
    columns = flat.reshape(math.prod(shape), flat.shape[-1]).t()
    doubled = func(torch.cat([columns, columns], 1), 0, **extra)[: columns.shape[1]]
    alone = torch.stack([func(c.contiguous(), 0, **extra) for c in columns.t()]) \
        if columns.shape[1] else inner.reshape(-1)
    return [_keep_shape(out.reshape(shape), sample, dims, keepdim)
            for out in (inner, doubled, alone)]


def check_reduction(fails: Failures, family: str, case: Case, red: Reduction,
                    batch_dims: tuple[int, ...] | None, keepdim: bool | None, extra: dict
                    ) -> None:
    """``torch.<red>(batch, batch_dims, keepdim=...)`` against the per-sample reduction."""
    op = f"{red.name}(dim={batch_dims}, keepdim={keepdim}, {extra})"
    k = case.k
    nd = 1 + k + len(case.feature)
    norm = None if batch_dims is None else tuple(sorted(d % nd for d in batch_dims))
    ragged_reduced = norm is not None and any(1 <= d <= k for d in norm)
    dense = norm is None or ragged_reduced  # else a batch of the same rows
    if norm is None:
        # Every element: torch's reduction of all the elements at once.
        whole = case.values_tensor().reshape(-1) if case.batch_size else case.dummy().reshape(-1)
        expected = [outcome(lambda: red.call(whole, None, None, extra))]
        if not isinstance(expected[0], Raised):
            values = [expected[0]]
            if red.name in ("var", "std"):
                layouts = outcome(lambda: _variance_layouts(red, whole, (0,), None, extra))
                values += [] if isinstance(layouts, Raised) else layouts
            flipped = outcome(lambda: red.call(whole.flip(0), None, None, extra))
            ignore = scale = None
            if red.accumulates and isinstance(flipped, Tensor) and flipped.is_floating_point():
                if red.name in SUMS:
                    scale = summation_scale(red, whole, (0,), None)
                ignore = ~match_mask(flipped, values[0], ulps=red.ulps, scale=scale)
            expected = [{"values": values, "indices": None, "zero_sign": None,
                         "ignore": ignore, "scale": scale}]
    else:
        sdims = tuple(d - 1 for d in norm)
        ragged = tuple(d for d in sdims if d < k)
        expected = [sample_reduction(red, s, sdims, keepdim, extra, ragged)
                    for s in case.reference_samples()]
    dim_arg = None if batch_dims is None else _dim_arg(batch_dims)

    def run(where: str, build: Callable) -> Any:
        return red.call(build(case), dim_arg, keepdim, extra)

    def check(where: str, got: Any) -> None:
        if red.pair and norm is not None:
            if not isinstance(got, tuple) or len(got) != 2:
                fails.add(family, op, where, "not a (values, indices) pair", summary(got))
                return
            got_values, got_indices = got
        else:
            got_values, got_indices = got, None
        if norm is None:
            problem = compare(got_values, expected[0]["values"], ulps=red.ulps,
                              ignore=expected[0]["ignore"], scale=expected[0]["scale"])
            if problem:
                fails.add(family, op, where, "values", problem)
            return
        if dense:
            check_dense(where, got_values, "values", expected, "values")
            if red.pair:
                check_dense(where, got_indices, "indices", expected, "indices")
            return
        check_batch_result(fails, family, op, where, got_values,
                           [e["values"][0] for e in expected], case, ulps=red.ulps,
                           zero_signs=[e.get("zero_sign") for e in expected],
                           ignores=[e.get("ignore") for e in expected],
                           scales=[e.get("scale") for e in expected],
                           alternatives=[e["values"][1:] for e in expected])
        if red.pair:
            check_batch_result(fails, family, op + " indices", where, got_indices,
                               [e["indices"] for e in expected], case)

    def check_dense(where: str, got: Any, part: str, expected: list[dict], key: str) -> None:
        """The dense result: row ``i`` against sample ``i``'s expectation."""
        alternatives = [e[key] if key == "values" else [e[key]] for e in expected]
        meta = alternatives[0][0]
        if case.batch_size == 0:
            want = [torch.zeros((0, *meta.shape), dtype=meta.dtype)]
            problem = compare(got, want)
        else:
            count = max(len(a) for a in alternatives)
            want = [torch.stack([a[min(j, len(a) - 1)] for a in alternatives])
                    for j in range(count)]

            def stacked(name: str, default: Callable[[Tensor], Tensor]) -> Tensor | None:
                if key != "values":
                    return None
                found = [e.get(name) for e in expected]
                if all(f is None for f in found):
                    return None
                return torch.stack([default(a[0]) if f is None else f
                                    for f, a in zip(found, alternatives)])

            problem = compare(
                got, want, ulps=red.ulps if key == "values" else 0,
                zero_sign=stacked("zero_sign", lambda t: torch.ones_like(t, dtype=torch.bool)),
                ignore=stacked("ignore", lambda t: torch.zeros_like(t, dtype=torch.bool)),
                scale=stacked("scale", lambda t: t.double().abs().clamp_min(1.0)))
        if problem:
            fails.add(family, op, where, part, problem)

    def probe() -> Any:
        if norm is None:
            return red.call(case.probe().reshape(-1), None, None, extra)
        tried = sample_reduction(red, case.probe(), sdims, keepdim, extra, ragged)
        if isinstance(tried, Raised):
            raise tried.exc
        return tried

    check_outcomes(fails, family, op, case, expected, run, check, probe)


@st.composite
def keepdims(draw: st.DrawFn) -> bool | None:
    return draw(st.sampled_from([None, False, True]))


def _ragged_dims(draw: st.DrawFn, case: Case) -> tuple[int, ...]:
    """The ragged dims of ``case``'s batch, each spelled positive or negative."""
    nd = 1 + case.k + len(case.feature)
    return tuple(d - nd if draw(st.booleans()) else d for d in range(1, 1 + case.k))


@fuzz
@given(data=st.data())
def test_reductions_over_the_ragged_dims(data: st.DataObject) -> None:
    """Every registered reduction over the ragged dim (or both ragged dims): a dense
    ``(B, *feature)`` tensor, row ``i`` torch's reduction of sample ``i``."""
    case = data.draw(cases(), label="case")
    keepdim = data.draw(keepdims(), label="keepdim")
    fails = Failures(case)
    for red in REDUCTIONS:
        dims = _ragged_dims(data.draw, case)
        if len(dims) > 1 and not red.tuple_dims and red.name != "prod":
            continue  # argmax / max(dim) take one dim: over two ragged dims they have no torch
            # reference (nestbatch's flat index is its own); prod over both is checked dim by dim
        extra = reduction_extras(red, data.draw)
        check_reduction(fails, "reduce ragged", case, red, dims, keepdim, extra)
    fails.check()


@fuzz
@given(data=st.data())
def test_reductions_over_feature_dims(data: st.DataObject) -> None:
    """Every registered reduction over one or two feature dims: a batch of the same rows."""
    case = data.draw(cases(min_features=1), label="case")
    keepdim = data.draw(keepdims(), label="keepdim")
    nd = 1 + case.k + len(case.feature)
    features = list(range(1 + case.k, nd))
    fails = Failures(case)
    for red in REDUCTIONS:
        count = data.draw(st.integers(1, len(features) if red.tuple_dims else 1))
        chosen = data.draw(st.permutations(features))[:count]
        dims = tuple(d - nd if data.draw(st.booleans()) else d for d in chosen)
        extra = reduction_extras(red, data.draw)
        check_reduction(fails, "reduce features", case, red, dims, keepdim, extra)
    fails.check()


@fuzz
@given(data=st.data())
def test_reductions_over_ragged_and_feature_dims(data: st.DataObject) -> None:
    """The reductions nestbatch composes (sum, nansum, mean, prod, amax, amin, logsumexp,
    count_nonzero, any, all) over the ragged dims and feature dims at once."""
    case = data.draw(cases(min_features=1), label="case")
    keepdim = data.draw(keepdims(), label="keepdim")
    nd = 1 + case.k + len(case.feature)
    fails = Failures(case)
    for red in REDUCTIONS:
        if not red.composable:
            continue
        ragged = _ragged_dims(data.draw, case)
        features = data.draw(st.lists(st.integers(1 + case.k, nd - 1), min_size=1,
                                      unique=True))
        dims = ragged + tuple(d - nd if data.draw(st.booleans()) else d for d in features)
        check_reduction(fails, "reduce ragged+features", case, red, dims, keepdim, {})
    fails.check()


def test_in_order_reference_adds_half_precision_in_float32():
    """The in-order reference overflows as float32 adds do (found under torch 2.14.1: a
    cumsum, accumulating in float64, gave -inf for bfloat16 [max, max, -inf], torch -inf by
    its order, nestbatch's segment sum nan; such a result depends on the order)."""
    big = torch.finfo(torch.bfloat16).max
    sample = torch.tensor([[big], [big], [float("-inf")]], dtype=torch.bfloat16)
    total = in_order_sum(next(r for r in REDUCTIONS if r.name == "sum"), sample, (0,), None)
    assert total.isnan().all()


@fuzz
@given(data=st.data())
def test_reductions_over_every_element(data: st.DataObject) -> None:
    """``dim=None``: torch's reduction of all the batch's elements at once (a 0-d tensor);
    argmax / argmin: the index into the samples flattened one after another (torch.nested's),
    torch's of that flat tensor, or its error."""
    case = data.draw(cases(), label="case")
    fails = Failures(case)
    for red in REDUCTIONS:
        if red.arg:
            whole = case.values_tensor().reshape(-1)
            expected = outcome(lambda red=red, whole=whole: red.call(whole, None, None, {}))
            for where, build in constructions(case):
                got = outcome(lambda red=red, build=build: red.call(build(case), None, None, {}))
                if not same_flat_index(got, expected):
                    fails.add("reduce all", red.name, where, "flat index",
                              f"{summary(got)}, expected {summary(expected)}")
            continue
        extra = reduction_extras(red, data.draw)
        check_reduction(fails, "reduce all", case, red, None, None, extra)
    fails.check()


def same_flat_index(got: Any, expected: Any) -> bool:
    """Whether an ``argmax()`` / ``argmin()`` of a batch is torch's of the flat tensor: the
    same 0-d index, or an error of the same kind."""
    if isinstance(expected, Raised):
        kinds = (IndexError, ValueError, TypeError, RuntimeError, NotImplementedError)
        kind = next(k for k in kinds if isinstance(expected.exc, k))
        return isinstance(got, Raised) and isinstance(got.exc, kind)
    return (isinstance(got, Tensor) and got.shape == () and got.dtype == torch.int64
            and got.item() == expected.item())


# =================================================================================== softmax
SOFTMAXES = (
    ("torch.softmax", torch.softmax, False),
    ("torch.log_softmax", torch.log_softmax, True),
    ("F.softmax", F.softmax, False),
    ("F.log_softmax", F.log_softmax, True),
    ("x.softmax", lambda x, *a, **kw: x.softmax(*a, **kw), False),
    ("x.log_softmax", lambda x, *a, **kw: x.log_softmax(*a, **kw), True),
    ("special.softmax", torch.special.softmax, False),
    ("special.log_softmax", torch.special.log_softmax, True),
)


def softmax_scale(sample: Tensor, dim: int, log: bool) -> Tensor:
    """The scale of a softmax result's rounding: 1 for probabilities; for log-probabilities,
    the largest finite input magnitude along ``dim`` (``x - max - log(sum)``), at least 1."""
    if not log:
        return torch.ones(sample.shape, dtype=torch.float64)
    x = sample.double()
    finite = torch.where(x.isfinite(), x.abs(), torch.zeros_like(x))
    peak = finite.amax(dim, keepdim=True) if x.shape[dim] else finite
    return (2 * peak + 1).expand(x.shape)


@fuzz
@given(data=st.data())
def test_softmax(data: st.DataObject) -> None:
    """softmax / log_softmax (every registered spelling) over every ragged and feature dim,
    with and without ``dtype=``; samples of -inf only give nan, as torch's."""
    case = data.draw(cases(), label="case")
    nd = 1 + case.k + len(case.feature)
    dims = list(range(1, nd))
    out_dtype = data.draw(st.sampled_from([None, torch.float32, torch.float64]), label="dtype")
    fails = Failures(case)
    for label, func, log in SOFTMAXES:
        for dim in dims:
            spelled = dim - nd if data.draw(st.booleans()) else dim
            kwargs = {} if out_dtype is None else {"dtype": out_dtype}
            op = f"{label}(dim={spelled}, {kwargs})"
            samples = case.reference_samples()
            expected = [outcome(lambda s=s, func=func, dim=dim, kwargs=kwargs:
                                func(s, dim - 1, **kwargs)) for s in samples]
            result_dtype = out_dtype or case.dtype
            scales = [softmax_scale(s.to(result_dtype) if result_dtype.is_floating_point else s,
                                    dim - 1, log) for s in samples]

            def run(where: str, build: Callable, spelled=spelled, kwargs=kwargs, func=func
                    ) -> Any:
                return func(build(case), spelled, **kwargs)

            def check(where: str, got: Any, op=op, expected=expected, scales=scales) -> None:
                check_batch_result(fails, "softmax", op, where, got, expected, case, ulps=4,
                                   scales=scales)

            def probe(func=func, dim=dim, kwargs=kwargs) -> Any:
                return func(case.probe(), dim - 1, **kwargs)

            check_outcomes(fails, "softmax", op, case, expected, run, check, probe)
    fails.check()


# ============================================================================== elementwise
_INT_CASTS = {"long": torch.int64, "int": torch.int32, "short": torch.int16, "char": torch.int8,
              "byte": torch.uint8}
_UNARY_ARGS: dict[str, tuple[tuple, dict]] = {
    "clamp": ((), {"min": -1, "max": 2}),
    "clip": ((), {"min": -1.5, "max": 2}),
    "clamp_min": ((0.5,), {}),
    "clamp_max": ((-1,), {}),
    "nan_to_num": ((), {"nan": 7.0, "posinf": 8.0}),
    "logit": ((1e-3,), {}),
}


def torch_function(name: str) -> Callable:
    """``torch.<name>`` when it is a function, else the method (``x.float()``, ...)."""
    func = getattr(torch, name, None)
    if callable(func) and not isinstance(func, torch.dtype):
        return func
    return lambda x, *args, **kwargs: getattr(x, name)(*args, **kwargs)


def undefined_casts(name: str, sample: Tensor) -> Tensor | None:
    """Elements whose float-to-integer cast is undefined behaviour (NaN, inf, out of range)."""
    if name not in _INT_CASTS or not sample.dtype.is_floating_point:
        return None
    info = torch.iinfo(_INT_CASTS[name])
    x = sample.double()
    return ~x.isfinite() | (x < info.min) | (x > info.max)


def check_elementwise(fails: Failures, family: str, op: str, name: str, case: Case,
                      sample_fn: Callable[[int, list[Tensor], list[Tensor]], Any],
                      batch_fn: Callable[[NestedBatch], Any], *, other: Case | None = None,
                      ignore_source: bool = False) -> None:
    """``batch_fn(build)`` against ``sample_fn(i, samples, other_samples)`` for every sample
    (``other``: the case of a second batch operand).

    torch's elementwise kernels give an element different bits with its position in the
    tensor (a vectorized body and a scalar tail: 1 ulp for exp2 / sinh / pow / atan2 ...,
    0.0 or -0.0 for ``maximum(0.0, -0.0)``, nan or 0 for ``fmod(max, tiny)``), so each element
    may also equal torch's result for the whole batch at once, in either of the two layouts the
    batch stores elements in: ``sample_fn`` applied to the packed rows and to the padded data.
    """
    samples = case.reference_samples()
    others = (other or case).reference_samples()
    expected = [outcome(lambda i=i: sample_fn(i, samples, others))
                for i in range(len(samples))]

    def probe() -> Any:
        return sample_fn(0, [case.probe()], [(other or case).probe()])

    alternatives: list[list[Tensor]] = [[] for _ in samples]
    if case.batch_size and not any(isinstance(e, Raised) for e in expected):
        twin_case = other or case
        for whole, split in ((Case.values_tensor, case.split_packed),
                             (Case.padded_data, case.split_padded)):
            out = outcome(lambda whole=whole: sample_fn(0, [whole(case)], [whole(twin_case)]))
            if isinstance(out, Tensor):
                for i, part in enumerate(split(out)):
                    alternatives[i].append(part)
    ignores = [undefined_casts(name, s) for s in samples] if ignore_source else None

    def run(where: str, build: Callable) -> Any:
        return batch_fn(build)

    def check(where: str, got: Any) -> None:
        check_batch_result(fails, family, op, where, got, expected, case, ignores=ignores,
                           alternatives=alternatives)

    check_outcomes(fails, family, op, case, expected, run, check, probe)


@fuzz
@given(data=st.data())
def test_unary_elementwise(data: st.DataObject) -> None:
    """Every op of ``nestbatch.ops.elementwise.UNARY``, as ``torch.<op>(batch)`` (the Tensor
    method where torch has no function), against the op on each sample."""
    case = data.draw(cases(), label="case")
    fails = Failures(case)
    for name, func in (*((n, torch_function(n)) for n in UNARY),
                       *((f"special.{n}", getattr(torch.special, n)) for n in SPECIAL_UNARY)):
        args, kwargs = _UNARY_ARGS.get(name, ((), {}))

        def sample_fn(i: int, samples: list[Tensor], _: Any, func=func, args=args, kwargs=kwargs
                      ) -> Any:
            return func(samples[i], *args, **kwargs)

        def batch_fn(build: Callable, func=func, args=args, kwargs=kwargs) -> Any:
            return func(build(case), *args, **kwargs)

        check_elementwise(fails, "unary", name, name, case, sample_fn, batch_fn,
                          ignore_source=True)
    fails.check()


#: torch.special's functions of two operands, and the functions of a tensor and an order:
#: each as a call of one batch (a second operand made of it).
_SPECIAL_AND_ORDERED: dict[str, Callable[[Any], Any]] = {
    **{f"special_{n}": (lambda x, n=n: getattr(torch.special, n)(x, x / 2 + 1))
       for n in SPECIAL_BINARY if "polynomial" not in n},
    # (of degree 3; torch 2.11's polynomials of NaN read uninitialized memory: finite values)
    **{f"special_{n}": (lambda x, n=n: getattr(torch.special, n)(x.nan_to_num(), 3))
       for n in SPECIAL_BINARY if "polynomial" in n},
    "special_multigammaln": lambda x: torch.special.multigammaln(x.abs() + 1, 1),
    "special_polygamma": lambda x: torch.special.polygamma(1, x),
    "polygamma": lambda x: torch.polygamma(2, x),
    "polygamma_method": lambda x: x.polygamma(1),
    "mvlgamma": lambda x: torch.mvlgamma(x.abs() + 1, p=1),
    "polygamma_": lambda x: x.clone().polygamma_(1),
    "mvlgamma_": lambda x: (x.abs() + 1).mvlgamma_(1),
    # (of small integers: torch builds crash the process on lcm of the dtype's minimum and -1)
    **{name: (lambda x, name=name: getattr(torch, name)(_small_ints(x), _small_ints(x) + 3))
       for name in INTEGER_BINARY},
    **{f"{name}_": (lambda x, name=name: getattr(_small_ints(x), f"{name}_")(_small_ints(x) - 2))
       for name in INTEGER_BINARY},
}


def _small_ints(x: Any) -> Any:
    """``x`` as int64 in [-50, 50] (NaN and infinities too): integer operands of any case."""
    return x.nan_to_num(0.0, 50.0, -50.0).clamp(-50, 50).to(torch.int64) if (
        x.is_floating_point() or x.is_complex()) else x.to(torch.int64).clamp(-50, 50)


@fuzz
@given(data=st.data())
def test_special_binary_and_ordered_elementwise(data: st.DataObject) -> None:
    """torch.special's elementwise functions of two operands (the second made of the first)
    and ``polygamma`` / ``mvlgamma`` / ``multigammaln`` (of an order), against each sample."""
    case = data.draw(cases(), label="case")
    fails = Failures(case)
    for name, call in _SPECIAL_AND_ORDERED.items():

        def sample_fn(i: int, samples: list[Tensor], _: Any, call=call) -> Any:
            return call(samples[i])

        def batch_fn(build: Callable, call=call) -> Any:
            return call(build(case))

        check_elementwise(fails, "special", name, name, case, sample_fn, batch_fn,
                          ignore_source=True)
    fails.check()


def binary_call(name: str) -> Callable[[Any, Any, Any], Any]:
    """``call(x, y, cond)``: the op with first operand ``x`` and second ``y``; ``cond`` is a
    bool operand of ``x``'s structure (for where / masked_fill)."""
    if name == "where":
        return lambda x, y, cond: torch.where(cond, x, y)
    if name == "masked_fill":
        return lambda x, y, cond: x.masked_fill(cond, y)
    if name == "lerp":
        return lambda x, y, cond: torch.lerp(x, y, 0.25)
    if name in ("addcmul", "addcdiv"):
        func = getattr(torch, name)
        return lambda x, y, cond: func(x, y, y, value=2)
    func = getattr(torch, name, None) or getattr(torch.Tensor, name)
    return lambda x, y, cond: func(x, y)


@st.composite
def dense_operand(draw: st.DrawFn, case: Case, dtype: torch.dtype) -> Tensor:
    """A dense tensor broadcasting against every sample: the feature shape, some dims 1,
    maybe fewer leading dims."""
    shape = [n if draw(st.booleans()) else 1 for n in case.feature]
    shape = shape[draw(st.integers(0, len(shape))):]
    values = draw(st.lists(elements(dtype), min_size=math.prod(shape),
                           max_size=math.prod(shape)))
    return tensor_of(values, dtype).reshape(shape)


OPERANDS = ("batch", "batch sharing the partition", "scalar", "dense", "dense first")


@fuzz
@given(data=st.data())
def test_binary_elementwise(data: st.DataObject) -> None:
    """Every op of ``nestbatch.ops.elementwise.BINARY`` (and torch.max / torch.min of two
    batches) with a second operand of one kind: another batch of the same structure (built the
    same way, or sharing the partition), a scalar, or a dense tensor broadcasting against the
    feature shape, first or second."""
    case = data.draw(cases(), label="case")
    kind = data.draw(st.sampled_from(OPERANDS), label="operand")
    other_dtype = data.draw(st.sampled_from([case.dtype, case.dtype, *DTYPES]), label="dtype")
    other = twin(data.draw, case, other_dtype)
    scalar = data.draw(st.sampled_from(special_values(other_dtype)), label="scalar")
    dense = data.draw(dense_operand(case, other_dtype), label="dense")
    fails = Failures((case, kind, other if kind.startswith("batch") else
                      scalar if kind == "scalar" else dense))
    for name in (*BINARY, *(("max", "min") if kind != "scalar" else ())):
        # (torch.max(x, 2) is a reduction over dim 2: max / min take tensors here)
        call = binary_call(name)

        def sample_fn(i: int, samples: list[Tensor], others: list[Tensor], call=call) -> Any:
            x = samples[i]
            cond = x != 0
            if kind.startswith("batch"):
                y = others[i]
            else:
                y = scalar if kind == "scalar" else dense
            return call(y, x, cond) if kind == "dense first" else call(x, y, cond)

        def batch_fn(build: Callable, call=call) -> Any:
            x = build(case)
            cond = x != 0
            if kind == "batch":
                y: Any = build(other)
            elif kind == "batch sharing the partition":
                y = x.with_values(other.values_tensor())
            else:
                y = scalar if kind == "scalar" else dense
            return call(y, x, cond) if kind == "dense first" else call(x, y, cond)

        check_elementwise(fails, f"binary with {kind}", name, name, case, sample_fn, batch_fn,
                          other=other)
    fails.check()


OPERATORS = {
    "+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv,
    "//": operator.floordiv, "%": operator.mod, "**": operator.pow, "&": operator.and_,
    "|": operator.or_, "^": operator.xor, "==": operator.eq, "!=": operator.ne,
    "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge,
}
_OPERATOR_NAMES = {"+": "add", "-": "sub", "*": "mul", "/": "div", "//": "floor_divide",
                   "%": "remainder", "**": "pow"}


@fuzz
@given(data=st.data())
def test_python_operators(data: st.DataObject) -> None:
    """Python's operators (the registered dunders, reflected ones included) with a scalar or
    another batch, unary ``-``, ``abs()``, ``~``; and the whole-batch comparisons
    ``torch.equal`` / ``torch.allclose``."""
    case = data.draw(cases(), label="case")
    other = twin(data.draw, case, data.draw(st.sampled_from([case.dtype, *DTYPES])))
    scalar = data.draw(st.sampled_from(special_values(case.dtype) + [2, -3, 0.5]),
                       label="scalar")
    dense = data.draw(dense_operand(case, other.dtype), label="dense")
    fails = Failures((case, other, scalar, dense))
    for symbol, func in OPERATORS.items():
        name = _OPERATOR_NAMES.get(symbol, "eq")
        for label, reflected, second in (("batch op scalar", False, "scalar"),
                                         ("scalar op batch", True, "scalar"),
                                         ("dense op batch", True, "dense"),
                                         ("batch op batch", False, "batch")):
            def sample_fn(i: int, samples: list[Tensor], others: list[Tensor], func=func,
                          reflected=reflected, second=second) -> Any:
                y = others[i] if second == "batch" else scalar if second == "scalar" \
                    else dense
                return func(y, samples[i]) if reflected else func(samples[i], y)

            def batch_fn(build: Callable, func=func, reflected=reflected,
                         second=second) -> Any:
                x = build(case)
                y = build(other) if second == "batch" else scalar if second == "scalar" \
                    else dense
                return func(y, x) if reflected else func(x, y)

            check_elementwise(fails, "operator", f"{label}: {symbol}", name, case,
                              sample_fn, batch_fn, other=other)
    for symbol, func in (("-x", operator.neg), ("abs(x)", abs), ("~x", operator.invert)):
        check_elementwise(fails, "operator", symbol, "neg", case,
                          lambda i, samples, _, func=func: func(samples[i]),
                          lambda build, func=func: func(build(case)))
    # Whole-batch comparisons: True when the structure matches and torch's says so per sample.
    for label, func in (("torch.equal", torch.equal), ("torch.allclose", torch.allclose),
                        ("allclose(equal_nan)", lambda a, b: torch.allclose(a, b,
                                                                            equal_nan=True))):
        for second in (case, other):
            pairs = list(zip(case.samples(), second.samples()))
            per_sample = [outcome(lambda a=a, b=b, func=func: func(a, b)) for a, b in pairs]
            if any(isinstance(r, Raised) for r in per_sample):
                continue  # (allclose of bool / mixed dtypes: torch's answer is no reference)
            if second.dtype != case.dtype and label != "torch.equal":
                continue  # torch.allclose refuses mixed dtypes (test_shape_semantics: so must we)
            want = all(per_sample)  # (torch.equal compares values across dtypes)
            for where, build in constructions(case):
                got = outcome(lambda func=func, build=build, second=second: func(
                    build(case), build(second)))
                if got is not want:
                    fails.add("whole-batch comparison", label, where, "answer",
                              f"got {got!r}, per-sample torch gives {want}"
                              f"{' (other batch)' if second is other else ' (itself)'}")
    fails.check()


_FILL_VALUES = (0, 1, -1, 2.5, NAN, -INF, True)


@fuzz
@given(data=st.data())
def test_inplace_elementwise(data: st.DataObject) -> None:
    """Every registered in-place op (``<op>_`` of UNARY and BINARY, ``+=`` ...) and ``zero_`` /
    ``fill_``: returns the batch itself, whose samples then equal the per-sample in-place
    results (torch refuses a result it cannot cast back: so must the batch)."""
    case = data.draw(cases(), label="case")
    kind = data.draw(st.sampled_from(["batch", "scalar", "dense"]), label="operand")
    other = twin(data.draw, case, data.draw(st.sampled_from([case.dtype, *DTYPES])))
    scalar = data.draw(st.sampled_from(special_values(other.dtype)), label="scalar")
    dense = data.draw(dense_operand(case, other.dtype), label="dense")
    fill = data.draw(st.sampled_from(_FILL_VALUES), label="fill")
    fails = Failures((case, kind, other if kind == "batch" else
                      scalar if kind == "scalar" else dense, fill))
    calls: list[tuple[str, str, Callable[[Any, Any, Any], Any]]] = []
    for name in UNARY:
        if hasattr(torch.Tensor, name + "_"):
            args, kwargs = _UNARY_ARGS.get(name, ((), {}))
            calls.append((name + "_", name, lambda x, y, c, m=name + "_", a=args, kw=kwargs:
                          getattr(x, m)(*a, **kw)))
    for name in BINARY:
        if hasattr(torch.Tensor, name + "_"):
            calls.append((name + "_", name, lambda x, y, c, m=name + "_":
                          _inplace_binary(m, x, y, c)))
    for symbol, name, func in (
            ("+=", "add", operator.iadd), ("-=", "sub", operator.isub),
            ("*=", "mul", operator.imul), ("/=", "div", operator.itruediv),
            ("//=", "floor_divide", operator.ifloordiv), ("%=", "remainder", operator.imod),
            ("**=", "pow", operator.ipow), ("&=", "bitwise_and", operator.iand),
            ("|=", "bitwise_or", operator.ior), ("^=", "bitwise_xor", operator.ixor)):
        calls.append((symbol, name, lambda x, y, c, func=func: func(x, y)))
    calls.append(("zero_", "zero", lambda x, y, c: x.zero_()))
    calls.append((f"fill_({fill})", "fill", lambda x, y, c: x.fill_(fill)))
    calls.append(("copy_", "copy", lambda x, y, c: x.copy_(y) if isinstance(y, Tensor | NestedBatch)
                  else x.fill_(y)))
    for op, name, call in calls:
        def sample_fn(i: int, samples: list[Tensor], others: list[Tensor], call=call,
                      op=op) -> Any:
            x = samples[i]
            y = others[i] if kind == "batch" else \
                scalar if kind == "scalar" else dense
            out = call(x, y, x != 0)
            if out is not x:
                raise AssertionError(f"torch's {op} did not return its input")
            return x

        def batch_fn(build: Callable, call=call, op=op) -> Any:
            x = build(case)
            y = build(other) if kind == "batch" else scalar if kind == "scalar" else dense
            out = call(x, y, x != 0)
            if out is not x:
                return f"{op} returned {summary(out)}, not the batch itself"
            return x

        check_elementwise(fails, f"in-place with {kind}", op, name, case, sample_fn, batch_fn,
                          other=other)
    fails.check()


def _inplace_binary(method: str, x: Any, y: Any, cond: Any) -> Any:
    if method == "masked_fill_":
        return x.masked_fill_(cond, y)
    if method == "lerp_":
        return x.lerp_(y, 0.25)
    if method in ("addcmul_", "addcdiv_"):
        return getattr(x, method)(y, y, value=2)
    return getattr(x, method)(y)


# ================================================================================ selection
def check_samples(fails: Failures, family: str, op: str, where: str, got: Any,
                  expected: Sequence[Tensor], dtype: torch.dtype,
                  num_ragged_dims: int | None = None) -> None:
    """``got``, a batch of ``dtype``, holds exactly ``expected`` (shapes, values)."""
    if not isinstance(got, NestedBatch):
        fails.add(family, op, where, "not a batch", summary(got))
        return
    if got.dtype != dtype:
        fails.add(family, op, where, "dtype", f"{got.dtype}, expected {dtype}")
        return
    samples = outcome(got.unbind)
    if isinstance(samples, Raised):
        fails.add(family, op, where, "unbind of the result raised", repr(samples))
        return
    if len(samples) != len(expected):
        fails.add(family, op, where, "batch size", f"{len(samples)} != {len(expected)}")
        return
    if num_ragged_dims is not None and got.num_ragged_dims != num_ragged_dims:
        fails.add(family, op, where, "ragged dims", f"{got.num_ragged_dims}")
    for i, (a, e) in enumerate(zip(samples, expected)):
        if a.shape != e.shape:
            fails.add(family, op, where, "shape",
                      f"sample {i}: {tuple(a.shape)}, torch gives {tuple(e.shape)}")
            return
        problem = compare(a, [e])
        if problem:
            fails.add(family, op, where, "values", f"sample {i}: {problem}")
            return


def expect_same(fails: Failures, family: str, op: str, where: str, got: Any,
                reference: Callable[[list[Tensor]], Any], case: Case, *, per_sample: bool,
                as_batch: bool, num_ragged_dims: int | None = None) -> None:
    """``got`` (an outcome) against torch's ``reference(samples)``: both refused, or the same
    samples (``as_batch``) / tensor. A ``per_sample`` reference of an empty batch is first
    tried on an empty sample (what torch refuses there, the batch refuses)."""
    samples = case.samples()
    want = outcome(lambda: reference(samples))
    if per_sample and not samples and not isinstance(want, Raised):
        probe = outcome(lambda: reference([case.dummy()]))
        want = probe if isinstance(probe, Raised) else want
    if isinstance(want, Raised):
        if not isinstance(got, Raised):
            fails.add(family, op, where, "accepted what torch refuses",
                      f"torch: {want!r}; nestbatch returned {summary(got)}")
        elif not isinstance(got.exc, (*ALLOWED_REFUSALS, IndexError, type(want.exc))):
            fails.add(family, op, where, "refused with another exception type", repr(got))
        return
    if isinstance(got, Raised):
        fails.add(family, op, where, "refused what torch accepts", repr(got))
        return
    if as_batch:
        check_samples(fails, family, op, where, got, want, case.dtype,
                      num_ragged_dims=num_ragged_dims)
        return
    problem = compare(got, [want])
    if problem:
        fails.add(family, op, where, "values", problem)


@st.composite
def slices(draw: st.DrawFn) -> slice:
    bound = st.one_of(st.none(), st.integers(-7, 7))
    return slice(draw(bound), draw(bound), draw(st.sampled_from([None, 1, 2, 3, -1, 0])))


_FIXED_SLICES = (slice(0, None), slice(None, None, 1), slice(None, 2), slice(-2, None),
                 slice(1, -1), slice(None, None, 2), slice(1, 4, 2), slice(-10, 10), slice(3, 1),
                 slice(0, 0))


@fuzz
@given(data=st.data())
def test_selection(data: st.DataObject) -> None:
    """Indexing and selection against the same indexing of each sample: ``b[i]``,
    ``torch.select`` on the batch, ragged and feature dims, ``b[:, a:b:c]`` (``0:``, ``::1``,
    negative bounds, steps), feature indices, batch selections (slices, lists, tensors, bool
    masks). An integer on a ragged dim is refused (documented, as TF's): checked.
    (``torch.narrow`` is not registered.)"""
    case = data.draw(cases(), label="case")
    drawn = data.draw(st.lists(slices(), min_size=1, max_size=3), label="slices")
    picks = data.draw(st.lists(st.integers(-6, 5), max_size=4), label="batch picks")
    position = data.draw(st.integers(-4, 3), label="position")
    fails = Failures(case)
    for where, build in constructions(case):
        check_selection(fails, case, where, build, drawn, picks, position)
    fails.check()


def check_selection(fails: Failures, case: Case, where: str, build: Callable, drawn: list,
                    picks: list[int], position: int) -> None:
    """The selections of :func:`test_selection` on the batch built by ``build``."""
    B, k, nf = case.batch_size, case.k, len(case.feature)

    def each(op: str, index: Any, reference: Callable[[list[Tensor]], Any], *,
             per_sample: bool = True, as_batch: bool = True, rd: int | None = None,
             how: Callable | None = None) -> None:
        batch = build(case)
        got = outcome(lambda: how(batch) if how else batch[index])
        expect_same(fails, "selection", op, where, got, reference, case,
                    per_sample=per_sample, as_batch=as_batch, num_ragged_dims=rd)

    for i in range(-B - 1, B + 1):
        each(f"b[{i}]", i, lambda xs, i=i: xs[i], per_sample=False, as_batch=False)
        each(f"torch.select(b, 0, {i})", None, lambda xs, i=i: xs[i], per_sample=False,
             as_batch=False, how=lambda b, i=i: torch.select(b, 0, i))
    for s in (*_FIXED_SLICES, *drawn):
        each(f"b[:, {s}]", (slice(None), s), lambda xs, s=s: [x[s] for x in xs], rd=k)
        # (the batch dim is sliced as a tensor's: no negative or zero step)
        each(f"b[{s}]", s, lambda xs, s=s: [xs[i] for i in torch.arange(len(xs))[s].tolist()],
             per_sample=False)
        if k == 2:
            t = drawn[0]
            each(f"b[:, {s}, {t}]", (slice(None), s, t),
                 lambda xs, s=s, t=t: [x[s, t] for x in xs], rd=2)
    each(f"b[{picks}]", picks, lambda xs: [xs[i] for i in picks], per_sample=False)
    each(f"b[tensor({picks})]", torch.tensor(picks, dtype=torch.int64),
         lambda xs: [xs[i] for i in picks], per_sample=False)
    mask = [bool(i % 2) for i in range(B)]
    each(f"b[{mask}]", torch.tensor(mask, dtype=torch.bool),
         lambda xs: [x for x, m in zip(xs, mask) if m], per_sample=False)
    # An integer on a ragged dim: refused (documented); torch.select picks it per sample.
    batch = build(case)
    got = outcome(lambda: batch[:, position])
    if not (isinstance(got, Raised) and isinstance(got.exc, IndexError)):
        fails.add("selection", f"b[:, {position}]", where, "integer on a ragged dim",
                  f"expected IndexError, got {summary(got)}")
    for dim in range(1, 1 + k):
        def stacked(xs: list[Tensor], dim: int = dim) -> Any:
            picked = [x.select(dim - 1, position) for x in xs]
            if k == 2:
                return picked
            if not picked:
                return torch.zeros((0, *case.feature), dtype=case.dtype)
            return torch.stack(picked)

        each(f"torch.select(b, {dim}, {position})", None, stacked, as_batch=k == 2,
             rd=1, per_sample=False, how=lambda b, dim=dim: torch.select(b, dim, position))
    for fd in range(nf):
        dim = 1 + k + fd
        j = position
        each(f"torch.select(b, {dim}, {j})", None,
             lambda xs, dim=dim, j=j: [x.select(dim - 1, j) for x in xs], rd=k,
             how=lambda b, dim=dim, j=j: torch.select(b, dim, j))
        index = (slice(None),) * dim + (j,)
        each(f"b[{index}]", index, lambda xs, index=index: [x[index[1:]] for x in xs], rd=k)
        tail = (j,) if fd == nf - 1 else (j, slice(None))
        each(f"b[..., {tail}]", (Ellipsis, *tail),
             lambda xs, tail=tail: [x[(Ellipsis, *tail)] for x in xs], rd=k)
        index = (slice(None),) * dim + (drawn[0],)
        each(f"b[{index}]", index, lambda xs, index=index: [x[index[1:]] for x in xs], rd=k)


# ============================================================================== conversions
def same_lists(a: Any, b: Any) -> bool:
    """Nested Python lists equal, NaN equal to NaN, -0.0 told from 0.0."""
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_lists(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return a == b and math.copysign(1, a) == math.copysign(1, b)
    return type(a) is type(b) and a == b


def reference_padded(case: Case, value: Any, widths: Sequence[int] | None = None) -> Tensor:
    samples = case.samples()
    if widths is None:
        widths = [max((s[d] for s in case.shapes), default=0) for d in range(case.k)]
    out = torch.full((case.batch_size, *widths, *case.feature), value, dtype=case.dtype)
    for i, sample in enumerate(samples):
        out[(i, *(slice(0, n) for n in sample.shape[: case.k]))] = sample
    return out


def reference_mask(case: Case) -> Tensor:
    widths = [max((s[d] for s in case.shapes), default=0) for d in range(case.k)]
    mask = torch.zeros((case.batch_size, *widths), dtype=torch.bool)
    for i, shape in enumerate(case.shapes):
        mask[(i, *(slice(0, n) for n in shape))] = True
    return mask


@fuzz
@given(data=st.data())
def test_conversions(data: st.DataObject) -> None:
    """Every conversion against its per-sample definition: ``unbind``, ``tolist``,
    ``packed()`` (values, lengths, offsets), ``padded(value)`` (data, mask),
    ``to_padded_tensor`` (with a larger ``output_size``), ``tensor_list()``, ``.to(layout)``,
    ``.to(dtype)``, ``clone`` / ``detach`` / ``contiguous``, and round trips through
    ``from_padded`` / ``from_lengths`` / ``from_offsets`` / ``from_shapes``."""
    case = data.draw(cases(), label="case")
    value = data.draw(st.sampled_from(special_values(case.dtype)), label="padding")
    extra = data.draw(st.integers(0, 2), label="extra width")
    to_dtype = data.draw(st.sampled_from(DTYPES), label="to dtype")
    fails = Failures((case, value, extra, to_dtype))
    for where, build in constructions(case):
        check_conversions(fails, case, where, build, value, extra, to_dtype)
    fails.check()


def check_conversions(fails: Failures, case: Case, where: str, build: Callable, value: Any,
                      extra: int, to_dtype: torch.dtype) -> None:
    """The conversions of :func:`test_conversions` on the batch built by ``build``."""
    samples = case.samples()
    k = case.k
    lengths = torch.tensor([math.prod(s) for s in case.shapes], dtype=torch.int64)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    widths = [max((s[d] for s in case.shapes), default=0) for d in range(k)]
    family = "conversion"

    def tensor(op: str, get: Callable[[NestedBatch], Any], want: Any,
               ignore: Tensor | None = None) -> None:
        got = outcome(lambda: get(build(case)))
        if isinstance(got, Raised):
            fails.add(family, op, where, "raised", repr(got))
            return
        problem = compare(got, [want], ignore=ignore)
        if problem:
            fails.add(family, op, where, "values", problem)

    def batch(op: str, get: Callable[[NestedBatch], Any], want: list[Tensor],
              rd: int = k) -> None:
        got = outcome(lambda: get(build(case)))
        if isinstance(got, Raised):
            fails.add(family, op, where, "raised", repr(got))
            return
        check_samples(fails, family, op, where, got, want, case.dtype, num_ragged_dims=rd)

    for label, unbind in (("b.unbind()", NestedBatch.unbind),
                          ("torch.unbind(b)", torch.unbind), ("list(b)", list)):
        got = outcome(lambda unbind=unbind: unbind(build(case)))
        if isinstance(got, Raised) or len(got) != len(samples) or any(
                a.shape != e.shape or compare(a, [e]) for a, e in zip(got, samples)):
            fails.add(family, label, where, "samples",
                      f"got {summary(got)}, torch gives {[s.tolist() for s in samples]}")
    got = outcome(lambda: build(case).tolist())
    if isinstance(got, Raised) or not same_lists(got, [s.tolist() for s in samples]):
        fails.add(family, "tolist", where, "lists",
                  f"got {got!r}, torch gives {[s.tolist() for s in samples]}")
    tensor("packed().values", lambda b: b.packed().values, case.values_tensor())
    tensor("values", lambda b: b.values, case.values_tensor())
    tensor("lengths", lambda b: b.lengths, lengths)
    tensor("offsets", lambda b: b.offsets, offsets)
    tensor("shape_per_sample", lambda b: b.shape_per_sample,
           torch.tensor(case.shapes, dtype=torch.int64).reshape(case.batch_size, k))
    for pad in (0.0, *special_values(case.dtype)):  # every special filler, every example
        want = reference_padded(case, pad)
        tensor(f"padded({pad!r}).data", lambda b, pad=pad: b.padded(pad).data, want)
        tensor(f"to_padded_tensor({pad!r})", lambda b, pad=pad: b.to_padded_tensor(pad),
               want)
    tensor("padded().mask", lambda b: b.padded().mask, reference_mask(case))
    tensor("mask", lambda b: b.mask, reference_mask(case))
    size = [case.batch_size, *(w + extra for w in widths), *case.feature]
    tensor(f"to_padded_tensor({value!r}, output_size={size})",
           lambda b: b.to_padded_tensor(value, size),
           reference_padded(case, value, [w + extra for w in widths]))
    batch("tensor_list()", lambda b: NestedBatch.from_list(
        list(b.tensor_list().tensors), k, dtype=case.dtype) if samples else b, samples)
    for layout in Layout:
        batch(f".to({layout})", lambda b, layout=layout: b.to(layout), samples)
    for label, func in (("torch.clone", torch.clone), ("b.clone()", lambda b: b.clone()),
                        ("torch.detach", torch.detach), ("b.detach()", lambda b: b.detach()),
                        ("b.contiguous()", lambda b: b.contiguous())):
        batch(label, func, samples)
    cast = [outcome(lambda s=s: s.to(to_dtype)) for s in samples]
    ignores = None
    if to_dtype == torch.int64:
        ignores = [undefined_casts("long", s) for s in samples]
    if not any(isinstance(c, Raised) for c in cast):
        got = outcome(lambda: build(case).to(to_dtype))
        if isinstance(got, Raised):
            fails.add(family, f".to({to_dtype})", where, "raised", repr(got))
        elif not isinstance(got, NestedBatch) or got.dtype != to_dtype:
            fails.add(family, f".to({to_dtype})", where, "dtype", summary(got))
        elif samples:
            check_batch_result(fails, family, f".to({to_dtype})", where, got, cast, case,
                               ignores=ignores)
    # Round trips through the constructors.
    if k == 1:
        batch("from_padded(b.padded(v).data, b.lengths)", lambda b: NestedBatch.from_padded(
            b.padded(value).data, b.lengths), samples)
        batch("from_padded(b.padded().data, host lengths)",
              lambda b: NestedBatch.from_padded(b.padded().data, lengths.tolist()), samples)
        batch("from_lengths(b.values, b.lengths)",
              lambda b: NestedBatch.from_lengths(b.values, b.lengths), samples)
        batch("from_offsets(b.values, b.offsets)",
              lambda b: NestedBatch.from_offsets(b.values, b.offsets), samples)
    else:
        batch("from_padded(b.padded(v).data, shape_per_sample)",
              lambda b: NestedBatch.from_padded(b.padded(value).data,
                                                shape_per_sample=b.shape_per_sample),
              samples)
        batch("from_shapes(b.values, b.shape_per_sample)",
              lambda b: NestedBatch.from_shapes(b.values, b.shape_per_sample), samples)


#: The registered implementations of the families fuzzed here; every function registered to
#: one of them must be named in FUZZED (``registered_functions()`` holds more: matmul, nn
#: functions, shape ops, cat / stack, attention, ``*_like`` creation, which are not fuzzed here).
FAMILIES = {
    ("nestbatch.ops.reductions", name) for name in
    ("_reduction", "_variance", "_max_min", "_softmax", "_log_softmax")
} | {
    ("nestbatch.ops.elementwise", "_elementwise"), ("nestbatch.ops.elementwise",
                                                    "_elementwise_inplace"),
    ("nestbatch.ops.elementwise", "_copy"), ("nestbatch.ops.indexing", "_getitem"),
    ("nestbatch.ops.shape", "_select"), ("nestbatch.ops.shape", "_unbind"),
    ("nestbatch.ops.comparison", "_equal"), ("nestbatch.ops.comparison", "_allclose"),
}
FUZZED = (
    {red.name for red in REDUCTIONS} | {"softmax", "log_softmax", "special_softmax",
                                        "special_log_softmax"}
    | set(UNARY) | set(BINARY) | {name + "_" for name in (*UNARY, *BINARY)}
    | set(DUNDERS) | set(INPLACE_DUNDERS) | {"__idiv__", "__rdiv__"}
    | {"__getitem__", "select", "unbind", "clone", "detach", "contiguous", "equal", "allclose"}
    | {"zero_", "fill_", "copy_"} | {f"special_{name}" for name in SPECIAL_UNARY}
    | {name for name in _SPECIAL_AND_ORDERED if not name.endswith("_method")}
)


def test_every_registered_function_of_the_fuzzed_families_is_fuzzed() -> None:
    """A new registration in a fuzzed family must be added to the fuzz (FUZZED)."""
    missing = []
    for func in registered_functions():
        impl = lookup(func).impl
        if (impl.__module__, impl.__name__) in FAMILIES:
            name = getattr(func, "__name__", repr(func))
            if name not in FUZZED:
                missing.append(name)
    assert not missing, f"registered but not fuzzed: {sorted(set(missing))}"

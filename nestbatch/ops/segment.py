"""Segment reductions of packed rows: every sample's rows reduce to one row.

Two backends compute the same results:

* ``"torch"``: :func:`torch.segment_reduce` over the offsets for floating dtypes (differentiable),
  ``scatter_reduce`` over the row ids for the others;
* ``"scatter"``: ``torch_scatter.segment_csr``, an optional accelerator (``pip install
  nestbatch[scatter]``; it builds from source against the installed torch, with
  ``--no-build-isolation``), for ``sum`` and ``mean``. Its ``prod`` is missing, and its ``max`` /
  ``min`` skip NaN and turn a sample of ``-inf`` into the dtype's lowest finite value (torch
  propagates NaN and keeps infinities), so those always run on torch.

``"auto"`` (the default) uses torch-scatter when it is importable and faster, torch's own ops
otherwise (see :func:`_scatter_is_faster`). :func:`set_segment_backend` picks one.

Empty samples get TensorFlow's results: ``sum`` 0, ``prod`` 1, ``mean`` nan, ``amax`` the
dtype's lowest finite value and ``amin`` its highest (TF's ``unsorted_segment_max`` /
``reduce_max`` of an empty row).
"""

from __future__ import annotations

import functools
import importlib.util
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor
from torch._subclasses.fake_tensor import FakeTensor

from nestbatch.batch import NestedBatch
from nestbatch.ops.common import fill_value_for

if TYPE_CHECKING:
    from nestbatch.layouts import RowPartition

REDUCTIONS = ("sum", "mean", "amax", "amin", "prod")
_BACKENDS = ("auto", "torch", "scatter")
_state = {"backend": "auto"}
_EMPTY = {"sum": 0, "prod": 1, "mean": float("nan")}
#: What torch-scatter computes as torch does (see the module docstring for the others).
_SCATTER_REDUCTIONS = ("sum", "mean")
#: torch.segment_reduce and torch-scatter accumulate in the values' dtype. For half precision
#: that loses the sum (a bfloat16 sum of 4096 values near 0.5 comes out 256, not about 2065):
#: these dtypes are reduced in float32, as torch.sum does, and the result cast back.
WIDENED_DTYPES = {torch.float16: torch.float32, torch.bfloat16: torch.float32}


@functools.cache
def scatter_available() -> bool:
    """Whether ``torch_scatter`` can be imported (looked up once per process)."""
    return importlib.util.find_spec("torch_scatter") is not None


def set_segment_backend(name: str) -> str:
    """Choose the segment-reduction backend (``"auto"``, ``"torch"`` or ``"scatter"``).

    Returns the previous one, so callers can restore it.

    Raises
    ------
    ValueError
        For an unknown name, or ``"scatter"`` when torch-scatter is not installed.
    """
    if name not in _BACKENDS:
        raise ValueError(f"backend must be one of {_BACKENDS}, got {name!r}")
    if name == "scatter" and not scatter_available():
        raise ValueError("backend 'scatter' needs torch-scatter (pip install nestbatch[scatter])")
    previous, _state["backend"] = _state["backend"], name
    return previous


def segment_reduce(values: Tensor, batch: NestedBatch, reduce: str) -> Tensor:
    """Reduce the packed rows of every sample.

    Parameters
    ----------
    values : Tensor
        ``(total, *feature)`` packed rows laid out as ``batch``'s.
    batch : NestedBatch
        Gives the offsets / row ids.
    reduce : str
        One of ``sum``, ``mean``, ``amax``, ``amin``, ``prod``.

    Returns
    -------
    Tensor
        ``(B, *feature)``; sums and products of integer / bool values are int64, as torch's.
        Sums, means and products of float16 / bfloat16 values are accumulated in float32 (two
        more ops: the widening and the cast back), as ``torch.sum``'s.
    """
    if reduce not in REDUCTIONS:
        raise ValueError(f"reduce must be one of {REDUCTIONS}, got {reduce!r}")
    if reduce == "mean" and not (values.is_floating_point() or values.is_complex()):
        raise RuntimeError(
            f"mean of a batch of dtype {values.dtype} is not defined; convert to a floating "
            "dtype first (as torch.mean requires)"
        )
    if reduce in ("sum", "prod") and not (values.is_floating_point() or values.is_complex()):
        values = values.to(torch.int64)
    if reduce in ("amax", "amin") and values.requires_grad and torch.is_grad_enabled():
        return segment_extreme(values, batch, reduce)  # (torch's gradient at ties)
    if reduce == "prod" and values.requires_grad and torch.is_grad_enabled() and \
            values.dtype not in WIDENED_DTYPES:  # (half precision: widened below, then here)
        return SegmentProduct.apply(values, batch.offsets, batch.row_ids)
    if reduce in _EMPTY and values.dtype in WIDENED_DTYPES:  # sums and products accumulate
        wide = values.to(WIDENED_DTYPES[values.dtype])
        return segment_reduce(wide, batch, reduce).to(values.dtype)
    if reduce in ("sum", "mean") and values.requires_grad and torch.is_grad_enabled() and \
            values.is_floating_point() and _state["backend"] != "scatter":
        return SegmentSum.apply(values, batch.offsets, batch.row_ids, reduce == "mean")
    if reduce in ("sum", "mean") and values.is_cpu and values.is_floating_point():
        # The sum below adds a sample's rows one by one: long samples go by chunks, or, in a
        # traced graph (which cannot read the lengths to chunk them), in float64, rounded once.
        if torch.compiler.is_compiling():
            if values.dtype != torch.float64:
                return _traced_segment_sum(values, batch.offsets, reduce == "mean")
        elif values.shape[0] > SUM_CHUNK_ROWS and _has_long_sample(values, batch):
            out = accurate_segment_sum(values, batch.offsets)
            return out if reduce == "sum" else _over_lengths(out, batch.lengths)
    backend = _state["backend"]
    if backend == "auto":
        backend = "scatter" if _scatter_is_faster(values, reduce) else "torch"
    if backend == "scatter" and reduce in _SCATTER_REDUCTIONS and values.is_floating_point():
        from torch_scatter import segment_csr

        out = segment_csr(values, batch.offsets, reduce=reduce)
    elif values.is_floating_point():
        if reduce == "mean" and values.is_cpu and values.numel() >= MEAN_BY_SUM_ELEMENTS:
            # On the CPU segment_reduce's mean is slower than its sum and one division (1.25x
            # at 1 MB and 32 MB, 2 cores): the same sum over the same count (0 / 0 is the
            # empty sample's nan). (Smaller, the two more ops cost more; on CUDA its one
            # kernel is fewer launches.)
            out = torch.segment_reduce(values, "sum", offsets=batch.offsets, axis=0,
                                       unsafe=True)
            return _over_lengths(out, batch.lengths)
        # segment_reduce gives TF's empty results itself for sum, mean and prod.
        name = {"amax": "max", "amin": "min"}.get(reduce, reduce)
        out = torch.segment_reduce(values, name, offsets=batch.offsets, axis=0, unsafe=True)
        if reduce in ("sum", "mean", "prod"):
            return out
    else:
        out = _scatter_rows(values, batch, reduce)
    return fill_empty(out, batch.partition, reduce)


#: On the CPU, torch.segment_reduce sums a segment's rows one after another: the rounding
#: errors of a long one add up (a relative 8e-3 over a million float32 rows, where torch.sum's
#: cascade keeps 4e-8). Samples longer than this many rows are summed in chunks of it, then
#: the chunks' sums alike, as many levels as it takes (4e-8 there; chunks of 1024 rows give
#: 1e-6 over a million uniform float32 values, where torch.sum gives 1.5e-7: the smaller chunks
#: cost about 10% more at 32 MB).
SUM_CHUNK_ROWS = 256


def _has_long_sample(values: Tensor, batch: NestedBatch) -> bool:
    """Whether a sample of the host rows ``values`` is longer than :data:`SUM_CHUNK_ROWS` (the
    host offsets read, where the longest is not known)."""
    if isinstance(values, FakeTensor):
        return False
    known = batch.partition.cached_max_shape
    longest = known[0] if known and batch.num_ragged_dims == 1 else int(
        batch.lengths.max()) if batch.batch_size else 0
    return longest > SUM_CHUNK_ROWS


def accurate_segment_sum(values: Tensor, offsets: Tensor) -> Tensor:
    """``(B, *F)`` sums of the host rows ``values`` ``(total, *F)`` of the samples ``offsets``
    ``(B + 1,)`` delimits, each in chunks of :data:`SUM_CHUNK_ROWS` rows whose sums are summed
    alike (a tree of sequential sums: the rounding error of a sample of ``n`` rows grows with
    ``log(n)``, not ``n``). Differentiable."""
    lengths = offsets[1:] - offsets[:-1]
    if values.shape[0] <= SUM_CHUNK_ROWS or int(lengths.max()) <= SUM_CHUNK_ROWS:
        return torch.segment_reduce(values, "sum", offsets=offsets, axis=0, unsafe=True)
    chunks = ((lengths + SUM_CHUNK_ROWS - 1) // SUM_CHUNK_ROWS).clamp_min(1)  # (one if empty)
    ends = chunks.cumsum(0)
    sample = torch.repeat_interleave(torch.arange(len(chunks)), chunks)
    index = torch.arange(int(ends[-1])) - (ends - chunks)[sample]
    starts = offsets[:-1][sample] + index * SUM_CHUNK_ROWS
    chunk_offsets = torch.cat([starts, offsets[-1:]])
    partial = torch.segment_reduce(values, "sum", offsets=chunk_offsets, axis=0, unsafe=True)
    return accurate_segment_sum(partial, torch.cat([ends.new_zeros(1), ends]))


def _over_lengths(sums: Tensor, lengths: Tensor) -> Tensor:
    """``sums`` ``(B, *F)`` over every sample's length ``(B,)`` (0 / 0: an empty sample's
    nan)."""
    count = lengths.to(sums.dtype)
    return sums / count.view(-1, *([1] * (sums.dim() - 1)))


def _traced_segment_sum(values: Tensor, offsets: Tensor, mean: bool) -> Tensor:
    """The sums (or means) of every sample's rows in a traced graph, which cannot read the
    lengths to chunk long samples: host float32 / half-precision rows summed in float64 (as
    accurate as the chunks), rounded once."""
    wide = values.is_cpu and values.dtype in (torch.float32, torch.float16, torch.bfloat16)
    out = torch.segment_reduce(values.to(torch.float64) if wide else values,
                               "mean" if mean else "sum", offsets=offsets, axis=0, unsafe=True)
    return out.to(values.dtype) if wide else out


def _scatter_is_faster(values: Tensor, reduce: str) -> bool:
    """Whether ``segment_csr`` beats ``torch.segment_reduce`` here (and is installed).

    On CUDA its CSR kernels are used for both sums and means. On the CPU (2 cores, torch 2.13,
    torch-scatter 2.1.2, forward, against ``segment_reduce`` over the offsets) its mean is
    1.1-1.6x faster from about 64k elements with rows of 8 or more, but its sum is slower
    (0.7-0.9x) up to about 1M elements and 1.0-1.2x faster only from about 4M; with rows of one
    element both are 1.5-3x slower. (Its amax / amin were faster with long segments, but give
    other answers than torch's for NaN and infinities.)
    """
    if isinstance(values, FakeTensor) or torch.compiler.is_compiling():
        # Its ops have no fake kernels: torch's trace and count. (Asked first: before 2.13,
        # dynamo cannot trace the import lookup of scatter_available.)
        return False
    if reduce not in _SCATTER_REDUCTIONS or not scatter_available():
        return False
    if values.is_cuda:
        return _scatter_has_cuda()
    row = values.numel() // max(1, values.shape[0])
    return row >= SCATTER_MIN_ROW and values.numel() >= SCATTER_MIN_ELEMENTS[reduce]


#: On the CPU, a mean is a segment sum over the lengths from this many elements (faster than
#: segment_reduce's mean from about 64k float32 elements on 2 cores; below, its one call wins).
MEAN_BY_SUM_ELEMENTS = 1 << 16
#: On the CPU, torch-scatter pays off from this many elements (see :func:`_scatter_is_faster`).
SCATTER_MIN_ELEMENTS = {"sum": 1 << 22, "mean": 1 << 16}
#: ... and from rows of this many elements.
SCATTER_MIN_ROW = 8


@functools.cache
def _scatter_has_cuda() -> bool:
    """Whether the installed torch-scatter was built with CUDA kernels (looked up once)."""
    import torch_scatter  # noqa: F401  (registers its ops)

    return torch.ops.torch_scatter.cuda_version() != -1


def _scatter_rows(values: Tensor, batch: NestedBatch, reduce: str) -> Tensor:
    # Dtypes segment_reduce lacks (integers, bool, complex): scatter by row id.
    shape = (batch.batch_size, *values.shape[1:])
    index = batch.row_ids.view(-1, *([1] * (values.dim() - 1))).expand_as(values)
    if reduce == "sum":
        return values.new_zeros(shape).scatter_add(0, index, values)
    return values.new_zeros(shape).scatter_reduce(0, index, values, reduce, include_self=False)


def fill_empty(out: Tensor, partition: RowPartition, reduce: str) -> Tensor:
    """Write the empty-sample result into the rows of samples with no element.

    Free when the host knows that no sample is empty; otherwise one ``masked_fill`` with the
    partition's cached empty-sample mask.
    """
    if partition.host_has_empty is False:
        return out
    fill = _EMPTY.get(reduce)
    if fill is None:
        fill = fill_value_for(out.dtype, "lowest" if reduce == "amax" else "highest")
    elif out.dtype.is_complex and fill != fill:
        fill = complex(fill, fill)  # (torch's mean of no complex element: nan+nanj)
    empty = partition.empty_samples.view(-1, *([1] * (out.dim() - 1)))
    return out.masked_fill(empty, fill)


def never_wins(dtype: torch.dtype, name: str) -> float | int | bool:
    """The padding value that never wins ``name``: for ``amax`` / ``argmax`` -inf (floating
    dtypes) or the dtype's lowest value, for ``amin`` / ``argmin`` +inf or its highest."""
    lowest = name in ("amax", "argmax")
    if dtype.is_floating_point:
        return float("-inf") if lowest else float("inf")
    return fill_value_for(dtype, "lowest" if lowest else "highest")


# ------------------------------------------------------------------ the gradient of extremes
# torch's amax / amin send the gradient to every element equal to the result, split evenly
# (``scale_grad_by_count``: the gradient over the count, times the equality mask; NaN where no
# element equals the result, a NaN one). ``torch.segment_reduce``'s backward splits it only
# where the gradient is positive, and a padded amax would share it with padding that ties; so
# the extremes autograd records compute their gradient here.
def segment_extreme(values: Tensor, batch: NestedBatch, reduce: str,
                    features: tuple[int, ...] = ()) -> Tensor:
    """``amax`` / ``amin`` of every sample's packed rows ``values`` ``(total, *F)`` of a
    floating dtype and, within the rows, of the dims ``features`` (kept as size 1): ``(B, *F)``,
    with torch's gradient over all the sample's elements at once (:class:`SegmentExtreme`)."""
    out = SegmentExtreme.apply(values, batch.offsets, batch.row_ids, reduce, features)
    return fill_empty(out, batch.partition, reduce)


class SegmentExtreme(torch.autograd.Function):
    """:func:`segment_extreme` before the empty samples' fill (their rows get nothing). Its
    arguments are tensors and constants, which ``torch.compile`` traces."""

    @staticmethod
    def forward(ctx: Any, values: Tensor, offsets: Tensor, row_ids: Tensor, reduce: str,
                features: tuple[int, ...]) -> Tensor:
        inner = getattr(torch, reduce)(values, features, keepdim=True) if features else values
        name = "max" if reduce == "amax" else "min"
        out = torch.segment_reduce(inner, name, offsets=offsets, axis=0, unsafe=True)
        ctx.save_for_backward(values, out, row_ids)
        ctx.features = features
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        values, out, row_ids = ctx.saved_tensors
        ties = values == out.index_select(0, row_ids)
        per_row = ties.sum(ctx.features, keepdim=True) if ctx.features else ties
        count = _per_sample_count(per_row, out.shape, row_ids)
        return (grad / count).index_select(0, row_ids) * ties, None, None, None, None


class SegmentSum(torch.autograd.Function):
    """``sum`` (or ``mean``) of every sample's packed rows ``values`` ``(total, *F)`` of a
    floating dtype (``(B, *F)``; 0, or nan, for an empty sample), whose backward is made of
    differentiable ops (a gather of the gradient by row id, a division by the lengths): a
    gradient of the gradient exists, as torch's for a sample alone
    (``torch.segment_reduce``'s backward has none)."""

    @staticmethod
    def forward(ctx: Any, values: Tensor, offsets: Tensor, row_ids: Tensor, mean: bool
                ) -> Tensor:
        ctx.save_for_backward(offsets, row_ids)
        ctx.mean = mean
        if values.is_cpu and not isinstance(values, FakeTensor) and \
                not torch.compiler.is_compiling():
            out = accurate_segment_sum(values, offsets)  # (long samples summed in chunks)
            return _over_lengths(out, offsets[1:] - offsets[:-1]) if mean else out
        return _traced_segment_sum(values, offsets, mean)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        offsets, row_ids = ctx.saved_tensors
        if ctx.mean:
            lengths = (offsets[1:] - offsets[:-1]).clamp_min(1).to(grad.dtype)
            grad = grad / lengths.view(-1, *([1] * (grad.dim() - 1)))
        return grad.index_select(0, row_ids), None, None, None


class SegmentProduct(torch.autograd.Function):
    """``prod`` of every sample's packed rows ``values`` ``(total, *F)`` of a floating dtype
    (``(B, *F)``, 1 for an empty sample), with torch's gradient of a sample alone: the product
    over the element (``result / x``) where the sample has no zero, else the product of the
    others (``torch.segment_reduce``'s is always the latter: a NaN element got 1)."""

    @staticmethod
    def forward(ctx: Any, values: Tensor, offsets: Tensor, row_ids: Tensor) -> Tensor:
        out = torch.segment_reduce(values, "prod", offsets=offsets, axis=0, unsafe=True)
        ctx.save_for_backward(values, out, offsets, row_ids)
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        values, out, offsets, row_ids = ctx.saved_tensors
        zero = values == 0
        zeros = _per_sample_count(zero, out.shape, row_ids).index_select(0, row_ids)
        # The product of the others, written with differentiable ops that stay finite (a
        # gradient of this gradient exists): N, the product of the sample's non-zero elements,
        # times the values of its zeros but one's own. (A third zero makes every product of
        # the others, and its derivatives, 0.)
        rows = functools.partial(_segment_rows, offsets=offsets, row_ids=row_ids)
        others = rows(values.masked_fill(zero, 1), "prod")
        zero_sum = rows(values.masked_fill(~zero, 0), "sum")  # (the zeros' values: 0, with a
        # gradient)
        at_zero = others * torch.where(zeros == 1, 1.0, torch.where(
            zeros == 2, zero_sum - values, 0.0))
        elsewhere = others / values.masked_fill(zero, 1) * torch.where(
            zeros == 0, 1.0, torch.where(zeros == 1, zero_sum, 0.0))
        share = torch.where(zero, at_zero, elsewhere)
        return grad.index_select(0, row_ids) * share, None, None


def _segment_rows(values: Tensor, reduce: str, *, offsets: Tensor, row_ids: Tensor) -> Tensor:
    """``reduce`` of every sample's rows, repeated for each of its rows (``(total, *F)``)."""
    out = torch.segment_reduce(values, reduce, offsets=offsets, axis=0, unsafe=True)
    return out.index_select(0, row_ids)


def _per_sample_count(flags: Tensor, shape: torch.Size, row_ids: Tensor) -> Tensor:
    """``shape`` ``(B, *F)`` int64: the True ``flags`` ``(total, *F)`` of every sample's rows
    (the backward functions above have row ids, not a batch: compile traces tensors)."""
    return torch.zeros(shape, dtype=torch.int64, device=flags.device).index_add_(
        0, row_ids, flags.to(torch.int64))


class MaskedExtreme(torch.autograd.Function):
    """``amax`` / ``amin`` of ``data`` over ``dims``, where only the elements ``mask`` (which
    broadcasts against ``data``) marks take part and the others hold a value that never wins
    (:func:`never_wins`), with torch's gradient: split among the taking part ties only."""

    @staticmethod
    def forward(ctx: Any, data: Tensor, mask: Tensor, dims: tuple[int, ...], reduce: str
                ) -> Tensor:
        out = getattr(torch, reduce)(data, dims, keepdim=True)
        ctx.save_for_backward(data, mask, out)
        ctx.dims = dims
        return out.squeeze(dims)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        data, mask, out = ctx.saved_tensors
        ties = (data == out) & mask
        count = ties.sum(ctx.dims, keepdim=True)
        return grad.view(out.shape) / count * ties, None, None, None


def masked_extreme(data: Tensor, mask: Tensor, dims: tuple[int, ...], reduce: str) -> Tensor:
    """``amax`` / ``amin`` (``reduce``) of ``data`` over ``dims``, its padding (not ``mask``)
    holding :func:`never_wins`; where autograd records, through :class:`MaskedExtreme`."""
    if data.requires_grad and torch.is_grad_enabled():
        return MaskedExtreme.apply(data, mask, dims, reduce)
    return getattr(torch, reduce)(data, dims)

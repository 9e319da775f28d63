"""Reductions (sum, mean, max, ..., var/std, any/all) and softmax over ragged or feature dims.

Over the ragged dims: segment reductions on packed rows (:mod:`nestbatch.ops.segment`), masked
ones on padded data, a dense ``(B, *feature)`` result; over feature dims only: a batch of the
same rows; both together: the ragged dims first. Empty samples, half precision, special values
and moved ragged dims follow the rules of ``docs/ops.rst`` (the one statement of them); one
level of a nested batch reduces in :mod:`nestbatch.ops.levels`.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from nestbatch.batch import NestedBatch, cached_layout, storage_dim
from nestbatch.checks import check_castable, ragged_out_error
from nestbatch.layouts import Layout
from nestbatch.ops.common import (
    PACKED_OR_PADDED,
    argument,
    dim_kind,
    fill_value_for,
    logical_flat_index,
    normalize_dim,
    torch_funcs,
    values_dim,
    wrap_padded,
)
from nestbatch.ops.elementwise import elementwise, expand_mask
from nestbatch.ops.levels import reduce_level
from nestbatch.ops.registry import register
from nestbatch.ops.segment import (
    WIDENED_DTYPES,
    fill_empty,
    masked_extreme,
    never_wins,
    segment_extreme,
    segment_reduce,
)

_COMPOSABLE = {"sum", "mean", "prod", "amax", "amin", "logsumexp", "count_nonzero", "any", "all"}
_SECOND_STAGE = {"count_nonzero": "sum"}  # how a feature stage continues a ragged stage



def _dims(batch: NestedBatch, dim: Any) -> tuple[int, ...] | None:
    if dim is None:
        return None
    dims = (dim,) if isinstance(dim, int) else tuple(dim)
    if not dims:
        return None  # (torch reads dim=() as every dim)
    return tuple(sorted({normalize_dim(batch, d) for d in dims}))


def _split_dims(
    batch: NestedBatch, dims: tuple[int, ...], name: str
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The ragged dims that reduce, and the feature dims (as dims of the packed values)."""
    k = batch.num_ragged_dims  # (dim 0 is handled by _across_samples)
    ragged = tuple(d for d in dims if dim_kind(batch, d) == "ragged")
    one_level = len(ragged) == 1 and batch.partition.ragged_rank > 1  # (see ops.levels)
    if ragged and len(ragged) != k and not one_level:
        raise ValueError(
            f"{name} over ragged dim(s) {list(ragged)} of a batch with {k} ragged dims: reduce "
            f"all ragged dims at once (dim={tuple(range(1, k + 1))}) or pad first (.padded())"
        )
    return ragged, tuple(values_dim(batch, d) for d in dims if d not in ragged)


# =========================================================================== ragged-dim kernels
def _lengths_like(batch: NestedBatch, out: Tensor) -> Tensor:
    return batch.lengths.view(-1, *([1] * (out.dim() - 1)))


def _ragged_packed(batch: NestedBatch, name: str, values: Tensor, correction: float) -> Any:
    if name in ("sum", "mean", "prod", "amax", "amin"):
        return segment_reduce(values, batch, name)
    if name in ("count_nonzero", "any"):
        count = segment_reduce((values != 0).to(torch.int64), batch, "sum")
        return count > 0 if name == "any" else count
    if name == "all":
        return segment_reduce((values == 0).to(torch.int64), batch, "sum") == 0
    if name == "logsumexp":
        # Shift by the sample's maximum for a stable exp; 0 where it is not finite or empty.
        detached = values.detach()  # (complex values: shifted by their real parts' maximum)
        peak = segment_reduce(detached.real if detached.is_complex() else detached, batch,
                              "amax")
        bad = ~torch.isfinite(peak) | (_lengths_like(batch, peak) == 0)
        shift = torch.where(bad, torch.zeros_like(peak), peak)
        total = segment_reduce((values - shift[batch.row_ids]).exp(), batch, "sum")
        return total.log() + shift
    if name in ("var", "std"):
        if values.shape[0]:
            values = _shifted_by_first(values, batch)
        mean = segment_reduce(values, batch, "mean")
        dev = values - mean[batch.row_ids]
        squares = segment_reduce((dev * dev.conj()).real, batch, "sum")
        return _finish_var(squares, batch, correction, name)
    if name in ("argmax", "argmin"):
        return _segment_arg(batch, values, name)
    raise _unknown_reduction(name)


def _shifted_by_first(values: Tensor, batch: NestedBatch) -> Tensor:
    """``values`` ``(total, *F)`` less each sample's first row, where that subtraction stays
    finite (the variance does not change).

    The shift keeps the mean pass's sum from overflowing where the values are huge but close
    together (two float64 maxima have variance 0, the exact value, where torch 2.13's CPU
    ``torch.var`` gives inf: a known difference, kept for now). Where the
    values span most of the range instead, the shift itself would overflow (``-max - max``) and
    give NaN where torch gives inf: such samples (per feature) are left unshifted.
    """
    detached = values.detach()
    first = batch.offsets[:-1].clamp(max=values.shape[0] - 1)
    start = detached.index_select(0, first)
    overflows = torch.isfinite(detached) & ~torch.isfinite(detached - start[batch.row_ids])
    unsafe = segment_reduce(overflows.to(torch.int64), batch, "amax") > 0
    shift = torch.where(unsafe, torch.zeros_like(start), start)
    return values - shift[batch.row_ids]


def _finish_var(squares: Tensor, batch: NestedBatch, correction: float, name: str) -> Tensor:
    dof = (_lengths_like(batch, squares) - correction).clamp_min(0).to(squares.dtype)
    var = squares / dof
    if name != "std":
        return var
    if var.requires_grad and torch.is_grad_enabled():
        # torch's std has gradient 0 where it is 0; sqrt's derivative there is infinite, and
        # 0 * inf is NaN even through a where: the zeros take the root of 1 instead.
        zero = var == 0
        return torch.where(zero, 0.0, torch.where(zero, 1.0, var).sqrt())
    return var.sqrt()


def _segment_arg(batch: NestedBatch, values: Tensor, name: str) -> Tensor:
    best = segment_reduce(values, batch, "amax" if name == "argmax" else "amin")
    best_rows = best[batch.row_ids]
    hit = values == best_rows
    if values.is_floating_point() or values.is_complex():
        # NaN is the largest and the smallest value (torch.argmax points at the first NaN),
        # and NaN == NaN is False.
        hit = hit | (values.isnan() & best_rows.isnan())
    positions = batch.partition.positions.view(-1, *([1] * (values.dim() - 1)))
    big = torch.iinfo(torch.int64).max
    candidates = torch.where(hit, positions, torch.full_like(positions, big))
    first = segment_reduce(candidates, batch, "amin")  # the first hit, as torch.argmax
    return torch.where(first == big, torch.full_like(first, -1), first)


def _ragged_padded(batch: NestedBatch, name: str, dtype: Any, correction: float) -> Any:
    padded = batch.padded(None)
    data = padded.data if dtype is None else padded.data.to(dtype)
    k = batch.num_ragged_dims
    dims = tuple(range(1, 1 + k))
    mask = expand_mask(padded.mask, data)
    if name in ("argmax", "argmin", "amax", "amin"):
        filled = data.masked_fill(~mask, never_wins(data.dtype, name))
        if name in ("amax", "amin"):
            out = masked_extreme(filled, mask, dims, name)  # (padding that ties takes no grad)
            # An empty sample reduced over infinities: TF's finite extreme instead.
            return fill_empty(out, batch.partition, name)
        # The padding follows every sample's elements: a filler equal to a sample's best value
        # loses to it (the first hit wins), so the extreme of the dtype, infinities included,
        # never points past the sample's end.
        flat = filled.flatten(1, k)
        index = flat.argmax(1) if name == "argmax" else flat.argmin(1)
        return torch.where(_lengths_like(batch, index) == 0, torch.full_like(index, -1), index)
    if name in ("count_nonzero", "any"):
        present = ((data != 0) & mask).flatten(1, k)
        return present.any(1) if name == "any" else present.sum(1)
    if name == "all":
        return ((data != 0) | ~mask).flatten(1, k).all(1)
    if name in ("sum", "mean"):
        total = data.masked_fill(~mask, 0).sum(dims)
        return total / _lengths_like(batch, total) if name == "mean" else total
    if name == "prod":
        return data.masked_fill(~mask, 1).flatten(1, k).prod(1)
    if name == "logsumexp":
        return data.masked_fill(~mask, float("-inf")).logsumexp(dims)
    if name in ("var", "std"):
        # Shifted by each sample's first element where that stays finite, as on the packed
        # rows (_shifted_by_first).
        detached = data.detach()
        start = detached[(slice(None), *[slice(0, 1)] * k)]
        overflows = torch.isfinite(detached) & ~torch.isfinite(detached - start) & mask
        unsafe = overflows.flatten(1, k).any(1, keepdim=True).view(start.shape)
        data = data - torch.where(unsafe, torch.zeros_like(start), start)
        count = _lengths_like(batch, data).to(data.dtype)
        mean = data.masked_fill(~mask, 0).sum(dims, keepdim=True) / count
        dev = (data - mean).masked_fill(~mask, 0)
        return _finish_var((dev * dev.conj()).real.sum(dims), batch, correction, name)
    raise _unknown_reduction(name)


# =========================================================================== the entry points
#: Dtypes whose variance torch's CPU kernels accumulate in float64.
_DOUBLE_VARIANCE = frozenset({torch.float16, torch.bfloat16, torch.float32})

#: Reductions that accumulate: widened from half precision (see :func:`reduce`).
_ACCUMULATING = frozenset({"sum", "mean", "prod", "logsumexp", "var", "std"})


def reduce(layout: Layout, batch: NestedBatch, name: str, dims: tuple[int, ...] | None,
           keepdim: bool, dtype: Any = None, correction: float = 1) -> Any:
    """Reduce ``batch`` over ``dims`` with the reduction ``name`` (see the module docstring)."""
    asked = dtype
    func = getattr(torch, name)
    extra = {"correction": correction} if name in ("var", "std") else {}
    if dtype is not None:
        extra["dtype"] = dtype
    if dims is None:
        if name in ("argmax", "argmin"):
            out = _flat_arg(batch, func)
            return out.reshape((1,) * batch.dim()) if keepdim else out
        values = batch.packed().values
        out = func(values, **extra) if name != "logsumexp" else func(values.flatten(), 0)
        return out.reshape((1,) * batch.dim()) if keepdim else out  # (every dim kept as 1)
    if 0 in dims:
        return _across_samples(batch, func, name, dims, keepdim, extra)
    ragged, features = _split_dims(batch, dims, name)
    if not ragged:
        out = _feature_reduce(func, batch.packed().values, features, keepdim, extra)
        moved_by = 0 if keepdim else sum(d < batch.ragged_dim for d in dims)
        return batch.with_values(out, batch.ragged_dim - moved_by)
    if features and (name not in _COMPOSABLE or len(ragged) < batch.num_ragged_dims):
        raise ValueError(
            f"{name} over ragged and feature dims at once is not supported; reduce the ragged "
            "dim(s) first, then the result"
        )
    result_dtype = batch.dtype if dtype is None else dtype
    _check_ragged_dtype(name, result_dtype)
    if len(ragged) < batch.num_ragged_dims:  # one level of a nested batch
        return reduce_level(batch, name, ragged[0], keepdim, dtype)
    if name == "logsumexp" and not (result_dtype.is_floating_point or result_dtype.is_complex):
        # torch.logsumexp of integers and bools is computed in the default float dtype.
        result_dtype = dtype = torch.get_default_dtype()
    widened = name in _ACCUMULATING and result_dtype in WIDENED_DTYPES
    if widened:
        # Half precision: computed in float32 and rounded once, as torch's reductions are
        # (torch.segment_reduce would sum in half precision, and a sum rounded before it is
        # divided or reduced over the feature dims rounds twice).
        dtype = WIDENED_DTYPES[result_dtype]
    if name in ("var", "std") and result_dtype in _DOUBLE_VARIANCE and batch.device.type == "cpu":
        # As torch's CPU kernels: in float64, which neither overflows (float32 values near
        # its maximum have a finite std) nor underflows. (On CUDA torch's, and these, are
        # computed in float32.)
        dtype = torch.float64
        widened = True
    if features and name in ("amax", "amin"):
        out, features = _extreme_rows_last(batch, func, name, features, keepdim), ()
    elif features and name == "logsumexp":
        values = batch.packed().values
        values = values if dtype is None else values.to(dtype)
        out, features = _logsumexp_rows_and_features(batch, values, features, keepdim), ()
    elif layout is Layout.PADDED and all(batch.max_shape) and not (
            name == "prod" and batch.requires_grad and torch.is_grad_enabled()):
        # (A product autograd records runs on the rows: torch's gradient of a padded product
        # depends on whether another sample holds a zero.)
        out = _ragged_padded(batch, name, dtype, correction)
    else:
        values = batch.packed().values
        out = _ragged_packed(batch, name, values if dtype is None else values.to(dtype),
                             correction)
    if features:
        second = getattr(torch, _SECOND_STAGE.get(name, name))
        out = _feature_reduce(second, out, features, keepdim, {})
    if widened:
        out = out.to(result_dtype)
    if name in ("any", "all") and batch.dtype == torch.uint8:
        out = out.to(torch.uint8)  # (torch's any / all of uint8 are uint8; of others bool)
    if asked is not None and out.dtype != asked:
        out = out.to(asked)  # (integer rows are summed in int64: the same bits, wrapped)
    if keepdim:
        k = batch.num_ragged_dims
        if k == 1:
            return out.unsqueeze(batch.ragged_dim)  # the ragged dim's logical position
        out = out.view(out.shape[0], *([1] * k), *out.shape[1:])
    return out


def _extreme_rows_last(batch: NestedBatch, func: Any, name: str, features: tuple[int, ...],
                       keepdim: bool) -> Tensor:
    """``amax`` / ``amin`` over the ragged dim(s) and ``features`` (dims of the packed values):
    ``(B, *F)`` with the feature dims kept as size 1 where ``keepdim``, else dropped.

    torch keeps the first of equal extremes in row-major order (``0.0`` before ``-0.0``), so
    the feature dims are reduced inside every row first, then the rows of every sample.
    """
    values = batch.packed().values
    if values.requires_grad and torch.is_grad_enabled():  # the ties of all the sample at once
        out = segment_extreme(values, batch, name, features)
    else:
        out = segment_reduce(_feature_reduce(func, values, features, True, {}), batch, name)
    return out if keepdim else out.squeeze(features)


def _logsumexp_rows_and_features(batch: NestedBatch, values: Tensor,
                                 features: tuple[int, ...], keepdim: bool) -> Tensor:
    """``logsumexp`` over the ragged dim and ``features`` (dims of the packed ``values``) at
    once, as torch's over several dims: shifted by the sample's maximum (of the real parts for
    complex values; 0 where that is not finite), so that an element of ``-inf`` gets gradient 0
    (a ragged stage first gave a column of ``-inf`` NaN). ``(B, *F)``, the feature dims kept as
    size 1 where ``keepdim``."""
    source = values.detach()
    source = source.real if source.is_complex() else source  # (torch's shift for complex)
    peak = segment_reduce(source.amax(features, keepdim=True), batch, "amax")
    bad = ~torch.isfinite(peak) | (_lengths_like(batch, peak) == 0)
    shift = torch.where(bad, torch.zeros_like(peak), peak)
    exps = (values - shift[batch.row_ids]).exp().sum(features, keepdim=True)
    out = segment_reduce(exps, batch, "sum").log() + shift
    return out if keepdim else out.squeeze(features)


def _flat_arg(batch: NestedBatch, func: Any) -> Tensor:
    """``argmax`` / ``argmin`` over every dim (torch.nested's): the index into the samples
    flattened one after another, each in its logical order (``torch.cat([s.flatten() for s in
    batch.unbind()])``), of the first extreme (NaN counting as one, as torch's). 0-d int64.

    With the ragged dim in place, that order is the packed values' own; with it moved, each
    element's logical index is computed and the smallest among the extremes taken."""
    values = batch.packed().values
    if batch.ragged_dim == 1 or values.numel() == 0:  # (torch's error for no element)
        return func(values)
    extreme = (torch.amax if func is torch.argmax else torch.amin)(values)
    hits = (values == extreme) | (values.isnan() & extreme.isnan())
    logical = logical_flat_index(batch, values.shape)
    return torch.where(hits, logical, logical.numel()).amin()


def _across_samples(batch: NestedBatch, func: Any, name: str, dims: tuple[int, ...],
                    keepdim: bool, extra: dict) -> Tensor:
    """Reduce over the batch dim, which takes every ragged dim with it (torch.nested's rule):
    one reduction of all packed rows, a dense result."""
    ragged = tuple(d for d in range(1, batch.dim()) if dim_kind(batch, d) == "ragged")
    if not set(ragged) <= set(dims):
        raise ValueError(
            f"{name} over dim 0 (the batch) is not supported on a NestedBatch without its "
            f"ragged dim(s) {list(ragged)}: samples differ in size; reduce them too "
            f"(dim={(0, *ragged)}), or reduce .values (all packed rows)"
        )
    features = tuple(values_dim(batch, d) for d in dims if d != 0 and d not in ragged)
    out = _feature_reduce(func, batch.packed().values, (0, *features), keepdim, extra)
    if keepdim:  # the packed rows' dim stands for the batch and the ragged dims
        if batch.num_ragged_dims == 1:
            return out.unsqueeze(batch.ragged_dim)
        return out.view(1, *([1] * batch.num_ragged_dims), *out.shape[1:])
    return out


def _check_ragged_dtype(name: str, dtype: torch.dtype) -> None:
    """Refuse, on every layout and with torch's message, the dtypes torch's reduction refuses
    (the padded and packed kernels would otherwise answer differently: a padded mean of
    integers divides in floats)."""
    if name in ("mean", "var", "std") and not (dtype.is_floating_point or dtype.is_complex):
        if name == "mean":
            raise RuntimeError(
                "mean(): could not infer output dtype. Input dtype must be either a floating "
                f"point or complex dtype. Got: {dtype} (give dtype= or convert the batch)"
            )
        raise RuntimeError(
            f"{name}: std and var only support floating point and complex dtypes, got {dtype}"
        )
    if name in ("argmax", "argmin") and dtype == torch.bool:
        raise RuntimeError(f"{name}(): does not support bool input")


def _feature_reduce(func: Any, values: Tensor, dims: tuple[int, ...], keepdim: bool,
                    extra: dict) -> Tensor:
    if func in (torch.any, torch.all, torch.argmax, torch.argmin) and len(dims) == 1:
        return func(values, dims[0], keepdim=keepdim)
    if func is torch.prod:
        # torch.prod takes one dim: reduce the dims one at a time, the last first.
        for d in sorted(dims, reverse=True):
            values = torch.prod(values, d, keepdim=keepdim, **extra)
            extra = {}
        return values
    if func is torch.count_nonzero:
        out = func(values, dims)
        return out.view(*(1 if d in dims else s for d, s in enumerate(values.shape))) \
            if keepdim else out
    return func(values, dims, keepdim=keepdim, **extra)


_NAMES = ("sum", "nansum", "mean", "prod", "amax", "amin", "argmax", "argmin", "logsumexp",
          "count_nonzero", "any", "all")

#: The reductions :func:`_segment_fast_path` serves, by function.
_SEGMENT_FAST = {
    func: func.__name__ for func in torch_funcs("sum", "mean", "amax", "amin")
}


def _segment_fast_path(func: Any, args: tuple, kwargs: dict) -> Any:
    """``sum`` / ``mean`` / ``amax`` / ``amin`` over dim 1, the ragged dim, of a batch with one
    ragged dim and floating packed rows at hand: one segment reduction on the cached offsets,
    what the general path computes, without its argument bookkeeping (most of the host time
    of a small call). ``NotImplemented`` for any other call."""
    name = _SEGMENT_FAST.get(func)
    if name is None:
        return NotImplemented
    if len(args) == 2 and not kwargs:
        dim = args[1]
    elif len(args) == 1 and len(kwargs) == 1:
        dim = kwargs.get("dim")
    else:
        return NotImplemented
    batch = args[0]
    if type(dim) is not int or dim != 1 or type(batch) is not NestedBatch:
        return NotImplemented
    packed = cached_layout(batch, Layout.PACKED)
    if packed is None or batch.ragged_dim != 1 or packed.partition.num_ragged_dims != 1:
        return NotImplemented
    if not packed.values.is_floating_point():
        return NotImplemented
    return segment_reduce(packed.values, batch, name)


#: The reductions torch computes in their ``out=`` tensor's dtype (``mean`` is not one: an
#: integer input raises, as torch's).
_TAKE_DTYPE = frozenset({"sum", "nansum", "prod"})
#: The reductions whose ``out=`` must have the result's dtype exactly (torch refuses another).
_EXACT_OUT = frozenset({"amax", "amin", "argmax", "argmin", "any", "all", "max", "min",
                        "count_nonzero"})


@register(*torch_funcs(*_NAMES), layouts=PACKED_OR_PADDED, prefer=Layout.PACKED,
          moved_ragged=True, fast=_segment_fast_path, nested=True, out=True)
def _reduction(layout: Layout, func: Any, args: tuple, kwargs: dict) -> Any:
    batch = args[0]
    kwargs = dict(kwargs)
    out = kwargs.pop("out", None)
    dtype = kwargs.get("dtype")
    if dtype is None and out is not None and func.__name__ in _TAKE_DTYPE:
        dtype = out.dtype  # (torch computes such a reduction in its out tensor's dtype)
    if func.__name__ == "nansum" and batch.dtype.is_complex:
        raise RuntimeError("nansum on CPU does not support complex inputs")
    if func.__name__ == "nansum" and batch.dtype.is_floating_point:
        # NaN counts as 0, before any cast (nansum(x, dtype=bool) of a NaN is False);
        # infinities stay (nan_to_num would make them the dtype's extremes).
        values = batch.packed().values
        if dtype is not None and not dtype.is_floating_point:
            torch.nansum(values.new_zeros(1), dtype=dtype)  # (raises where torch refuses it)
        batch = batch.with_values(values.masked_fill(values.isnan(), 0))
    rounded_to = None
    if func.__name__ == "mean" and dtype in WIDENED_DTYPES and dtype != batch.dtype:
        # torch's CPU mean in half precision: the float32 mean of the input, rounded once
        # (mean(x, dtype=float16) of 1e5 and 0 is 5e4, not the mean of x rounded first: inf).
        rounded_to, dtype = dtype, torch.float32
    if dtype is not None and dtype != batch.dtype:
        batch = batch.to(dtype)  # torch casts the input first (sum(x, dtype=int8) wraps)
    name = "sum" if func.__name__ == "nansum" else func.__name__
    dims = _dims(batch, argument(args, kwargs, 1, "dim", kwargs.get("axis")))
    keepdim = bool(argument(args, kwargs, 2, "keepdim", False))
    result = reduce(layout, batch, name, dims, keepdim, dtype)
    if rounded_to is not None:
        result = result.to(rounded_to)
    return write_out(result, out, func.__name__)


@register(*torch_funcs("var", "std"), layouts=PACKED_OR_PADDED, prefer=Layout.PACKED,
          moved_ragged=True, out=True)
def _variance(layout: Layout, func: Any, args: tuple, kwargs: dict) -> Any:
    batch = args[0]
    dims = _dims(batch, argument(args, kwargs, 1, "dim"))
    unbiased = argument(args, kwargs, 2, "unbiased")
    correction = kwargs.get("correction", 0 if unbiased is False else 1)
    keepdim = bool(argument(args, kwargs, 3, "keepdim", False))
    if batch.dtype.is_complex:
        # torch's: the variances of the real and imaginary parts, each in the real dtype (so
        # each rounded, and overflowing, as torch's), added; then the root.
        parts = [reduce(layout, part, "var", dims, keepdim, correction=correction)
                 for part in (torch.real(batch), torch.imag(batch))]
        result = parts[0] + parts[1]
        result = result.sqrt() if func.__name__ == "std" else result
    else:
        result = reduce(layout, batch, func.__name__, dims, keepdim, correction=correction)
    return write_out(result, kwargs.get("out"), func.__name__)


def write_out(result: Any, out: Any, name: str) -> Any:
    """``result``, written into ``out`` when given (a tensor, or a pair for ``max`` / ``min``
    with a dim), as torch's ``out=``: resized to the result's shape (with torch's warning when
    it held elements), the result cast to its dtype where torch casts, and returned.

    Raises
    ------
    TypeError
        For a ragged result (a batch): no tensor holds it.
    RuntimeError
        Where torch raises: a result dtype that cannot be cast to ``out``'s, or a result autograd
        records (``out=`` is not differentiable).
    """
    if out is None:
        return result
    if isinstance(result, tuple):
        if not isinstance(out, tuple | list) or len(out) != len(result):
            raise TypeError(f"{name}: out must be a tuple of {len(result)} tensors")
        return type(result)(write_out(r, o, name) for r, o in zip(result, out))
    if isinstance(result, NestedBatch):
        raise ragged_out_error(name)
    if not isinstance(out, Tensor):
        raise TypeError(f"{name}: out must be a Tensor, got {type(out).__name__}")
    if result.requires_grad and torch.is_grad_enabled():
        raise RuntimeError(f"{name}(): functions with out=... arguments don't support automatic "
                           "differentiation, but one of the arguments requires grad.")
    check_castable(result.dtype, out.dtype)
    if name in _EXACT_OUT and out.dtype != result.dtype:
        raise RuntimeError(f"{name}: expected out tensor to have dtype {result.dtype}, but got "
                           f"{out.dtype} instead")
    if out.shape != result.shape:
        if out.numel():
            warnings.warn(f"An output with one or more elements was resized since it had shape "
                          f"{list(out.shape)}, which does not match the required output shape "
                          f"{list(result.shape)}.", UserWarning, stacklevel=3)
        out.resize_(result.shape)
    return out.copy_(result)


@register(*torch_funcs("max", "min"), layouts=PACKED_OR_PADDED, prefer=Layout.PACKED,
          moved_ragged=True, out=True)
def _max_min(layout: Layout, func: Any, args: tuple, kwargs: dict) -> Any:
    """``max(x)``: a 0-d tensor; ``max(x, dim)``: ``(values, indices)``; ``max(x, y)``: maximum."""
    batch = args[0]
    if kwargs.get("out") is not None:
        out = kwargs["out"]
        kept = {key: v for key, v in kwargs.items() if key != "out"}
        return write_out(_max_min(layout, func, args, kept), out, func.__name__)
    other = argument(args, kwargs, 1, "dim", kwargs.get("other"))
    name = func.__name__
    if other is None:
        return func(batch.values)
    if not isinstance(other, int):
        pair = torch.maximum if name == "max" else torch.minimum
        return elementwise(Layout.PACKED, pair, (batch, other), {})
    dims = _dims(batch, other)
    keepdim = bool(argument(args, kwargs, 2, "keepdim", False))
    result_type = torch.return_types.max if name == "max" else torch.return_types.min
    kind = dim_kind(batch, dims[0])
    if kind == "feature":  # torch's own op on the rows: its values, indices and gradient
        best, index = func(batch.packed().values, values_dim(batch, dims[0]), keepdim)
        ragged_dim = batch.ragged_dim - (not keepdim and dims[0] < batch.ragged_dim)
        return result_type((batch.with_values(best, ragged_dim),
                            batch.with_values(index, ragged_dim)))
    # torch.max(bools, dim) has indices though torch.argmax(bools) is refused: found on 0 / 1.
    ranked = batch.to(torch.uint8) if batch.dtype == torch.bool else batch
    arg = "argmax" if name == "max" else "argmin"
    if kind == "ragged" and batch.partition.ragged_rank == 1 and batch.num_ragged_dims == 1:
        # The values are the rows at the indices, as torch's (the gradient goes to them alone,
        # where amax would split it among ties).
        index = reduce(layout, ranked, arg, dims, False)
        best = _rows_at(batch, index, name)
        if keepdim:
            best, index = best.unsqueeze(batch.ragged_dim), index.unsqueeze(batch.ragged_dim)
        return result_type((best, index))
    best = reduce(layout, batch, "amax" if name == "max" else "amin", dims, keepdim)
    return result_type((best, reduce(layout, ranked, arg, dims, keepdim)))


def _rows_at(batch: NestedBatch, index: Tensor, name: str) -> Tensor:
    """``(B, *F)``: every sample's packed row ``index`` (``(B, *F)`` positions in the sample,
    -1 for an empty one, which gets the documented empty extreme)."""
    values = batch.packed().values
    reduce = "amax" if name == "max" else "amin"
    if values.shape[0] == 0:
        return values.new_full(index.shape, fill_value_for(
            values.dtype, "lowest" if name == "max" else "highest"))
    start = batch.offsets[:-1].view(-1, *([1] * (index.dim() - 1)))
    rows = (start + index.clamp(min=0)).clamp(max=values.shape[0] - 1)
    return fill_empty(values.gather(0, rows), batch.partition, reduce)  # (empty: index -1)


# =========================================================================== softmax
@register(*torch_funcs("softmax", functional=True), torch.special.softmax,
          layouts=PACKED_OR_PADDED, prefer=Layout.PACKED, moved_ragged=True)
def _softmax(layout: Layout, func: Any, args: tuple, kwargs: dict) -> Any:
    return _softmax_call(layout, args, kwargs, log=False)


# Registered apart from softmax, so that no name test (untraceable by dynamo) tells them apart.
@register(*torch_funcs("log_softmax", functional=True), torch.special.log_softmax,
          layouts=PACKED_OR_PADDED, prefer=Layout.PACKED, moved_ragged=True)
def _log_softmax(layout: Layout, func: Any, args: tuple, kwargs: dict) -> Any:
    return _softmax_call(layout, args, kwargs, log=True)


@register(F.softmin, layouts=PACKED_OR_PADDED, prefer=Layout.PACKED, moved_ragged=True)
def _softmin(layout: Layout, func: Any, args: tuple, kwargs: dict) -> Any:
    """``F.softmin``: as torch computes it, the softmax of the negated batch."""
    batch = args[0]
    dim = argument(args, kwargs, 1, "dim")
    if dim is None:
        raise ValueError("softmin on a NestedBatch needs an explicit dim")
    dtype = argument(args, kwargs, 3, "dtype")
    return softmax(layout, -batch, normalize_dim(batch, dim), dtype=dtype)


def _softmax_call(layout: Layout, args: tuple, kwargs: dict, *, log: bool) -> Any:
    batch = args[0]
    dim = argument(args, kwargs, 1, "dim")
    if dim is None:
        raise ValueError("softmax on a NestedBatch needs an explicit dim")
    dim = normalize_dim(batch, dim)
    dtype = next((a for a in args[2:] if isinstance(a, torch.dtype)), kwargs.get("dtype"))
    return softmax(layout, batch, dim, log=log, dtype=dtype)


def softmax(layout: Layout, batch: NestedBatch, dim: int, *, log: bool = False,
            dtype: Any = None) -> NestedBatch:
    """Softmax (or log-softmax) of ``batch`` along ``dim`` (normalized); padding excluded.

    Returns
    -------
    NestedBatch
        Same structure. Over the ragged dim, where the padding is cheap (at most
        :data:`SOFTMAX_PADDING_RATIO` padded slots per element, sizes known on the host) or the
        batch is stored padded: ``torch.softmax`` of the data padded with ``-inf`` (one
        conversion kernel, one softmax; the result stays padded). Otherwise a segment softmax on
        the packed rows (two segment reductions, two row gathers and three elementwise ops;
        float16 / bfloat16 values are widened to float32 first and the result cast back, two
        more, so that the sums do not lose precision).
    """
    kind, stored = storage_dim(batch, dim)
    fn = F.log_softmax if log else F.softmax
    if kind == "batch":
        raise ValueError("softmax over dim 0 (the batch) is not supported on a NestedBatch")
    if kind == "feature" or not (batch.dtype if dtype is None else dtype).is_floating_point:
        # (Over the ragged dim, torch's softmax of integers or complex numbers raises its own
        # error, but of no element, which it returns: so does the same call on the rows.)
        return batch.with_values(fn(batch.values, stored if kind == "feature" else 0,
                                    dtype=dtype))
    if batch.num_ragged_dims == 1 and layout is Layout.PACKED and not _pads_cheaply(batch):
        values = batch.values if dtype is None else batch.values.to(dtype)
        return batch.with_values(_segment_softmax(batch, values, log))
    padded = batch.padded(float("-inf")) if batch.dtype.is_floating_point else batch.padded(None)
    data = padded.data if dtype is None else padded.data.to(dtype)
    if padded.padding_value != float("-inf"):
        data = data.masked_fill(~expand_mask(padded.mask, data), float("-inf"))
    out = fn(data, stored)
    # Padded slots of a non-empty sample come out as exp(-inf) = 0 (log: -inf).
    filler = None if padded.partition.host_has_empty is not False else (
        float("-inf") if log else 0.0)
    return wrap_padded(out, padded.partition, batch.ragged_dim, filler)


#: Padded softmax runs when the padded data has at most this many slots per element: it makes
#: two passes over the padded slots where the segment softmax makes about seven over the rows.
SOFTMAX_PADDING_RATIO = 3


def _pads_cheaply(batch: NestedBatch) -> bool:
    partition = batch.partition
    if not (partition.knows_max_shape and partition.knows_total):
        return False  # the padded width or the total would have to be read from the device
    slots = partition.batch_size * partition.max_shape[0]
    return slots <= SOFTMAX_PADDING_RATIO * max(partition.total, 1)


def _segment_softmax(batch: NestedBatch, values: Tensor, log: bool) -> Tensor:
    if not values.is_floating_point():
        raise RuntimeError(f"softmax is not defined for {values.dtype}; convert to a float dtype")
    if values.dtype in WIDENED_DTYPES:
        # The sums of exps in float32 and one rounding, as torch.softmax: summed in half
        # precision, a long sample's probabilities add up to 10 instead of 1.
        wide = values.to(WIDENED_DTYPES[values.dtype])
        return _segment_softmax(batch, wide, log).to(values.dtype)
    offsets, rows = batch.offsets, batch.row_ids
    # Samples whose rows are all -inf give nan, as torch.softmax does; empty samples have no rows.
    peak = torch.segment_reduce(values.detach(), "max", offsets=offsets, axis=0, unsafe=True)
    shifted = values - peak.index_select(0, rows)
    exp = shifted.exp()
    total = torch.segment_reduce(exp, "sum", offsets=offsets, axis=0, unsafe=True)
    if log:
        return shifted - total.log().index_select(0, rows)
    return exp / total.index_select(0, rows)


def _unknown_reduction(name: str) -> ValueError:
    # (A guard: the registry only sends the reductions it registered.)
    return ValueError(f"unknown reduction {name}")

"""Order statistics and paired reductions: ``median``, ``nanmedian``, ``quantile``,
``nanquantile``, ``mode``, ``aminmax``, ``var_mean`` and ``std_mean``.

Each gives what torch's function gives on every sample alone, batched, with dims read logically
(a moved ragged dim included, see :func:`~nestbatch.batch.storage_dim`):

* over a feature dim: torch's own function on the packed rows, a batch (its values, indices and
  gradient are torch's);
* over the ragged dim (one ragged dim): a dense ``(B, *F)`` tensor, one value per sample
  (``quantile`` with a 1-d ``q``: ``(B, Q, *F)``, the ``q`` dim first in every sample's result,
  as torch's). ``median`` / ``nanmedian`` / ``quantile`` / ``nanquantile`` / ``mode`` read
  every sample's rows in torch's stable ascending order (NaN last) from the sort helpers of
  :mod:`nestbatch.ops.ordering`, then pick ranks there with a few whole-batch ops; ``aminmax``
  and ``var_mean`` / ``std_mean`` are nestbatch's own ``amin`` / ``amax``, ``var`` / ``std``
  and ``mean`` of the batch;
* with no dim (``median()``, ``nanmedian()``, ``quantile(q)``, ``aminmax()``, ``var_mean(x)``):
  torch's function of every element of every sample, one sample after another (the packed
  values: the result does not depend on their order);
* over dim 0 (the batch): a ``ValueError``, as the reductions: it would mix samples.

An empty sample gets torch's answer for it: ``median`` / ``nanmedian`` / ``mode`` /
``aminmax`` along the ragged dim raise torch's ``IndexError`` and ``quantile`` /
``nanquantile`` its ``RuntimeError`` (named with the first such sample), ``var_mean`` /
``std_mean`` give NaN. Finding such a sample reads the sizes where only the device holds them
(one sync, which torch's own error needs); with the sizes on the host nothing is read.

Indices equal torch's wherever the sample has no ties. Among equal values torch's CPU kernels
pick by an unstable selection (``median``) or sort (``mode``); here ``median`` picks in the
stable order and ``mode`` gives the last occurrence of its value (torch's CPU choice for samples
of up to 16 elements). torch's CPU ``mode`` of a sample holding NaN is not well defined (its
sort compares NaN as neither smaller nor larger, which breaks the ordering); here a NaN counts
once per occurrence (``NaN != NaN``, as torch's count of runs) and sorts last, so it is the mode
only of a sample of NaN alone. The sign of a zero that ties with another extreme in
``aminmax`` is the first one's (``amin`` / ``amax``'s), where torch's kernel may keep another.

A batch with several ragged dims runs these ops over feature dims or with no dim and refuses a
ragged dim (``ValueError``); the registry refuses ragged rank ``r >= 2``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from nestbatch.batch import NestedBatch, storage_dim
from nestbatch.layouts import Layout
from nestbatch.ops.common import (
    PACKED_OR_PADDED,
    argument,
    logical_elements,
    normalize_dim,
    torch_funcs,
)
from nestbatch.ops.ordering import padded_sort, sorts_padded, stable_order
from nestbatch.ops.reductions import write_out
from nestbatch.ops.registry import register
from nestbatch.ops.segment import segment_reduce

#: Dtypes whose median / mode / aminmax torch computes on every device; for another, torch's
#: own function runs on one element first, to raise torch's error (median of bools).
_REAL = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8,
                   torch.uint8, torch.int16, torch.int32, torch.int64})

_INTERPOLATIONS = ("linear", "lower", "higher", "midpoint", "nearest")


# =========================================================================== arguments, checks
def _route(batch: NestedBatch, dim: Any, op: str) -> tuple[int, str, int]:
    """``dim`` normalized, its kind (``"ragged"`` / ``"feature"``) and its stored dim.

    Raises
    ------
    ValueError
        For dim 0 (the batch), and for a ragged dim of a batch with several ragged dims.
    """
    if isinstance(dim, bool) or not hasattr(type(dim), "__index__"):
        raise TypeError(f"{op}(): argument 'dim' must be int, not {type(dim).__name__}")
    dim = normalize_dim(batch, dim)
    kind, stored = storage_dim(batch, dim)
    if kind == "batch":
        raise ValueError(
            f"{op} over dim 0 (the batch) of a NestedBatch is not supported: it would mix "
            "elements of different samples, whose sizes differ; apply it to .values (the packed "
            "rows) or to .padded().data (with .mask)"
        )
    if kind == "ragged" and batch.num_ragged_dims > 1:
        raise ValueError(
            f"{op} over ragged dim {dim} of a batch with {batch.num_ragged_dims} ragged dims is "
            "not supported; reduce a feature dim, pass no dim, or pad first (.padded())"
        )
    return dim, kind, stored


def _first_empty(batch: NestedBatch, features_too: bool = False) -> int | None:
    """The first sample with no row (``features_too``: or no element, a feature dim of size
    0), or None. On the host where it knows the sizes; else one read of the device."""
    partition = batch.partition
    if partition.batch_size == 0:
        return None
    if features_too and batch.feature_shape.numel() == 0:
        return 0
    known = partition.host_has_empty
    if known is False:
        return None
    if known:
        return partition.host_lengths.index(0)
    empty = partition.empty_samples
    first = int(torch.where(empty.any(), empty.to(torch.int8).argmax(), -1))  # (the one sync)
    return None if first < 0 else first


def _empty_dim_error(op: str, dim: int, sample: int) -> IndexError:
    """torch's error for a reduction along a sample's empty ``dim`` (logical dim of the batch)."""
    return IndexError(f"{op}: Expected reduction dim {dim - 1} to have non-zero size. "
                      f"(sample {sample} is empty along it)")


def _check_reducible(batch: NestedBatch, dim: int, op: str, probe: Any) -> None:
    """Raise torch's errors for the call on every sample in turn: the ``IndexError`` of the first
    sample empty along the ragged ``dim``, and (from sample 0 on) torch's dtype error, which
    ``probe()`` (torch's own function on one element) raises for a dtype torch refuses."""
    first = _first_empty(batch)
    if first == 0:
        raise _empty_dim_error(op, dim, 0)
    if batch.batch_size and batch.dtype not in _REAL:
        probe()
    if first is not None:
        raise _empty_dim_error(op, dim, first)


def _keep(out: Tensor, batch: NestedBatch, keepdim: bool, lead: int = 0) -> Tensor:
    """A dense ``(B, *lead, *F)`` result over the ragged dim, with a dim of 1 at the ragged dim's
    logical place (after ``lead`` dims of a sample's result) where ``keepdim``."""
    return out.unsqueeze(batch.ragged_dim + lead) if keepdim else out


def _moved(batch: NestedBatch, dim: int, keepdim: bool) -> int:
    """The ragged dim's logical place in a feature reduction's result."""
    return batch.ragged_dim - (not keepdim and dim < batch.ragged_dim)


# =========================================================================== sorted rows
def sorted_rows(layout: Layout, batch: NestedBatch) -> tuple[Tensor, Tensor]:
    """Every sample's packed rows in torch's stable ascending order, per feature (one ragged
    dim): row ``offsets[b] + r`` holds the ``r``-th smallest of sample ``b`` (NaN last).

    The padded data sorted where :func:`~nestbatch.ops.ordering.sorts_padded` says so (its
    filler sorts after every element: it never reaches a sample's rows), else the packed rows
    (:func:`~nestbatch.ops.ordering.stable_order`).

    Returns
    -------
    values : Tensor
        ``(total, *F)``, differentiable: gathered from the batch's elements.
    positions : Tensor
        ``(total, *F)`` int64: every value's position in its sample (torch's indices).
    """
    partition = batch.partition
    if sorts_padded(layout, batch):
        values, indices, _ = padded_sort(batch, 0, False)
        rows, at = partition.row_ids, partition.positions
        return values[rows, at], indices[rows, at]
    source, positions = stable_order(batch, False)
    return batch.packed().values.gather(0, source), positions


def _starts(batch: NestedBatch, like: Tensor) -> Tensor:
    """``(B, 1, ..., 1)`` int64: every sample's first packed row, broadcast over ``like``'s
    trailing dims."""
    return batch.offsets[:-1].to(torch.int64).view(-1, *([1] * (like.dim() - 1)))


def _at_rank(values: Tensor, positions: Tensor, batch: NestedBatch, rank: Tensor
             ) -> tuple[Tensor, Tensor]:
    """The sorted ``values`` / ``positions`` at every sample's ``rank`` ``(B, *F)``."""
    rows = _starts(batch, rank) + rank
    return values.gather(0, rows), positions.gather(0, rows)


def _counted(values: Tensor, batch: NestedBatch) -> Tensor:
    """``(B, *F)`` int64: every sample's elements that are not NaN."""
    if not values.is_floating_point():
        return batch.lengths.to(torch.int64).view(-1, *([1] * (values.dim() - 1))).expand(
            batch.batch_size, *values.shape[1:])
    return segment_reduce((~values.detach().isnan()).to(torch.int64), batch, "sum")


# =========================================================================== median
@register(*torch_funcs("median"), layouts=PACKED_OR_PADDED, prefer=Layout.PACKED,
          moved_ragged=True, out=True)
def _median(layout: Layout, func: Any, args: tuple, kwargs: dict) -> Any:
    """``median(input)``: 0-d; ``median(input, dim, keepdim=False)``: ``(values, indices)``."""
    return _medians(layout, args, kwargs, "median", torch.return_types.median)


@register(*torch_funcs("nanmedian"), layouts=PACKED_OR_PADDED, prefer=Layout.PACKED,
          moved_ragged=True, out=True)
def _nanmedian(layout: Layout, func: Any, args: tuple, kwargs: dict) -> Any:
    """``nanmedian``: ``median`` of every sample's elements that are not NaN."""
    return _medians(layout, args, kwargs, "nanmedian", torch.return_types.nanmedian)


def _medians(layout: Layout, args: tuple, kwargs: dict, op: str, result: Any) -> Any:
    batch = args[0]
    func = getattr(torch, op)
    if len(args) < 2 and "dim" not in kwargs:
        if "keepdim" in kwargs:  # (torch's parser: keepdim needs a dim)
            raise TypeError(f'{op}() missing 1 required positional arguments: "dim"')
        return write_out(func(logical_elements(batch)), kwargs.get("out"), op)
    dim, kind, stored = _route(batch, argument(args, kwargs, 1, "dim"), op)
    keepdim = bool(argument(args, kwargs, 2, "keepdim", False))
    values = batch.packed().values
    if kind == "feature":
        out = func(values, stored, keepdim)
        rd = _moved(batch, dim, keepdim)
        pair = result((batch.with_values(out.values, rd), batch.with_values(out.indices, rd)))
        return write_out(pair, kwargs.get("out"), op)
    _check_reducible(batch, dim, "median()", lambda: func(values.new_zeros(1), 0))
    pair = median_ragged(layout, batch, ignore_nan=op == "nanmedian")
    pair = result(tuple(_keep(t, batch, keepdim) for t in pair))
    return write_out(pair, kwargs.get("out"), op)


def median_ragged(layout: Layout, batch: NestedBatch, ignore_nan: bool
                  ) -> tuple[Tensor, Tensor]:
    """Every sample's median along its one ragged dim (no sample empty) and its position,
    ``(B, *F)`` each: the ``(n - 1) // 2``-th smallest of its ``n`` elements; with a NaN, the
    first NaN (``median``) or the median of the others (``nanmedian``; a NaN when all are)."""
    values, positions = sorted_rows(layout, batch)
    kept = _counted(values, batch)  # (NaN sorts last: the first kept rows are the numbers)
    if ignore_nan:
        rank = torch.where(kept > 0, (kept - 1).div(2, rounding_mode="floor"), 0)
    else:
        lengths = batch.lengths.to(torch.int64).view(-1, *([1] * (kept.dim() - 1)))
        rank = torch.where(kept < lengths, kept, (lengths - 1).div(2, rounding_mode="floor"))
    return _at_rank(values, positions, batch, rank)


# =========================================================================== quantile
@register(*torch_funcs("quantile"), layouts=PACKED_OR_PADDED, prefer=Layout.PACKED,
          moved_ragged=True, out=True)
def _quantile(layout: Layout, func: Any, args: tuple, kwargs: dict) -> Any:
    """``quantile(input, q, dim=None, keepdim=False, *, interpolation='linear')``.

    torch's own checks of ``q`` run first, on one element: a tensor ``q`` is read for its range
    as torch reads it (on the CPU; an asynchronous assert on CUDA).
    """
    return _quantiles(layout, args, kwargs, "quantile")


@register(*torch_funcs("nanquantile"), layouts=PACKED_OR_PADDED, prefer=Layout.PACKED,
          moved_ragged=True, out=True)
def _nanquantile(layout: Layout, func: Any, args: tuple, kwargs: dict) -> Any:
    """``nanquantile``: ``quantile`` of every sample's elements that are not NaN."""
    return _quantiles(layout, args, kwargs, "nanquantile")


def _quantiles(layout: Layout, args: tuple, kwargs: dict, op: str) -> Any:
    batch = args[0]
    func = getattr(torch, op)
    q = argument(args, kwargs, 1, "q")
    dim = argument(args, kwargs, 2, "dim")
    keepdim = bool(argument(args, kwargs, 3, "keepdim", False))
    interpolation = kwargs.get("interpolation", "linear")
    values = batch.packed().values
    if dim is None:  # torch's own call on all the elements (its errors for none, its checks)
        out = func(logical_elements(batch), q, keepdim=keepdim, interpolation=interpolation)
        if keepdim:  # (every dim of the input kept as 1, after the q dim)
            out = out.reshape(*out.shape[:out.dim() - 1], *[1] * batch.dim())
        return write_out(out, kwargs.get("out"), op)
    dim, kind, stored = _route(batch, dim, op)
    first = _first_empty(batch, features_too=True)
    if first == 0:  # (torch checks that the input has elements before anything else)
        raise _quantile_empty(0)
    # torch's own checks of q, of the interpolation and of the dtype, with its messages: run on
    # one element (a tensor q is read once, as torch reads it).
    func(values.new_zeros(1), q, interpolation=interpolation)
    if first is not None:
        raise _quantile_empty(first)
    q = torch.as_tensor(q, dtype=values.dtype, device=values.device)
    if kind == "feature":
        return write_out(_quantile_feature(batch, q, dim, stored, keepdim, interpolation, func),
                         kwargs.get("out"), op)
    out = quantile_ragged(layout, batch, q, interpolation, op == "nanquantile")
    return write_out(_keep(out, batch, keepdim, lead=q.dim()), kwargs.get("out"), op)


def _quantile_empty(sample: int) -> RuntimeError:
    return RuntimeError(f"quantile() input tensor must be non-empty (sample {sample} has no "
                        "element)")


def _quantile_feature(batch: NestedBatch, q: Tensor, dim: int, stored: int, keepdim: bool,
                      interpolation: str, func: Any) -> NestedBatch:
    """torch's quantile of the packed rows along a feature dim; a 1-d ``q`` puts its dim first
    in every sample, before the ragged dim (one ragged dim only: it moves)."""
    values = batch.packed().values
    if q.dim() and batch.num_ragged_dims > 1:
        raise ValueError(
            "quantile with a 1-d q over a feature dim of a batch with several ragged dims is not "
            "supported: the q dim would come before the ragged dims; pass q as a float"
        )
    source = values if batch.batch_size else values.new_zeros(1, *values.shape[1:])
    out = func(source, q, stored, keepdim, interpolation=interpolation)
    if not batch.batch_size:  # (no sample: torch's refusal of no element does not apply)
        out = out.narrow(q.dim(), 0, 0)
    if q.dim():  # (Q, total, ...) -> (total, Q, ...): the q dim first within the sample
        return batch.with_values(out.movedim(0, 1), _moved(batch, dim, keepdim) + 1)
    return batch.with_values(out, _moved(batch, dim, keepdim))


def quantile_ragged(layout: Layout, batch: NestedBatch, q: Tensor, interpolation: str,
                    ignore_nan: bool) -> Tensor:
    """Every sample's quantiles ``q`` (0-d or ``(Q,)``, the batch's dtype) along its one ragged
    dim (no sample empty): ``(B, *F)`` or ``(B, Q, *F)``.

    torch's computation on every sample's sorted elements, with the same ops in the same dtype
    (the same bits): ranks ``q * (n - 1)`` (``n`` the elements that are not NaN for
    ``nanquantile``, the last rank where ``quantile`` meets a NaN), rounded as
    ``interpolation`` says, then the neighbours gathered and, for ``linear`` / ``midpoint``,
    blended by ``lerp``.
    """
    values, _ = sorted_rows(layout, batch)
    kept = _counted(values, batch)  # (B, *F)
    features = values.shape[1:]
    qs = q.reshape(1, -1, *[1] * len(features))  # (1, Q, 1...)
    lengths = batch.lengths.to(torch.int64).view(-1, 1, *[1] * len(features))
    if ignore_nan:
        ranks = qs * (kept.unsqueeze(1) - 1)
        ranks = ranks.masked_fill(ranks < 0, 0)
    else:
        last = lengths - 1  # (a NaN makes the rank the last, whose value is NaN)
        ranks = torch.where(kept.unsqueeze(1) < lengths, last.to(values.dtype), qs * last)
    if interpolation == "lower":
        ranks = ranks.floor()
    elif interpolation == "higher":
        ranks = ranks.ceil()
    elif interpolation == "nearest":
        ranks = ranks.round()
    below = ranks.to(torch.int64)
    out = _gather_ranks(values, batch, below)
    if interpolation in ("linear", "midpoint"):
        weights = torch.full_like(ranks, 0.5) if interpolation == "midpoint" else ranks - below
        out = out.lerp(_gather_ranks(values, batch, ranks.ceil().to(torch.int64)), weights)
    return out if q.dim() else out.squeeze(1)


def _gather_ranks(values: Tensor, batch: NestedBatch, ranks: Tensor) -> Tensor:
    """The sorted ``values`` ``(total, *F)`` at every sample's ``ranks`` ``(B, Q, *F)``."""
    n, width = ranks.shape[:2]
    rows = (_starts(batch, ranks) + ranks).reshape(n * width, *ranks.shape[2:])
    return values.gather(0, rows).view(ranks.shape)


# =========================================================================== mode
@register(*torch_funcs("mode"), layouts=PACKED_OR_PADDED, prefer=Layout.PACKED,
          moved_ragged=True, out=True)
def _mode(layout: Layout, func: Any, args: tuple, kwargs: dict) -> Any:
    """``mode(input, dim=-1, keepdim=False)``: ``(values, indices)``."""
    batch = args[0]
    dim, kind, stored = _route(batch, argument(args, kwargs, 1, "dim", -1), "mode")
    keepdim = bool(argument(args, kwargs, 2, "keepdim", False))
    values = batch.packed().values
    if kind == "feature":
        out = torch.mode(values, stored, keepdim)
        rd = _moved(batch, dim, keepdim)
        pair = (batch.with_values(out.values, rd), batch.with_values(out.indices, rd))
    else:
        _check_reducible(batch, dim, "mode()", lambda: torch.mode(values.new_zeros(1), 0))
        pair = tuple(_keep(t, batch, keepdim) for t in mode_ragged(layout, batch))
    return write_out(torch.return_types.mode(pair), kwargs.get("out"), "mode")


def mode_ragged(layout: Layout, batch: NestedBatch) -> tuple[Tensor, Tensor]:
    """Every sample's most frequent value along its one ragged dim (no sample empty) and its
    position, ``(B, *F)`` each: the smallest among the most frequent, at its last occurrence.

    In the sorted rows, equal values form runs (a NaN is a run of its own: ``NaN != NaN``); a
    row's count within its run is its row less the run's first row (a running maximum of the
    runs' first rows), plus one. The mode ends the first run whose count reaches the sample's
    largest count.
    """
    values, positions = sorted_rows(layout, batch)
    sorted_ = values.detach()
    shape = (-1, *[1] * (values.dim() - 1))
    row = torch.arange(values.shape[0], device=values.device).view(shape).expand(values.shape)
    starts = batch.partition.positions.view(shape) == 0
    if values.shape[0] > 1:
        changed = torch.cat([torch.ones_like(sorted_[:1], dtype=torch.bool),
                             sorted_[1:] != sorted_[:-1]])
        starts = starts | changed
    first_of_run = torch.where(starts, row, 0).cummax(0).values
    count = row - first_of_run + 1
    most = segment_reduce(count, batch, "amax")
    hits = count == most.index_select(0, batch.partition.row_ids)
    big = torch.iinfo(torch.int64).max
    end = segment_reduce(torch.where(hits, row, big), batch, "amin")  # (B, *F) sorted rows
    return values.gather(0, end), positions.gather(0, end)


# =========================================================================== aminmax
@register(*torch_funcs("aminmax"), layouts=PACKED_OR_PADDED, prefer=Layout.PACKED,
          moved_ragged=True, out=True)
def _aminmax(layout: Layout, func: Any, args: tuple, kwargs: dict) -> Any:
    """``aminmax(input, *, dim=None, keepdim=False)``: ``(min, max)``."""
    batch = args[0]
    if len(args) > 1:  # (torch's parser: dim and keepdim are keyword-only)
        raise TypeError(f"aminmax() takes 1 positional argument but {len(args)} were given")
    dim, keepdim = kwargs.get("dim"), bool(kwargs.get("keepdim", False))
    values = batch.packed().values
    if dim is None:
        low, high = torch.aminmax(logical_elements(batch))
        if keepdim:  # (every dim of the input kept as 1)
            low, high = low.reshape([1] * batch.dim()), high.reshape([1] * batch.dim())
        pair = (low, high)
    else:
        dim, kind, stored = _route(batch, dim, "aminmax")
        if kind == "feature":
            out = torch.aminmax(values, dim=stored, keepdim=keepdim)
            rd = _moved(batch, dim, keepdim)
            pair = (batch.with_values(out.min, rd), batch.with_values(out.max, rd))
        else:
            _check_reducible(batch, dim, "aminmax",
                             lambda: torch.aminmax(values.new_zeros(1), dim=0))
            # nestbatch's amin / amax over the ragged dim: torch's values, and torch's
            # gradient (split evenly among equal extremes, as aminmax's).
            pair = (torch.amin(batch, dim, keepdim), torch.amax(batch, dim, keepdim))
    return write_out(torch.return_types.aminmax(pair), kwargs.get("out"), "aminmax")


# =========================================================================== var_mean, std_mean
@register(*torch_funcs("var_mean", "std_mean"), layouts=PACKED_OR_PADDED,
          prefer=Layout.PACKED, moved_ragged=True)
def _spread_mean(layout: Layout, func: Any, args: tuple, kwargs: dict) -> Any:
    """``var_mean`` / ``std_mean(input, dim=None, *, correction=1, keepdim=False)`` (also
    ``(input, dim, unbiased, keepdim=False)`` and ``(input, unbiased)``): ``(var, mean)``.

    With no dim, torch's of every element in logical order; over feature dims only, torch's
    of the packed rows (its kernel, bit for bit: a NaN mean where its one-pass inner loop meets
    an infinity); over the ragged dim, nestbatch's ``var`` (``std``) and ``mean`` of the batch:
    torch's values to rounding (an infinite mean, as torch's outer loop gives for the samples
    ``unbind`` returns), and torch's gradient.
    """
    batch = args[0]
    op = func.__name__
    if not (batch.dtype.is_floating_point or batch.dtype.is_complex):
        raise RuntimeError(f"{op} only support floating point and complex dtypes")
    dim = argument(args, kwargs, 1, "dim")
    unbiased = argument(args, kwargs, 2, "unbiased")
    if isinstance(dim, bool):  # var_mean(input, unbiased)
        dim, unbiased = None, dim
    correction = kwargs.get("correction")
    if correction is None:
        correction = 0 if unbiased is False else 1
    keepdim = bool(argument(args, kwargs, 3, "keepdim", False))
    if dim is not None:
        for d in (dim,) if isinstance(dim, int) else dim:
            _route(batch, d, op)  # (dim 0 and a ragged dim of several: refused by name)
    if dim is None:
        first, mean = func(logical_elements(batch), correction=correction)
        if keepdim:  # (every dim of the input kept as 1)
            first, mean = first.reshape([1] * batch.dim()), mean.reshape([1] * batch.dim())
        return first, mean
    dims = [normalize_dim(batch, d) for d in ((dim,) if isinstance(dim, int) else dim)]
    if all(storage_dim(batch, d)[0] == "feature" for d in dims):
        stored = [storage_dim(batch, d)[1] for d in dims]
        first, mean = func(batch.packed().values, stored, correction=correction,
                           keepdim=keepdim)
        moved_by = 0 if keepdim else sum(d < batch.ragged_dim for d in dims)
        return (batch.with_values(first, batch.ragged_dim - moved_by),
                batch.with_values(mean, batch.ragged_dim - moved_by))
    spread = torch.std if op == "std_mean" else torch.var
    first = spread(batch, dim, correction=correction, keepdim=keepdim)
    return first, torch.mean(batch, dim, keepdim)

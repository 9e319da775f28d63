"""Cumulative scans along a dim of every sample: ``cumsum``, ``cumprod``, ``logcumsumexp``,
``cummax``, ``cummin`` (functions and methods) and the in-place ``cumsum_`` / ``cumprod_``.

The result is torch's function applied to every sample alone, the results batched: the same
dtypes (integer and bool sums and products give int64, ``dtype=`` casts first), the same special
values, ties and NaN rules, and for ``cummax`` / ``cummin`` indices that are positions inside
the sample. Each route below runs torch's own scan kernel over the same elements in the same
order as the sample alone does, so the values are the same bits.

* Over a feature dim: torch's scan of the packed rows ``(total, *feature)`` (of the padded
  data where the batch only has that): every row is scanned on its own, as inside its sample.
* Over a ragged dim: torch's scan of the right-padded data ``(B, *padded, *feature)`` along
  that dim, then the valid slots gathered back into packed rows (or kept padded, where the batch
  only has its padded layout). The padding comes after every sample's elements, so no element
  of a sample sees it. Several ragged dims (samples ``(H_i, W_i, C)``) scan one of them the same
  way. Where autograd records, the padding holds the scan's neutral element (0, 1, ``-inf``),
  so that the zero gradient of the padded outputs stays zero through the backward (``cumprod``'s
  multiplies by the outputs: junk padding would give ``0 * inf``, NaN, in the sample).
* A batch of ragged rank ``r >= 2`` (nested raggedness) scans its feature dims and its innermost
  ragged dim (every innermost row alone); an outer ragged dim raises a ``ValueError``.
* Over dim 0 (the batch): a ``ValueError``, as ``softmax`` and the reductions refuse it (a scan
  runs inside one sample, and the samples differ in size). ``out=`` raises the registry's
  ``TypeError``: no tensor holds a ragged result.

A batch whose ragged dim was moved (``b.transpose(1, 2)``, see
:attr:`~nestbatch.NestedBatch.ragged_dim`) reads its dims logically: every route maps the dim to
where storage keeps it (:func:`~nestbatch.batch.storage_dim`), the ragged dim first.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from nestbatch.batch import NestedBatch, after_stored_write, storage_dim, stored_layout
from nestbatch.conversions.packed_padded import padded_data_to_packed
from nestbatch.layouts import Layout, Packed, Padded
from nestbatch.ops.common import (
    PACKED_OR_PADDED,
    normalize_dim,
    replace_storage,
    torch_funcs,
    wrap_padded,
)
from nestbatch.ops.registry import register

#: The scans, each with the element that changes no result when it is scanned in (the padding's
#: filler where autograd records; ``cummax`` / ``cummin`` need none: see :func:`_filler`).
NEUTRAL: dict[str, float | None] = {
    "cumsum": 0, "cumprod": 1, "logcumsumexp": -math.inf, "cummax": None, "cummin": None,
}
#: The scans that take torch's ``dtype=`` (the input is cast to it first).
_TAKES_DTYPE = frozenset({"cumsum", "cumprod"})

#: A scan's result: one tensor, or ``cummax`` / ``cummin``'s ``(values, indices)`` pair.
ScanResult = Tensor | tuple[Tensor, Tensor]


# =========================================================================== registrations
@register(*torch_funcs(*NEUTRAL), layouts=PACKED_OR_PADDED, prefer=Layout.PACKED,
          moved_ragged=True, nested=True)
def _scan(layout: Layout, func: Any, args: tuple, kwargs: dict) -> Any:
    name = func.__name__
    batch, dim, dtype = _arguments(name, args, kwargs)
    return scan(layout, batch, name, dim, dtype)


@register(torch.Tensor.cumsum_, torch.Tensor.cumprod_, layouts=PACKED_OR_PADDED,
          prefer=Layout.PACKED, moved_ragged=True, nested=True)
def _scan_inplace(layout: Layout, func: Any, args: tuple, kwargs: dict) -> NestedBatch:
    """``b.cumsum_(dim)`` / ``b.cumprod_(dim)``: the scan written into the batch's stored layout.

    Along a feature dim of packed rows, torch's in-place op on the stored rows (one launch);
    otherwise the scan computed out of place in the batch's dtype, which is what torch's
    in-place scan computes (an integer sum wraps the same way), and written back
    (:func:`~nestbatch.ops.common.replace_storage`).
    """
    name = func.__name__[:-1]
    batch, dim, dtype = _arguments(func.__name__, args, kwargs, takes_dtype=True)
    if dtype is not None and dtype != batch.dtype:
        raise RuntimeError(
            f"Tensor.{func.__name__}: an in-place scan keeps the batch's dtype {batch.dtype}; "
            f"got dtype={dtype} (use the out-of-place {name} for another dtype)"
        )
    kind, stored_dim = storage_dim(batch, dim)
    stored = stored_layout(batch)
    if kind == "feature" and isinstance(stored, Packed):
        # Every packed row is scanned alone along a feature dim: torch's own in-place op on the
        # stored rows is the per-sample one (its checks, its autograd, views see the write).
        func(stored.values, stored_dim)
        after_stored_write(batch)
        return batch
    return replace_storage(batch, scan(layout, batch, name, dim, batch.dtype))


def _arguments(name: str, args: tuple, kwargs: dict, *, takes_dtype: bool | None = None
               ) -> tuple[NestedBatch, int, torch.dtype | None]:
    """The batch, the normalized ``dim`` and ``dtype`` of a scan's call, read as torch reads
    them: ``dim`` by position or keyword (numpy's ``axis`` too), ``dtype`` by keyword only.

    Raises
    ------
    TypeError
        For a missing ``dim``, an argument too many, or a keyword the scan does not take.
    IndexError
        For ``dim`` out of range.
    """
    batch, rest = args[0], list(args[1:])
    extra = {key: value for key, value in kwargs.items() if not (key == "out" and value is None)}
    if "axis" in extra:  # (torch's parser takes numpy's name for dim)
        extra["dim"] = extra.pop("axis")
    if "dim" in extra:
        rest.append(extra.pop("dim"))
    if len(rest) != 1:
        raise TypeError(f"{name}() takes the input and one dim (by position or as dim=), "
                        f"got {len(rest)} dims")
    takes_dtype = name in _TAKES_DTYPE if takes_dtype is None else takes_dtype
    dtype = extra.pop("dtype", None) if takes_dtype else None
    if extra:
        raise TypeError(f"{name}() got unexpected keyword arguments {sorted(extra)}")
    return batch, normalize_dim(batch, rest[0]), dtype


# =========================================================================== the scan
def scan(layout: Layout, batch: NestedBatch, name: str, dim: int,
         dtype: torch.dtype | None = None) -> NestedBatch | tuple[NestedBatch, NestedBatch]:
    """``name`` of ``batch`` along logical ``dim`` (normalized), as torch's on every sample.

    Parameters
    ----------
    layout : Layout
        The layout the registry chose: packed rows, or padded data the batch already has.
    batch : NestedBatch
        ``(B, ..., *feature)``, any ragged dims (one of them possibly moved) or ragged rank.
    name : str
        A key of :data:`NEUTRAL`.
    dim : int
        A logical dim in ``[1, batch.dim())``.
    dtype : torch.dtype, optional
        ``cumsum`` / ``cumprod``: the dtype the input is cast to first.

    Returns
    -------
    NestedBatch or (NestedBatch, NestedBatch)
        The batch of the same samples' shapes; ``cummax`` / ``cummin``: torch's named pair of
        values and int64 indices (positions inside every sample along ``dim``).

    Raises
    ------
    ValueError
        Along dim 0, or along an outer ragged dim of a batch of ragged rank ``r >= 2``.
    """
    kind, stored = storage_dim(batch, dim)
    if kind == "batch":
        raise ValueError(
            f"{name} along dim 0 (the batch) is not supported on a NestedBatch: a scan runs "
            f"inside every sample, and the samples differ in size; scan one of dims 1.."
            f"{batch.dim() - 1} (a ragged or feature dim), or .values (all packed rows) yourself"
        )
    if batch.partition.ragged_rank > 1:
        return _nested_scan(batch, name, dim, kind, stored, dtype)
    if kind == "feature" and layout is not Layout.PADDED:
        out = _scan_tensor(name, batch.packed().values, stored, dtype)
        return _each(out, batch.with_values)
    # Padded data: a feature dim is a dim of the rows after the batch's ragged ones.
    padded_dim = stored + batch.num_ragged_dims if kind == "feature" else stored
    out, padded = _padded_scan(batch, name, padded_dim, dtype)
    if layout is Layout.PADDED:
        return _each(out, lambda t: wrap_padded(t, padded.partition, batch.ragged_dim))
    return _each(out, lambda t: batch.with_values(padded_data_to_packed(t, padded.partition)))


def _padded_scan(batch: NestedBatch, name: str, padded_dim: int, dtype: torch.dtype | None
                 ) -> tuple[ScanResult, Padded]:
    """``name`` of the batch's right-padded data ``(B, *padded, *feature)`` along
    ``padded_dim``: the result over the same padded shape (junk in the padded slots), and the
    padded layout it was computed from."""
    padded = batch.padded(_filler(batch, name))
    return _scan_tensor(name, padded.data, padded_dim, dtype), padded


def _filler(batch: NestedBatch, name: str) -> float | None:
    """The padding a padded scan needs: its neutral element where autograd records (see the
    module docstring), else none in particular (``None``: a cached padded layout serves, what
    its padding holds reaches no sample's element)."""
    if not (batch.requires_grad and torch.is_grad_enabled()):
        return None
    # (Only float and complex batches record: NEUTRAL's -inf fits them. cummax / cummin's
    # backward scatters the gradient to the indices, no product of outputs: any filler.)
    return NEUTRAL[name]


def _nested_scan(batch: NestedBatch, name: str, dim: int, kind: str, stored: int,
                 dtype: torch.dtype | None) -> NestedBatch | tuple[NestedBatch, NestedBatch]:
    """A scan of a batch of ragged rank ``r >= 2``: along a feature dim, of its innermost
    rows; along the innermost ragged dim (``dim == r``), of every innermost row alone (a batch
    of ragged rank 1 over the last level's partition, scanned along its ragged dim)."""
    levels = batch.partition.levels
    values = batch.packed().values
    if kind == "feature":
        return _each(_scan_tensor(name, values, stored, dtype), batch.with_values)
    if stored != len(levels):
        raise ValueError(
            f"{name} along ragged dim {dim} of a batch of ragged rank {len(levels)} is not "
            f"supported: only the innermost ragged dim (dim={len(levels)}) and the feature dims "
            "are (an outer level's rows differ in length); scan the padded data (.padded().data "
            "with .mask) instead"
        )
    rows = NestedBatch.trusted(Packed.trusted(values, levels[-1]))
    out, padded = _padded_scan(rows, name, 1, dtype)
    return _each(out, lambda t: batch.with_values(padded_data_to_packed(t, padded.partition)))


def _scan_tensor(name: str, data: Tensor, dim: int, dtype: torch.dtype | None) -> ScanResult:
    """torch's scan ``name`` of ``data`` along ``dim`` (``dtype`` only where torch takes it)."""
    func = getattr(torch, name)
    return func(data, dim, dtype=dtype) if name in _TAKES_DTYPE else func(data, dim)


def _each(out: ScanResult, wrap: Callable[[Tensor], Any]) -> Any:
    """``wrap`` of a scan's tensor, or of both tensors of ``cummax`` / ``cummin``'s pair (kept
    as torch's named tuple type: ``.values``, ``.indices``)."""
    if isinstance(out, tuple):
        return type(out)((wrap(out[0]), wrap(out[1])))
    return wrap(out)

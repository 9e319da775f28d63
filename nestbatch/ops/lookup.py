"""Value lookups and counts: ``one_hot``, ``isin``, ``bucketize``, ``searchsorted``, ``histc``,
``bincount``, ``histogram``, ``unique``, ``unique_consecutive``.

Two families, each with one rule:

* **lookups** (``F.one_hot``, ``torch.isin``, ``torch.bucketize``, ``torch.searchsorted``): a
  result per element, so a batch of the input's structure, torch's function of the packed
  values ``(total, *feature)`` (the same as torch on every sample alone; padding never takes
  part). ``F.one_hot`` adds its class dim last, a feature dim; with ``num_classes=-1`` it reads
  the largest value over every element, as torch does on one tensor (torch's one read of the
  device). A batch as ``searchsorted``'s ``sorted_sequence`` holds one sorted sequence per row
  along its last dim, which must be a feature dim;
* **counts** (``histc``, ``bincount``, ``histogram``, ``unique``, ``unique_consecutive``): torch's
  function of every element, in the order ``torch.cat([s.flatten() for s in b.unbind()])``:
  the packed values flattened (a moved ragged dim is put back in that logical order first), a
  dense result. ``unique``'s ``return_inverse`` is a batch of the input's structure. Where torch
  reads the device for its output's size (``bincount``, ``unique``, ``histc`` with
  ``min=max=0`` on CUDA), so does the batch, once; nothing else reads it.

A batch of ragged rank 2 (nested) is served by its innermost packed values: lookups keep its
structure, counts see its elements in order. Refused, with a ``ValueError`` saying why: ``isin``
of two batches (per sample or against all of the other's elements: both are readings of it),
a batch as ``bucketize``'s boundaries, a per-sample ``searchsorted`` sequence along a ragged dim,
``unique(dim=...)`` along the batch or a ragged dim (its slices differ in size per sample). None
of these functions is differentiable in torch (their results are integers, or counts of the
values): no gradient flows through them here either.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from nestbatch.batch import NestedBatch
from nestbatch.checks import ragged_out_error
from nestbatch.layouts import Layout
from nestbatch.ops.common import (
    REQUIRED,
    bind_arguments,
    check_same_structure,
    dim_kind,
    is_batch,
    logical_elements,
    logical_flat_index,
    normalize_dim,
    values_dim,
)
from nestbatch.ops.registry import register

_PACKED = (Layout.PACKED,)


def packed_values(batch: NestedBatch) -> Tensor:
    """``(total, *feature)``: every element of ``batch`` once, padding excluded (the innermost
    rows of a nested batch)."""
    return batch.packed().values


# ================================================================================== lookups
@register(F.one_hot, layouts=_PACKED, moved_ragged=True, nested=True)
def _one_hot(layout: Layout, func: Any, args: tuple, kwargs: dict) -> NestedBatch:
    """``F.one_hot(b, num_classes=-1)``: ``(B, *sample, C)``, the class dim a new last feature
    dim. ``num_classes=-1`` takes ``C`` from the largest value of all samples together, as
    torch from its one tensor (one read of the device, torch's own; an empty batch raises
    torch's error)."""
    batch = args[0]
    return batch.with_values(func(packed_values(batch), *args[1:], **kwargs))


@register(torch.isin, layouts=_PACKED, moved_ragged=True, nested=True, out=True)
def _isin(layout: Layout, func: Any, args: tuple, kwargs: dict) -> NestedBatch | Tensor:
    """``torch.isin(elements, test_elements)``: a batch of ``elements``' structure when the
    elements are a batch; a dense tensor of their shape when only ``test_elements`` is one (its
    elements are every sample's, as a tensor's are).

    Raises
    ------
    ValueError
        For two batches: "each sample against its own test elements" and "against every
        sample's" are both readings; pass ``test.values`` for the second.
    """
    elements, test, rest = _two_operands("isin", ("elements", "test_elements"), args, kwargs)
    if is_batch(elements) and is_batch(test):
        raise ValueError(
            "torch.isin of two NestedBatches is ambiguous (each sample against its own test "
            "elements, or against every sample's); for the latter pass test_elements.values "
            "(every element of the batch), for the former compare each sample alone"
        )
    if is_batch(test):
        if kwargs.get("out") is not None:
            rest["out"] = kwargs["out"]
        return func(elements, packed_values(test), **rest)
    if kwargs.get("out") is not None:
        raise ragged_out_error("torch.isin")
    return elements.with_values(func(packed_values(elements), test, **rest))


def _two_operands(name: str, names: tuple[str, str], args: tuple, kwargs: dict
                  ) -> tuple[Any, Any, dict]:
    """The first two operands of ``name`` (by position or keyword) and the other keywords,
    ``out`` left out (the registry refuses it for a batch result; ``isin`` hands it on where
    its result is dense)."""
    rest = {key: value for key, value in kwargs.items() if key not in (*names, "out")}
    bound = bind_arguments(f"torch.{name}", [(names[0], REQUIRED), (names[1], REQUIRED)],
                           args, {key: kwargs[key] for key in names if key in kwargs})
    return bound[names[0]], bound[names[1]], rest


@register(torch.bucketize, layouts=_PACKED, moved_ragged=True, nested=True)
def _bucketize(layout: Layout, func: Any, args: tuple, kwargs: dict) -> NestedBatch:
    """``torch.bucketize(b, boundaries)``: the bucket of every element, a batch of ``b``'s
    structure; ``boundaries`` is a 1-d dense tensor, as torch requires.

    Raises
    ------
    ValueError
        For a batch as ``boundaries`` (torch takes 1-d boundaries only; a batch has at least
        two dims).
    """
    input, boundaries, rest = _two_operands("bucketize", ("input", "boundaries"), args, kwargs)
    if is_batch(boundaries):
        raise ValueError(
            "torch.bucketize takes 1-d dense boundaries, got a NestedBatch; for one sorted "
            "sequence per sample use torch.searchsorted with a batch whose last dim is a "
            "feature dim"
        )
    return input.with_values(func(packed_values(input), boundaries, **rest))


@register(torch.searchsorted, layouts=_PACKED, moved_ragged=True, nested=True)
def _searchsorted(layout: Layout, func: Any, args: tuple, kwargs: dict) -> NestedBatch:
    """``torch.searchsorted(sorted_sequence, values)`` with a batch among them: a batch of
    ``values``' structure.

    * ``sorted_sequence`` a 1-d dense tensor, ``values`` a batch: every element looked up in it;
    * ``sorted_sequence`` a batch ``(B, ..., M)`` whose last dim is a feature dim: each of its
      rows of ``M`` a sorted sequence, ``values`` a batch of the same structure and ragged dim
      ``(B, ..., N)`` (``sorter`` a batch like ``sorted_sequence``), as torch pairs the leading
      dims of every sample.

    Raises
    ------
    ValueError
        For a batch sequence whose last dim is ragged, dense ``values`` against a batch
        sequence (its leading dims cannot match every sample's), a dense sequence of more than
        one dim against a batch, or ``sorter`` not shaped like the sequence.
    """
    sequence, values, rest = _two_operands(
        "searchsorted", ("sorted_sequence", "values"), args, kwargs)
    if not is_batch(sequence):
        return _in_dense_sequence(func, sequence, values, rest)
    _check_sequence_batch(sequence, values)
    sorter = rest.get("sorter")
    if sorter is not None:
        if not is_batch(sorter):
            raise ValueError(
                "torch.searchsorted of a NestedBatch sorted_sequence takes sorter as a "
                "NestedBatch of the same structure (the sorting indices of every row)"
            )
        check_same_structure(sequence, sorter, "sorted_sequence and sorter")
        rest["sorter"] = packed_values(sorter)
    out = func(packed_values(sequence), packed_values(values), **rest)
    return values.with_values(out)


def _in_dense_sequence(func: Any, sequence: Tensor, values: NestedBatch, rest: dict
                       ) -> NestedBatch:
    """Every element of the batch ``values`` looked up in one dense 1-d sequence."""
    if isinstance(sequence, Tensor) and sequence.dim() != 1:
        raise ValueError(
            f"torch.searchsorted of NestedBatch values takes a 1-d dense sorted_sequence (a "
            f"sequence of {sequence.dim()} dims pairs its leading dims with every sample's, "
            "whose sizes differ); give the sequences as a NestedBatch of the values' structure"
        )
    if is_batch(rest.get("sorter")):
        raise ValueError("torch.searchsorted with a dense sorted_sequence takes a dense "
                         "sorter of the same shape, got a NestedBatch")
    return values.with_values(func(sequence, packed_values(values), **rest))


def _check_sequence_batch(sequence: NestedBatch, values: Any) -> None:
    """A batch sequence runs row by row: its last dim a feature dim, ``values`` a batch whose
    rows pair with its rows."""
    last = sequence.dim() - 1
    if dim_kind(sequence, last) != "feature":
        raise ValueError(
            f"torch.searchsorted of a NestedBatch sorted_sequence searches along its last dim, "
            f"which is ragged in this batch of shape {sequence.shape}: only a feature last dim "
            "is supported (rows of the packed values); search each sample alone, or use a "
            "batch whose sequences lie along a feature dim"
        )
    if not is_batch(values):
        raise ValueError(
            "torch.searchsorted of a NestedBatch sorted_sequence takes values as a NestedBatch "
            "of the same structure (torch pairs the leading dims of the two, and these differ "
            "per sample)"
        )
    check_same_structure(sequence, values, "sorted_sequence and values")
    if values.ragged_dim != sequence.ragged_dim:
        raise ValueError(
            f"torch.searchsorted: sorted_sequence presents its ragged dim at logical dim "
            f"{sequence.ragged_dim} and values at {values.ragged_dim}; their leading dims must "
            "match, as torch requires"
        )


# =================================================================================== counts
def _moved(batch: NestedBatch) -> bool:
    return batch.num_ragged_dims == 1 and batch.ragged_dim != 1


@register(torch.histc, torch.Tensor.histc, layouts=_PACKED, moved_ragged=True, nested=True,
          out=True)
def _histc(layout: Layout, func: Any, args: tuple, kwargs: dict) -> Tensor:
    """``torch.histc(b, bins=100, min=0, max=0)``: torch's histogram of every element, a dense
    ``(bins,)`` tensor; ``min=max=0`` takes the range of every element, as torch's."""
    return func(logical_elements(args[0]), *args[1:], **kwargs)


_BINCOUNT = (("input", REQUIRED), ("weights", None), ("minlength", 0))


@register(torch.bincount, torch.Tensor.bincount, layouts=_PACKED, moved_ragged=True,
          nested=True)
def _bincount(layout: Layout, func: Any, args: tuple, kwargs: dict) -> Tensor:
    """``torch.bincount(b, weights=None, minlength=0)`` of a batch of 1-d samples ``(B, j)``:
    torch's bincount of every element (its one read of the device, for the output's size);
    ``weights`` a batch of the same structure.

    Raises
    ------
    RuntimeError
        torch's own, for samples of other than one dim or of other dtypes than integers.
    ValueError
        For dense ``weights`` (no dense tensor has a batch's ragged shape).
    """
    bound = bind_arguments("torch.bincount", _BINCOUNT, args, kwargs)
    batch, weights = bound["input"], bound["weights"]
    if batch.dim() != 2:
        # torch's own error for an input of the samples' number of dims.
        func(torch.empty((0,) * (batch.dim() - 1), dtype=batch.dtype, device=batch.device))
    return func(logical_elements(batch), _flat_weights("torch.bincount", batch, weights),
                minlength=bound["minlength"])


def _flat_weights(name: str, batch: NestedBatch, weights: Any) -> Tensor | None:
    """The weights of every element, flattened as the batch's (a batch of its structure)."""
    if weights is None:
        return None
    if not is_batch(weights):
        raise ValueError(
            f"{name} of a NestedBatch takes its weights as a NestedBatch of the same "
            f"structure, got {type(weights).__name__}"
        )
    check_same_structure(batch, weights, "the input and its weights")
    if weights.ragged_dim != batch.ragged_dim or weights.dim() != batch.dim():
        raise ValueError(f"{name}: the weights must have the input's shape, got "
                         f"{weights.shape} for an input of shape {batch.shape}")
    return logical_elements(weights)


@register(torch.histogram, torch.Tensor.histogram, layouts=_PACKED, moved_ragged=True,
          nested=True, out=True)
def _histogram(layout: Layout, func: Any, args: tuple, kwargs: dict) -> Any:
    """``torch.histogram(b, bins, *, range=None, weight=None, density=False)``: torch's
    ``(hist, bin_edges)`` of every element; ``weight`` a batch of the same structure."""
    batch = args[0]
    if kwargs.get("weight") is not None:
        kwargs = {**kwargs, "weight": _flat_weights("torch.histogram", batch, kwargs["weight"])}
    if any(is_batch(a) for a in args[1:]):
        raise ValueError("torch.histogram takes bins as an int or a 1-d dense tensor of "
                         "edges, got a NestedBatch")
    return func(logical_elements(batch), *args[1:], **kwargs)


_UNIQUE = (("input", REQUIRED), ("sorted", True), ("return_inverse", False),
           ("return_counts", False), ("dim", None))
_UNIQUE_CONSECUTIVE = (("input", REQUIRED), ("return_inverse", False),
                       ("return_counts", False), ("dim", None))


@register(torch.unique, torch.Tensor.unique, torch.unique_consecutive,
          torch.Tensor.unique_consecutive, layouts=_PACKED, moved_ragged=True, nested=True)
def _unique(layout: Layout, func: Any, args: tuple, kwargs: dict) -> Any:
    """``torch.unique`` / ``unique_consecutive`` (functions and methods).

    With ``dim=None``: torch's result for every element in order (``unique_consecutive`` merges
    a run that crosses from one sample into the next, as torch does in the flattened tensor);
    the unique values and ``counts`` dense, ``inverse`` a batch of the input's structure.

    With ``dim`` a feature dim: the unique slices along it, each slice holding every sample's
    elements in order (torch's lexicographic order of the flattened slices): a batch of the
    same rows with that dim's size changed; ``inverse`` ``(size(dim),)`` and ``counts`` dense.

    Raises
    ------
    ValueError
        For ``dim`` the batch or a ragged dim (its slices differ in size per sample), or a
        feature dim of a batch whose ragged dim was moved.
    """
    consecutive = func in (torch.unique_consecutive, torch.Tensor.unique_consecutive)
    name = "torch.unique_consecutive" if consecutive else "torch.unique"
    bound = bind_arguments(name, _UNIQUE_CONSECUTIVE if consecutive else _UNIQUE, args, kwargs)
    batch = bound.pop("input")
    call = torch.unique_consecutive if consecutive else torch.unique
    if bound["dim"] is not None:
        return _unique_slices(batch, call, name, bound)
    out = call(logical_elements(batch), **bound)
    if not bound["return_inverse"]:
        return out
    values = packed_values(batch)
    inverse = out[1]
    if _moved(batch):  # (the inverse of every element, back from logical to packed order)
        inverse = inverse[logical_flat_index(batch, values.shape).reshape(-1)]
    return (out[0], batch.with_values(inverse.view(values.shape)), *out[2:])


def _unique_slices(batch: NestedBatch, call: Any, name: str, bound: dict) -> Any:
    """``unique`` along feature ``dim``: torch's along dim 0 of the packed values with that
    dim moved first (each slice then holds every sample's elements in order)."""
    dim = normalize_dim(batch, bound["dim"])
    kind = dim_kind(batch, dim)
    if kind != "feature" or _moved(batch):
        why = (f"dim {dim} is the {kind} dim: its slices differ in size per sample"
               if kind != "feature" else "a moved ragged dim orders the elements of a slice "
               "otherwise than the packed rows")
        raise ValueError(
            f"{name}(dim={bound['dim']}) of a NestedBatch of shape {batch.shape}: only a "
            f"feature dim of a batch with its ragged dims in place is supported ({why}); use "
            "dim=None for the unique elements"
        )
    stored = values_dim(batch, dim)
    out = call(packed_values(batch).movedim(stored, 0), **{**bound, "dim": 0})
    if isinstance(out, Tensor):
        return batch.with_values(out.movedim(0, stored))
    return (batch.with_values(out[0].movedim(0, stored)), *out[1:])



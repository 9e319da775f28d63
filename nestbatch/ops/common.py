"""Helpers shared by the op implementations: dims, row structure, registration of name families.

A batch has dim 0 = the batch, dims ``1..k`` ragged (``k = num_ragged_dims``), then the feature
dims. Packed values have shape ``(total, *feature)``, so feature dim ``d`` of the batch is dim
``d - k`` of the values. A batch with one ragged dim may present it at another logical position
(:attr:`~nestbatch.NestedBatch.ragged_dim`, after a ``transpose``) while storage keeps it first;
:func:`storage_dim` maps a logical dim to where it is stored, and every op interprets dims
through it (:func:`dim_kind`, :func:`values_dim`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from nestbatch.batch import NestedBatch, after_stored_write, storage_dim, stored_layout
from nestbatch.checks import check_castable
from nestbatch.checks import normalize_dim as checked_dim
from nestbatch.layouts import Layout, Padded, RowPartition

PACKED_OR_PADDED = (Layout.PACKED, Layout.PADDED)


def is_batch(x: Any) -> bool:
    """Whether ``x`` is a :class:`~nestbatch.NestedBatch`."""
    return isinstance(x, NestedBatch)


def first_batch(args: Iterable[Any]) -> NestedBatch:
    """The first :class:`~nestbatch.NestedBatch` among ``args`` (one level of lists searched)."""
    for a in args:
        for b in a if isinstance(a, (list, tuple)) else (a,):
            if is_batch(b):
                return b
    raise TypeError("expected a NestedBatch among the arguments")


def torch_funcs(*names: str, functional: bool = False) -> tuple[Callable, ...]:
    """``torch.<name>`` and ``torch.Tensor.<name>`` (and ``F.<name>``) for every name that exists.

    Lets a module register one implementation for the function, the method and the in-place
    method spellings of an op in one line.
    """
    found: list[Callable] = []
    sources = (torch, torch.Tensor, F) if functional else (torch, torch.Tensor)
    for name in names:
        for source in sources:
            func = getattr(source, name, None)
            # Only functions: ``torch.float`` is a dtype and ``Tensor.real`` a descriptor (the
            # property ``batch.real`` is made from ``torch.real``).
            if callable(func) and func not in found:
                found.append(func)
    return tuple(found)


def argument(args: tuple, kwargs: dict, pos: int, name: str, default: Any = None) -> Any:
    """A torch function's argument given at position ``pos`` or as keyword ``name``."""
    if len(args) > pos:
        return args[pos]
    return kwargs.get(name, default)


#: :func:`bind_arguments`' mark of a parameter without a default.
REQUIRED = object()


def bind_arguments(name: str, spec: Sequence[tuple[str, Any]], args: tuple, kwargs: dict
                   ) -> dict[str, Any]:
    """The parameters ``spec`` (``(name, default)`` pairs in order; default
    :data:`REQUIRED` for none) of a call by name, in ``spec``'s order, defaults filled in, as
    Python binds them.

    Raises
    ------
    TypeError
        For too many positional arguments, an unknown or repeated keyword, or a missing
        required parameter (the function ``name`` in the message).
    """
    if len(args) > len(spec):
        raise TypeError(f"{name} takes at most {len(spec)} positional arguments, got "
                        f"{len(args)}")
    bound = {key: value for (key, _), value in zip(spec, args)}
    known = dict(spec)
    for key, value in kwargs.items():
        if key not in known or key in bound:
            raise TypeError(f"{name} got an unexpected or repeated argument {key!r}")
        bound[key] = value
    for key, default in spec:
        if key not in bound:
            if default is REQUIRED:
                raise TypeError(f"{name} is missing its argument {key!r}")
            bound[key] = default
    return {key: bound[key] for key, _ in spec}  # (in the parameters' order)


def logical_flat_index(batch: NestedBatch, shape: torch.Size) -> Tensor:
    """``(total, *feature)`` int64 (``shape``: the packed values'): where every packed element
    of ``batch`` (one ragged dim, moved to logical dim ``r``) lies in its samples flattened one
    after another, each sample ``(*feature[:r-1], L_i, *feature[r-1:])`` in row-major order
    (``torch.cat([s.flatten() for s in batch.unbind()])``). No read of the device."""
    partition = batch.partition
    features = shape[1:]
    before = batch.ragged_dim - 1  # (feature dims logically before the ragged dim)
    outer_size, inner_size = math.prod(features[:before]), math.prod(features[before:])
    rows = (-1, *[1] * len(features))
    device = partition.offsets.device
    outer = torch.arange(outer_size, device=device).view(
        *features[:before], *[1] * len(features[before:]))
    inner = torch.arange(inner_size, device=device).view(features[before:])
    lengths = partition.lengths[partition.row_ids].view(rows)
    start = (partition.offsets[:-1][partition.row_ids] * (outer_size * inner_size)).view(rows)
    position = partition.positions.view(rows)
    return start + outer * (lengths * inner_size) + position * inner_size + inner


def logical_elements(batch: NestedBatch) -> Tensor:
    """``(N,)``: ``torch.cat([s.flatten() for s in batch.unbind()])`` without a loop, every
    element of every sample one sample after another, each in its logical order: the packed
    values flattened where the ragged dims lead, else every element put at its logical place
    (:func:`logical_flat_index`; differentiable, no read of the device)."""
    values = batch.packed().values
    if batch.ragged_dim == 1:
        return values.reshape(-1)
    index = logical_flat_index(batch, values.shape).reshape(-1)
    return values.new_zeros(values.numel()).scatter(0, index, values.reshape(-1))


def normalize_dim(batch: NestedBatch, dim: object, name: str = "dim") -> int:
    """``dim`` in ``[0, batch.dim())`` (:func:`nestbatch.checks.normalize_dim`)."""
    return checked_dim(dim, batch.dim(), name)


def dim_kind(batch: NestedBatch, dim: int) -> str:
    """``"batch"``, ``"ragged"`` or ``"feature"`` for a normalized ``dim``."""
    return storage_dim(batch, dim)[0]


def values_dim(batch: NestedBatch, dim: int) -> int:
    """The dim of the packed values that is feature ``dim`` (normalized) of the batch."""
    return storage_dim(batch, dim)[1]


def feature_values_dim(batch: NestedBatch, dim: int, what: str) -> int:
    """The packed values' dim of logical feature ``dim``; a ``ValueError`` naming ``what`` for
    the batch or a ragged dim (ops along a feature dim: ``glu``, ``chunk``, ``narrow``, ...)."""
    dim = normalize_dim(batch, dim)
    kind, stored = storage_dim(batch, dim)
    if kind != "feature":
        why = "the samples" if kind == "batch" else "its sizes differ per sample"
        raise ValueError(
            f"{what} along dim {dim} of a NestedBatch: only feature dims are supported (dim "
            f"{dim} is the {kind} dim: {why}); pass dim=-1 for the last feature dim"
        )
    return stored


def check_same_structure(a: NestedBatch, b: NestedBatch, what: str = "batches") -> None:
    """Raise unless ``a`` and ``b`` have the same per-sample ragged shapes.

    The same partition object is the fast path; host shapes are compared when both are known;
    otherwise the device shapes are compared with ``torch.equal`` (a device sync).

    Raises
    ------
    ValueError
        Naming both structures when they differ.
    """
    pa, pb = a.partition, b.partition
    if pa is pb:
        return
    same = pa.batch_size == pb.batch_size and pa.num_ragged_dims == pb.num_ragged_dims
    if pa.ragged_rank > 1 or pb.ragged_rank > 1:
        # Nested raggedness: every level's rows the same (one level at a time).
        same = same and pa.ragged_rank == pb.ragged_rank and all(
            _same_level(la, lb) for la, lb in zip(pa.levels, pb.levels))
        if not same:
            raise ValueError(f"{what} must have the same nested row structure at every level")
        return
    if same and torch.compiler.is_compiling():
        # A traced graph compares on the device and fails asynchronously on a mismatch: a
        # comparison of host shapes would specialize the graph on every length, a read of the
        # device comparison would break it.
        if pa.num_ragged_dims == 1:
            equal = (pa.offsets == pb.offsets.to(pa.device)).all()
        else:
            equal = (pa.shape_per_sample == pb.shape_per_sample.to(pa.device)).all()
        torch._assert_async(equal, f"{what} must have the same row structure")
        return
    if same and pa.knows_host_shapes and pb.knows_host_shapes:
        same = pa.host_shapes == pb.host_shapes
    elif same:
        same = torch.equal(pa.shape_per_sample, pb.shape_per_sample.to(pa.device))
    if not same:
        raise ValueError(
            f"{what} must have the same row structure: got per-sample ragged shapes "
            f"{_describe_shapes(pa)} and {_describe_shapes(pb)}"
        )


def _same_level(a: RowPartition, b: RowPartition) -> bool:
    """Whether two one-ragged-dim partitions have the same lengths (on the host when both know
    them, else one read of the device)."""
    if a is b:
        return True
    if a.batch_size != b.batch_size:
        return False
    if a.knows_host_shapes and b.knows_host_shapes:
        return a.host_lengths == b.host_lengths
    return torch.equal(a.lengths, b.lengths.to(a.device))


def _describe_shapes(partition: RowPartition) -> str:
    shapes = partition.shape_per_sample
    if partition.num_ragged_dims == 1:
        return f"lengths={shapes[:, 0].tolist()}"
    return f"shape_per_sample={shapes.tolist()}"


def wrap_padded(data: Tensor, partition: RowPartition, ragged_dim: int = 1,
                filler: float | None = None) -> NestedBatch:
    """A batch over padded ``data`` (stored order) whose padding holds ``filler`` (None: no
    particular value)."""
    # Trusted: an op's padded result over a valid batch's partition (on the data's device).
    return NestedBatch.trusted(Padded.trusted(data, partition, filler), ragged_dim)


def fill_value_for(dtype: torch.dtype, kind: str) -> float | int | bool:
    """The identity / empty-sample value of a reduction ``kind`` for ``dtype``.

    ``"lowest"`` and ``"highest"`` are the dtype's finite extremes (TF's results for ``max`` /
    ``min`` of an empty row).
    """
    if dtype == torch.bool:
        return kind == "highest"
    info = torch.finfo(dtype) if dtype.is_floating_point else torch.iinfo(dtype)
    return info.min if kind == "lowest" else info.max


def replace_storage(batch: NestedBatch, result: NestedBatch) -> NestedBatch:
    """Write ``result``'s elements into ``batch``'s stored tensors, in place; return ``batch``.

    The in-place contract (see :mod:`nestbatch.tensor_methods`): the layout the batch was
    built in is updated in place (so views of its samples see the change, as with torch), the
    padding of a padded layout keeps its filler (when it has one), and every other cached
    layout is dropped, since it now holds stale values.

    Raises
    ------
    RuntimeError
        If ``result``'s dtype cannot be cast to ``batch``'s (as torch's in-place ops).
    """
    check_castable(result.dtype, batch.dtype)
    if result.feature_shape != batch.feature_shape:
        raise RuntimeError(
            f"in-place result has feature shape {tuple(result.feature_shape)}, which does not "
            f"match the batch's {tuple(batch.feature_shape)}"
        )
    primary = stored_layout(batch)
    result = result.to(batch.dtype)
    if isinstance(primary, Padded):
        # The result padded as the stored data is (its width, side and filler), copied over:
        # one conversion and one copy (writing through the mask would read it on the host).
        filler = 0 if primary.padding_value is None else primary.padding_value
        padded = result.padded(filler, tuple(primary.padded_shape),
                               padding_side=primary.padding_side)
        primary.data.copy_(padded.data)
    elif hasattr(primary, "values"):
        primary.values.copy_(result.packed().values)
    else:
        for tensor, new in zip(primary.tensors, result.tensor_list().tensors):
            tensor.copy_(new)
    # Other layouts were computed from the old values; only the primary one stays valid.
    after_stored_write(batch)
    return batch

"""Index payloads: batches whose values index the rows of another batch.

A mesh's faces index its vertices, a graph's edges its nodes, a span its tokens. Each sample of
the index batch holds *local* indices, into the matching sample of the target batch. Once the
target is packed (all samples' rows back to back), the same entries as *packed* (global)
indices are the local ones shifted by the sample's first row: PyTorch3D's ``faces_packed`` rule
(``faces_packed = faces + verts_first_idx[mesh]``). :func:`packed_indices` goes one way,
:func:`local_indices` the other.

Filler: an index batch laid out padded holds ``-1`` in its padded slots (``padded(-1)`` /
``to_padded_tensor(-1)``), never a valid index; :data:`INDEX_FILLER` names it. Sample values are
always real entries: ``-1`` never appears among them (checked with ``validate=True``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from nestbatch.batch import NestedBatch
from nestbatch.checks import read_device_values
from nestbatch.ops.common import check_same_structure

__all__ = ["INDEX_FILLER", "local_indices", "packed_indices"]

#: The padded slots of an index batch: not an index of any row.
INDEX_FILLER = -1


def packed_indices(indices: NestedBatch, into: NestedBatch, *, validate: bool = True
                   ) -> NestedBatch:
    """``indices`` shifted from positions in each sample of ``into`` to rows of its packed
    values (``into.values``).

    Parameters
    ----------
    indices : NestedBatch
        ``(B, (L_i), *D)`` integer: sample ``i`` indexes the rows of sample ``i`` of ``into``,
        in ``[0, N_i)`` (e.g. faces ``(F_i, 3)`` of meshes with ``N_i`` vertices).
    into : NestedBatch
        ``(B, (N_i), *F)`` with one ragged dim: the batch the indices point into.
    validate : bool, default True
        Check that every index lies in its sample's range: one read of the device (a sync).

    Returns
    -------
    NestedBatch
        Same structure as ``indices``; ``into.values[result.values]`` gathers the rows. Of the
        indices' dtype where that is int32 or int64, else int64 (a narrower dtype would wrap).

    Raises
    ------
    TypeError, ValueError
        For a non-integer ``indices``, batch sizes that differ, or (``validate``) an index out
        of its sample's range.
    """
    shift = _sample_starts(indices, into)
    if validate:
        _check_range(indices.values, _per_row(into.lengths, indices), "indices", "local")
    return indices.with_values((indices.values + shift).to(_packed_dtype(indices, into)))


def local_indices(packed: Tensor | NestedBatch, indices: NestedBatch, into: NestedBatch, *,
                  validate: bool = True) -> NestedBatch:
    """The inverse of :func:`packed_indices`: global rows of ``into.values`` back to positions
    in each sample of ``into``.

    Parameters
    ----------
    packed : Tensor or NestedBatch
        ``(total, *D)`` integer, laid out as ``indices.values`` (row ``r`` belongs to the sample
        of packed row ``r`` of ``indices``), or a batch of ``indices``' structure, e.g.
        ``packed_indices(indices, into)`` (its values are used).
    indices : NestedBatch
        Gives the structure (which sample every row of ``packed`` belongs to).
    into : NestedBatch
        The batch the indices point into.
    validate : bool, default True
        Check that every index lies in the rows of its own sample: one read (a sync).

    Returns
    -------
    NestedBatch
        ``indices``' structure with the local indices.
    """
    if isinstance(packed, NestedBatch) and isinstance(indices, NestedBatch):
        check_same_structure(indices, packed, "packed and indices")
        packed = packed.values
    if not isinstance(packed, Tensor) or packed.shape != indices.values.shape:
        shape = tuple(packed.shape) if isinstance(packed, Tensor) else type(packed).__name__
        raise ValueError(
            f"packed must be a tensor shaped as indices.values {tuple(indices.values.shape)}, "
            f"got {shape}"
        )
    local = packed - _sample_starts(indices, into)  # (in int64: the starts may not fit)
    if validate:
        _check_range(local, _per_row(into.lengths, indices), "packed", "global")
    return indices.with_values(local.to(packed.dtype))  # (each within its sample: it fits)


def _sample_starts(indices: NestedBatch, into: NestedBatch) -> Tensor:
    """``into``'s first packed row of each row's sample, shaped to broadcast over ``indices``'
    packed values."""
    for name, batch in (("indices", indices), ("into", into)):
        if not isinstance(batch, NestedBatch):
            raise TypeError(f"{name} must be a NestedBatch, got {type(batch).__name__}")
    values = indices.values
    if values.is_floating_point() or values.is_complex() or values.dtype == torch.bool:
        raise TypeError(f"indices must hold integers, got {values.dtype}")
    if indices.batch_size != into.batch_size:
        raise ValueError(
            f"indices has {indices.batch_size} samples but into has {into.batch_size}: sample i "
            "of indices points into sample i of into"
        )
    if indices.device != into.device:
        raise ValueError(f"indices is on {indices.device} but into is on {into.device}")
    return _per_row(into.offsets[:-1], indices)


def _per_row(per_sample: Tensor, indices: NestedBatch) -> Tensor:
    # One value per sample of ``into``, at each packed row of ``indices``, in int64: in the
    # indices' own dtype a start or size past its range would wrap (int16 edges of 400 graphs
    # of 100 nodes), and so would the check made with it.
    values = indices.values
    return per_sample.to(torch.int64)[indices.row_ids].view(-1, *([1] * (values.dim() - 1)))


def _packed_dtype(indices: NestedBatch, into: NestedBatch) -> torch.dtype:
    """The dtype of packed indices: the indices' own where it is int32 or int64, else int64
    (narrower ones cannot hold the rows of most packed batches; torch's promotion of the
    documented rule gives int64 too).

    Raises
    ------
    ValueError
        For int32 indices into a batch of more rows than int32 holds (known on the host).
    """
    dtype = indices.values.dtype
    if dtype == torch.int32:
        partition = into.partition
        if partition.knows_total and partition.total > torch.iinfo(torch.int32).max + 1:
            raise ValueError(
                f"indices of dtype int32 cannot hold the packed rows of into ({partition.total} "
                "rows): convert them to int64 first"
            )
        return dtype
    return torch.int64


def _check_range(local: Tensor, sizes: Tensor, name: str, kind: str) -> None:
    """Raise if an entry of ``local`` is outside ``[0, sizes)`` (per row): one read."""
    if local.numel() == 0:
        return
    offending = ((local < 0) | (local >= sizes)).reshape(local.shape[0], -1).any(1)
    if read_device_values(offending.any().reshape(1))[0]:
        row = int(offending.nonzero()[0])  # the error path reads more, to name the row
        size = int(sizes.reshape(sizes.shape[0], -1)[row, 0])
        raise ValueError(
            f"{name}: an index of packed row {row} is outside its sample's {kind} range "
            f"[0, {size}) once shifted back (indices must point into their own sample)"
        )

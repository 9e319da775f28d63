"""Reductions over one ragged level of a batch of ragged rank ``r >= 2`` (nested raggedness).

TensorFlow's semantics: reducing level ``j`` combines, position by position, the rows of level
``j`` that share a parent, each as if padded with the reduction's identity; the result has
ragged rank ``r - 1``.

* ``j == r`` (the innermost level): every innermost row reduces to one value, a segment
  reduction over that level's rows; an empty row gives the documented empty result (``sum`` 0,
  ``prod`` 1, ``mean`` nan, ``amax`` the dtype's lowest value, ``amin`` its highest).
* ``j < r``: the rows merge, and every merged row is as long as the longest of them (a sample
  whose level-``j`` rows are ``[[1, 2], [3]]`` sums to ``[4, 2]``); ``mean`` divides by the
  number of values that met at each position. Computed on the padded data; the result's sizes
  come from every level's row counts (counted on the host when the sizes are there; else read
  from the device once per level, a sync: the output's shape needs them).
"""

from __future__ import annotations

import torch
from torch import Tensor

from nestbatch.batch import NestedBatch
from nestbatch.conversions.packed_padded import packed_values_to_padded
from nestbatch.layouts import Packed, RowPartition
from nestbatch.ops.segment import WIDENED_DTYPES, masked_extreme, never_wins, segment_reduce

#: The reductions one level of a nested batch supports.
LEVEL_REDUCTIONS = ("sum", "mean", "prod", "amax", "amin")


def reduce_level(batch: NestedBatch, name: str, level: int, keepdim: bool,
                 dtype: torch.dtype | None) -> NestedBatch:
    """``name`` over ragged dim ``level`` (1..r) of ``batch`` (ragged rank ``r >= 2``).

    Returns
    -------
    NestedBatch
        Of ragged rank ``r - 1``; with ``keepdim`` its values get a size-1 dim in front of the
        feature dims.

    Raises
    ------
    ValueError
        For a reduction not in :data:`LEVEL_REDUCTIONS`.
    """
    if name not in LEVEL_REDUCTIONS:
        raise ValueError(
            f"{name} over one ragged level of a batch of ragged rank "
            f"{batch.partition.ragged_rank} is not supported (only {LEVEL_REDUCTIONS}); reduce "
            "every ragged dim at once, or pad first (.padded())"
        )
    values = batch.packed().values
    result_dtype = values.dtype if dtype is None else dtype
    if name in ("sum", "prod") and not (result_dtype.is_floating_point or result_dtype.is_complex):
        result_dtype = torch.int64  # as torch's sums and products of integers and bools
    wide = WIDENED_DTYPES.get(result_dtype, result_dtype)  # sums, means, products accumulate
    values = values.to(result_dtype if name in ("amax", "amin") else wide)
    levels = batch.partition.levels
    if level == len(levels):
        rows = NestedBatch.trusted(Packed.trusted(values, levels[-1]))
        out, partition = segment_reduce(values, rows, name), _chain(levels[:-1])
    else:
        out, partition = _merge_level(values, batch.partition, name, level)
    out = out.to(result_dtype)
    return NestedBatch.trusted(Packed.trusted(out.unsqueeze(1) if keepdim else out, partition))


def _chain(levels: tuple[RowPartition, ...]) -> RowPartition:
    return levels[0] if len(levels) == 1 else RowPartition.nested(levels)


def _merge_level(values: Tensor, partition: RowPartition, name: str, level: int
                 ) -> tuple[Tensor, RowPartition]:
    """The rows of level ``level < r`` merged (see the module docstring): the packed result
    and its partition."""
    shape = partition.max_shape
    mask = partition.mask(shape)
    trailing = (1,) * (values.dim() - 1)
    identity = {"sum": 0, "mean": 0, "prod": 1}.get(name)
    if identity is None:  # the padding never wins
        identity = never_wins(values.dtype, name)
    data = packed_values_to_padded(values, partition, shape, identity)
    if name == "mean":
        count = mask.sum(level).view(*mask.shape[:level], *mask.shape[level + 1:], *trailing)
        merged = data.sum(level) / count
    elif data.shape[level] == 0:  # no row anywhere at this level: nothing to read
        merged = data.sum(level)
    elif name in ("amax", "amin"):  # (padding that ties takes no gradient)
        merged = masked_extreme(data, mask.view(*mask.shape, *trailing), (level,), name)
    else:
        merged = getattr(torch, name)(data, level)
    # The result's partition: every level's row counts, their maximum over the merged position
    # (counted on the host when every level's sizes are there: no device read).
    on_host = all(lv.knows_host_shapes for lv in partition.levels)
    counts = _padded_counts(partition.to("cpu") if on_host else partition)
    result = _partition_from_counts(counts[:level - 1] + [
        c.amax(level) if c.shape[level] else c.sum(level) for c in counts[level:]], values.device)
    return merged[(result.row_ids, *result.ragged_index)], result


def _padded_counts(partition: RowPartition) -> list[Tensor]:
    """Every level's row lengths as a padded tensor over the levels above it: ``(B,)``,
    ``(B, M1)``, ..., ``(B, M1, ..., M_{r-1})``, 0 where no row is."""
    levels = partition.levels
    counts = [levels[0].lengths]
    for depth in range(1, len(levels)):
        above = _chain(levels[:depth])
        counts.append(packed_values_to_padded(levels[depth].lengths, above,
                                              partition.max_shape[:depth], 0))
    return counts


def _partition_from_counts(counts: list[Tensor], device: torch.device) -> RowPartition:
    """The partition on ``device`` whose level ``d`` row lengths are ``counts[d]`` read at every
    row of the levels above (``counts[0]``: the samples'). Counts on the host give host sizes;
    on the device, every level's total is read once (a sync)."""
    levels = [RowPartition.from_lengths(counts[0])]
    for count in counts[1:]:
        above = _chain(tuple(levels))
        levels.append(RowPartition.from_lengths(count[(above.row_ids, *above.ragged_index)]))
    if counts[0].device != device:  # counted on the host: the sizes stay known there
        # (host tensors: their tolist is no sync)
        levels = [RowPartition.from_host_lengths(lv.lengths.tolist(), device) for lv in levels]
    return _chain(tuple(levels))

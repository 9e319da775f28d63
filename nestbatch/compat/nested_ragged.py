"""Nested raggedness (TensorFlow's ``ragged_rank > 1``): a batch of documents of sentences of
tokens, ragged at every level.

The encoding is TF's: ``flat_values`` ``(total, *feature)`` and ``nested_row_splits``, one
offsets vector per ragged level, outermost first. Level ``j``'s splits partition the rows of
level ``j + 1`` (the last level's partition the rows of ``flat_values``). A batch of ragged rank
1 is an ordinary :class:`~nestbatch.NestedBatch`; :class:`NestedRaggedBatch` holds rank 2 and
more, and one level down (:attr:`NestedRaggedBatch.values`) is a batch of rank one less.

Build one with ``NestedBatch.from_nested_row_splits`` / ``from_nested_row_lengths`` (TF's names).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from nestbatch.batch import NestedBatch, extend
from nestbatch.checks import (
    as_offsets,
    check_host_offsets,
    check_offsets_on_device,
    check_tensor,
    host_ints,
    host_sizes,
)

__all__ = ["NestedRaggedBatch", "from_nested_row_lengths", "from_nested_row_splits"]

#: The reductions over the innermost ragged dim (each gives a batch of ragged rank one less).
REDUCTIONS = ("sum", "mean", "amax", "amin")


class NestedRaggedBatch:
    """A batch of ragged rank ``r >= 2``: samples ``(R_1, ..., R_r, *feature)`` ragged at every
    level, each level's rows of different lengths (TF's nested row splits).

    Parameters
    ----------
    flat_values : Tensor
        ``(total, *feature)``: the innermost rows of every sample, back to back.
    nested_row_splits : sequence of Tensor
        ``r`` offsets vectors, outermost first (int64, on ``flat_values``' device).

    Notes
    -----
    Build it with :func:`from_nested_row_splits` (which validates); the constructor trusts its
    arguments.
    """

    def __init__(self, flat_values: Tensor, nested_row_splits: Sequence[Tensor]) -> None:
        self.flat_values = flat_values
        self.nested_row_splits = tuple(nested_row_splits)

    # ------------------------------------------------------------------------------ structure
    @property
    def ragged_rank(self) -> int:
        """Number of ragged levels ``r``."""
        return len(self.nested_row_splits)

    @property
    def batch_size(self) -> int:
        """Number of samples (rows of the outermost level)."""
        return self.nested_row_splits[0].shape[0] - 1

    def __len__(self) -> int:
        return self.batch_size

    def nested_row_lengths(self) -> tuple[Tensor, ...]:
        """The lengths of every level's rows, outermost first (TF ``nested_row_lengths``)."""
        return tuple(splits.diff() for splits in self.nested_row_splits)

    @property
    def values(self) -> NestedBatch | NestedRaggedBatch:
        """The batch one level down: the rows of the outermost level as samples (rank ``r-1``)."""
        return _batch(self.flat_values, self.nested_row_splits[1:])

    @property
    def dtype(self) -> torch.dtype:
        return self.flat_values.dtype

    @property
    def device(self) -> torch.device:
        return self.flat_values.device

    # ------------------------------------------------------------------------------ samples
    def unbind(self) -> tuple[NestedBatch | NestedRaggedBatch, ...]:
        """Every sample, as a batch of its rows (ragged rank ``r - 1``; TF's ``rt[i]``)."""
        return tuple(self[i] for i in range(self.batch_size))

    def __getitem__(self, index: int | slice) -> NestedBatch | NestedRaggedBatch:
        """Sample ``index`` (a batch of its rows, ragged rank ``r - 1``), or the samples of a
        slice (ragged rank ``r``). Reads the splits it cuts (a sync on a device)."""
        if isinstance(index, slice):
            start, stop, step = index.indices(self.batch_size)
            if step != 1:
                raise ValueError(f"slices of the batch take step 1, got {step}")
            return self._samples(start, max(start, stop))
        if isinstance(index, bool) or not isinstance(index, int):
            raise TypeError(f"index must be an int or a slice, got {type(index).__name__}")
        if not -self.batch_size <= index < self.batch_size:
            raise IndexError(f"sample {index} out of range for batch size {self.batch_size}")
        index %= self.batch_size
        return self._samples(index, index + 1).values

    def _samples(self, start: int, stop: int) -> NestedBatch | NestedRaggedBatch:
        """Samples ``start:stop``: every level's splits cut to the rows they cover, rebased.

        Reads the first and last split of every level (a device sync on a GPU): they bound the
        slice of the next level, which needs host ints."""
        splits = []
        for level in self.nested_row_splits:
            part = level[start : stop + 1]
            first, last = (int(v) for v in part[[0, -1]].tolist())
            splits.append(part - first)
            start, stop = first, last
        return _batch(self.flat_values[start:stop], splits)

    def tolist(self) -> list:
        """Nested Python lists of the values (TF ``to_list``; reads the device)."""
        return [sample.tolist() for sample in self.unbind()]

    to_list = tolist

    # ------------------------------------------------------------------------------ padding
    def to_tensor(self, default_value: float = 0.0) -> Tensor:
        """``(B, max R_1, ..., max R_r, *feature)``: every ragged dim padded to its maximum
        (TF ``to_tensor``), ``default_value`` in the padded slots."""
        inner = self.values
        inner_padded = inner.to_padded_tensor(default_value) if isinstance(inner, NestedBatch) \
            else inner.to_tensor(default_value)
        rows = NestedBatch.from_offsets(inner_padded, self.nested_row_splits[0], validate=False)
        return rows.to_padded_tensor(default_value)

    def to_padded_tensor(self, padding: float = 0.0) -> Tensor:
        """torch's name for :meth:`to_tensor`."""
        return self.to_tensor(padding)

    # ------------------------------------------------------------------------------ reductions
    def reduce(self, name: str) -> NestedBatch | NestedRaggedBatch:
        """``name`` (sum / mean / amax / amin) over the innermost ragged dim: a batch of ragged
        rank one less, one entry per innermost row (an empty row gives what ``torch.<name>``
        of an empty sample gives in nestbatch: 0, nan, or the filler of ``amax`` / ``amin``)."""
        if name not in REDUCTIONS:
            raise ValueError(f"reduction must be one of {REDUCTIONS}, got {name!r}")
        innermost = NestedBatch.from_offsets(self.flat_values, self.nested_row_splits[-1],
                                             validate=False)
        reduced = getattr(torch, name)(innermost, dim=1)
        return _batch(reduced, self.nested_row_splits[:-1])

    def sum(self, dim: int) -> NestedBatch | NestedRaggedBatch:
        """Sum over ``dim``, the innermost ragged dim (``dim == ragged_rank``)."""
        return self._reduce_dim("sum", dim)

    def mean(self, dim: int) -> NestedBatch | NestedRaggedBatch:
        return self._reduce_dim("mean", dim)

    def amax(self, dim: int) -> NestedBatch | NestedRaggedBatch:
        return self._reduce_dim("amax", dim)

    def amin(self, dim: int) -> NestedBatch | NestedRaggedBatch:
        return self._reduce_dim("amin", dim)

    def _reduce_dim(self, name: str, dim: Any) -> NestedBatch | NestedRaggedBatch:
        if dim != self.ragged_rank:
            raise ValueError(
                f"{name} of a batch of ragged rank {self.ragged_rank} is supported over its "
                f"innermost ragged dim (dim={self.ragged_rank}), got dim={dim}"
            )
        return self.reduce(name)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in REDUCTIONS and args and isinstance(args[0], NestedRaggedBatch):
            dim = args[1] if len(args) > 1 else kwargs.get("dim")
            return args[0]._reduce_dim(name, dim)
        return NotImplemented

    def __repr__(self) -> str:
        return (
            f"NestedRaggedBatch(ragged_rank={self.ragged_rank}, batch_size={self.batch_size}, "
            f"feature_shape={tuple(self.flat_values.shape[1:])}, dtype={self.dtype}, "
            f"device={self.device})"
        )


def _batch(flat_values: Tensor, splits: Sequence[Tensor]) -> NestedBatch | NestedRaggedBatch:
    if len(splits) == 0:
        raise ValueError("a batch needs at least one level of row splits")
    if len(splits) == 1:
        return NestedBatch.from_offsets(flat_values, splits[0], validate=False)
    return NestedRaggedBatch(flat_values, splits)


def from_nested_row_splits(
    flat_values: Tensor, nested_row_splits: Sequence[Tensor | Sequence[int]], *,
    validate: bool = True,
) -> NestedBatch | NestedRaggedBatch:
    """Batch of ragged rank ``len(nested_row_splits)`` (TF ``from_nested_row_splits``).

    Parameters
    ----------
    flat_values : Tensor
        ``(total, *feature)``.
    nested_row_splits : sequence of 1-d integer tensors or int sequences
        Offsets, outermost first: level ``j``'s last entry is the number of rows of level
        ``j + 1`` (of ``flat_values`` for the last level).
    validate : bool, default True
        Check every level as TF's ``validate=True``: starts at 0, never decreases, ends at the
        next level's row count. Host splits are checked on the host; device ones with one read
        each.

    Returns
    -------
    NestedBatch or NestedRaggedBatch
        An ordinary batch for one level, a :class:`NestedRaggedBatch` for more.
    """
    check_tensor(flat_values, "flat_values")
    if flat_values.dim() < 1:
        raise ValueError("flat_values must have a row dim (total, *feature), got a scalar")
    if isinstance(nested_row_splits, Tensor) or not isinstance(nested_row_splits, Sequence) \
            or len(nested_row_splits) == 0:
        raise TypeError("nested_row_splits must be a non-empty sequence of offsets vectors")
    host_levels: list[tuple[int, ...] | None] = []
    for level, raw in enumerate(nested_row_splits):
        name = f"nested_row_splits[{level}]"
        if not isinstance(raw, Tensor):
            host_levels.append(host_ints(raw, name))
        elif raw.is_cpu and not (raw.is_floating_point() or raw.dtype == torch.bool):
            host_levels.append(tuple(raw.reshape(-1).tolist()))  # a host tensor: no sync
        else:
            host_levels.append(None)
    splits = [
        as_offsets(raw if isinstance(raw, Tensor) else torch.tensor(host, dtype=torch.int64),
                   flat_values.device, f"nested_row_splits[{level}]")
        for level, (raw, host) in enumerate(zip(nested_row_splits, host_levels))
    ]
    if validate:
        # Host splits are checked on the host (no sync); device ones with one read each.
        rows = [s.shape[0] - 1 for s in splits[1:]] + [flat_values.shape[0]]
        for level, (offsets, host, count) in enumerate(zip(splits, host_levels, rows)):
            name = f"nested_row_splits[{level}]"
            if host is None:
                check_offsets_on_device(offsets, count, name=name)
            elif not host:
                raise ValueError(f"{name} must have at least one entry (B + 1 values), got none")
            else:
                check_host_offsets(list(host), count, None, name)
    return _batch(flat_values, splits)


def from_nested_row_lengths(
    flat_values: Tensor, nested_row_lengths: Sequence[Tensor | Sequence[int]], *,
    validate: bool = True,
) -> NestedBatch | NestedRaggedBatch:
    """Batch of ragged rank ``len(nested_row_lengths)`` from every level's row lengths,
    outermost first (TF ``from_nested_row_lengths``); see :func:`from_nested_row_splits`."""
    if isinstance(nested_row_lengths, Tensor) or not isinstance(nested_row_lengths, Sequence) \
            or len(nested_row_lengths) == 0:
        raise TypeError("nested_row_lengths must be a non-empty sequence of lengths vectors")
    splits: list[Tensor | tuple[int, ...]] = []
    for level, lengths in enumerate(nested_row_lengths):
        if not isinstance(lengths, Tensor):
            # Host lengths give host splits, checked on the host (no sync).
            sizes = host_sizes(lengths, f"nested_row_lengths[{level}]")
            splits.append((0, *itertools.accumulate(sizes)))
            continue
        offsets = lengths.new_zeros(lengths.shape[0] + 1, dtype=torch.int64)
        torch.cumsum(lengths, 0, out=offsets[1:])
        splits.append(offsets)
    return from_nested_row_splits(flat_values, splits, validate=validate)


extend("from_nested_row_splits", from_nested_row_splits)
extend("from_nested_row_lengths", from_nested_row_lengths)

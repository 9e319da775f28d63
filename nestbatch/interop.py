"""A :class:`~nestbatch.NestedBatch` to and from torch's other ragged formats: ``PackedSequence``
and ``torch.nested`` tensors.

Functions rather than methods: torch code builds these formats with functions
(``pack_sequence``, ``torch.nested.nested_tensor``), and a batch is not the place to look for
every format it converts to. :func:`nestbatch.as_nested` takes either format too. The layout-level
conversions they run are in :mod:`nestbatch.convert.packed_sequence` and
:mod:`nestbatch.convert.nested_tensor`.
"""

from __future__ import annotations

from torch import Tensor
from torch.nn.utils.rnn import PackedSequence

from nestbatch.batch import NestedBatch, moved_ragged_error
from nestbatch.convert.nested_tensor import nested_tensor_to_layout, packed_to_nested_tensor
from nestbatch.convert.packed_sequence import (
    packed_sequence_to_packed,
    packed_to_packed_sequence,
)

__all__ = ["from_nested_tensor", "from_packed_sequence", "to_nested_tensor", "to_packed_sequence"]


def from_packed_sequence(sequence: PackedSequence) -> NestedBatch:
    """Batch of the sequences of a ``PackedSequence`` (sorted or not), in sample order.

    The lengths come from its CPU ``batch_sizes``, so no device sync; one gather of the rows.
    """
    if not isinstance(sequence, PackedSequence):
        raise TypeError(f"sequence must be a PackedSequence, got {type(sequence).__name__}")
    return NestedBatch(packed_sequence_to_packed(sequence))


def to_packed_sequence(batch: NestedBatch) -> PackedSequence:
    """``batch`` as a ``PackedSequence`` (unsorted: sample order is kept by its indices).

    Needs one ragged dim at dim 1 and no zero-length sample; reads the lengths on the host once
    if only the device has them (``batch_sizes`` lives on the CPU).
    """
    _check_batch(batch, "to_packed_sequence")
    return packed_to_packed_sequence(batch.packed())


def from_nested_tensor(nt: Tensor, num_ragged_dims: int | None = None) -> NestedBatch:
    """Batch of a ``torch.nested`` tensor; a contiguous jagged one shares its storage.

    ``num_ragged_dims`` applies to a strided nested tensor (default: inferred from the sample
    shapes); a jagged one has one ragged dim.
    """
    return NestedBatch(nested_tensor_to_layout(nt, num_ragged_dims))


def to_nested_tensor(batch: NestedBatch) -> Tensor:
    """A jagged ``torch.nested`` tensor sharing ``batch``'s packed values (one ragged dim, at
    dim 1)."""
    _check_batch(batch, "to_nested_tensor")
    return packed_to_nested_tensor(batch.packed())


def _check_batch(batch: object, what: str) -> None:
    if not isinstance(batch, NestedBatch):
        raise TypeError(f"{what} takes a NestedBatch, got {type(batch).__name__}")
    if batch.ragged_dim != 1:
        raise moved_ragged_error(batch, what)

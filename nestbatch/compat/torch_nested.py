"""torch.nested's public functions, spelled as torch.nested spells them, making batches.

Code written for torch.nested's jagged layout changes its import (``import nestbatch.torch_nested
as nested`` where it had ``torch.nested``) or its constructor calls, and nothing else:

=================================  ===================================================
torch.nested                       here
=================================  ===================================================
``nested_tensor(ts, ...)``         :func:`nested_tensor` (= :func:`nestbatch.nested`)
``as_nested_tensor(ts, ...)``      :func:`as_nested_tensor` (keeps autograd history)
``nested_tensor_from_jagged``      :func:`nested_tensor_from_jagged`
``narrow(t, 1, start, length)``    :func:`narrow` (a copy, not a view)
``masked_select(t, mask)``         :func:`masked_select`
``to_padded_tensor(nt, pad)``      :func:`to_padded_tensor`; ``torch.nested.to_padded_tensor``
                                   itself also takes a batch (``__torch_function__``)
=================================  ===================================================

``layout=torch.jagged`` is accepted everywhere (a batch's packed layout); ``torch.strided`` is
refused (torch.nested's strided nested tensors are padded storage here: ``Layout.PADDED``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from nestbatch.batch import NestedBatch
from nestbatch.checks import check_tensor
from nestbatch.compat.factories import as_nested, layout_arg, nested
from nestbatch.errors import torch_compatible
from nestbatch.layouts import RowPartition

__all__ = [
    "as_nested_tensor", "masked_select", "narrow", "nested_tensor", "nested_tensor_from_jagged",
    "to_padded_tensor",
]

#: torch.nested.nested_tensor: a new leaf batch holding a copy of the samples.
nested_tensor = nested


@torch_compatible
def as_nested_tensor(
    ts: Tensor | Sequence[Tensor], dtype: torch.dtype | None = None,
    device: torch.device | str | None = None, layout: Any = None,
) -> NestedBatch:
    """A batch of ``ts`` (a list of samples, or a tensor whose rows along dim 0 are the
    samples) that keeps their autograd history, as ``torch.nested.as_nested_tensor``
    (:func:`nestbatch.as_nested`)."""
    if layout is not None:
        layout_arg(layout)
    return as_nested(ts if isinstance(ts, Tensor) else list(ts), dtype=dtype, device=device)


@torch_compatible
def nested_tensor_from_jagged(
    values: Tensor, offsets: Tensor | None = None, lengths: Tensor | None = None,
    jagged_dim: int | None = None, min_seqlen: int | None = None,
    max_seqlen: int | None = None,
) -> NestedBatch:
    """A batch over packed ``values (total, *feature)`` (shared, no copy) from ``offsets`` or
    ``lengths``, as ``torch.nested.nested_tensor_from_jagged``; ``max_seqlen`` is the padded
    length (:meth:`NestedBatch.from_offsets`'s ``max_len``). With both ``offsets`` and
    ``lengths`` (samples that do not fill their slots) the samples are copied out of
    ``values`` (one read of the lengths' total when they are a device tensor: the copy's size
    needs it); ``min_seqlen`` is not needed."""
    check_tensor(values, "values")
    if jagged_dim not in (None, 1):
        raise ValueError(
            f"jagged_dim={jagged_dim}: the ragged dim of a batch built from packed values is dim "
            "1 (transpose the result to move it)"
        )
    if offsets is None and lengths is None:
        raise ValueError(
            "nested_tensor_from_jagged(): At least one of offsets or lengths is required."
        )
    if offsets is None:
        return NestedBatch.from_lengths(values, lengths, max_len=max_seqlen)
    if lengths is None:
        return NestedBatch.from_offsets(values, offsets, max_len=max_seqlen)
    _, rows = _narrowed_rows(offsets[:-1], lengths)
    return NestedBatch.from_lengths(values[rows], lengths, max_len=max_seqlen)


@torch_compatible
def narrow(tensor: Tensor, dim: int, start: int | Tensor, length: int | Tensor,
           layout: Any = torch.strided) -> NestedBatch:
    """The batch whose sample ``i`` is ``tensor[i, start_i : start_i + length_i]`` (``start``
    and ``length``: ints or ``(B,)`` integer tensors), as ``torch.nested.narrow``'s jagged
    layout. A copy, where torch.nested makes a view. Reads the device twice when ``start`` /
    ``length`` live there: their range check (a bad range must raise, not gather garbage) and
    the lengths' total (the result's size needs it)."""
    check_tensor(tensor, "tensor")
    if dim != 1:
        raise ValueError(f"narrow: only dim=1 is supported (the ragged dim), got dim={dim}")
    if tensor.dim() < 2:
        raise ValueError(f"narrow needs a tensor of at least 2 dims, got {tuple(tensor.shape)}")
    batch_size = tensor.shape[0]
    start = torch.as_tensor(start, device=tensor.device).expand(batch_size)
    length = torch.as_tensor(length, device=tensor.device).expand(batch_size)
    if bool(((start < 0) | (length < 0) | (start + length > tensor.shape[1])).any()):
        raise ValueError(
            f"narrow: start and length must select inside dim 1 (size {tensor.shape[1]}), got "
            f"start={start.tolist()} and length={length.tolist()}"
        )
    samples, positions = _narrowed_rows(start, length)
    return NestedBatch.from_lengths(tensor[samples, positions], length.contiguous())


def _narrowed_rows(start: Tensor, length: Tensor) -> tuple[Tensor, Tensor]:
    """``(sample, position)`` of every entry ``start_i .. start_i + length_i - 1``, in order."""
    partition = RowPartition.from_lengths(length.to(torch.int64))
    samples = partition.row_ids
    return samples, start.to(torch.int64)[samples] + partition.positions


@torch_compatible
def masked_select(tensor: Tensor, mask: Tensor) -> NestedBatch:
    """The batch of the entries of ``tensor`` where ``mask`` (broadcast to it) is True, one
    sample per row of its last dim, as ``torch.nested.masked_select`` (one read: the number
    of selected entries)."""
    check_tensor(tensor, "tensor")
    check_tensor(mask, "mask")
    values = tensor.masked_select(mask)
    lengths = mask.expand(tensor.shape).sum(dim=tensor.dim() - 1).reshape(-1)
    return NestedBatch.from_lengths(values, lengths)


@torch_compatible
def to_padded_tensor(input: NestedBatch, padding: float,  # noqa: A002 (torch's name)
                     output_size: Sequence[int] | None = None) -> Tensor:
    """``input.to_padded_tensor(padding, output_size)``, as ``torch.nested.to_padded_tensor``."""
    if not isinstance(input, NestedBatch):
        return torch.nested.to_padded_tensor(input, padding, output_size)
    return input.to_padded_tensor(padding, output_size)

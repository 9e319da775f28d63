"""The pure-PyTorch references of the ``nestbatch::*`` operators (any device, differentiable).

Conversions between packed and padded rows with one ragged dim take the packed ``offsets``
``(B + 1,)`` and host ints (``max_len``, ``total``), never a layout object, so this module is a
leaf: it imports nothing from nestbatch.

The batched, per-sample indexing primitives work on *normalized* tensors: data ``(B, N, *D)``
(one batch dim, then the indexed dim), per-sample index tensors ``(B, M)`` and per-sample valid
counts ``sizes`` ``(B,)``. Index slot ``j`` of sample ``b`` is *valid* when ``j < sizes[b]``;
padded (invalid) slots are never read, so they may hold any value, even an out-of-range one.

Conventions shared by all primitives:

* Valid indices must already be non-negative and in range: resolving negative indices needs the
  per-sample valid size of the *indexed* object, which only the caller
  (``nestbatch.compat.batching_helpers``) knows. No range checks happen here, so no host
  synchronization is introduced (except where the output shape depends on data, see
  :func:`mask_to_indices`).
* Index and size tensors may be ``int32`` or ``int64``.
* Inputs are never modified in place; all functions are differentiable with respect to their
  floating point data arguments through ordinary torch autograd, and gradients of filler slots
  are zero.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torch.nn.utils.rnn import pad_sequence
from torch.types import Number

__all__ = [
    "BLOCK_ELEMENTS",
    "bool_compaction",
    "fill_padding",
    "index_mapping",
    "indexing_access",
    "indexing_write",
    "indices_to_mask",
    "inverse_indexing_access",
    "mask_to_indices",
    "packed_to_padded",
    "padded_to_packed",
    "sizes_mask",
]

#: On the CPU, samples averaging at least this many elements are padded as whole blocks
#: (``pad_sequence``'s C++ loop); shorter ones through one gather of every padded slot.
#: Measured on 2 cores: blocks 2x faster at 775 elements per sample, 6x at 25k; the gather
#: 5x faster at 100.
BLOCK_ELEMENTS = 512


def packed_to_padded(
    values: Tensor, offsets: Tensor, max_len: int, padding_value: Number
) -> Tensor:
    """``(total, *D)`` packed rows -> ``(B, max_len, *D)``; sample ``b`` is rows
    ``offsets[b]:offsets[b + 1]``, cut at ``max_len``; other slots hold ``padding_value``.

    Every output element is written once: a gather of each slot's source row, then the
    padding (a scatter into a pre-filled tensor writes twice and is several times slower on the
    CPU). Long samples on the CPU are copied as whole blocks instead.
    """
    batch = offsets.shape[0] - 1
    shape = (batch, max_len, *values.shape[1:])
    if values.shape[0] == 0 or math.prod(shape) == 0:
        # Nothing to read; adding ``values.sum() * 0`` keeps the autograd link to ``values``.
        out = values.new_full(shape, padding_value)
        return out + values.sum() * 0 if values.requires_grad else out
    if _blocks_pay_off(values, offsets):
        return _pad_blocks(values, offsets, max_len, padding_value)
    positions = torch.arange(max_len, device=values.device)
    starts = offsets[:-1].unsqueeze(1)
    inside = positions < (offsets[1:].unsqueeze(1) - starts)
    rows = (starts + positions).clamp_(0, values.shape[0] - 1)
    out = values.index_select(0, rows.reshape(-1)).view(shape)
    trailing = (1,) * (values.dim() - 1)
    # In place on the fresh gather output: no second output to allocate (and, on the CPU, to
    # fault in page by page); index_select's backward needs no output.
    return out.masked_fill_(~inside.view(batch, max_len, *trailing), padding_value)


def _blocks_pay_off(values: Tensor, offsets: Tensor) -> bool:
    # Host offsets are free to read; a compiled graph takes the gather.
    batch = offsets.shape[0] - 1
    return (
        values.device.type == "cpu"
        and offsets.device.type == "cpu"
        and batch > 0
        and values.numel() >= BLOCK_ELEMENTS * batch
        and not torch.compiler.is_compiling()
    )


def _pad_blocks(values: Tensor, offsets: Tensor, max_len: int, padding_value: Number) -> Tensor:
    # pad_sequence copies the blocks in one C++ loop; extra length (kaolin's max_shape) is
    # padded on after, and samples longer than max_len are cut (the operators' contract).
    bounds = offsets.tolist()  # host offsets (see _blocks_pay_off): no sync
    blocks = [values[a:max(a, min(b, a + max_len))] for a, b in zip(bounds, bounds[1:])]
    out = pad_sequence(blocks, batch_first=True, padding_value=padding_value)
    if out.shape[1] < max_len:
        tail = out.new_full((out.shape[0], max_len - out.shape[1], *out.shape[2:]), padding_value)
        out = torch.cat([out, tail], 1)
    return out


def padded_to_packed(data: Tensor, offsets: Tensor, total: int) -> Tensor:
    """``(B, L, *D)`` padded data -> ``(total, *D)`` packed rows: the first
    ``offsets[b + 1] - offsets[b]`` slots of every sample, back to back (lengths at most ``L``,
    offsets from 0 to ``total``)."""
    batch = data.shape[0]
    lengths = (offsets[1:] - offsets[:-1]).to(torch.int64)
    samples = torch.arange(batch, device=data.device)
    row_ids = torch.repeat_interleave(samples, lengths, output_size=total)
    positions = torch.arange(total, device=data.device) - offsets[:-1].to(torch.int64)[row_ids]
    return data[row_ids, positions]


def fill_padding(data: Tensor, sizes: Tensor, value: float) -> Tensor:
    """Set the padded slots of each sample to ``value``.

    Parameters
    ----------
    data : Tensor
        Shape ``(B, N, *D)``.
    sizes : Tensor
        Integer tensor of shape ``(B,)``; slots ``>= sizes[b]`` along dim 1 are padding.
    value : float or int or bool
        Value written into the padded slots (cast to ``data.dtype``).

    Returns
    -------
    Tensor
        New tensor of shape ``(B, N, *D)``; the gradient of padded slots is 0.
    """
    padding = sizes_mask(sizes, data.shape[1], padding=True)
    return data.masked_fill(padding.view(*padding.shape, *(1,) * (data.dim() - 2)), value)


def indexing_access(
    data: Tensor, indices: Tensor, sizes: Tensor, filler_value: float = 0
) -> Tensor:
    """Per-sample gather: ``out[b, j] = data[b, indices[b, j]]`` for ``j < sizes[b]``.

    Parameters
    ----------
    data : Tensor
        Shape ``(B, N, *D)``.
    indices : Tensor
        ``int32``/``int64`` of shape ``(B, M)``; valid slots hold indices in ``[0, N)``.
    sizes : Tensor
        Shape ``(B,)``, number of valid index slots per sample.
    filler_value : float or int or bool
        Value of the output slots ``j >= sizes[b]``.

    Returns
    -------
    Tensor
        Shape ``(B, M, *D)``. Duplicate indices are allowed; their gradients add up in ``data``.
    """
    num_samples, width = indices.shape
    shape = (num_samples, width, *data.shape[2:])
    if data.shape[1] == 0:
        # Nothing can be read: every slot is a filler slot (the sum keeps the autograd link).
        out = data.new_full(shape, filler_value)
        return out + data.sum() * 0 if data.requires_grad else out
    # Padded slots may hold any index: clamp them into range, read, then overwrite them.
    safe = indices.clamp(0, data.shape[1] - 1).long()
    trailing = (1,) * (data.dim() - 2)
    if math.prod(data.shape[2:]) >= _ROW_COPY_ELEMENTS:
        # Long rows: one index_select of whole rows of the flattened (B * N) data copies them
        # faster than gather's per-element index reads (1.5x at 64 float32 features).
        starts = torch.arange(0, num_samples * data.shape[1], data.shape[1], device=data.device)
        flat = data.reshape(num_samples * data.shape[1], *data.shape[2:])
        gathered = flat.index_select(0, (safe + starts.unsqueeze(1)).reshape(-1)).view(shape)
    else:
        gathered = torch.gather(data, 1, safe.view(num_samples, width, *trailing).expand(shape))
    # In place on the fresh gather output (saves an allocation; its backward needs no output).
    padding = sizes_mask(sizes, width, padding=True)
    return gathered.masked_fill_(padding.view(num_samples, width, *trailing), filler_value)


#: Rows of at least this many elements are gathered with ``index_select`` of whole rows, shorter
#: ones with ``gather`` (fewer ops, which is what costs at small sizes).
_ROW_COPY_ELEMENTS = 32


def sizes_mask(sizes: Tensor, width: int, *, padding: bool = False) -> Tensor:
    """Bool ``(*sizes.shape, width)``: True where slot ``j < sizes[...]`` (a sample's element),
    or with ``padding=True`` where ``j >= sizes[...]``. The one place nestbatch builds a mask
    from sizes: two ops (an ``arange`` and a comparison)."""
    slots = torch.arange(width, device=sizes.device)
    sizes = sizes.unsqueeze(-1)
    return slots >= sizes if padding else slots < sizes


def indexing_write(to_write: Tensor, indices: Tensor, sizes: Tensor, into: Tensor) -> Tensor:
    """Per-sample scatter: ``out[b, indices[b, j]] = to_write[b, j]`` for ``j < sizes[b]``.

    Parameters
    ----------
    to_write : Tensor
        Shape ``(B, M, *D)``, same dtype as ``into``.
    indices : Tensor
        ``int32``/``int64`` of shape ``(B, M)``; valid slots hold indices in ``[0, N)``. Valid
        indices of a sample should be unique; for duplicates an unspecified one of the written
        values wins.
    sizes : Tensor
        Shape ``(B,)``, number of valid index slots per sample.
    into : Tensor
        Shape ``(B, N, *D)``; the values at all positions not written to are taken from here.

    Returns
    -------
    Tensor
        Shape ``(B, N, *D)``. Gradients reach ``into`` only at positions that were not
        overwritten.
    """
    num_samples, width = indices.shape
    num_targets = into.shape[1]
    feature = tuple(into.shape[2:])
    rows = num_samples * num_targets
    # Rows of all samples back to back, plus one dummy row that padding slots write into and
    # that is dropped afterwards: no data-dependent (host-syncing) selection of the valid
    # slots, and the result is a contiguous prefix of the buffer. (index_copy_ rather than a
    # scatter along dim 1: it copies rows bit for bit, NaN payloads included.)
    flat = torch.cat([into.reshape(rows, *feature), into.new_zeros((1, *feature))])
    starts = torch.arange(num_samples, device=indices.device).unsqueeze(1) * num_targets
    target = torch.where(sizes_mask(sizes, width, padding=True), rows, indices.long() + starts)
    flat.index_copy_(0, target.reshape(-1), to_write.reshape(num_samples * width, *feature))
    return flat[:rows].view(into.shape)


def inverse_indexing_access(
    data: Tensor, indices: Tensor, sizes: Tensor, num_targets: int, filler_value: float = 0
) -> Tensor:
    """Scatter into a filler-initialized tensor: ``out[b, indices[b, j]] = data[b, j]``.

    Parameters
    ----------
    data : Tensor
        Shape ``(B, M, *D)``.
    indices : Tensor
        ``int32``/``int64`` of shape ``(B, M)``; valid slots hold unique indices in
        ``[0, num_targets)``.
    sizes : Tensor
        Shape ``(B,)``, number of valid index slots per sample.
    num_targets : int
        Size of dim 1 of the output.
    filler_value : float or int or bool
        Value of all output positions that are not written to.

    Returns
    -------
    Tensor
        Shape ``(B, num_targets, *D)``.
    """
    into = data.new_full((data.shape[0], num_targets) + tuple(data.shape[2:]), filler_value)
    return indexing_write(data, indices, sizes, into)


def index_mapping(
    source: Tensor, source_indices: Tensor, target_indices: Tensor, sizes: Tensor, target: Tensor
) -> Tensor:
    """Per-sample mapping ``out[b, target_indices[b, j]] = source[b, source_indices[b, j]]``.

    Parameters
    ----------
    source : Tensor
        Shape ``(B, Ns, *D)``.
    source_indices : Tensor
        Shape ``(B, M)``; valid slots in ``[0, Ns)``, duplicates allowed (their gradients add up).
    target_indices : Tensor
        Shape ``(B, M)``; valid slots hold unique indices in ``[0, Nt)``.
    sizes : Tensor
        Shape ``(B,)``, number of valid index pairs per sample.
    target : Tensor
        Shape ``(B, Nt, *D)``, same dtype as ``source``.

    Returns
    -------
    Tensor
        Shape ``(B, Nt, *D)``: ``target`` with the mapped values written in.
    """
    gathered = indexing_access(source, source_indices, sizes, 0)
    return indexing_write(gathered, target_indices, sizes, target)


def mask_to_indices(mask: Tensor, max_count: int | None = None) -> tuple[Tensor, Tensor]:
    """Positions of the ``True`` entries of each row of a mask, in increasing order.

    Parameters
    ----------
    mask : Tensor
        Bool tensor of shape ``(B, N)``.
    max_count : int, optional
        Output width; entries of rank ``>= max_count`` are dropped. Default: the largest count,
        read on the host (one synchronization when the mask lives on a GPU: the output's shape
        depends on it); pass it to avoid that.

    Returns
    -------
    indices : Tensor
        ``int64`` of shape ``(B, max_count)``; padded slots hold 0.
    counts : Tensor
        ``int64`` of shape ``(B,)``, number of ``True`` entries per row.
    """
    num_samples, num_entries = mask.shape
    counts = mask.sum(dim=1, dtype=torch.int64)
    if max_count is None:
        max_count = int(counts.max().item()) if num_samples > 0 else 0
    rank = torch.cumsum(mask, dim=1, dtype=torch.int64) - 1
    # Unselected (and overflowing) positions are scattered into a dummy column that is dropped.
    kept = mask & (rank < max_count)
    slot = torch.where(kept, rank, torch.full((), max_count, device=mask.device))
    positions = torch.arange(num_entries, device=mask.device).expand(num_samples, num_entries)
    out = torch.zeros((num_samples, max_count + 1), dtype=torch.int64, device=mask.device)
    out.scatter_(1, slot, positions)
    return out[:, :max_count].contiguous(), counts


def indices_to_mask(indices: Tensor, sizes: Tensor, num_targets: int) -> Tensor:
    """Bool mask with ``mask[b, indices[b, j]] = True`` for ``j < sizes[b]``.

    Parameters
    ----------
    indices : Tensor
        ``int32``/``int64`` of shape ``(B, M)``; valid slots in ``[0, num_targets)``.
    sizes : Tensor
        Shape ``(B,)``, number of valid index slots per sample.
    num_targets : int
        Width of the mask.

    Returns
    -------
    Tensor
        Bool tensor of shape ``(B, num_targets)``.
    """
    num_samples, width = indices.shape
    target = torch.where(sizes_mask(sizes, width, padding=True), num_targets, indices.long())
    out = torch.zeros((num_samples, num_targets + 1), dtype=torch.bool, device=indices.device)
    out.scatter_(1, target, True)
    return out[:, :num_targets]


def bool_compaction(data: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """Per-sample boolean selection, packed to the front of dim 1.

    The output width is the largest ``True`` count: reading it is one host synchronization.

    Parameters
    ----------
    data : Tensor
        Shape ``(B, N, *D)``.
    mask : Tensor
        Bool tensor of shape ``(B, N)``.

    Returns
    -------
    out : Tensor
        Shape ``(B, max_count, *D)``; padded slots hold 0.
    counts : Tensor
        ``int64`` of shape ``(B,)``, the number of selected entries per sample.
    """
    indices, counts = mask_to_indices(mask)
    return indexing_access(data, indices, counts, 0), counts

"""CPU implementations of the operators: one write per output element, few ops per call.

The pure-PyTorch references (:mod:`nestbatch.conversions.packed_padded`,
:mod:`nestbatch.compat.batched_indexing`) are written for autograd and for every device: they gather
through per-slot index tensors or build the output in two passes (``pad_sequence`` fills, then
copies). On the CPU the conversions can do better:

* the output comes from :func:`~nestbatch.kernels.host_memory.empty_for_write` (huge pages, the
  dominant cost of a large fresh tensor being its page faults);
* every output row is written exactly once, straight into that buffer (``out=`` / in-place ops):
  long samples as whole blocks (one ``torch.cat`` over the samples and their padding), short ones
  through one row index per packed row (``index_copy_`` / ``index_select``), which costs 8 bytes
  of index per row but no per-sample Python work.
  (``fill_padding`` is the exception: it copies the data, then overwrites the padded rows.)

These paths are not differentiable (``out=`` ops are not), so a call that autograd must record
runs the fallback instead; so do inputs outside the operators' normal contract (decreasing
offsets, samples longer than the padded length, packed offsets that do not start at 0), where the
fallback defines the behaviour.
The index operators of the ``RaggedBatch`` helpers (writes, inverse access, index mapping,
masks <-> indices, boolean compaction) take a selection path at small sizes: see
:data:`SELECTION_SLOTS`.
Everything here reads only host memory: no synchronization questions arise.
"""

from __future__ import annotations

import array
import itertools
import math
import operator

import torch
from torch import Tensor
from torch.types import Number

from nestbatch.kernels import host_library
from nestbatch.kernels.checks import INDEX_DTYPES
from nestbatch.kernels.host_memory import empty_for_write
from nestbatch.kernels.torch_impl import sizes_mask

#: Outputs from this size on are too large for aten's jagged kernels (few samples) to beat the
#: one-write paths below. Measured on 2 cores, B <= 16: aten's kernel is 1.05-2.7x faster than
#: the one-write path at 1-16 MB.
LARGE_OUTPUT_BYTES = 24 << 20

#: Each operator's one-write path (every output element written once, into memory advised as
#: huge pages when large) replaces its fallback from this output size on; smaller outputs keep
#: the fallback, whose fixed costs are lower. Measured on 2 cores, B=32-16384 samples, rows of
#: 8-64 floats: packed -> padded is 1.0-10x faster (2-6x typical) from 2 MB on and 0.55-4x at
#: 0.5-1 MB; fill_padding 1.6-2.6x from 4 MB on and 0.5-1.7x at 1-2 MB.
ONE_WRITE_PADDED_BYTES = 2 << 20
ONE_WRITE_FILL_BYTES = 4 << 20

#: ``indexing_access`` outputs from this size on take its one-write path (one row gather of the
#: flattened data), smaller ones the selection path (:data:`GATHER_SELECTION_SLOTS`), whose
#: ``gather`` checks the indices itself. Measured on 2 cores, ``batched_indexing_access`` with
#: its bounds check: the one-write path is 1.07-1.24x faster at 256 KB, 1.7-2.8x at 0.5-1 MB;
#: the selection path 1.2-2x faster at 16-64 KB.
ONE_WRITE_ACCESS_BYTES = 256 << 10

#: Samples averaging at least this many rows are copied as whole blocks; shorter ones through a
#: row index. Measured on 2 cores: at 770 rows of 1 KiB the index path is 1.3x faster, at 100k
#: rows of 12 bytes the block path is 8x faster (the index costs more than the rows).
BLOCK_ROWS = 1024

#: Below :data:`ONE_WRITE_PADDED_BYTES`, ``out=`` takes the block path when samples average at least
#: this many elements, else the fallback plus a copy. Measured on 2 cores: blocks are 1.3x
#: faster at 6k elements per sample (B=8) and 2x at 24k (B=64), the fallback 1.2-2.7x faster at
#: 48-384 elements per sample.
SMALL_BLOCK_ELEMENTS = 512

#: aten's jagged <-> padded CPU kernels take a small conversion up to this many samples: they
#: cost about 15 us plus 2 us per sample (measured on 2 cores: 16 us at B=4, 150 us at B=64,
#: where the fallback takes 60-100 us).
ATEN_JAGGED_SAMPLES = 16

#: Dtypes aten's jagged <-> padded CPU kernels cover, and so do the compiled kernels' dtype
#: dispatch (AT_ALL_TYPES plus Half, BFloat16 and Bool): all but complex and the rarer unsigned.
KERNEL_DTYPES = frozenset({
    torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.bool,
    torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
})

#: Conversions moving at most this many rows list the flat position of every row in the
#: ``(B, width)`` grid on the host (C-level iteration over ranges built from the host offsets,
#: one ``frombuffer``) and move the rows with one ``index_select`` / ``index_copy_``: a few us,
#: where aten's jagged kernels take about 15 us plus 2 us per sample. Measured on 2 cores,
#: B samples of 1-8 rows of 16 floats, public calls: padded -> packed 1.1x faster at B=4, 1.5x
#: at B=16, 1.7x at B=64; packed -> padded 1.3x faster at B=64, 1.2x at B=16, even at B=8 and
#: 1.15x slower at B=4, so there aten's kernel keeps up to :data:`LISTED_FROM_SAMPLES` samples.
LISTED_ROWS = 512

#: packed -> padded lists its rows from this many samples on (see :data:`LISTED_ROWS`).
LISTED_FROM_SAMPLES = 8

#: The operators whose CPU implementation starts with a C function of
#: :mod:`~nestbatch.kernels.host_library` taking the operator's arguments (``None`` where it does
#: not apply): :func:`nestbatch.kernels.call` calls it first, directly, when autograd need not
#: record the call. Their first argument is their operator's one differentiable input.
HOST_KERNELS = {
    "packed_to_padded": host_library.packed_to_padded,
    "padded_to_packed": host_library.padded_to_packed,
    "fill_padding": host_library.fill_padding,
}

# The overloads' C++ entry points: the same call without ``OpOverload.__call__``'s frame.
_JAGGED_TO_PADDED = torch.ops.aten._jagged_to_padded_dense_forward.default._op
_PADDED_TO_JAGGED = torch.ops.aten._padded_dense_to_jagged_forward.default._op


def _aten_jagged_applies(data: Tensor, offsets: Tensor, filler: Number = 0) -> bool:
    """Whether aten's FBGEMM-derived jagged kernels may compute a small CPU conversion.

    They have no autograd formula (so only for calls autograd does not record) and take the
    filler as a double (so only fillers a double holds exactly).
    """
    return (
        data.is_cpu and offsets.is_cpu  # _applies(data, offsets), inline on this hot path
        and not (data.requires_grad and torch.is_grad_enabled())
        and data.dtype in KERNEL_DTYPES
        and offsets.dtype in INDEX_DTYPES
        and host_library.held_exactly(filler, data.dtype)
        and float(filler) == filler  # (int64 fillers beyond 2**53 would be rounded)
    )


def _applies(data: Tensor, index: Tensor) -> bool:
    """Whether the fast path may run: host tensors (not meta ones), nothing for autograd."""
    on_host = data.is_cpu and index.is_cpu
    return on_host and not (data.requires_grad and torch.is_grad_enabled())


def _regular_lengths(offsets: Tensor, max_len: int) -> Tensor | None:
    """``offsets.diff()`` as int64 when every length is in ``[0, max_len]``, else ``None``."""
    lengths = offsets.diff().long()
    if lengths.numel() and not (0 <= int(lengths.min()) and int(lengths.max()) <= max_len):
        return None
    return lengths


def _row_index(lengths: Tensor, starts: Tensor, count: int) -> Tensor:
    """``(count,)`` int64: ``starts[b] + j`` for ``j < lengths[b]``, samples back to back
    (``count`` must be ``lengths.sum()``)."""
    first = torch.zeros_like(lengths)
    torch.cumsum(lengths[:-1], 0, out=first[1:])
    shift = (starts - first).repeat_interleave(lengths, output_size=count)
    return shift.add_(torch.arange(count, dtype=torch.int64))


def _rows_inside(lengths: Tensor, width: int, total: int) -> Tensor:
    """Flat indices of the rows of a ``(B, width)`` grid inside each sample (``total`` of them)."""
    batch_starts = torch.arange(lengths.shape[0], dtype=torch.int64) * width
    return _row_index(lengths, batch_starts, total)


def _rows_outside(lengths: Tensor, width: int, total: int) -> Tensor:
    """Flat indices of the padded rows of a ``(B, width)`` grid whose samples hold ``total``."""
    batch_ends = torch.arange(1, lengths.shape[0] + 1, dtype=torch.int64) * width
    padding = width - lengths
    return _row_index(padding, batch_ends - padding, lengths.shape[0] * width - total)


def _grid_rows(offsets: Tensor, width: int) -> tuple[Tensor, int, int] | None:
    """``(rows, start, stop)`` for host ``offsets`` whose lengths all lie in ``[0, width]``:
    the flat position ``b * width + j`` in a ``(B, width)`` grid of every packed row
    ``offsets[b] + j``, samples back to back, and the first and last offset. ``None`` for other
    offsets (the callers' references define what those give)."""
    host = offsets.tolist()  # a host tensor (the CPU implementations get nothing else): no sync
    lengths = list(map(operator.sub, host[1:], host[:-1]))
    if lengths and not (0 <= min(lengths) and max(lengths) <= width):
        return None
    starts = range(0, len(lengths) * width, width) if width else (0,) * len(lengths)
    ends = map(operator.add, starts, lengths)
    rows = list(itertools.chain.from_iterable(map(range, starts, ends)))
    listed = torch.frombuffer(array.array("q", rows), dtype=torch.int64) if rows else \
        torch.empty(0, dtype=torch.int64)
    return listed, host[0], host[-1]


def _use_blocks(total: int, batch: int) -> bool:
    return total >= BLOCK_ROWS * batch


def _into(result: Tensor, out: Tensor | None) -> Tensor:
    return result if out is None else out.copy_(result)


def packed_to_padded(
    values: Tensor,
    offsets: Tensor,
    max_len: int,
    padding_value: Number,
    fallback,
    out: Tensor | None = None,
) -> Tensor:
    """``(total, *D)`` packed rows -> ``(B, max_len, *D)`` (the ``nestbatch::packed_to_padded``
    operator on the CPU), written into ``out`` when given (contiguous, of the right shape).
    ``fallback`` computes the same thing where this path does not apply.
    """
    result = host_library.packed_to_padded(values, offsets, max_len, padding_value, out)
    if result is not None:
        return result
    batch = offsets.shape[0] - 1
    shape = (batch, max_len, *values.shape[1:])
    if (out is None and batch >= LISTED_FROM_SAMPLES and values.shape[0] <= LISTED_ROWS
            and _applies(values, offsets)):
        listed = _grid_rows(offsets, max_len)
        if listed is not None and 0 <= listed[1] <= listed[2] <= values.shape[0]:
            rows, start, stop = listed
            grid = values.new_full(shape, padding_value)
            rows_read = values if stop - start == values.shape[0] else values[start:stop]
            grid.flatten(0, 1).index_copy_(0, rows, rows_read)
            return grid
    output_bytes = math.prod(shape) * values.element_size()
    large = output_bytes >= LARGE_OUTPUT_BYTES
    if out is None and batch <= ATEN_JAGGED_SAMPLES and not large and _aten_jagged_applies(
        values, offsets, padding_value
    ):
        # One C++ call, whose fixed cost (~15 us) beats the fallback's several ops.
        try:
            return _JAGGED_TO_PADDED(values, [offsets], [max_len], float(padding_value))
        except RuntimeError:
            pass  # offsets outside aten's contract: the fallback defines the result
    # A caller's buffer has no fresh pages to pay for: below ONE_WRITE_PADDED_BYTES, copying
    # blocks straight into it beats computing a new tensor and copying that, unless samples are
    # short.
    one_write = output_bytes >= ONE_WRITE_PADDED_BYTES
    small_blocks = out is not None and values.numel() >= SMALL_BLOCK_ELEMENTS * batch
    if not ((one_write or small_blocks) and _applies(values, offsets)):
        return _into(fallback(values, offsets, max_len, padding_value), out)
    lengths = _regular_lengths(offsets, max_len)
    start, stop = int(offsets[0]), int(offsets[-1])
    if lengths is None or not 0 <= start <= stop <= values.shape[0]:
        return _into(fallback(values, offsets, max_len, padding_value), out)
    out = empty_for_write(shape, like=values) if out is None else out
    if out.numel() == 0:
        return out
    rows = out.view(batch * max_len, *values.shape[1:])
    values = values[start:stop]
    if not one_write or _use_blocks(stop - start, batch):
        # Each sample's block, then filler rows (one row, expanded) up to max_len.
        fill = values.new_full((1, *values.shape[1:]), padding_value)
        pieces = []
        for block in values.split(lengths.tolist()):  # (the CPU path: host tensors, no sync)
            pieces.append(block)
            if block.shape[0] < max_len:
                pieces.append(fill.expand(max_len - block.shape[0], *fill.shape[1:]))
        torch.cat(pieces, 0, out=rows)
        return out
    total = stop - start
    rows.index_copy_(0, _rows_inside(lengths, max_len, total), values)
    rows.index_fill_(0, _rows_outside(lengths, max_len, total), padding_value)
    return out


def padded_to_packed(
    data: Tensor, offsets: Tensor, total: int, fallback, out: Tensor | None = None
) -> Tensor:
    """``(B, L, *D)`` padded data -> ``(total, *D)`` packed rows (``nestbatch::padded_to_packed``
    on the CPU), written into ``out`` when given (contiguous, of the right shape). ``fallback``
    computes the same thing where this path does not apply."""
    result = host_library.padded_to_packed(data, offsets, total, out)
    if result is not None:
        return result
    if not _applies(data, offsets):
        return _into(fallback(data, offsets, total), out)
    batch, width = data.shape[:2]
    if out is None and total <= LISTED_ROWS:
        listed = _grid_rows(offsets, width)
        if listed is not None and listed[1] == 0 and listed[2] == total:
            return data.flatten(0, 1).index_select(0, listed[0])
    small = data.numel() * data.element_size() < LARGE_OUTPUT_BYTES
    few = data.shape[0] <= ATEN_JAGGED_SAMPLES
    if out is None and small and few and _aten_jagged_applies(data, offsets):
        try:
            return _PADDED_TO_JAGGED(data, [offsets], total)
        except RuntimeError:
            pass  # lengths past the padded width, or offsets not ending at total
    lengths = _regular_lengths(offsets, width)
    if lengths is None or int(offsets[0]) != 0 or int(offsets[-1]) != total:
        return _into(fallback(data, offsets, total), out)
    out = empty_for_write((total, *data.shape[2:]), like=data) if out is None else out
    if total == 0:
        return out
    if _use_blocks(total, batch):
        blocks = [sample[:length] for sample, length in zip(data.unbind(0), lengths.tolist())]
        torch.cat(blocks, 0, out=out)
        return out
    inside = _rows_inside(lengths, width, total)
    torch.index_select(data.reshape(batch * width, *data.shape[2:]), 0, inside, out=out)
    return out


def fill_padding(data: Tensor, sizes: Tensor, value: Number, fallback) -> Tensor:
    """``(B, N, *D)`` with slots ``>= sizes[b]`` set to ``value`` (``nestbatch::fill_padding``
    on the CPU). ``fallback`` computes the same thing where this path does not apply."""
    result = host_library.fill_padding(data, sizes, value)
    if result is not None:
        return result
    large = data.numel() * data.element_size() >= ONE_WRITE_FILL_BYTES
    if not (large and _applies(data, sizes)):
        return fallback(data, sizes, value)
    batch, width = data.shape[:2]
    lengths = sizes.long().clamp(0, width)
    out = empty_for_write(data.shape, like=data)
    out.copy_(data)
    outside = _rows_outside(lengths, width, int(lengths.sum()))
    out.view(batch * width, *data.shape[2:]).index_fill_(0, outside, value)
    return out


def indexing_access(
    data: Tensor, indices: Tensor, sizes: Tensor, filler_value: Number, fallback
) -> Tensor:
    """Per-sample gather ``(B, N, *D)`` -> ``(B, M, *D)``, filler for slots ``j >= sizes[b]``
    (``nestbatch::indexing_access`` on the CPU). ``fallback`` computes the same thing where
    this path does not apply; indices of valid slots must be in range (the caller checks)."""
    if _access_selects(data, indices):
        return _select_access(data, indices, sizes, filler_value)
    batch, width = indices.shape
    shape = (batch, width, *data.shape[2:])
    large = math.prod(shape) * data.element_size() >= ONE_WRITE_ACCESS_BYTES
    if not (large and data.shape[1] > 0 and _applies(data, indices)):
        return fallback(data, indices, sizes, filler_value)
    valid = sizes_mask(sizes.long(), width)
    # Padded slots may hold any index: read row 0 of their sample, then overwrite them. Valid
    # slots out of range (unchecked callers) read the clamped row of their own sample, as the
    # fallback does, never another sample's.
    rows = torch.where(valid, indices.long().clamp(0, data.shape[1] - 1), 0)
    rows += torch.arange(batch).unsqueeze(1) * data.shape[1]
    flat = data.reshape(batch * data.shape[1], *data.shape[2:])
    out = empty_for_write(shape, like=data)
    gathered = out.view(batch * width, *data.shape[2:])
    torch.index_select(flat, 0, rows.view(-1), out=gathered)
    gathered.index_fill_(0, (~valid).view(-1).nonzero().squeeze(1), filler_value)
    return out


# ------------------------------------------------------------------ small host index operators
#: Host calls with at most this many index slots take the selection path: the valid slots are
#: listed once (``nonzero``; on the host that reads no device) and written with one
#: advanced-index assignment, 5-8 ops where the references' sync-free formulations (written for
#: devices: dummy rows, ``where``, ``scatter``) take 9-14. At small sizes each op costs 2-4 us of
#: host time, which is the whole cost of a call. A selection path reads and writes only the
#: valid slots, through ``gather`` or advanced indexing, which check every index in C++: see
#: :func:`call_validating`. Measured on 2 cores (``batched_indexing_write``,
#: ``get_mask_from_indices``): 1.15-1.6x faster than the references up to 2048 slots, even at
#: 4096, 1.1-1.5x slower from 8192 on.
SELECTION_SLOTS = 1 << 12

#: ``indexing_write`` also keeps its selection path only while the rows it writes (slots times
#: the bytes of a row) fit in this many bytes: its advanced-index assignment slows down with
#: the rows' size (measured on 2 cores: 1.15-1.5x faster than the fallback at 128 KB, even at
#: 256 KB, 3x slower at 1 MB).
WRITE_SELECTION_BYTES = 128 << 10

#: The gathers (``indexing_access``) and the writes into a fresh or cloned target from a
#: gathered source (``inverse_indexing_access``, ``index_mapping``) keep the selection path up
#: to this many slots: measured on 2 cores at 65k and 131k slots it is 1.3-1.6x faster than the
#: references for the gather, 1.7-9x for the inverse access, 1.25-2x for the mapping, where
#: the plain writes and the masks are 0.7-0.9x (they keep :data:`SELECTION_SLOTS`).
GATHER_SELECTION_SLOTS = 1 << 17


def _selects(slots: int, *tensors: Tensor, limit: int | None = None) -> bool:
    """Whether the selection path may run: at most ``limit`` slots (default
    :data:`SELECTION_SLOTS`), nothing for autograd to record (the references carry the
    operators' gradient conventions). The tensors are host tensors: this module's functions are
    the operators' CPU implementations."""
    if slots > (SELECTION_SLOTS if limit is None else limit):
        return False
    if torch.is_grad_enabled():
        for tensor in tensors:
            if tensor.requires_grad:
                return False
    return True


def _write_selects(to_write: Tensor, indices: Tensor, sizes: Tensor, into: Tensor) -> bool:
    slots = indices.numel()
    row_bytes = math.prod(to_write.shape[2:]) * to_write.element_size()
    return slots * row_bytes <= WRITE_SELECTION_BYTES and _selects(slots, to_write, indices, into)


def _access_selects(data: Tensor, indices: Tensor, *_: object) -> bool:
    slots = indices.numel()
    shape = data.shape
    return (shape[1] > 0 and slots * math.prod(shape[2:]) * data.element_size()
            < ONE_WRITE_ACCESS_BYTES and _selects(slots, data, indices,
                                                  limit=GATHER_SELECTION_SLOTS))


def _valid_slots(sizes: Tensor, width: int) -> tuple[Tensor, Tensor]:
    """``(sample, slot)`` of every valid index slot, samples in order."""
    return sizes_mask(sizes, width).nonzero(as_tuple=True)


def _select_access(data: Tensor, indices: Tensor, sizes: Tensor, filler_value: Number) -> Tensor:
    result = host_library.gather_rows(data, indices, sizes, filler_value)
    if result is not None:
        return result
    # Padded slots may hold any index: read row 0 for them, then overwrite them. ``gather``
    # raises for a valid index outside ``[0, N)``.
    padding = sizes_mask(sizes, indices.shape[1], padding=True)
    safe = indices.masked_fill(padding, 0)
    if safe.dtype != torch.int64:
        safe = safe.long()
    if data.dim() == 3:  # one feature dim, the common case: the cheapest views
        rows = torch.gather(data, 1, safe.unsqueeze(2).expand(-1, -1, data.shape[2]))
        return rows.masked_fill_(padding.unsqueeze(2), filler_value)
    trailing = (1,) * (data.dim() - 2)
    rows = torch.gather(data, 1, safe.view(*safe.shape, *trailing).expand(
        -1, -1, *data.shape[2:]))
    return rows.masked_fill_(padding.view(*padding.shape, *trailing), filler_value)


def _scattered(source: Tensor, source_indices: Tensor | None, target_indices: Tensor,
               sizes: Tensor, out: Tensor) -> Tensor:
    """``out`` with ``out[b, target_indices[b, j]] = source[b, source_indices[b, j]]``
    (``source_indices`` ``None``: slot ``j``) for the valid slots: the C library's row copies
    where they apply, else one advanced-indexing write (which raises for an index outside its
    dim, or counts a negative one from the end)."""
    done = host_library.scatter_rows(source, source_indices, target_indices, sizes, out)
    if done is not None:
        return done
    b, j = _valid_slots(sizes, target_indices.shape[1])
    rows = source[b, j] if source_indices is None else source[b, source_indices[b, j]]
    out[b, target_indices[b, j]] = rows
    return out


def _select_write(to_write: Tensor, indices: Tensor, sizes: Tensor, into: Tensor) -> Tensor:
    out = into.clone(memory_format=torch.contiguous_format)
    return _scattered(to_write, None, indices, sizes, out)


def _select_inverse(data: Tensor, indices: Tensor, sizes: Tensor, num_targets: int,
                    filler_value: Number) -> Tensor:
    out = data.new_full((data.shape[0], num_targets, *data.shape[2:]), filler_value)
    return _scattered(data, None, indices, sizes, out)


def _select_mapping(source: Tensor, source_indices: Tensor, target_indices: Tensor,
                    sizes: Tensor, target: Tensor) -> Tensor:
    out = target.clone(memory_format=torch.contiguous_format)
    return _scattered(source, source_indices, target_indices, sizes, out)


def _select_to_mask(indices: Tensor, sizes: Tensor, num_targets: int) -> Tensor:
    b, j = _valid_slots(sizes, indices.shape[1])
    out = torch.zeros((indices.shape[0], num_targets), dtype=torch.bool)
    out[b, indices[b, j]] = True
    return out


#: Operator name -> (whether its selection path runs on the arguments, the path itself).
_SELECTION_PATHS = {
    "indexing_access": (_access_selects, _select_access),
    "indexing_write": (_write_selects, _select_write),
    "inverse_indexing_access": (lambda data, indices, *_: _selects(
        indices.numel(), data, indices, limit=GATHER_SELECTION_SLOTS), _select_inverse),
    "index_mapping": (lambda source, source_indices, target_indices, sizes, target: _selects(
        source_indices.numel(), source, source_indices, target_indices, target,
        limit=GATHER_SELECTION_SLOTS), _select_mapping),
    "indices_to_mask": (lambda indices, *_: _selects(indices.numel(), indices), _select_to_mask),
}


def call_validating(name: str, args: tuple) -> Tensor | None:
    """Operator ``name`` on host tensors ``args`` when its selection path runs on them, else
    ``None`` (nothing computed). A selection path checks the indices itself, as
    :func:`nestbatch.kernels.call_validating` describes: a caller that would otherwise read the
    smallest and largest index first (2-3 ops per index tensor) can check only when it raises.
    """
    path = _SELECTION_PATHS.get(name)
    if path is None or not path[0](*args):
        return None
    return path[1](*args)


def _selected_or(name: str, fallback, *args: object) -> Tensor:
    """The selection path of operator ``name`` where it runs on ``args``, else ``fallback``."""
    selects, selection = _SELECTION_PATHS[name]
    return selection(*args) if selects(*args) else fallback(*args)


def indexing_write(to_write: Tensor, indices: Tensor, sizes: Tensor, into: Tensor,
                   fallback) -> Tensor:
    """``into`` with ``out[b, indices[b, j]] = to_write[b, j]`` for ``j < sizes[b]``
    (``nestbatch::indexing_write`` on the CPU); ``fallback`` where this path does not apply."""
    return _selected_or("indexing_write", fallback, to_write, indices, sizes, into)


def inverse_indexing_access(data: Tensor, indices: Tensor, sizes: Tensor, num_targets: int,
                            filler_value: Number, fallback) -> Tensor:
    """``(B, num_targets, *D)`` filler with ``out[b, indices[b, j]] = data[b, j]`` written in
    (``nestbatch::inverse_indexing_access`` on the CPU)."""
    return _selected_or("inverse_indexing_access", fallback, data, indices, sizes, num_targets,
                        filler_value)


def index_mapping(source: Tensor, source_indices: Tensor, target_indices: Tensor,
                  sizes: Tensor, target: Tensor, fallback) -> Tensor:
    """``target`` with ``out[b, target_indices[b, j]] = source[b, source_indices[b, j]]``
    (``nestbatch::index_mapping`` on the CPU)."""
    return _selected_or("index_mapping", fallback, source, source_indices, target_indices,
                        sizes, target)


def indices_to_mask(indices: Tensor, sizes: Tensor, num_targets: int, fallback) -> Tensor:
    """Bool ``(B, num_targets)``, True at ``indices[b, j]`` for ``j < sizes[b]``
    (``nestbatch::indices_to_mask`` on the CPU)."""
    return _selected_or("indices_to_mask", fallback, indices, sizes, num_targets)


def row_counts(mask: Tensor) -> Tensor:
    """``(B,)`` int64: the number of True entries in each row of a ``(B, N)`` mask."""
    return mask.sum(dim=1, dtype=torch.int64)


def _true_positions(mask: Tensor, max_count: int) -> tuple[Tensor, Tensor]:
    """Each row's True positions in increasing order (a stable descending sort puts them first)
    cut at ``max_count <= N``, and ``kept``: the sorted row, True below the row's count."""
    kept, positions = torch.sort(mask, dim=1, descending=True, stable=True)
    return positions[:, :max_count], kept[:, :max_count]


def mask_to_indices(mask: Tensor, max_count: int, fallback,
                    counts: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Positions of the True entries of each row, ``(B, max_count)`` int64 (padded slots 0),
    and the counts (``nestbatch::mask_to_indices`` on the CPU). ``counts``: the
    :func:`row_counts` of ``mask`` when the caller has them."""
    if max_count > mask.shape[1] or not _selects(mask.numel(), mask):
        return fallback(mask, max_count)
    positions, kept = _true_positions(mask, max_count)
    return positions * kept, row_counts(mask) if counts is None else counts


def bool_compaction(data: Tensor, mask: Tensor, max_count: int, fallback,
                    counts: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The selected rows of ``(B, N, *D)`` packed to the front, ``(B, max_count, *D)`` (padded
    slots 0), and the counts (``nestbatch::bool_compaction`` on the CPU). ``counts``: the
    :func:`row_counts` of ``mask`` when the caller has them."""
    if max_count > mask.shape[1] or not _selects(mask.numel(), data, mask):
        return fallback(data, mask, max_count)
    positions, kept = _true_positions(mask, max_count)
    trailing = (1,) * (data.dim() - 2)
    rows = torch.gather(data, 1, positions.view(*positions.shape, *trailing).expand(
        -1, -1, *data.shape[2:]))
    padding = ~kept.view(*kept.shape, *trailing)
    return rows.masked_fill_(padding, 0), row_counts(mask) if counts is None else counts

"""The kernels' entry points: the padded-layout hot paths, as ``torch.library`` operators.

The functions here are the entry points callers use. They validate their arguments (raising
``TypeError`` / ``ValueError`` / ``IndexError`` before any kernel runs) and call the
``nestbatch::*`` operators of :mod:`nestbatch.kernels.operators`, which run a CUDA kernel from
``csrc/`` on CUDA tensors (built on first use, see :mod:`nestbatch.kernels.extension`) and the
pure-PyTorch implementation elsewhere. Both paths give identical results.

The indexing functions have the signatures of their counterparts in
:mod:`nestbatch.compat.batched_indexing` (plus keyword-only extras), so a call site switches by
changing the module it calls.

Host synchronizations: none in the operators. The wrappers read the device once where the
result needs it: the bounds check of ``check_bounds=True`` (one flag per call; pass
``check_bounds=False`` where the caller already validated), and the output width of
:func:`mask_to_indices` / :func:`bool_compaction` when ``max_count`` is not given.
"""

from __future__ import annotations

from torch import Tensor

from nestbatch.kernels import cpu, operators
from nestbatch.kernels.checks import (
    check_batched,
    check_count,
    check_index_args,
    check_index_bounds,
    check_index_tensor,
    check_mask,
    check_out,
    check_same_device,
    check_tensor,
    filler_arg,
    max_count_of,
)
from nestbatch.kernels.dispatch import CPU, call, runs_on_host


# --------------------------------------------------------------------------------- conversions
def packed_to_padded(
    values: Tensor,
    offsets: Tensor,
    max_len: int,
    padding_value: float = 0.0,
    *,
    out: Tensor | None = None,
) -> Tensor:
    """Lay packed rows out in a padded tensor (one ragged dim).

    Parameters
    ----------
    values : Tensor
        ``(total, *D)``, the rows of all samples back to back.
    offsets : Tensor
        ``(B + 1,)`` int32/int64: sample ``b`` is rows ``offsets[b]:offsets[b + 1]``.
    max_len : int
        Padded length, at least the longest sample (longer samples are truncated).
    padding_value : int, float or bool, default 0
        Filler of the slots past each sample's length.
    out : Tensor, optional
        A contiguous ``(B, max_len, *D)`` tensor of ``values``' dtype and device to write the
        result into, e.g. a reused (pinned) staging buffer: on the CPU this skips the cost of
        fresh pages, which exceeds the copy's own. Not differentiable, like PyTorch's ``out=``.
        On CUDA the result is computed, then copied in.

    Returns
    -------
    Tensor
        ``(B, max_len, *D)`` (``out`` when given); gradients flow back to ``values`` (padded
        slots get none).
    """
    values = check_tensor(values, "values")
    if values.dim() < 1:
        raise ValueError("values must have a row dim: (total, *D)")
    offsets = check_index_tensor("offsets", offsets, 1)
    if offsets.shape[0] < 1:
        raise ValueError("offsets must have shape (B + 1,), got an empty tensor")
    check_same_device(values, offsets=offsets)
    max_len = check_count(max_len, "max_len")
    filler = filler_arg("padding_value", padding_value, values.dtype)
    if out is None:
        return call("packed_to_padded", values, offsets, max_len, filler)
    check_out(out, (offsets.shape[0] - 1, max_len, *values.shape[1:]), values)
    if values.device.type == "cpu":
        fallback = operators.packed_to_padded_torch
        return cpu.packed_to_padded(values, offsets, max_len, filler, fallback, out=out)
    return out.copy_(call("packed_to_padded", values, offsets, max_len, filler))


def padded_to_packed(
    data: Tensor, offsets: Tensor, total: int, *, out: Tensor | None = None
) -> Tensor:
    """Gather the valid slots of a padded tensor into packed rows (one ragged dim).

    Parameters
    ----------
    data : Tensor
        ``(B, L, *D)``.
    offsets : Tensor
        ``(B + 1,)`` int32/int64 sample starts; every length must be at most ``L``.
    total : int
        ``offsets[-1]``, given by the caller so that no device read is needed.
    out : Tensor, optional
        A contiguous ``(total, *D)`` tensor of ``data``'s dtype and device to write the result
        into (see :func:`packed_to_padded`).

    Returns
    -------
    Tensor
        ``(total, *D)`` (``out`` when given), rows in sample order.
    """
    data = check_batched("data", check_tensor(data, "data"))
    offsets = check_index_tensor("offsets", offsets, 1)
    if offsets.shape[0] != data.shape[0] + 1:
        raise ValueError(f"offsets must have shape ({data.shape[0] + 1},), got {offsets.shape}")
    check_same_device(data, offsets=offsets)
    total = check_count(total, "total")
    if out is None:
        return call("padded_to_packed", data, offsets, total)
    check_out(out, (total, *data.shape[2:]), data)
    if data.device.type == "cpu":
        fallback = operators.padded_to_packed_torch
        return cpu.padded_to_packed(data, offsets, total, fallback, out=out)
    return out.copy_(call("padded_to_packed", data, offsets, total))


def fill_padding(data: Tensor, sizes: Tensor, value: float) -> Tensor:
    """Set the padded slots of each sample to ``value`` (a new tensor).

    Parameters
    ----------
    data : Tensor
        ``(B, N, *D)``.
    sizes : Tensor
        ``(B,)`` int32/int64; slots ``>= sizes[b]`` along dim 1 are padding.
    value : int, float or bool
        Written into the padded slots (cast to ``data.dtype``).

    Returns
    -------
    Tensor
        ``(B, N, *D)``; the gradient of padded slots is 0.
    """
    data = check_batched("data", check_tensor(data, "data"))
    sizes = check_index_tensor("sizes", sizes, 1)
    if sizes.shape[0] != data.shape[0]:
        raise ValueError(f"sizes must have shape ({data.shape[0]},), got {tuple(sizes.shape)}")
    check_same_device(data, sizes=sizes)
    return call("fill_padding", data, sizes, filler_arg("value", value, data.dtype))


# ------------------------------------------------------------------------------------ indexing
def indexing_access(
    data: Tensor,
    indices: Tensor,
    sizes: Tensor,
    filler_value: float = 0,
    *,
    check_bounds: bool = True,
) -> Tensor:
    """Per-sample gather: ``out[b, j] = data[b, indices[b, j]]`` for ``j < sizes[b]``.

    Parameters
    ----------
    data : Tensor
        ``(B, N, *D)``.
    indices : Tensor
        ``(B, M)`` int32/int64; valid slots in ``[0, N)``, duplicates allowed.
    sizes : Tensor
        ``(B,)``, the number of valid index slots per sample.
    filler_value : int, float or bool, default 0
        Value of the output slots ``j >= sizes[b]``.
    check_bounds : bool, default True
        Raise ``IndexError`` on a valid slot out of range (one device read).

    Returns
    -------
    Tensor
        ``(B, M, *D)``; gradients of duplicate indices add up in ``data``.
    """
    data = check_batched("data", check_tensor(data, "data"))
    indices, sizes = check_index_args(data, indices, sizes)
    if check_bounds:
        check_index_bounds("indices", indices, sizes, data.shape[1])
    filler = filler_arg("filler_value", filler_value, data.dtype)
    return call("indexing_access", data, indices, sizes, filler)


def indexing_write(
    to_write: Tensor, indices: Tensor, sizes: Tensor, into: Tensor, *, check_bounds: bool = True
) -> Tensor:
    """Per-sample scatter: ``out[b, indices[b, j]] = to_write[b, j]`` for ``j < sizes[b]``.

    Parameters
    ----------
    to_write : Tensor
        ``(B, M, *D)``, same dtype as ``into``.
    indices : Tensor
        ``(B, M)`` int32/int64; valid slots hold unique indices in ``[0, N)`` (for duplicates an
        unspecified one of the written rows wins).
    sizes : Tensor
        ``(B,)``, the number of valid index slots per sample.
    into : Tensor
        ``(B, N, *D)``: the values of every position not written to.
    check_bounds : bool, default True
        Raise ``IndexError`` on a valid slot out of range (one device read).

    Returns
    -------
    Tensor
        ``(B, N, *D)``; gradients reach ``into`` only where it was not overwritten.
    """
    into = check_batched("into", check_tensor(into, "into"))
    to_write = check_batched("to_write", check_tensor(to_write, "to_write"), into.shape[0])
    if to_write.dtype != into.dtype or to_write.shape[2:] != into.shape[2:]:
        raise ValueError(
            f"to_write {to_write.dtype} {tuple(to_write.shape)} does not match into "
            f"{into.dtype} {tuple(into.shape)}"
        )
    indices, sizes = check_index_args(into, indices, sizes)
    if indices.shape[1] != to_write.shape[1]:
        raise ValueError(f"indices {tuple(indices.shape)} must match to_write's first two dims")
    check_same_device(into, to_write=to_write)
    if check_bounds:
        check_index_bounds("indices", indices, sizes, into.shape[1])
    return call("indexing_write", to_write, indices, sizes, into)


def inverse_indexing_access(
    data: Tensor,
    indices: Tensor,
    sizes: Tensor,
    num_targets: int,
    filler_value: float = 0,
    *,
    check_bounds: bool = True,
) -> Tensor:
    """Scatter into a filler-initialized tensor: ``out[b, indices[b, j]] = data[b, j]``.

    Parameters
    ----------
    data : Tensor
        ``(B, M, *D)``.
    indices : Tensor
        ``(B, M)`` int32/int64; valid slots hold unique indices in ``[0, num_targets)``.
    sizes : Tensor
        ``(B,)``, the number of valid index slots per sample.
    num_targets : int
        Size of dim 1 of the output.
    filler_value : int, float or bool, default 0
        Value of every output position not written to.
    check_bounds : bool, default True
        Raise ``IndexError`` on a valid slot out of range (one device read).

    Returns
    -------
    Tensor
        ``(B, num_targets, *D)``.
    """
    data = check_batched("data", check_tensor(data, "data"))
    indices, sizes = check_index_args(data, indices, sizes)
    if indices.shape[1] != data.shape[1]:
        raise ValueError(f"indices {tuple(indices.shape)} must match data's first two dims")
    num_targets = check_count(num_targets, "num_targets")
    if check_bounds:
        check_index_bounds("indices", indices, sizes, num_targets)
    filler = filler_arg("filler_value", filler_value, data.dtype)
    return call("inverse_indexing_access", data, indices, sizes, num_targets, filler)


def index_mapping(
    source: Tensor,
    source_indices: Tensor,
    target_indices: Tensor,
    sizes: Tensor,
    target: Tensor,
    *,
    check_bounds: bool = True,
) -> Tensor:
    """Per-sample mapping ``out[b, target_indices[b, j]] = source[b, source_indices[b, j]]``.

    Parameters
    ----------
    source : Tensor
        ``(B, Ns, *D)``.
    source_indices : Tensor
        ``(B, M)``; valid slots in ``[0, Ns)``, duplicates allowed (gradients add up).
    target_indices : Tensor
        ``(B, M)``; valid slots hold unique indices in ``[0, Nt)``.
    sizes : Tensor
        ``(B,)``, the number of valid index pairs per sample.
    target : Tensor
        ``(B, Nt, *D)``, same dtype as ``source``.
    check_bounds : bool, default True
        Raise ``IndexError`` on a valid pair out of range (one device read).

    Returns
    -------
    Tensor
        ``(B, Nt, *D)``: ``target`` with the mapped rows written in.
    """
    target = check_batched("target", check_tensor(target, "target"))
    source = check_batched("source", check_tensor(source, "source"), target.shape[0])
    if source.dtype != target.dtype or source.shape[2:] != target.shape[2:]:
        raise ValueError(
            f"source {source.dtype} {tuple(source.shape)} does not match target "
            f"{target.dtype} {tuple(target.shape)}"
        )
    source_indices, sizes = check_index_args(source, source_indices, sizes)
    target_indices = check_index_tensor("target_indices", target_indices, 2)
    if target_indices.shape != source_indices.shape:
        raise ValueError("source_indices and target_indices must have the same shape")
    check_same_device(
        target, source=source, source_indices=source_indices, target_indices=target_indices
    )
    if check_bounds:
        check_index_bounds("source_indices", source_indices, sizes, source.shape[1])
        check_index_bounds("target_indices", target_indices, sizes, target.shape[1])
    return call("index_mapping", source, source_indices, target_indices, sizes, target)


# ------------------------------------------------------------------------------- masks/indices
def mask_to_indices(mask: Tensor, *, max_count: int | None = None) -> tuple[Tensor, Tensor]:
    """Positions of the ``True`` entries of each row of a mask, in increasing order.

    Parameters
    ----------
    mask : Tensor
        ``(B, N)`` bool.
    max_count : int, optional
        Output width, at least the largest ``True`` count. When omitted it is computed, which
        reads the device once.

    Returns
    -------
    indices : Tensor
        ``(B, max_count)`` int64; padded slots hold 0.
    counts : Tensor
        ``(B,)`` int64, the number of ``True`` entries per row.
    """
    mask = check_mask(mask)
    if max_count is None and runs_on_host(mask):
        return counted_on_host("mask_to_indices", mask)
    return call("mask_to_indices", mask, max_count_of(mask, max_count))


def indices_to_mask(
    indices: Tensor, sizes: Tensor, num_targets: int, *, check_bounds: bool = True
) -> Tensor:
    """Bool mask with ``mask[b, indices[b, j]] = True`` for ``j < sizes[b]``.

    Parameters
    ----------
    indices : Tensor
        ``(B, M)`` int32/int64; valid slots in ``[0, num_targets)``.
    sizes : Tensor
        ``(B,)``, the number of valid index slots per sample.
    num_targets : int
        Width of the mask.
    check_bounds : bool, default True
        Raise ``IndexError`` on a valid slot out of range (one device read).

    Returns
    -------
    Tensor
        ``(B, num_targets)`` bool.
    """
    indices = check_index_tensor("indices", indices, 2)
    indices, sizes = check_index_args(indices, indices, sizes)
    num_targets = check_count(num_targets, "num_targets")
    if check_bounds:
        check_index_bounds("indices", indices, sizes, num_targets)
    return call("indices_to_mask", indices, sizes, num_targets)


def bool_compaction(
    data: Tensor, mask: Tensor, *, max_count: int | None = None
) -> tuple[Tensor, Tensor]:
    """Per-sample boolean selection, packed to the front of dim 1.

    Parameters
    ----------
    data : Tensor
        ``(B, N, *D)``.
    mask : Tensor
        ``(B, N)`` bool.
    max_count : int, optional
        Output width, at least the largest ``True`` count; computed (one device read) if omitted.

    Returns
    -------
    out : Tensor
        ``(B, max_count, *D)``; padded slots hold 0.
    counts : Tensor
        ``(B,)`` int64, the number of selected entries per sample.
    """
    data = check_batched("data", check_tensor(data, "data"))
    mask = check_mask(mask, data.shape[0], data.shape[1])
    check_same_device(data, mask=mask)
    if max_count is None and runs_on_host(data):
        return counted_on_host("bool_compaction", data, mask)
    return call("bool_compaction", data, mask, max_count_of(mask, max_count))


def counted_on_host(name: str, *args: Tensor) -> tuple[Tensor, Tensor]:
    """Host operator ``name`` (``mask_to_indices`` / ``bool_compaction``) on ``args``, the mask
    last, at the width of its largest count: the counts size the output, so they are summed
    once and handed to the operator (host memory: reading them is no sync)."""
    counts = cpu.row_counts(args[-1])
    width = int(counts.max()) if counts.shape[0] else 0
    return CPU[name](*args, width, counts=counts)

"""The kernels' entry points, re-exported (and described) by :mod:`nestbatch.kernels`: argument
checks (:mod:`nestbatch.kernels.checks`), then the ``nestbatch::*`` operators through
:func:`nestbatch.kernels.dispatch.call`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from torch import Tensor

from nestbatch.kernels import cpu, torch_impl
from nestbatch.kernels.checks import (
    check_batched,
    check_count,
    check_index_args,
    check_index_bounds,
    check_index_tensor,
    check_mask,
    check_out,
    check_rows_match,
    check_same_device,
    check_tensor,
    filler_arg,
    max_count_of,
)
from nestbatch.kernels.dispatch import CPU, call, runs_on_host

_CHECK_BOUNDS = """    check_bounds : bool, default True
        Raise ``IndexError`` on a valid slot out of range (one device read). ``False`` skips
        the check for indices known to be in range: a slot that is not is skipped by the CUDA
        kernels (never read or written); on the CPU it raises torch's error or reaches another
        slot of its own sample.
"""
_CHECK_PAIRS = _CHECK_BOUNDS.replace("valid slot", "valid pair")
_MAX_COUNT = """    max_count : int, optional
        Output width, at least the largest ``True`` count; computed (one device read) if omitted.
"""
_T = TypeVar("_T", bound=Callable[..., Any])


def _documented_as(torch_path: Callable[..., Any], extra: str = _CHECK_BOUNDS
                   ) -> Callable[[_T], _T]:
    """Give an entry point the docstring of its operator's torch path, which takes the same
    arguments, plus the ``extra`` parameters the entry point adds (one text for both)."""
    head, returns, tail = (torch_path.__doc__ or "").partition("\n    Returns\n")

    def attach(entry_point: _T) -> _T:
        entry_point.__doc__ = f"{head.rstrip()}\n{extra}{returns}{tail}" if returns else None
        return entry_point

    return attach


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
        return CPU["packed_to_padded"](values, offsets, max_len, filler, out=out)
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
        return CPU["padded_to_packed"](data, offsets, total, out=out)
    return out.copy_(call("padded_to_packed", data, offsets, total))


@_documented_as(torch_impl.fill_padding, extra="")
def fill_padding(data: Tensor, sizes: Tensor, value: float) -> Tensor:
    data = check_batched("data", check_tensor(data, "data"))
    sizes = check_index_tensor("sizes", sizes, 1)
    if sizes.shape[0] != data.shape[0]:
        raise ValueError(f"sizes must have shape ({data.shape[0]},), got {tuple(sizes.shape)}")
    check_same_device(data, sizes=sizes)
    return call("fill_padding", data, sizes, filler_arg("value", value, data.dtype))


# ------------------------------------------------------------------------------------ indexing
@_documented_as(torch_impl.indexing_access)
def indexing_access(
    data: Tensor,
    indices: Tensor,
    sizes: Tensor,
    filler_value: float = 0,
    *,
    check_bounds: bool = True,
) -> Tensor:
    data = check_batched("data", check_tensor(data, "data"))
    indices, sizes = check_index_args(data, indices, sizes)
    if check_bounds:
        check_index_bounds("indices", indices, sizes, data.shape[1])
    filler = filler_arg("filler_value", filler_value, data.dtype)
    return call("indexing_access", data, indices, sizes, filler)


@_documented_as(torch_impl.indexing_write)
def indexing_write(
    to_write: Tensor, indices: Tensor, sizes: Tensor, into: Tensor, *, check_bounds: bool = True
) -> Tensor:
    into = check_batched("into", check_tensor(into, "into"))
    to_write = check_batched("to_write", check_tensor(to_write, "to_write"), into.shape[0])
    check_rows_match("to_write", to_write, "into", into)
    indices, sizes = check_index_args(into, indices, sizes)
    if indices.shape[1] != to_write.shape[1]:
        raise ValueError(f"indices {tuple(indices.shape)} must match to_write's first two dims")
    check_same_device(into, to_write=to_write)
    if check_bounds:
        check_index_bounds("indices", indices, sizes, into.shape[1])
    return call("indexing_write", to_write, indices, sizes, into)


@_documented_as(torch_impl.inverse_indexing_access)
def inverse_indexing_access(
    data: Tensor,
    indices: Tensor,
    sizes: Tensor,
    num_targets: int,
    filler_value: float = 0,
    *,
    check_bounds: bool = True,
) -> Tensor:
    data = check_batched("data", check_tensor(data, "data"))
    indices, sizes = check_index_args(data, indices, sizes)
    if indices.shape[1] != data.shape[1]:
        raise ValueError(f"indices {tuple(indices.shape)} must match data's first two dims")
    num_targets = check_count(num_targets, "num_targets")
    if check_bounds:
        check_index_bounds("indices", indices, sizes, num_targets)
    filler = filler_arg("filler_value", filler_value, data.dtype)
    return call("inverse_indexing_access", data, indices, sizes, num_targets, filler)


@_documented_as(torch_impl.index_mapping, extra=_CHECK_PAIRS)
def index_mapping(
    source: Tensor,
    source_indices: Tensor,
    target_indices: Tensor,
    sizes: Tensor,
    target: Tensor,
    *,
    check_bounds: bool = True,
) -> Tensor:
    target = check_batched("target", check_tensor(target, "target"))
    source = check_batched("source", check_tensor(source, "source"), target.shape[0])
    check_rows_match("source", source, "target", target)
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
@_documented_as(torch_impl.mask_to_indices, extra="")
def mask_to_indices(mask: Tensor, *, max_count: int | None = None) -> tuple[Tensor, Tensor]:
    return _counted("mask_to_indices", max_count, check_mask(mask))


@_documented_as(torch_impl.indices_to_mask)
def indices_to_mask(
    indices: Tensor, sizes: Tensor, num_targets: int, *, check_bounds: bool = True
) -> Tensor:
    indices = check_index_tensor("indices", indices, 2)
    indices, sizes = check_index_args(indices, indices, sizes)
    num_targets = check_count(num_targets, "num_targets")
    if check_bounds:
        check_index_bounds("indices", indices, sizes, num_targets)
    return call("indices_to_mask", indices, sizes, num_targets)


@_documented_as(torch_impl.bool_compaction, extra=_MAX_COUNT)
def bool_compaction(
    data: Tensor, mask: Tensor, *, max_count: int | None = None
) -> tuple[Tensor, Tensor]:
    data = check_batched("data", check_tensor(data, "data"))
    mask = check_mask(mask, data.shape[0], data.shape[1])
    check_same_device(data, mask=mask)
    return _counted("bool_compaction", max_count, data, mask)


def _counted(name: str, max_count: int | None, *args: Tensor) -> tuple[Tensor, Tensor]:
    """Operator ``name`` (``mask_to_indices`` / ``bool_compaction``) on ``args``, the mask last,
    at width ``max_count``, by default the largest count. On the host the counts size the
    output, so they are summed once and handed to the operator (host memory: no sync)."""
    if max_count is None and runs_on_host(args[0]):
        counts = cpu.row_counts(args[-1])
        width = int(counts.max()) if counts.shape[0] else 0
        return CPU[name](*args, width, counts=counts)
    return call(name, *args, max_count_of(args[-1], max_count))

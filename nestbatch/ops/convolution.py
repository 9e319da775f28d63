"""Convolutions and pooling on a :class:`~nestbatch.NestedBatch`: torch's function applied to
every sample alone, the results batched.

A function of ``N`` spatial dims (``conv{N}d``, ``conv_transpose{N}d``, ``max_pool{N}d``,
``avg_pool{N}d``) reads each sample as torch reads a tensor: ``(C, *spatial)`` unbatched or
``(M, C, *spatial)`` batched, the spatial dims last. Where the batch's one ragged dim sits
decides how it runs:

* **Over the samples' own batch dim** (torch.nested's semantics, ``convolution_default`` of
  ``torch/nested/_internal/ops.py``): samples ``(n_i, C, *spatial)``, ragged dim 1. The rows of
  every sample are independent inputs, so the function runs once on the packed values
  ``(sum n_i, C, *spatial)`` and the result keeps the partition. No device sync.
* **Over a spatial dim** (a sequence ``(B, C, j)``, made e.g. by ``x.transpose(1, 2)`` of a
  ``(B, j, C)`` batch): the function runs once on the padded data, the ragged dim padded with a
  filler equal to torch's own padding (0 for convolutions and average pooling, the lowest value
  for max pooling), and every sample keeps the first ``out_len_i`` positions of its result
  (torch's output size of its length). Every output position of a sample reads only the
  sample's elements and positions torch pads itself, so the values are the sample's own (up to
  the rounding of a different kernel choice: convolutions can differ in the last bits; the
  pools give torch's bits). Where a window can overhang a shorter sample's end and count other
  slots than torch counts for the sample alone (``ceil_mode``, or ``count_include_pad=False``
  with padding), average pooling takes the window sums (in float32 for half precision, as
  torch's kernel) and divides them by every sample's own divisor. Max pooling's
  ``return_indices`` are positions inside each sample, as torch gives them, where the ragged dim
  is the first spatial dim (always for 1-d pooling). Syncs: none where the host knows the
  sizes; else one read of the shortest and longest length (a sample torch refuses, too short
  for the window, must raise before anything runs; the padded width is the longest).
* **Over the channels** (``(B, j, L)`` read as unbatched ``(C=n_i, L)`` samples): pooling
  treats every channel alone, so it runs on the packed values (torch refuses a sample of no
  channel: where only the device knows the sizes, one read of whether a sample is empty); a
  convolution mixes the channels, whose number differs per sample, and is refused.

A sample torch refuses (zero length, shorter than the window, a pooling padding over half the
kernel) raises torch's own error: torch itself is run on a zero sample of that shape. Batches
with more than one ragged dim, or of ragged rank 2 and more, are refused, as are return
indices of 2-d / 3-d max pooling whose ragged dim is not the first spatial dim (their flat
index would need every sample's own row length).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from nestbatch.batch import NestedBatch
from nestbatch.layouts import Layout, Packed, RowPartition
from nestbatch.ops.common import (
    PACKED_OR_PADDED,
    REQUIRED,
    bind_arguments,
    fill_value_for,
    wrap_padded,
)
from nestbatch.ops.registry import register

# ================================================================================ the functions
#: The parameters after the input, in torch's order, of each family, with their defaults
#: (``REQUIRED``: none).
_CONV_PARAMS = (("weight", REQUIRED), ("bias", None), ("stride", 1), ("padding", 0),
                ("dilation", 1), ("groups", 1))
_CONV_T_PARAMS = (("weight", REQUIRED), ("bias", None), ("stride", 1), ("padding", 0),
                  ("output_padding", 0), ("groups", 1), ("dilation", 1))
_MAX_PARAMS = (("kernel_size", REQUIRED), ("stride", None), ("padding", 0), ("dilation", 1),
               ("ceil_mode", False), ("return_indices", False))
_AVG_PARAMS = (("kernel_size", REQUIRED), ("stride", None), ("padding", 0),
               ("ceil_mode", False), ("count_include_pad", True), ("divisor_override", None))


class _Op(NamedTuple):
    """One registered function: its family, number of spatial dims and parameters."""

    kind: str  # "conv", "conv_transpose", "max_pool" or "avg_pool"
    dims: int
    params: tuple
    indices: bool = False  # always returns (values, indices)


def _spellings() -> dict[Callable, _Op]:
    """Every spelling of the functions that reaches ``__torch_function__`` (``F.conv1d`` is
    ``torch.conv1d``; ``F.max_pool1d`` is a Python function of its own; the modules call
    these)."""
    table: dict[Callable, _Op] = {}
    for n in (1, 2, 3):
        table[getattr(torch, f"conv{n}d")] = _Op("conv", n, _CONV_PARAMS)
        table[getattr(torch, f"conv_transpose{n}d")] = _Op("conv_transpose", n, _CONV_T_PARAMS)
        table[getattr(F, f"max_pool{n}d")] = _Op("max_pool", n, _MAX_PARAMS)
        table[getattr(F, f"max_pool{n}d_with_indices")] = _Op("max_pool", n, _MAX_PARAMS, True)
        table[getattr(F, f"avg_pool{n}d")] = _Op("avg_pool", n, _AVG_PARAMS)
        for source in (torch, torch._C._nn):  # builtins without F's return_indices
            builtin = getattr(source, f"max_pool{n}d", None)
            if builtin is not None:
                table[builtin] = _Op("max_pool", n, _MAX_PARAMS[:-1])
            builtin = getattr(source, f"max_pool{n}d_with_indices", None)
            if builtin is not None:
                table[builtin] = _Op("max_pool", n, _MAX_PARAMS[:-1], True)
    table[torch.avg_pool1d] = _Op("avg_pool", 1, _AVG_PARAMS[:-1])
    return table


_OPS = _spellings()


@register(*_OPS, layouts=PACKED_OR_PADDED, moved_ragged=True)
def _convolve(layout: Layout, func: Callable, args: tuple, kwargs: dict) -> Any:
    """A convolution or pooling of a batch: on the packed values, or on the padded data over
    the ragged dim (see the module's docstring)."""
    op = _OPS[func]
    batch = args[0]
    name = getattr(func, "__name__", op.kind)
    if not isinstance(batch, NestedBatch):
        raise TypeError(f"{name} takes a NestedBatch as its input, got {type(batch).__name__}")
    params = bind_arguments(name, (("input", REQUIRED), *op.params), args, kwargs)
    del params["input"]
    axis = _ragged_axis(batch, op, name)
    if axis is None:
        return _on_values(batch, op, func, args, kwargs)
    return _over_ragged(batch, op, func, args, kwargs, params, axis, name)


def _ragged_axis(batch: NestedBatch, op: _Op, name: str) -> int | None:
    """Which spatial dim of the samples is ragged (0 for the first), or None where the function
    runs on the packed values (the ragged dim is the samples' own batch dim, or a pooling's
    channel dim).

    Raises
    ------
    ValueError
        For samples of a rank torch refuses, more than one ragged dim, and a convolution whose
        channel dim is ragged.
    """
    rank, n = batch.dim() - 1, op.dims
    if rank not in (n + 1, n + 2):
        raise ValueError(
            f"{name} takes samples of {n + 1} dims (C, *spatial) or {n + 2} (M, C, *spatial), "
            f"as torch takes tensors; this batch's samples have {rank} dims "
            f"{batch.sample_shape} (None: ragged)"
        )
    if batch.num_ragged_dims != 1:
        raise ValueError(
            f"{name} of a NestedBatch with {batch.num_ragged_dims} ragged dims is not "
            "supported: only one ragged dim, spatial or the samples' own batch dim"
        )
    first_spatial = rank - n + 1  # (logical dim)
    if batch.ragged_dim >= first_spatial:
        return batch.ragged_dim - first_spatial
    if (batch.ragged_dim == 1 and rank == n + 2) or op.kind in ("max_pool", "avg_pool"):
        return None
    raise ValueError(
        f"{name} of a NestedBatch whose ragged dim (logical dim {batch.ragged_dim}) is the "
        f"channel dim of samples {batch.sample_shape}: a convolution mixes the channels, whose "
        "number differs per sample. Put the ragged dim first (samples (n_i, C, *spatial)) or "
        "among the spatial dims (samples (C, *spatial) with a ragged length)"
    )


# ============================================================================ on the packed rows
def _on_values(batch: NestedBatch, op: _Op, func: Callable, args: tuple, kwargs: dict) -> Any:
    """``func`` of the packed values ``(total, *feature)``, which hold every sample's
    independent inputs (its batch rows, or the channels of a pooling): the partition is kept.

    Where the ragged dim is a pooling's channel dim, torch refuses a sample with no channel
    (checked first: reads whether a sample is empty, a sync where only the device knows), and
    an empty batch runs on one zero row (torch refuses an input of no channel).
    """
    rows = _usual_strides(batch.values)
    if batch.ragged_dim != 1 or batch.dim() - 1 == op.dims + 1:  # channels ragged
        if batch.batch_size == 0:
            probe = rows.new_zeros((1, *rows.shape[1:]))
            return _each(func(probe, *args[1:], **kwargs), lambda t: batch.with_values(t[:0]))
        empty = batch.partition.host_has_empty
        if empty is None:
            empty = bool((batch.lengths == 0).any())
        if empty:
            _raise_as_torch(batch, func, args, kwargs, 0)
    return _each(func(rows, *args[1:], **kwargs), batch.with_values)


def _each(result: Tensor | tuple, wrap: Callable[[Tensor], NestedBatch]) -> Any:
    """``wrap`` of a result, or of each of a tuple's (max pooling's values and indices)."""
    if isinstance(result, tuple):
        return tuple(wrap(t) for t in result)
    return wrap(result)


def _raise_as_torch(batch: NestedBatch, func: Callable, args: tuple, kwargs: dict,
                    size: int) -> None:
    """Run ``func`` on a zero sample of this batch's sample shape with ragged size ``size``:
    where torch refuses such a sample, its own error is raised (returns otherwise)."""
    shape = [size if s is None else s for s in batch.sample_shape]
    probe = torch.zeros(shape, dtype=batch.dtype, device=batch.device)
    with torch.no_grad():
        func(probe, *args[1:], **kwargs)


# ==================================================================== over the ragged dim
class _Window(NamedTuple):
    """The window of the ragged spatial dim: what its output length depends on."""

    kernel: int
    stride: int
    padding: int | str  # "same": the output is as long as the input
    dilation: int = 1
    ceil_mode: bool = False
    output_padding: int = 0
    transposed: bool = False


def _over_ragged(batch: NestedBatch, op: _Op, func: Callable, args: tuple, kwargs: dict,
                 params: dict, axis: int, name: str) -> Any:
    """``func`` over a ragged spatial dim: once on the padded data, every sample cut to its
    output length."""
    n = op.dims
    window = _window(op, params, axis, name)
    if op.kind == "max_pool" and axis > 0 and (op.indices or params.get("return_indices")):
        raise ValueError(
            f"{name} with return_indices over a ragged spatial dim other than the first: the "
            "flat index into each sample would need its own row length; transpose the ragged "
            "dim to the first spatial dim (the indices are then torch's)"
        )
    shortest, longest = _extent(batch)
    # (avg_pool3d also refuses an input dim shorter than its kernel, whatever the padding)
    if batch.batch_size and (_too_short(shortest, window) or (
            op.kind == "avg_pool" and n == 3 and shortest < window.kernel)):
        _raise_as_torch(batch, func, args, kwargs, shortest)  # (torch's error for the sample)
    filler = fill_value_for(batch.dtype, "lowest") if op.kind == "max_pool" else 0
    if op.kind == "max_pool" and batch.dtype.is_floating_point:
        filler = float("-inf")  # (never beats an element, nor a tie: torch's is strict)
    x = _padded_input(batch, filler, longest, window)
    rank = batch.dim() - 1
    flat = x.flatten(0, 1) if rank == n + 2 else x  # samples' own batch dim into torch's
    divide = op.kind == "avg_pool" and _own_divisors(params, window)
    if divide and batch.batch_size:  # (torch's kernel is not run: its dtype checks are, here)
        _raise_as_torch(batch, func, args, kwargs, shortest)
    y = _window_sums(flat, params, n) if divide else func(flat, *args[1:], **kwargs)
    partition = _out_partition(batch, window, longest)

    def wrap(out: Tensor) -> NestedBatch:
        out = out.unflatten(0, x.shape[:2]) if rank == n + 2 else out
        if divide:
            out = _divide(out, batch, params, n, axis, x.shape[-n:])
        data = out.movedim(batch.ragged_dim, 1)
        if batch.batch_size == 0:
            data = data[:, :0]
        return wrap_padded(data, partition, batch.ragged_dim)

    return _each(y, wrap)


def _window(op: _Op, params: dict, axis: int, name: str) -> _Window:
    """The ragged dim's window from the call's parameters."""
    n = op.dims
    if op.kind in ("conv", "conv_transpose"):
        weight = params["weight"]
        if not isinstance(weight, Tensor) or weight.dim() != n + 2:
            raise ValueError(f"{name}: weight must be a tensor of {n + 2} dims, got "
                             f"{getattr(weight, 'shape', type(weight).__name__)}")
        padding = params["padding"]
        if isinstance(padding, str):
            if padding not in ("same", "valid"):
                raise ValueError(f"{name}: padding must be 'same', 'valid' or ints, got "
                                 f"{padding!r}")
            padding = "same" if padding == "same" else 0
        else:
            padding = _per_axis(padding, n, "padding", name)[axis]
        return _Window(
            kernel=weight.shape[2 + axis],
            stride=_per_axis(params["stride"], n, "stride", name)[axis],
            padding=padding,
            dilation=_per_axis(params["dilation"], n, "dilation", name)[axis],
            output_padding=_per_axis(params.get("output_padding", 0), n, "output_padding",
                                     name)[axis],
            transposed=op.kind == "conv_transpose",
        )
    kernel, stride, padding = _pool_geometry(params, n, name)
    return _Window(
        kernel=kernel[axis],
        stride=stride[axis],
        padding=padding[axis],
        dilation=_per_axis(params.get("dilation", 1), n, "dilation", name)[axis],
        ceil_mode=bool(params["ceil_mode"]),
    )


def _pool_geometry(params: dict, n: int, name: str) -> tuple[tuple[int, ...], ...]:
    """A pooling's kernel size, stride (torch's default: the kernel size) and padding, ``n``
    ints each."""
    kernel = _per_axis(params["kernel_size"], n, "kernel_size", name)
    stride = params["stride"]
    if stride is None or (isinstance(stride, Sequence) and len(stride) == 0):
        stride = kernel
    return kernel, _per_axis(stride, n, "stride", name), \
        _per_axis(params["padding"], n, "padding", name)


def _per_axis(value: Any, n: int, what: str, name: str) -> tuple[int, ...]:
    """An int or sequence parameter as ``n`` ints (one int, or one in a sequence, for all)."""
    if isinstance(value, Sequence) and not isinstance(value, str):
        if len(value) in (1, n):
            return tuple(int(v) for v in value) * (n // len(value))
    elif isinstance(value, int | torch.SymInt):
        return (int(value),) * n
    raise ValueError(f"{name}: {what} must be an int or {n} ints, got {value!r}")


def _out_length(length: Any, w: _Window) -> Any:
    """torch's output size along the ragged dim for input ``length`` (an int or an int64
    tensor), before any check (it may be below 1: torch refuses such an input)."""
    if w.transposed:
        return (length - 1) * w.stride - 2 * w.padding + w.dilation * (w.kernel - 1) \
            + w.output_padding + 1
    if w.padding == "same":
        return length
    span = length + 2 * w.padding - w.dilation * (w.kernel - 1) - 1
    if not w.ceil_mode:
        return span // w.stride + 1
    out = (span + w.stride - 1) // w.stride + 1
    # torch's pooling_output_shape: the last window starts inside the input or its left padding
    return out - ((out - 1) * w.stride >= length + w.padding) * 1


def _too_short(length: int, w: _Window) -> bool:
    """Whether torch may refuse a sample of this length (empty, or no whole window): then
    torch is asked (:func:`_raise_as_torch`). A stride below 1 is left to torch too."""
    return length == 0 or w.stride < 1 or _out_length(length, w) < 1


def _extent(batch: NestedBatch) -> tuple[int, int]:
    """The shortest and longest length: from the host when it knows them, else one read of
    the device (a sync, of both at once), needed because the longest is the padded width (a
    shape) and a sample torch refuses (shorter than the window) must raise before anything
    runs."""
    partition = batch.partition
    if batch.batch_size == 0:
        return 0, 0
    if partition.knows_host_shapes:
        return min(partition.host_lengths), partition.max_shape[0]
    lengths = batch.lengths
    if partition.knows_max_shape:
        return int(lengths.min()), partition.max_shape[0]
    shortest, longest = torch.stack([lengths.min(), lengths.max()]).tolist()
    return shortest, longest


def _padded_input(batch: NestedBatch, filler: float, longest: int, w: _Window) -> Tensor:
    """The padded samples in logical order ``(B, *sample)``, the ragged dim filled with
    ``filler`` past each sample. An empty batch gets a width every window fits (torch refuses
    a width too small even for no sample)."""
    partition = batch.partition
    if partition.knows_max_shape or not batch.has_layout(Layout.PACKED):
        data = batch.padded(filler).data  # (cached; from a padded layout: its own width)
    else:
        # The packed rows under a partition that knows the longest length just read: padded
        # without reading it again.
        known = RowPartition.from_lengths(batch.lengths, max_len=longest)
        data = NestedBatch.trusted(Packed.trusted(batch.values, known)).padded(filler).data
    if batch.batch_size == 0:
        width = 1 if w.transposed else w.dilation * (w.kernel - 1) + 1
        data = data.new_zeros((0, max(width, 1), *data.shape[2:]))
    return _usual_strides(data.movedim(1, batch.ragged_dim))


def _usual_strides(x: Tensor) -> Tensor:
    """A contiguous ``x`` as a view with the usual strides: a size-1 dim may keep an odd
    stride (a transposed width of 1), on which torch's bfloat16 CPU convolution crashes
    (PyTorch 2.13). Other tensors are returned as they are."""
    return x.reshape(-1).view(x.shape) if x.is_contiguous() else x


def _out_partition(batch: NestedBatch, w: _Window, longest: int) -> RowPartition:
    """The partition of the output lengths, on the host too where it knows the input's (an
    output length is monotone in the input's: the longest input gives the longest output)."""
    partition = batch.partition
    top = max(_out_length(longest, w), 0) if batch.batch_size else 0
    if partition.knows_host_shapes:
        host = torch.tensor(partition.host_lengths, dtype=torch.int64)
        return RowPartition.from_host_lengths_tensor(
            _out_length(host, w).clamp_min(0), batch.device, max_len=top)
    return RowPartition.from_lengths(_out_length(batch.lengths, w).clamp_min(0), max_len=top)


# ================================================================================ average pooling
def _own_divisors(params: dict, w: _Window) -> bool:
    """Whether a window of a sample shorter than the padded width can count other elements
    than torch counts for the sample alone. Not without ``ceil_mode``: every window then ends
    by the sample's end plus the padding, and holds one of its elements, so that torch's
    count (``count_include_pad``: the kernel size; else the elements, all the sample's
    when there is no padding) is the padded data's. Nor with ``divisor_override`` (an empty
    window sums to 0 in both)."""
    if params.get("divisor_override") is not None:
        return False
    return w.ceil_mode or (not params["count_include_pad"] and w.padding != 0)


def _window_sums(x: Tensor, params: dict, n: int) -> Tensor:
    """The window sums of ``x`` (the zero filler adds nothing), to be divided by every
    sample's own divisor (:func:`_divide`). In float32 for half precision: torch's kernel
    accumulates and divides there, then rounds once."""
    kernel, stride, padding = _pool_geometry(params, n, f"avg_pool{n}d")
    ceil = bool(params["ceil_mode"])
    wide = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    if n == 1:  # (torch's avg_pool1d is avg_pool2d of one row, which takes a divisor)
        return F.avg_pool2d(wide.unsqueeze(-2), (1, *kernel), (1, *stride), (0, *padding),
                            ceil, True, 1).squeeze(-2)
    pool = F.avg_pool2d if n == 2 else F.avg_pool3d
    return pool(wide, kernel, stride, padding, ceil, True, 1)


def _divide(sums: Tensor, batch: NestedBatch, params: dict, n: int, axis: int,
            sizes: Sequence[int]) -> Tensor:
    """Window sums ``(B, *sample_out)`` over each window's divisor as torch counts it for the
    sample alone (``count_include_pad``), 0 where a window holds no element of the sample
    (torch's value there)."""
    kernel, stride, padding = _pool_geometry(params, n, f"avg_pool{n}d")
    first = sums.dim() - n  # logical dim of the first spatial dim
    pooled = inside = None
    for j in range(n):
        count = sums.shape[first + j]
        start = torch.arange(count, device=sums.device) * stride[j] - padding[j]
        size = batch.lengths[:, None] if j == axis else sizes[j]
        end = torch.minimum(start + kernel[j], torch.as_tensor(size + padding[j]))
        clipped = (torch.minimum(end, torch.as_tensor(size)) - start.clamp_min(0)).clamp_min(0)
        shape = [1] * sums.dim()
        shape[first + j] = count
        if j == axis:
            shape[0] = batch.batch_size
        along, held = (end - start).view(shape), clipped.view(shape)
        pooled = along if pooled is None else pooled * along
        inside = held if inside is None else inside * held
    divisor = pooled if params["count_include_pad"] else inside
    divisor = torch.where(divisor == 0, 1, divisor)  # (masked below)
    if sums.dtype.is_floating_point:
        out = sums / divisor
    else:  # integers: C's division, toward zero
        out = torch.div(sums, divisor, rounding_mode="trunc")
    out = torch.where(inside > 0, out, torch.zeros((), dtype=out.dtype, device=out.device))
    return out.to(batch.dtype)

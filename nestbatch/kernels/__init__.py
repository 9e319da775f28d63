"""Compiled kernels for the padded-layout hot paths, as ``torch.library`` operators.

The functions here are the entry points callers use. They validate their arguments (raising
``TypeError`` / ``ValueError`` / ``IndexError`` before any kernel runs) and call the
``nestbatch::*`` operators of :mod:`nestbatch.kernels.operators`, which run a CUDA kernel from
``csrc/`` on CUDA tensors (built on first use, see :mod:`nestbatch.kernels.extension`) and the
pure-PyTorch implementation elsewhere. Both paths give identical results.

The indexing functions have the signatures of their counterparts in
:mod:`nestbatch.batched_indexing` (plus keyword-only extras), so a call site switches by changing
the module it calls.

Host synchronizations: none in the operators. The wrappers read the device once where the
result needs it: the bounds check of ``check_bounds=True`` (one flag per call; pass
``check_bounds=False`` where the caller already validated), and the output width of
:func:`mask_to_indices` / :func:`bool_compaction` when ``max_count`` is not given.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch._subclasses.fake_tensor import FakeTensor

from nestbatch.kernels import cpu as _cpu
from nestbatch.kernels import operators as _operators  # registers nestbatch::*
from nestbatch.kernels import reference as _reference
from nestbatch.kernels.arguments import check_count
from nestbatch.kernels.extension import extension_status, load_extension

__all__ = [
    "bool_compaction",
    "call",
    "call_validating",
    "extension_status",
    "fill_padding",
    "index_mapping",
    "indexing_access",
    "indexing_write",
    "indices_to_mask",
    "inverse_indexing_access",
    "load_extension",
    "mask_to_indices",
    "packed_to_padded",
    "padded_to_packed",
    "runs_compiled",
]

_ops = torch.ops.nestbatch


def call(name: str, *args: object) -> object:
    """Run operator ``nestbatch::<name>`` on arguments the caller has already validated.

    The one road from nestbatch's layouts to the operators: no argument checks (the public
    functions of this module make them), no device reads. CUDA tensors, fake tensors and
    graphs that ``torch.compile`` traces go through the operator (compiled kernel, fake kernel,
    autograd formula). Host tensors would only run its CPU implementation, so that is called
    directly: the same computation, differentiated by PyTorch's autograd, without the
    custom-op dispatch (about 50 us a call).
    """
    first = args[0]
    if isinstance(first, FakeTensor) or torch.compiler.is_compiling():
        return getattr(_ops, name)(*args)
    if first.is_cpu:  # _runs_on_host, inline
        return _CPU[name](*args)
    if first.is_cuda:
        kernel = _direct_kernel(name, args)
        if kernel is not None:
            return kernel(*args)
    return getattr(_ops, name)(*args)


def _runs_on_host(first: Tensor) -> bool:
    """Whether :func:`call` runs the CPU implementation directly (host tensors, eager)."""
    return first.is_cpu and not isinstance(first, FakeTensor) and not torch.compiler.is_compiling()


def call_validating(name: str, *args: object) -> Tensor | None:
    """:func:`call` of operator ``name`` on ``args`` when that call checks the indices itself,
    else ``None`` (nothing computed).

    Such a call raises (``IndexError`` or ``RuntimeError``) for every valid slot outside
    ``[-n, n)`` (``n`` the size of the dim the slot indexes) and counts a negative slot from
    the end of that dim or raises for it too. So far: host calls that take the CPU selection
    path (:func:`nestbatch.kernels.cpu.call_validating`).
    """
    return _cpu.call_validating(name, args) if _runs_on_host(args[0]) else None


def runs_compiled(args: tuple) -> bool:
    """Whether an operator called on ``args`` runs the compiled CUDA kernels, which never read
    or write out of bounds whatever the indices (the PyTorch implementations may raise)."""
    first = args[0]
    return (
        first.is_cuda
        and not isinstance(first, FakeTensor)
        and not torch.compiler.is_compiling()
        and load_extension()
        and _operators.kernels_cover(args)
    )


def _direct_kernel(name: str, args: tuple):
    """The compiled CUDA kernel of operator ``name`` when it covers ``args`` (their dtypes) and
    autograd has nothing to record, else ``None``.

    Called straight through the C++ dispatcher: the same kernel the operator would run, without
    the Python layers of ``torch.library.custom_op`` (about 15 us a call, the kernel's own time
    at small sizes). One pass over ``args`` without generator frames: every CUDA call pays it.
    """
    grad = torch.is_grad_enabled()
    for arg in args:
        if isinstance(arg, Tensor) and (
            arg.dtype not in _KERNEL_DTYPES or (grad and arg.requires_grad)
        ):
            return None
    return _operators.compiled_kernel(name)


_run = call
_CPU = _operators.CPU_IMPLEMENTATIONS
_KERNEL_DTYPES = _operators.KERNEL_DTYPES


# ---------------------------------------------------------------------------------- validation
def _tensor(name: str, value: object) -> Tensor:
    if not isinstance(value, Tensor):
        raise TypeError(f"{name} must be a Tensor, got {type(value).__name__}")
    return value


def _integer_tensor(name: str, value: object, dim: int) -> Tensor:
    tensor = _tensor(name, value)
    if tensor.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{name} must be an int32 or int64 tensor, got {tensor.dtype}")
    if tensor.dim() != dim:
        raise ValueError(f"{name} must have {dim} dims, got shape {tuple(tensor.shape)}")
    return tensor


def _count(name: str, value: object) -> int:
    return check_count(value, name)


def _filler(name: str, value: object, dtype: torch.dtype) -> int | float | bool:
    # Cast to ``dtype`` as torch's fills do (5 is True for bool); not a number is an error.
    # (The front object's conversions refuse what the dtype cannot hold exactly.)
    if isinstance(value, Tensor) and value.numel() == 1:
        # A 0-d tensor filler is read on the host (one sync if it lives on the device).
        return value.item()
    if not isinstance(value, int | float | bool):
        raise TypeError(f"{name} must be a Python int, float or bool, got {type(value).__name__}")
    return value


def _same_device(reference: Tensor, **others: Tensor) -> None:
    for name, tensor in others.items():
        if tensor.device != reference.device:
            raise ValueError(f"{name} is on {tensor.device}, the data on {reference.device}")


def _check_out(out: object, shape: tuple[int, ...], source: Tensor) -> None:
    out = _tensor("out", out)
    if tuple(out.shape) != shape or out.dtype != source.dtype or out.device != source.device:
        raise ValueError(
            f"out must be a {shape} {source.dtype} tensor on {source.device}, got "
            f"{tuple(out.shape)} {out.dtype} on {out.device}"
        )
    if not out.is_contiguous():
        raise ValueError("out must be contiguous")
    if torch.is_grad_enabled() and (source.requires_grad or out.requires_grad):
        raise RuntimeError(
            "out= is not differentiable: call without out, or under torch.no_grad()"
        )


def _batched(name: str, data: Tensor, batch_size: int | None = None) -> Tensor:
    if data.dim() < 2:
        raise ValueError(f"{name} must have shape (B, N, *D), got {tuple(data.shape)}")
    if batch_size is not None and data.shape[0] != batch_size:
        raise ValueError(f"{name} has {data.shape[0]} samples, expected {batch_size}")
    return data


def _index_args(data: Tensor, indices: object, sizes: object) -> tuple[Tensor, Tensor]:
    indices = _integer_tensor("indices", indices, 2)
    sizes = _integer_tensor("sizes", sizes, 1)
    if indices.shape[0] != data.shape[0] or sizes.shape[0] != data.shape[0]:
        raise ValueError(
            f"indices {tuple(indices.shape)} and sizes {tuple(sizes.shape)} must have one row "
            f"per sample ({data.shape[0]})"
        )
    _same_device(data, indices=indices, sizes=sizes)
    return indices, sizes


def _check_bounds(name: str, indices: Tensor, sizes: Tensor, bound: int) -> None:
    """Raise ``IndexError`` if a valid slot of ``indices`` is outside ``[0, bound)``.

    One ``aminmax`` over every slot and one read of its two numbers (a synchronization when
    the tensors live on a device). Only when a slot, possibly a padding one, is out of range are
    the valid slots checked alone (more reads, to name the bad slot).
    """
    if indices.numel() == 0:
        return
    low, high = torch.stack(torch.aminmax(indices)).cpu().tolist()
    if 0 <= low and high < bound:
        return
    valid = _reference.sizes_mask(sizes, indices.shape[1])
    bad = valid & ((indices < 0) | (indices >= bound))
    if bool(bad.any()):
        sample, slot = (int(i) for i in bad.nonzero()[0])
        raise IndexError(
            f"{name}[{sample}, {slot}] = {int(indices[sample, slot])} is out of range for a "
            f"dim of size {bound}"
        )


def _max_count(mask: Tensor, max_count: int | None) -> int:
    if max_count is not None:
        return _count("max_count", max_count)
    if mask.shape[0] == 0:
        return 0
    # The output width is data dependent: one read of the device.
    return int(mask.sum(dim=1).amax().cpu())


def _counted_on_host(name: str, *args: Tensor) -> tuple[Tensor, Tensor]:
    """Host operator ``name`` (``mask_to_indices`` / ``bool_compaction``) on ``args``, the mask
    last, at the width of its largest count: the counts size the output, so they are summed
    once and handed to the operator (host memory: reading them is no sync)."""
    counts = _cpu.row_counts(args[-1])
    width = int(counts.max()) if counts.shape[0] else 0
    return _CPU[name](*args, width, counts=counts)


def _mask(mask: object, rows: int | None = None, width: int | None = None) -> Tensor:
    mask = _tensor("mask", mask)
    if mask.dtype != torch.bool or mask.dim() != 2:
        raise ValueError(f"mask must be a bool tensor (B, N), got {mask.dtype} {tuple(mask.shape)}")
    if rows is not None and tuple(mask.shape) != (rows, width):
        raise ValueError(f"mask must have shape {(rows, width)}, got {tuple(mask.shape)}")
    return mask


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
    values = _tensor("values", values)
    if values.dim() < 1:
        raise ValueError("values must have a row dim: (total, *D)")
    offsets = _integer_tensor("offsets", offsets, 1)
    if offsets.shape[0] < 1:
        raise ValueError("offsets must have shape (B + 1,), got an empty tensor")
    _same_device(values, offsets=offsets)
    max_len = _count("max_len", max_len)
    filler = _filler("padding_value", padding_value, values.dtype)
    if out is None:
        return _run("packed_to_padded", values, offsets, max_len, filler)
    _check_out(out, (offsets.shape[0] - 1, max_len, *values.shape[1:]), values)
    if values.device.type == "cpu":
        reference = _operators._packed_to_padded_reference
        return _cpu.packed_to_padded(values, offsets, max_len, filler, reference, out=out)
    return out.copy_(_run("packed_to_padded", values, offsets, max_len, filler))


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
    data = _batched("data", _tensor("data", data))
    offsets = _integer_tensor("offsets", offsets, 1)
    if offsets.shape[0] != data.shape[0] + 1:
        raise ValueError(f"offsets must have shape ({data.shape[0] + 1},), got {offsets.shape}")
    _same_device(data, offsets=offsets)
    total = _count("total", total)
    if out is None:
        return _run("padded_to_packed", data, offsets, total)
    _check_out(out, (total, *data.shape[2:]), data)
    if data.device.type == "cpu":
        reference = _operators._padded_to_packed_reference
        return _cpu.padded_to_packed(data, offsets, total, reference, out=out)
    return out.copy_(_run("padded_to_packed", data, offsets, total))


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
    data = _batched("data", _tensor("data", data))
    sizes = _integer_tensor("sizes", sizes, 1)
    if sizes.shape[0] != data.shape[0]:
        raise ValueError(f"sizes must have shape ({data.shape[0]},), got {tuple(sizes.shape)}")
    _same_device(data, sizes=sizes)
    return _run("fill_padding", data, sizes, _filler("value", value, data.dtype))


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
    data = _batched("data", _tensor("data", data))
    indices, sizes = _index_args(data, indices, sizes)
    if check_bounds:
        _check_bounds("indices", indices, sizes, data.shape[1])
    filler = _filler("filler_value", filler_value, data.dtype)
    return _run("indexing_access", data, indices, sizes, filler)


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
    into = _batched("into", _tensor("into", into))
    to_write = _batched("to_write", _tensor("to_write", to_write), into.shape[0])
    if to_write.dtype != into.dtype or to_write.shape[2:] != into.shape[2:]:
        raise ValueError(
            f"to_write {to_write.dtype} {tuple(to_write.shape)} does not match into "
            f"{into.dtype} {tuple(into.shape)}"
        )
    indices, sizes = _index_args(into, indices, sizes)
    if indices.shape[1] != to_write.shape[1]:
        raise ValueError(f"indices {tuple(indices.shape)} must match to_write's first two dims")
    _same_device(into, to_write=to_write)
    if check_bounds:
        _check_bounds("indices", indices, sizes, into.shape[1])
    return _run("indexing_write", to_write, indices, sizes, into)


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
    data = _batched("data", _tensor("data", data))
    indices, sizes = _index_args(data, indices, sizes)
    if indices.shape[1] != data.shape[1]:
        raise ValueError(f"indices {tuple(indices.shape)} must match data's first two dims")
    num_targets = _count("num_targets", num_targets)
    if check_bounds:
        _check_bounds("indices", indices, sizes, num_targets)
    filler = _filler("filler_value", filler_value, data.dtype)
    return _run("inverse_indexing_access", data, indices, sizes, num_targets, filler)


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
    target = _batched("target", _tensor("target", target))
    source = _batched("source", _tensor("source", source), target.shape[0])
    if source.dtype != target.dtype or source.shape[2:] != target.shape[2:]:
        raise ValueError(
            f"source {source.dtype} {tuple(source.shape)} does not match target "
            f"{target.dtype} {tuple(target.shape)}"
        )
    source_indices, sizes = _index_args(source, source_indices, sizes)
    target_indices = _integer_tensor("target_indices", target_indices, 2)
    if target_indices.shape != source_indices.shape:
        raise ValueError("source_indices and target_indices must have the same shape")
    _same_device(
        target, source=source, source_indices=source_indices, target_indices=target_indices
    )
    if check_bounds:
        _check_bounds("source_indices", source_indices, sizes, source.shape[1])
        _check_bounds("target_indices", target_indices, sizes, target.shape[1])
    return _run("index_mapping", source, source_indices, target_indices, sizes, target)


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
    mask = _mask(mask)
    if max_count is None and _runs_on_host(mask):
        return _counted_on_host("mask_to_indices", mask)
    return _run("mask_to_indices", mask, _max_count(mask, max_count))


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
    indices = _integer_tensor("indices", indices, 2)
    indices, sizes = _index_args(indices, indices, sizes)
    num_targets = _count("num_targets", num_targets)
    if check_bounds:
        _check_bounds("indices", indices, sizes, num_targets)
    return _run("indices_to_mask", indices, sizes, num_targets)


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
    data = _batched("data", _tensor("data", data))
    mask = _mask(mask, data.shape[0], data.shape[1])
    _same_device(data, mask=mask)
    if max_count is None and _runs_on_host(data):
        return _counted_on_host("bool_compaction", data, mask)
    return _run("bool_compaction", data, mask, _max_count(mask, max_count))

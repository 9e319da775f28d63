"""Argument checks of the kernels' entry points and of the layers above (one message each):
tensors, integer index tensors, counts, fillers, devices, ``out=`` buffers and index bounds."""

from __future__ import annotations

import operator

import torch
from torch import Tensor

from nestbatch.kernels.torch_impl import sizes_mask

#: The dtypes of index and size tensors the kernels take.
INDEX_DTYPES = (torch.int64, torch.int32)


def negative_error(name: str, got: object) -> ValueError:
    """The error for sizes or counts that hold a negative number (``got``: what to show)."""
    return ValueError(f"{name} must be non-negative, got {got}")


def check_count(value: object, name: str) -> int:
    """A non-negative Python int (NumPy integers and 0-d integer tensors too; not bools,
    floats or strings)."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got a bool ({value})")
    try:
        count = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {type(value).__name__} ({value!r})") from None
    if count < 0:
        raise negative_error(name, count)
    return count


def check_type(value: object, name: str, *types: type) -> object:
    """``value``, or a ``TypeError`` naming ``name`` unless it is an instance of ``types``."""
    if not isinstance(value, types):
        expected = " or ".join("torch.Tensor" if t is Tensor else t.__name__ for t in types)
        raise TypeError(f"{name} must be a {expected}, got {type(value).__name__}")
    return value


def check_tensor(value: object, name: str) -> Tensor:
    """``value``, or a ``TypeError`` unless it is a tensor."""
    if not isinstance(value, Tensor):  # (on every call: no second frame when it is one)
        check_type(value, name, Tensor)
    return value


def check_index_dtype(value: Tensor, name: str) -> Tensor:
    """``value`` (a tensor or a batch) if its dtype is int32 or int64 (the kernels' indices)."""
    if value.dtype not in INDEX_DTYPES:
        raise TypeError(f"{name} must have dtype int32 or int64, got {value.dtype}")
    return value


def check_bool(value: Tensor, name: str) -> Tensor:
    """``value`` (a tensor or a batch) if its dtype is bool."""
    if value.dtype != torch.bool:
        raise TypeError(f"{name} must be a bool tensor (torch.bool), got {value.dtype}")
    return value


def check_index_tensor(name: str, value: object, dim: int) -> Tensor:
    tensor = check_index_dtype(check_tensor(value, name), name)
    if tensor.dim() != dim:
        raise ValueError(f"{name} must have {dim} dims, got shape {tuple(tensor.shape)}")
    return tensor


def filler_arg(name: str, value: object, dtype: torch.dtype) -> int | float | bool:
    # Cast to ``dtype`` as torch's fills do (5 is True for bool); not a number is an error.
    # (The front object's conversions refuse what the dtype cannot hold exactly.)
    if isinstance(value, Tensor) and value.numel() == 1:
        # A 0-d tensor filler is read on the host (one sync if it lives on the device).
        return value.item()
    if not isinstance(value, int | float | bool):
        raise TypeError(f"{name} must be a Python int, float or bool, got {type(value).__name__}")
    return value


def check_same_device(reference: Tensor, reference_name: str = "data", /,
                      **others: Tensor) -> None:
    """Raise ``ValueError`` naming the first of ``others`` not on ``reference``'s device."""
    for name, tensor in others.items():
        if tensor.device != reference.device:
            raise ValueError(f"{name} is on {tensor.device} but {reference_name} is on "
                             f"{reference.device}")


def check_out(out: object, shape: tuple[int, ...], source: Tensor) -> None:
    out = check_tensor(out, "out")
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


def check_rows_match(name: str, rows: Tensor, other_name: str, other: Tensor) -> None:
    """Raise unless two batched tensors ``(B, N, *D)`` share their dtype and row shape ``D``."""
    if rows.dtype != other.dtype or rows.shape[2:] != other.shape[2:]:
        raise ValueError(
            f"{name} {rows.dtype} {tuple(rows.shape)} does not match {other_name} "
            f"{other.dtype} {tuple(other.shape)}"
        )


def check_batched(name: str, data: Tensor, batch_size: int | None = None) -> Tensor:
    if data.dim() < 2:
        raise ValueError(f"{name} must have shape (B, N, *D), got {tuple(data.shape)}")
    if batch_size is not None and data.shape[0] != batch_size:
        raise ValueError(f"{name} has {data.shape[0]} samples, expected {batch_size}")
    return data


def check_index_args(data: Tensor, indices: object, sizes: object) -> tuple[Tensor, Tensor]:
    indices = check_index_tensor("indices", indices, 2)
    sizes = check_index_tensor("sizes", sizes, 1)
    if indices.shape[0] != data.shape[0] or sizes.shape[0] != data.shape[0]:
        raise ValueError(
            f"indices {tuple(indices.shape)} and sizes {tuple(sizes.shape)} must have one row "
            f"per sample ({data.shape[0]})"
        )
    check_same_device(data, indices=indices, sizes=sizes)
    return indices, sizes


def check_index_bounds(name: str, indices: Tensor, sizes: Tensor, bound: int) -> None:
    """Raise ``IndexError`` if a valid slot of ``indices`` is outside ``[0, bound)``.

    One ``aminmax`` over every slot and one read of its two numbers (a synchronization when
    the tensors live on a device). Only when a slot, possibly a padding one, is out of range are
    the valid slots checked alone (:func:`check_valid_slots`: more reads, to name the bad slot).
    """
    if indices.numel() == 0:
        return
    low, high = torch.stack(torch.aminmax(indices)).cpu().tolist()
    if not (0 <= low and high < bound):
        check_valid_slots(name, indices, sizes, bound)


def check_valid_slots(
    name: str, indices: Tensor, sizes: Tensor, bound: Tensor | int, *,
    negative: bool = False, target: str = "a dim",
) -> int:
    """The one bounds check of ragged indices: raise ``IndexError`` naming the first valid slot
    of ``indices`` ``(B, M)`` outside ``[0, bound)`` (``[-bound, bound)`` with ``negative``);
    else return the smallest valid index (0 when none is valid).

    ``sizes`` ``(B,)`` counts each sample's valid slots; ``bound`` is one size or one per
    sample ``(B,)``. Reads the device (the error path, or the slow path of a caller that read
    the extremes of every slot first).
    """
    valid = sizes_mask(sizes, indices.shape[1])
    per_sample = bound.unsqueeze(1) if isinstance(bound, Tensor) else bound
    low = -per_sample if negative else 0
    bad = valid & ((indices < low) | (indices >= per_sample))
    if bool(bad.any()):
        sample, slot = (int(v) for v in bad.nonzero()[0])
        size = int(bound[sample]) if isinstance(bound, Tensor) else bound
        index = int(indices[sample, slot])  # (read first: see ops.indexing's _raise_outside)
        raise IndexError(
            f"{name}: index {index} (sample {sample}, slot {slot}) is out of range for "
            f"{target} of size {size}"
        )
    return int(torch.where(valid, indices, 0).min()) if indices.numel() else 0


def max_count_of(mask: Tensor, max_count: int | None) -> int:
    if max_count is not None:
        return check_count(max_count, "max_count")
    if mask.shape[0] == 0:
        return 0
    # The output width is data dependent: one read of the device.
    return int(mask.sum(dim=1).amax().cpu())


def check_mask(mask: object, rows: int | None = None, width: int | None = None) -> Tensor:
    mask = check_bool(check_tensor(mask, "mask"), "mask")
    if mask.dim() != 2:
        raise ValueError(f"mask must have shape (B, N), got {tuple(mask.shape)}")
    if rows is not None and tuple(mask.shape) != (rows, width):
        raise ValueError(f"mask must have shape {(rows, width)}, got {tuple(mask.shape)}")
    return mask

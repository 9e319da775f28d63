"""Argument checks shared by the layouts, conversions and constructors.

Every check raises a ``ValueError`` or ``TypeError`` that names the argument, what was expected
and what was given. Checks that must read device values say so: they synchronize with the
device, which is why constructors take ``validate=False`` for trusted input.
"""

from __future__ import annotations

import array
import operator
from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor

from nestbatch.kernels.checks import check_count, check_filler
from nestbatch.kernels.dispatch import making_fake_tensors
from nestbatch.kernels.torch_impl import sizes_mask

# Re-exported: these checks live with the kernels, a leaf the kernels' own functions share.
__all__ = ["check_count", "check_filler"]


def check_tensor(value: object, name: str) -> Tensor:
    """Raise ``TypeError`` unless ``value`` is a tensor."""
    if not isinstance(value, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    return value


def as_index_tensor(value: Tensor | Sequence[int], name: str, device: torch.device) -> Tensor:
    """Return ``value`` as a 1-d int64 tensor on ``device``.

    Python sequences are accepted; tensors must have an integer dtype (floats are refused rather
    than truncated) and one dimension.
    """
    if not isinstance(value, Tensor):
        value = torch.tensor(host_ints(value, name), dtype=torch.int64).reshape(-1)
    if value.is_floating_point() or value.is_complex() or value.dtype == torch.bool:
        raise TypeError(f"{name} must be an integer tensor (int32 or int64), got {value.dtype}")
    if value.dim() != 1:
        raise ValueError(f"{name} must be 1-d, got shape {tuple(value.shape)}")
    return value.to(device=device, dtype=torch.int64)


_INT_TYPE = {int}


def _plain_ints(value: object) -> bool:
    """Whether ``value`` is a list or tuple of Python ints (checked at C speed)."""
    return type(value) in (list, tuple) and set(map(type, value)) <= _INT_TYPE


def host_ints(value: object, name: str) -> tuple[int, ...]:
    """A Python sequence of integers as a tuple of ints, checked on the host (any sign).

    Integers (Python ints, NumPy integers, 0-d integer tensors on the CPU) are accepted; floats,
    bools and strings are refused rather than truncated or read character by character.

    Raises
    ------
    TypeError
        If ``value`` is not a sequence of integers.
    """
    if _plain_ints(value):
        return tuple(value)  # the common case, checked at C speed (no loop in Python)
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise TypeError(
            f"{name} must be a sequence of ints or a 1-d integer tensor, got "
            f"{type(value).__name__}"
        )
    ints = []
    for i, item in enumerate(value):
        if isinstance(item, bool) or (isinstance(item, Tensor) and item.dtype == torch.bool):
            raise TypeError(f"{name}[{i}] must be an int, got a bool ({item})")
        try:
            ints.append(operator.index(item))
        except TypeError:
            raise TypeError(
                f"{name}[{i}] must be an int, got {type(item).__name__} ({item!r})"
            ) from None
    return tuple(ints)


def host_sizes(value: object, name: str) -> tuple[int, ...]:
    """:func:`host_ints`, all non-negative (``ValueError`` naming the first negative one)."""
    return checked_host_sizes(value, name).sizes


class HostSizes(NamedTuple):
    """Non-negative host sizes and what checks of them need: their sum and largest entry, and
    for many sizes the ``int64`` host tensor they were read into (reused for the offsets)."""

    sizes: tuple[int, ...]
    total: int
    largest: int
    as_tensor: Tensor | None


#: From this many sizes on, their sum, extremes and offsets come from one host tensor (C
#: speed: 4096 sizes cost about 90 us read into it instead of 220 us of Python builtins).
MANY_SIZES = 64


def checked_host_sizes(value: object, name: str) -> HostSizes:
    """:func:`host_sizes` with their sum and largest entry, read once.

    Raises
    ------
    TypeError
        If ``value`` is not a sequence of integers.
    ValueError
        If a size is negative, or too large for int64.
    """
    # _plain_ints, inline: this is on every batch built from host sizes (about 1 us a call)
    if type(value) in (list, tuple) and set(map(type, value)) <= _INT_TYPE:
        sizes = tuple(value)
    else:
        sizes = host_ints(value, name)
    if len(sizes) < MANY_SIZES or making_fake_tensors():
        smallest, largest = (min(sizes), max(sizes)) if sizes else (0, 0)
        tensor, total = None, sum(sizes)
    else:
        try:
            tensor = torch.frombuffer(array.array("q", sizes), dtype=torch.int64)
        except OverflowError:
            raise ValueError(f"{name} must fit in int64, got {max(sizes)}") from None
        low, high = torch.aminmax(tensor)
        smallest, largest, total = int(low), int(high), int(tensor.sum())
    if smallest < 0:
        raise ValueError(f"{name} must be non-negative, got {smallest} in {list(sizes)}")
    return tuple.__new__(HostSizes, (sizes, total, largest, tensor))  # (no __new__ frame)


def read_device_values(values: Tensor) -> list:
    """The entries of a small device tensor on the host: one device-to-host copy (a sync).

    The one place validation reads the device, so every such read is easy to find and count.
    """
    return values.cpu().tolist()


def as_offsets(offsets: object, device: torch.device, name: str = "offsets") -> Tensor:
    """``offsets`` as a 1-d int64 tensor on ``device`` (int32 is widened; a copy only when the
    dtype or device differs). Checks the type and shape, not the values."""
    check_tensor(offsets, name)
    if offsets.dtype not in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8):
        raise TypeError(f"{name} must be an integer tensor (int32 or int64), got {offsets.dtype}")
    if offsets.dim() != 1:
        raise ValueError(f"{name} must be 1-d (B + 1,), got shape {tuple(offsets.shape)}")
    if offsets.dtype is torch.int64 and offsets.device == device:
        return offsets
    return offsets.to(device=device, dtype=torch.int64)


def check_offsets_on_device(offsets: Tensor, num_values: int, max_len: int | None = None,
                            name: str = "offsets") -> None:
    """Check device ``offsets`` ``(B + 1,)``: start at 0, never decrease, end at ``num_values``,
    and (when ``max_len`` is given) no sample longer than ``max_len``.

    Costs four small device ops and one read of two numbers (one synchronization): the chain
    ``[o_0, 0, o_0, o_1, ..., o_B, n, o_B]`` has all its steps in ``[0, max_len]`` exactly when
    the offsets are valid. The chain is laid out twice in one tensor so that one subtraction of
    two strided views gives every step and its negation, and one ``amax`` the largest of each.
    Details of a failure are read on the error path only.
    """
    count = offsets.numel()
    if count == 0:
        raise ValueError(f"{name} must have at least one entry (B + 1 values), got an empty tensor")
    if count <= _HOST_CHECKED and offsets.is_cpu:
        check_host_offsets(offsets.tolist(), num_values, max_len, name)  # host memory: no sync
        return
    ends = torch.tensor([0, num_values], dtype=offsets.dtype, device=offsets.device)
    chain = torch.cat([offsets[:1], ends[:1], offsets, ends[1:], offsets[-1:]] * 2)
    length = offsets.numel() + 4
    later = chain.as_strided((2, length - 1), (length - 1, 1), 1)  # rows: c[j + 1], c[j]
    earlier = chain.as_strided((2, length - 1), (length + 1, 1), 0)  # rows: c[j], c[j + 1]
    largest, negated_smallest = read_device_values((later - earlier).amax(1))
    smallest = -negated_smallest
    limit = num_values if max_len is None else max_len
    if smallest >= 0 and largest <= limit:
        return
    check_offsets(offsets, num_values, name)
    longest = int(offsets.diff().max()) if offsets.numel() > 1 else 0
    raise ValueError(
        f"max_len={max_len} is smaller than the longest sample ({longest} rows): the padded "
        "layout would lose data; give the true maximum or leave max_len out"
    )


#: Host offsets up to this many entries are checked in Python (cheaper than four tensor ops).
_HOST_CHECKED = 1024


def check_host_offsets(
    offsets: list[int], num_values: int, max_len: int | None, name: str = "offsets"
) -> None:
    """The checks of :func:`check_offsets_on_device` on host offsets (no device involved)."""
    steps = list(map(operator.sub, offsets[1:], offsets[:-1]))
    if offsets[0] != 0:
        raise ValueError(f"{name} must start at 0, got {offsets[0]}")
    if offsets[-1] != num_values:
        raise ValueError(
            f"{name} must end at the number of values ({num_values}), got {offsets[-1]}"
        )
    if steps and min(steps) < 0:
        raise ValueError(f"{name} must be non-decreasing, got {offsets}")
    if max_len is not None and steps and max(steps) > max_len:
        raise ValueError(
            f"max_len={max_len} is smaller than the longest sample ({max(steps)} rows): the "
            "padded layout would lose data; give the true maximum or leave max_len out"
        )


def check_offsets(offsets: Tensor, num_values: int, name: str = "offsets") -> None:
    """Check that ``offsets`` start at 0, never decrease and end at ``num_values``.

    Reads device values (synchronizes; :func:`check_offsets_on_device` is the one-read check
    of the hot path, this one names the failure).
    """
    if offsets.numel() == 0:
        raise ValueError(f"{name} must have at least one entry (B + 1 values), got an empty tensor")
    first, last = int(offsets[0]), int(offsets[-1])
    if first != 0:
        raise ValueError(f"{name} must start at 0, got {first}")
    if last != num_values:
        raise ValueError(
            f"{name} must end at the number of values ({num_values}), got {last}"
        )
    if offsets.numel() > 1 and bool((offsets[1:] < offsets[:-1]).any()):
        raise ValueError(f"{name} must be non-decreasing, got {offsets.tolist()}")


def check_non_negative(sizes: Tensor, name: str, total: int | None = None) -> None:
    """Check that no entry of ``sizes`` ``(B, k)`` is negative and (with ``total``) that their
    per-sample products add up to ``total``: one read of two numbers (a sync on a device;
    host work for a CPU tensor)."""
    if sizes.numel() == 0:
        if total:
            raise ValueError(f"{name} describes 0 rows but values has {total}")
        return
    counted = sizes.prod(-1).sum() if total is not None else sizes.new_zeros(())
    negative, rows = read_device_values(torch.stack([(sizes < 0).any().to(counted.dtype),
                                                     counted]))
    if negative:
        raise ValueError(f"{name} must be non-negative, got {sizes.tolist()}")
    if total is not None and rows != total:
        raise ValueError(f"{name} describes {rows} rows but values has {total}")


def check_fits(sizes: Tensor, capacity: Sequence[int], name: str) -> None:
    """Check that per-sample ragged sizes ``(B, k)`` are non-negative and fit a padded shape
    ``capacity``: one read (a sync on a device; host work for a CPU tensor)."""
    if sizes.numel() == 0:
        return
    limit = torch.as_tensor(list(capacity), dtype=sizes.dtype, device=sizes.device)
    if bool(((sizes < 0) | (sizes > limit)).any()):
        if bool((sizes < 0).any()):  # the error path reads more, to say which
            raise ValueError(f"{name} must be non-negative, got {sizes.tolist()}")
        largest = sizes.amax(0).tolist()
        raise ValueError(
            f"{name} do not fit the padded data: largest sizes {largest} exceed its "
            f"ragged dims {list(capacity)}"
        )


def check_same_feature_shape(shapes: Sequence[torch.Size], num_ragged_dims: int, name: str) -> None:
    """Check that every sample has ``num_ragged_dims`` ragged dims and the same feature shape."""
    if not shapes:
        return
    ndim = len(shapes[0])
    if ndim < num_ragged_dims:
        raise ValueError(
            f"{name}[0] has {ndim} dims, fewer than num_ragged_dims={num_ragged_dims}"
        )
    feature = shapes[0][num_ragged_dims:]
    for i, shape in enumerate(shapes):
        if len(shape) != ndim:
            raise ValueError(
                f"every sample in {name} must have the same number of dims: sample 0 has {ndim}, "
                f"sample {i} has {len(shape)}"
            )
        if shape[num_ragged_dims:] != feature:
            raise ValueError(
                f"every sample in {name} must have the same feature shape (the dims after the "
                f"{num_ragged_dims} ragged dim(s)): sample 0 has {tuple(feature)}, sample {i} has "
                f"{tuple(shape[num_ragged_dims:])}"
            )


def normalize_empty_samples(tensors: Sequence[object], num_ragged_dims: int) -> list[object]:
    """The samples, with those that hold no element as zero-size samples of the batch's shape.

    A sample with no element is a zero-size sample whatever its shape, dtype or device (as the
    ``RaggedBatch`` reference counts ``torch.tensor([[]])``, shape ``(1, 0)``, beside ``(n, 4)``
    boxes): where it does not fit the first sample that has elements, it becomes an empty tensor
    of shape ``(0,) * num_ragged_dims + feature_shape`` in that sample's dtype and on its device.
    When no sample has elements, or an entry is not a tensor, nothing changes (the usual checks
    then apply).
    """
    reference = next((t for t in tensors if isinstance(t, Tensor) and t.numel()), None)
    if reference is None:
        return list(tensors)
    k = num_ragged_dims
    feature = reference.shape[k:]
    out = []
    for t in tensors:
        if isinstance(t, Tensor) and t.numel() == 0 and (
            t.dim() != reference.dim() or t.shape[k:] != feature
            or t.dtype != reference.dtype or t.device != reference.device
        ):
            t = reference.new_empty((0,) * k + tuple(feature))
        out.append(t)
    return out


def common_dtype_device(
    tensors: Sequence[Tensor],
    dtype: torch.dtype | None,
    device: torch.device | str | None,
    name: str,
) -> tuple[torch.dtype, torch.device]:
    """Return the dtype and device a list of samples is stored with.

    Mixed dtypes or devices are an error unless ``dtype=`` / ``device=`` says what to convert to.
    """
    for i, t in enumerate(tensors):
        check_tensor(t, f"{name}[{i}]")
    if dtype is None:
        dtypes = {t.dtype for t in tensors}
        if len(dtypes) > 1:
            raise TypeError(
                f"samples in {name} have mixed dtypes {sorted(map(str, dtypes))}; pass dtype= "
                "to convert them to one"
            )
        dtype = tensors[0].dtype if tensors else torch.get_default_dtype()
    if device is None:
        devices = {t.device for t in tensors}
        if len(devices) > 1:
            raise ValueError(
                f"samples in {name} are on mixed devices {sorted(map(str, devices))}; pass device= "
                "to move them to one"
            )
        device = tensors[0].device if tensors else torch.device("cpu")
    return dtype, torch.device(device)


def check_prefix_mask(mask: Tensor, name: str = "mask") -> Tensor:
    """Return per-sample lengths of a prefix mask ``(B, max_len)``; refuse any other mask.

    A prefix mask is True on the first ``length`` slots of each row and False after them.
    Reads device values (one synchronization).
    """
    if mask.dtype != torch.bool:
        raise TypeError(f"{name} must be a bool tensor, got {mask.dtype}")
    if mask.dim() != 2:
        raise ValueError(f"{name} must have shape (B, max_len), got {tuple(mask.shape)}")
    lengths = mask.sum(1, dtype=torch.int64)
    expected = sizes_mask(lengths, mask.shape[1])
    if not torch.equal(expected, mask):
        bad = (expected != mask).any(1).nonzero().flatten().tolist()
        raise ValueError(
            f"{name} must be a prefix mask (True then False along each row); rows {bad} are not"
        )
    return lengths

"""Argument checks of the package above the kernels: every message written once.

The kernels' own checks (tensors, types, dtypes, counts, fillers, devices, ``out=`` and the one
bounds check of ragged indices) live in :mod:`nestbatch.kernels.checks`, a leaf, and are
re-exported here; this module adds the checks of sizes, offsets, masks, dims and the
constructors' arguments (``NestedBatch``, the layouts, ``RaggedBatch``). What stays beside an
op is only what needs the op's own objects (e.g. attention's operand shapes).

Every check raises a ``ValueError``, ``TypeError`` or ``IndexError`` that names the argument,
what was expected and what was given. Checks that must read device values say so: they
synchronize with the device, which is why constructors take ``validate=False`` for trusted input.
"""

from __future__ import annotations

import array
import math
import operator
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor

from nestbatch.errors import NestedValueError
from nestbatch.kernels.checks import (
    INDEX_DTYPES,
    check_bool,
    check_count,
    check_index_dtype,
    check_same_device,
    check_tensor,
    check_type,
    check_valid_slots,
    negative_error,
)
from nestbatch.kernels.dispatch import making_fake_tensors
from nestbatch.kernels.host_library import host_sizes
from nestbatch.kernels.torch_impl import sizes_mask

# Re-exported: these checks live with the kernels, a leaf the kernels' own functions share.
__all__ = [
    "check_bool", "check_count", "check_index_dtype", "check_same_device", "check_tensor",
    "check_type", "check_valid_slots",
]


def check_filler(value: object, dtype: torch.dtype, name: str = "padding_value") -> object:
    """``value`` as ``torch.full`` stores it in a tensor of ``dtype``, as a Python number:
    ``4.2`` is ``True`` for bool and ``4`` for ``int32``, ``-1`` is ``255`` for ``uint8``,
    ``1e6`` is ``inf`` for ``float16``, ``0.1`` its float32 rounding. A 0-d host tensor is read.

    Raises
    ------
    TypeError
        For something that is not a number.
    NestedValueError
        Where ``torch.full`` raises (a ``ValueError`` and, as torch's error, a
        ``RuntimeError``): a value out of an integer dtype's range (``300`` for ``uint8``),
        a non-finite value for an integer dtype, a complex value for a real dtype, ``1e300``
        for ``float32``.
    """
    if isinstance(value, Tensor) and value.numel() == 1 and value.is_cpu:
        value = value.item()  # (a host tensor: no sync)
    if not isinstance(value, int | float | complex):
        raise TypeError(f"{name} must be a number, got {type(value).__name__} ({value!r})")
    if torch.compiler.is_compiling():  # (torch checks the fill itself in the traced graph)
        return value if dtype.is_floating_point or dtype.is_complex else \
            (bool if dtype == torch.bool else int)(value)
    # (-0.0 and 0.0 are equal keys: the sign tells them apart.)
    key = (type(value), value, dtype, type(value) is float and math.copysign(1.0, value))
    stored = _FILLERS_SEEN.get(key, _UNSEEN)
    if stored is _UNSEEN:
        try:  # torch's own cast on the host (a few us, once per filler and dtype)
            stored = torch.full((), value, dtype=dtype).item()  # (host memory: no sync)
        except (RuntimeError, OverflowError) as error:
            raise NestedValueError(
                f"{name}={value!r} cannot be stored in a {dtype} tensor (torch.full refuses "
                f"it: {error})"
            ) from None
        if len(_FILLERS_SEEN) < 256:  # the few fillers a program uses
            _FILLERS_SEEN[key] = stored
    return stored


_UNSEEN = object()
_FILLERS_SEEN: dict[tuple, object] = {}


def check_fill_fits(value: object, dtype: torch.dtype) -> None:
    """Raise torch's ``RuntimeError`` where ``torch.full`` of several elements refuses ``value``
    for ``dtype``: a finite number past float16's or bfloat16's range (a 0-d fill, as
    :func:`check_filler`, stores it as an infinity). For the peers whose padding is such a
    fill (kaolin, PyTorch3D)."""
    if dtype in (torch.float16, torch.bfloat16) and isinstance(value, int | float) \
            and math.isfinite(value):
        torch.empty(2, dtype=dtype).fill_(value)  # (torch's own check and message)


def check_castable(result: torch.dtype, output: torch.dtype) -> None:
    """Raise torch's ``RuntimeError`` where an in-place or ``out=`` result of dtype ``result``
    cannot be written into a tensor of dtype ``output`` (``torch.can_cast``)."""
    if not torch.can_cast(result, output):
        raise RuntimeError(f"result type {result} can't be cast to the desired output type "
                           f"{output}")


def ragged_out_error(name: str) -> TypeError:
    """The error for ``out=`` given to a function whose result is ragged (a batch)."""
    return TypeError(f"{name}: out= cannot hold a ragged result (a NestedBatch); use the "
                     "returned batch")


def check_integer_tensor(value: object, name: str, ndim: int | None = None,
                         shape: str = "") -> Tensor:
    """``value`` if it is an integer tensor (any integer dtype) of ``ndim`` dims.

    Raises
    ------
    TypeError
        For something that is not a tensor, or a float, complex or bool tensor.
    ValueError
        For another number of dims (the message spells the expected ``shape``).
    """
    check_tensor(value, name)
    if value.is_floating_point() or value.is_complex() or value.dtype == torch.bool:
        raise TypeError(f"{name} must be an integer tensor (any integer dtype), got {value.dtype}")
    if ndim is not None and value.dim() != ndim:
        raise ValueError(f"{name} must be {ndim}-d {shape}, got shape {tuple(value.shape)}")
    return value


def check_values(values: object, name: str = "values") -> Tensor:
    """``values`` if it is a tensor ``(total, *feature)`` (at least one dim)."""
    if not isinstance(values, Tensor):
        check_tensor(values, name)
    if values.dim() < 1:
        raise ValueError(f"{name} must have at least one dim (total, *feature), got a scalar")
    return values


def check_one_of(**given: object) -> None:
    """Raise unless exactly one of the keyword arguments is not ``None``."""
    count = 0
    for value in given.values():  # (a loop: no generator frame on every constructor call)
        count += value is not None
    if count != 1:
        *first, last = given
        raise ValueError(f"give exactly one of {', '.join(first)} or {last}")


def normalize_dim(dim: object, ndim: int, name: str = "dim") -> int:
    """``dim`` in ``[0, ndim)`` (negative dims count from the end).

    Raises
    ------
    TypeError
        If ``dim`` is not an int.
    IndexError
        If ``dim`` is out of range.
    """
    if not isinstance(dim, int) or isinstance(dim, bool):
        raise TypeError(f"{name} must be an int, got {type(dim).__name__}")
    if not -ndim <= dim < ndim:
        raise IndexError(
            f"{name}={dim} out of range for {ndim} dims (expected in [{-ndim}, {ndim - 1}])"
        )
    return dim % ndim


def as_index_tensor(value: Tensor | Sequence[int], name: str, device: torch.device) -> Tensor:
    """Return ``value`` as a 1-d int64 tensor on ``device``.

    Python sequences are accepted; tensors must have an integer dtype (floats are refused rather
    than truncated) and one dimension.
    """
    if not isinstance(value, Tensor):
        value = torch.tensor(host_ints(value, name), dtype=torch.int64).reshape(-1)
    check_integer_tensor(value, name, 1)
    return value.to(device=device, dtype=torch.int64)


_INT_TYPE = {int}


def host_ints(value: object, name: str) -> tuple[int, ...]:
    """A Python sequence of integers as a tuple of ints, checked on the host (any sign).

    Integers (Python ints, NumPy integers, 0-d integer tensors on the CPU) are accepted; floats,
    bools and strings are refused rather than truncated or read character by character.

    Raises
    ------
    TypeError
        If ``value`` is not a sequence of integers.
    """
    if type(value) in (list, tuple) and set(map(type, value)) <= _INT_TYPE:
        return tuple(value)  # a list or tuple of ints, checked at C speed (no loop in Python)
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


class HostSizes(NamedTuple):
    """Non-negative host sizes and what checks of them need: their sum and largest entry, and
    either their ``int64`` offsets as bytes (when one C pass read them: never while fake tensors
    are made) or, for many sizes, the ``int64`` host tensor they were read into (both reused for
    the offsets)."""

    sizes: tuple[int, ...]
    total: int
    largest: int
    as_tensor: Tensor | None
    offsets: bytearray | None = None


#: From this many sizes on, their sum, extremes and offsets come from one host tensor (C
#: speed: 4096 sizes cost about 90 us read into it instead of 220 us of Python builtins).
MANY_SIZES = 64


#: 1-d integer tensors in host memory of up to this many sizes are read into a list and checked
#: as host sizes (:func:`host_tensor_sizes`). Measured at B=4: ``from_padded(data,
#: lengths).packed()`` 13.5 us that way, 27-37 us keeping the tensor; ``tolist`` of 4096 sizes
#: costs about 40 us.
HOST_TENSOR_SIZES = 4096

_HOST_SIZE_DTYPES = frozenset({torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64})


def host_tensor_sizes(value: object) -> object:
    """``value``, or for a 1-d integer tensor in host memory of at most
    :data:`HOST_TENSOR_SIZES` entries its entries as a list. The ``tolist()`` is no sync: the
    tensor is in host memory. Everything else is returned as it is (device tensors, other
    dtypes or shapes, larger ones, fake tensors and graphs being traced, where a list would
    make the sizes constants)."""
    if (type(value) is Tensor and value.is_cpu and value.dim() == 1
            and value.shape[0] <= HOST_TENSOR_SIZES and value.dtype in _HOST_SIZE_DTYPES
            and not making_fake_tensors()):
        return value.tolist()
    return value


def checked_host_sizes(value: object, name: str) -> HostSizes:
    """:func:`host_ints`, all non-negative, with their sum and largest entry, read once: a
    list or tuple of ints in one C pass, which also gives their offsets as bytes, except while
    fake tensors are made (``torch.compile`` cannot see into C, and those bytes could not
    become a tensor): then, and for other sequences, in Python.

    Raises
    ------
    TypeError
        If ``value`` is not a sequence of integers.
    ValueError
        If a size is negative, or too large for int64.
    """
    fake = making_fake_tensors()
    read = None if fake else host_sizes(value)
    if read is not None:
        offsets, total, smallest, largest = read
        if smallest < 0:
            raise negative_error(name, f"{smallest} in {list(value)}")
        return tuple.__new__(HostSizes, (tuple(value), total, largest, None, offsets))
    # host_ints' first test, inline: this is on every batch built from host sizes (~1 us a call)
    if type(value) in (list, tuple) and set(map(type, value)) <= _INT_TYPE:
        sizes = tuple(value)
    else:
        sizes = host_ints(value, name)
    if len(sizes) < MANY_SIZES or fake:
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
        raise negative_error(name, f"{smallest} in {list(sizes)}")
    return tuple.__new__(HostSizes, (sizes, total, largest, tensor, None))  # (no __new__ frame)


def read_device_values(values: Tensor) -> list:
    """The entries of a small device tensor on the host: one device-to-host copy (a sync).

    The one place validation reads the device, so every such read is easy to find and count.
    """
    return values.cpu().tolist()


def as_offsets(offsets: object, device: torch.device, name: str = "offsets") -> Tensor:
    """``offsets`` as a 1-d int64 tensor on ``device`` (int32 is widened; a copy only when the
    dtype or device differs). Checks the type and shape, not the values."""
    if type(offsets) is not Tensor or offsets.dtype not in INDEX_DTYPES or offsets.dim() != 1:
        check_integer_tensor(offsets, name, 1, "(B + 1,)")  # (called when not plainly fine)
    if offsets.dtype is torch.int64 and offsets.device == device:
        return offsets
    return offsets.to(device=device, dtype=torch.int64)


def check_offsets_on_device(offsets: Tensor, num_values: int, max_len: int | None = None,
                            name: str = "offsets") -> int:
    """Check device ``offsets`` ``(B + 1,)``: start at 0, never decrease, end at ``num_values``,
    and (when ``max_len`` is given) no sample longer than ``max_len``. Returns the longest
    sample's length (read anyway: a caller keeps it and need not read it again).

    Costs four small device ops and one read of two numbers (one synchronization): the chain
    ``[o_0, 0, o_0, o_1, ..., o_B, n, o_B]`` has all its steps in ``[0, max_len]`` exactly when
    the offsets are valid. The chain is laid out twice in one tensor so that one subtraction of
    two strided views gives every step and its negation, and one ``amax`` the largest of each.
    Details of a failure are read on the error path only. Short offsets in host memory are
    read into Python and checked there (no device: no sync).
    """
    count = offsets.numel()
    if count == 0:
        raise ValueError(f"{name} must have at least one entry (B + 1 values), got an empty tensor")
    if count <= _HOST_CHECKED and offsets.is_cpu:
        return check_host_offsets(offsets.tolist(), num_values, max_len, name)  # no sync
    ends = torch.tensor([0, num_values], dtype=offsets.dtype, device=offsets.device)
    chain = torch.cat([offsets[:1], ends[:1], offsets, ends[1:], offsets[-1:]] * 2)
    length = offsets.numel() + 4
    later = chain.as_strided((2, length - 1), (length - 1, 1), 1)  # rows: c[j + 1], c[j]
    earlier = chain.as_strided((2, length - 1), (length + 1, 1), 0)  # rows: c[j], c[j + 1]
    largest, negated_smallest = read_device_values((later - earlier).amax(1))
    smallest = -negated_smallest
    limit = num_values if max_len is None else max_len
    if smallest >= 0 and largest <= limit:
        return largest  # (valid offsets: the chain's largest step is the longest sample)
    # The error path reads the offsets themselves, to say what is wrong.
    return check_host_offsets(read_device_values(offsets), num_values, max_len, name)


#: Host offsets up to this many entries are checked in Python (cheaper than four tensor ops).
_HOST_CHECKED = 1024


def check_host_offsets(
    offsets: Sequence[int], num_values: int, max_len: int | None, name: str = "offsets"
) -> int:
    """The checks of :func:`check_offsets_on_device` on host offsets (no device involved);
    returns the longest sample's length."""
    if not offsets:
        raise ValueError(f"{name} must have at least one entry (B + 1 values), got none")
    steps = list(map(operator.sub, offsets[1:], offsets[:-1]))
    if offsets[0] != 0:
        raise ValueError(f"{name} must start at 0, got {offsets[0]}")
    if offsets[-1] != num_values:
        raise ValueError(
            f"{name} must end at the number of values ({num_values}), got {offsets[-1]}"
        )
    if steps and min(steps) < 0:
        raise ValueError(f"{name} must be non-decreasing, got {list(offsets)}")
    longest = max(steps, default=0)
    check_max_len(longest, max_len)
    return longest


def check_max_len(longest: int, max_len: int | None) -> None:
    """Raise if a ``max_len`` was given and the longest sample exceeds it."""
    if max_len is not None and longest > max_len:
        raise ValueError(
            f"max_len={max_len} is smaller than the longest sample ({longest} rows): the padded "
            "layout would lose data; give the true maximum or leave max_len out"
        )


def check_lengths_total(total: int, longest: int, num_rows: int, max_len: int | None) -> None:
    """Check the lengths' sum and largest entry against the values' rows and ``max_len``."""
    if total != num_rows:
        raise ValueError(f"lengths add up to {total} but values has {num_rows} rows")
    if max_len is not None and longest > max_len:  # (tested here: no frame on every batch)
        check_max_len(longest, max_len)


def check_device_lengths(lengths: Tensor, num_rows: int, max_len: int | None) -> None:
    """:func:`check_lengths_total` (and signs) of device lengths: one read of three numbers (a
    sync: validation of device sizes needs their values); on failure the lengths themselves are
    read, to show them."""
    smallest, longest, total = 0, 0, 0
    if lengths.numel():  # (amin and amax refuse an empty tensor)
        stats = torch.stack([lengths.amin(), lengths.amax(), lengths.sum()])
        smallest, longest, total = read_device_values(stats)
    if smallest < 0:
        # The error path reads the lengths themselves, to show them.
        raise negative_error("lengths", lengths.tolist())
    check_lengths_total(total, longest, num_rows, max_len)


def check_non_negative(sizes: Tensor, name: str, total: int) -> None:
    """Check that no entry of ``sizes`` ``(B, k)`` is negative and that their per-sample
    products add up to ``total``: one read of two numbers (a sync on a device; host work for a
    CPU tensor; none for no sizes). On failure the sizes are read, to show them."""
    negative, rows = 0, 0
    if sizes.numel():
        counted = sizes.prod(-1).sum()
        flags = torch.stack([(sizes < 0).any().to(counted.dtype), counted])
        negative, rows = read_device_values(flags)
    if negative:
        raise negative_error(name, sizes.tolist())
    if rows != total:
        raise ValueError(f"{name} describes {rows} rows but values has {total}")


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
    Reads device values (one synchronization: whether a mask is a prefix mask is in its
    values); on failure the bad rows' numbers are read, to name them.
    """
    check_bool(mask, name)
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


def check_padding_side(side: object, num_ragged_dims: int) -> str:
    """``side`` if it is ``"right"`` or ``"left"`` (the latter with one ragged dim)."""
    if side not in ("right", "left"):
        raise ValueError(f'padding_side must be "right" or "left", got {side!r}')
    if side == "left" and num_ragged_dims != 1:
        raise ValueError(
            f'padding_side="left" needs one ragged dim (as pad_sequence), got {num_ragged_dims}'
        )
    return side


def check_ragged_dim(ragged_dim: object, num_ragged_dims: int, num_feature_dims: int) -> int:
    """``ragged_dim``: 1, or for a batch with one ragged dim any of ``1 .. 1 + features``."""
    if not isinstance(ragged_dim, int) or isinstance(ragged_dim, bool):
        raise TypeError(f"ragged_dim must be an int, got {type(ragged_dim).__name__}")
    if ragged_dim != 1 and num_ragged_dims != 1:
        raise ValueError(
            f"ragged_dim={ragged_dim}: a batch with {num_ragged_dims} ragged dims keeps "
            "them leading (dims 1..k); only a batch with one ragged dim can move it"
        )
    if not 1 <= ragged_dim <= 1 + num_feature_dims:
        raise ValueError(
            f"ragged_dim={ragged_dim} out of range [1, {1 + num_feature_dims}] for this batch"
        )
    return ragged_dim


def check_padded_sizes(data: Tensor, sizes: Tensor, name: str, read_values: bool = True) -> None:
    """Check per-sample sizes ``(B, k)`` against padded ``data (B, *padded, *feature)``: one
    per sample and, with ``read_values``, non-negative and fitting the padded dims (one read: a
    sync on a device, host work for host sizes; on failure the sizes are read, to show them)."""
    if sizes.shape[0] != data.shape[0]:
        raise ValueError(
            f"{name} has {sizes.shape[0]} samples but data has batch size {data.shape[0]}"
        )
    k = sizes.shape[1]
    if data.dim() < 1 + k:
        raise ValueError(
            f"data must have at least {1 + k} dims for {k} ragged dim(s), got {tuple(data.shape)}"
        )
    if not read_values or sizes.numel() == 0:
        return
    capacity = list(data.shape[1 : 1 + k])
    if sizes.is_cpu:  # host sizes: their extremes read at once (one op; tolist is no sync)
        smallest, largest = (extreme.tolist() for extreme in torch.aminmax(sizes, dim=0))
        fits = min(smallest) >= 0 and all(map(operator.le, largest, capacity))
    else:
        limit = torch.as_tensor(capacity, dtype=sizes.dtype, device=sizes.device)
        fits = not bool(((sizes < 0) | (sizes > limit)).any())
    if not fits:
        if bool((sizes < 0).any()):  # the error path reads more, to say which
            raise negative_error(name, sizes.tolist())
        raise ValueError(
            f"{name} do not fit the padded data: largest sizes {sizes.amax(0).tolist()} exceed "
            f"its ragged dims {capacity}"
        )


def check_host_lengths_fit(data: Tensor, lengths: HostSizes) -> None:
    """Check lengths known on the host against padded ``data (B, max_len, *feature)``, on the
    host (no device read)."""
    if data.dim() < 2 or len(lengths.sizes) != data.shape[0]:
        raise ValueError(
            f"lengths has {len(lengths.sizes)} entries but data has shape {tuple(data.shape)} "
            "(expected (B, max_len, *feature) with B == len(lengths))"
        )
    if lengths.largest > data.shape[1]:
        raise ValueError(
            f"lengths do not fit the padded data: largest length {lengths.largest} exceeds its "
            f"max_len {data.shape[1]}"
        )


def check_ragged_batch_args(
    tensor: object, mask: object, sample_sizes: object, non_uniform_dim: int | None
) -> tuple[int, int]:
    """Check the arguments of a ``RaggedBatch``: ``tensor (*batch_shape, ..., N, ...)`` with
    a ``mask (*batch_shape, N)`` and / or ``sample_sizes (*batch_shape,)``.

    Returns
    -------
    tuple of int
        ``(num_batch_dims, non_uniform_dim)``, the latter normalized.
    """
    check_tensor(tensor, "tensor")
    if mask is None and sample_sizes is None:
        raise ValueError("at least one of mask or sample_sizes must be given")
    if mask is not None:
        if type(mask) is not Tensor or mask.dtype != torch.bool:
            check_bool(check_tensor(mask, "mask"), "mask")
        if mask.dim() < 2:
            raise ValueError(
                "mask must have at least 2 dims (*batch_shape, max_sample_size), "
                f"got shape {tuple(mask.shape)}"
            )
    if sample_sizes is not None:
        if type(sample_sizes) is not Tensor or sample_sizes.dtype not in INDEX_DTYPES:
            check_integer_tensor(sample_sizes, "sample_sizes")
        if sample_sizes.dim() < 1:
            raise ValueError("sample_sizes must have at least 1 dim (*batch_shape,), got a scalar")
    num_batch_dims = mask.dim() - 1 if mask is not None else sample_sizes.dim()
    if mask is not None and sample_sizes is not None and mask.shape[:-1] != sample_sizes.shape:
        raise ValueError(
            f"mask batch shape {tuple(mask.shape[:-1])} does not match "
            f"sample_sizes shape {tuple(sample_sizes.shape)}"
        )
    if tensor.dim() <= num_batch_dims:
        raise ValueError(
            f"tensor must have more than num_batch_dims={num_batch_dims} dims, "
            f"got shape {tuple(tensor.shape)}"
        )
    nud = num_batch_dims
    if non_uniform_dim is not None:
        nud = normalize_dim(non_uniform_dim, tensor.dim(), "non_uniform_dim")
        check_non_uniform_dim(nud, num_batch_dims)
    batch_shape = tensor.shape[:num_batch_dims]
    for name, other in (("mask", mask), ("sample_sizes", sample_sizes)):
        if other is not None and other.shape[:num_batch_dims] != batch_shape:  # (inline: hot)
            check_batch_shape(name, other.shape[:num_batch_dims], batch_shape,
                              "tensor batch shape")
        if other is not None and other.device != tensor.device:
            check_same_device(tensor, "tensor", **{name: other})
    if mask is not None and mask.shape[-1] != tensor.shape[nud]:
        raise ValueError(
            f"mask width {mask.shape[-1]} does not match "
            f"tensor.shape[non_uniform_dim={nud}]={tensor.shape[nud]}"
        )
    return num_batch_dims, nud


def check_batch_shape(name: str, shape: Sequence[int], expected: Sequence[int],
                      expected_name: str = "expected") -> None:
    """Raise unless the batch shape of ``name`` is ``expected`` (tuples or ``torch.Size``)."""
    if tuple(shape) != tuple(expected):
        raise ValueError(
            f"{name} batch shape {tuple(shape)} does not match {expected_name} {tuple(expected)}"
        )


def check_batch_dim(batch_dim: object, num_batch_dims: int, name: str = "batch_dim") -> int:
    """``batch_dim`` if it is one of the ``num_batch_dims`` batch dims (counted from 0)."""
    if not isinstance(batch_dim, int) or not 0 <= batch_dim < num_batch_dims:
        raise ValueError(f"{name} must be in [0, {num_batch_dims}), got {batch_dim}")
    return batch_dim


def check_non_uniform_dim(dim: int, num_batch_dims: int, name: str = "non_uniform_dim") -> int:
    """``dim`` if, normalized, it is not one of the ``num_batch_dims`` batch dims."""
    if dim < num_batch_dims:
        raise ValueError(f"{name} must not be one of the {num_batch_dims} batch dims, got {dim}")
    return dim


def check_batch_indices(indices: Sequence[int], batch_size: int) -> None:
    """Raise ``IndexError`` naming the first of host sample ``indices`` outside the batch
    (negative ones count from the end)."""
    bad = [i for i in indices if not -batch_size <= i < batch_size]
    if bad:
        raise IndexError(f"batch index {bad[0]} is out of range for batch size {batch_size}")


def check_index_batch(indices: Any, name: str, kind: type) -> Any:
    """``indices`` if it is an int32 / int64 ragged batch of type ``kind`` (a ``RaggedBatch``,
    read through its ``dtype``, ``num_batch_dims``, ``dim()``) of shape ``(*batch_shape,
    max_num_indices)``."""
    if type(indices) is not kind or indices.dtype not in INDEX_DTYPES:  # (no frames if fine)
        check_index_dtype(check_type(indices, name, kind), name)
    if indices.dim() != indices.num_batch_dims + 1:
        raise ValueError(
            f"{name} must have shape (*batch_shape, max_num_indices) with "
            f"{indices.num_batch_dims} batch dims, got shape {tuple(indices.shape)}"
        )
    return indices


def check_same_dtype(name: str, value: Any, ref_name: str, ref: Any) -> None:
    """Raise ``TypeError`` unless ``value`` and ``ref`` (tensors or batches) share a dtype."""
    if value.dtype != ref.dtype:
        raise TypeError(f"{name} has dtype {value.dtype} but {ref_name} has dtype {ref.dtype}")


def check_same_ndim(name: str, value: Any, ref_name: str, ref: Any) -> None:
    """Raise ``ValueError`` unless ``value`` and ``ref`` (tensors or batches) have the same
    number of dims (in the ``RaggedBatch`` reference's words: its writes assert this first).
    Callers on hot paths compare ``len(shape)`` inline and call this only to raise."""
    if len(value.shape) != len(ref.shape):
        raise ValueError(
            f"{name} and {ref_name} must have the same number of dimensions, got shapes "
            f"{tuple(value.shape)} ({len(value.shape)} dims) and {tuple(ref.shape)} "
            f"({len(ref.shape)} dims)"
        )


def check_tensor_sequence(value: object, name: str = "tensors", items: bool = True
                          ) -> Sequence[Tensor]:
    """``value`` if it is a list or tuple (any sequence but a tensor) whose items (checked
    unless ``items`` is False: a caller that checks them itself) are tensors."""
    if type(value) not in (list, tuple) and (  # (the ABC check costs ~1 us: not first)
        isinstance(value, Tensor) or not isinstance(value, Sequence)
    ):
        raise TypeError(f"{name} must be a list or tuple of tensors, got {type(value).__name__}")
    for i, item in enumerate(value if items else ()):
        check_tensor(item, f"{name}[{i}]")
    return value

"""Argument checks shared by the kernels' functions and the layers above (this is a leaf):
counts (``max_len``, ``total``, ...) and the fillers a dtype can hold."""

from __future__ import annotations

import math
import operator

import torch
from torch import Tensor


def check_filler(value: object, dtype: torch.dtype, name: str = "padding_value") -> object:
    """``value`` if a tensor of ``dtype`` can hold it exactly, as torch's fill would store it.

    Numbers only (a 0-d host tensor is read); integer dtypes take integral values in their range
    (``0.0`` is fine, ``2.5`` or ``-1`` for ``uint8`` is not), bool takes 0 and 1, floating
    dtypes take anything their range holds (infinities and nan included).

    Raises
    ------
    TypeError
        For something that is not a number.
    ValueError
        For a number the dtype cannot hold, naming ``name``, the dtype and the value.
    """
    if isinstance(value, Tensor) and value.numel() == 1 and value.is_cpu:
        value = value.item()
    if not isinstance(value, int | float | complex):
        raise TypeError(f"{name} must be a number, got {type(value).__name__} ({value!r})")
    key = (type(value), value, dtype)
    if not torch.compiler.is_compiling() and key in _FILLERS_SEEN:
        return value  # (a traced graph checks afresh: no guard on this module's memo)
    if isinstance(value, complex) and not dtype.is_complex:
        raise ValueError(f"{name}={value!r} is complex; a {dtype} tensor cannot hold it")
    if dtype.is_complex:
        _remember(key)  # a complex tensor holds every number
        return value
    if dtype.is_floating_point:
        largest = torch.finfo(dtype).max
        if math.isfinite(value) and abs(value) > largest:
            raise ValueError(f"{name}={value!r} overflows {dtype} (largest {largest})")
    else:
        info = None if dtype == torch.bool else torch.iinfo(dtype)
        low, high = (0, 1) if info is None else (info.min, info.max)
        integral = isinstance(value, int) or (math.isfinite(value) and float(value).is_integer())
        if not integral or not low <= value <= high:
            raise ValueError(
                f"{name}={value!r} cannot be held by a {dtype} tensor (integers in [{low}, {high}])"
            )
    _remember(key)
    return value


_FILLERS_SEEN: set = set()


def _remember(key: tuple) -> None:
    # A few hundred (type, value, dtype) triples: the fillers a program uses, checked once.
    # Not while torch.compile traces: a graph must not change module state it guards on.
    if not torch.compiler.is_compiling() and len(_FILLERS_SEEN) < 256:
        _FILLERS_SEEN.add(key)


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
        raise ValueError(f"{name} must be non-negative, got {count}")
    return count


def making_fake_tensors() -> bool:
    """Whether fake tensors are being made (``torch.compile``, FakeTensorMode): host tensors
    then cannot be computed with (ops on them are refused or traced), only made by factories."""
    if torch.compiler.is_compiling():
        return True  # first: dynamo cannot trace the dispatch-mode query below
    return torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE) is not None

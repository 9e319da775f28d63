"""`memoized`: a lock-free cached property for the layouts' derived metadata."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


class memoized:  # noqa: N801 (used as a decorator, like ``property``)
    """Like :func:`functools.cached_property`, without its lock.

    Python 3.11's ``cached_property`` takes an ``RLock`` on every first access (about 1 us, and
    a graph break under ``torch.compile``). A layout is immutable and its metadata is a pure
    function of it, so computing a value twice in a race is harmless. The value lands in the
    instance ``__dict__``, which later lookups find first (this is a non-data descriptor), so a
    cached read costs a plain attribute access.

    Nothing is stored while ``torch.compile`` traces: a value computed inside a graph would be
    written back onto the object as a side effect after every call (an extra graph output), and
    values that depend on how the graph was traced (see
    :attr:`~nestbatch.layouts.RowPartition.host_has_empty`) must not outlive it.
    """

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self.fn = fn
        self.name = fn.__name__
        self.__doc__ = fn.__doc__

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        if instance is None:
            return self
        value = self.fn(instance)
        if not torch.compiler.is_compiling():
            instance.__dict__[self.name] = value
        return value

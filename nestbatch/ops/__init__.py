"""Torch functions on a :class:`~nestbatch.NestedBatch`: the dispatch entry point."""

from __future__ import annotations

from typing import Any


def dispatch(func: Any, types: tuple, args: tuple, kwargs: dict) -> Any:
    """Run ``func`` on the nested batches in ``args`` / ``kwargs``.

    Raises
    ------
    TypeError
        For a function with no nestbatch implementation, naming it and the way to a plain tensor.
    """
    name = getattr(func, "__name__", repr(func))
    raise TypeError(
        f"{name} is not supported on a NestedBatch; use .padded().data (with .mask) or .values "
        "(the packed rows) to get a plain tensor"
    )

"""Torch functions on a :class:`~nestbatch.NestedBatch`.

Every module of this package registers implementations in :mod:`nestbatch.ops.registry`; they
are imported on the first dispatch (:func:`nestbatch.ops.registry.ensure_loaded`), so a new
module needs no edit here. :func:`dispatch` is what ``NestedBatch.__torch_function__`` calls.
"""

from nestbatch.ops.registry import dispatch, ensure_loaded, register

__all__ = ["dispatch", "ensure_loaded", "register"]

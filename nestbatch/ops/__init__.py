"""Torch functions on a :class:`~nestbatch.NestedBatch`.

Every module of this package registers implementations in :mod:`nestbatch.ops.registry`, and
importing the package imports them all (``nestbatch`` itself imports it): the registry is
complete before the first dispatch, with no import on the dispatch path. The registry plugs
:func:`dispatch` into ``NestedBatch.__torch_function__`` (:func:`nestbatch.batch.extend`).
A new module of ops is listed below.
"""

from nestbatch.ops import (  # noqa: F401  (imported for their registrations)
    attention,
    autograd,
    comparison,
    convolution,
    elementwise,
    interop,
    lookup,
    losses,
    matmul,
    nn,
    norms,
    ordering,
    pad,
    reductions,
    scans,
    shape,
    statistics,
    structure,
)
from nestbatch.ops.registry import dispatch, register

__all__ = ["dispatch", "register"]

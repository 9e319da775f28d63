"""Whole-batch comparisons: ``torch.equal``, ``torch.allclose`` (and their Tensor methods).

Two batches are equal when they have the same structure (batch size, ragged dims and where the
ragged dim is presented, per-sample ragged shapes, feature shape) and the same values, compared
across dtypes as :func:`torch.equal` does; ``allclose`` relaxes the values as
:func:`torch.allclose` does, and raises for two dtypes as it does. A batch and a tensor are never
equal. These read the answer on the host (a sync on a GPU), as torch's own do; comparing
per-sample shapes that exist only on the device reads them too.

The truth value of a batch (``if a == b:``) is ambiguous, as a tensor's with several elements,
and raises (see :class:`~nestbatch.tensor_methods.TensorMethods`).
"""

from __future__ import annotations

from typing import Any

import torch

from nestbatch.batch import NestedBatch
from nestbatch.layouts import Layout
from nestbatch.ops.registry import register

_ANY_LAYOUT = (Layout.PACKED, Layout.PADDED, Layout.LIST)


def same_structure(a: NestedBatch, b: NestedBatch) -> bool:
    """Whether ``a`` and ``b`` have the same structure (values and dtypes not compared)."""
    if (a.batch_size, a.num_ragged_dims, a.ragged_dim, a.feature_shape) != (
        b.batch_size, b.num_ragged_dims, b.ragged_dim, b.feature_shape
    ):
        return False
    pa, pb = a.partition, b.partition
    if pa is pb:
        return True
    if pa.knows_host_shapes and pb.knows_host_shapes:
        return pa.host_shapes == pb.host_shapes
    return torch.equal(pa.shape_per_sample, pb.shape_per_sample.to(pa.device))


@register(torch.equal, torch.Tensor.equal, layouts=_ANY_LAYOUT, prefer=Layout.PACKED,
          moved_ragged=True)
def _equal(layout: Layout, func: Any, args: tuple, kwargs: dict) -> bool:
    a, b = args[0], args[1] if len(args) > 1 else kwargs["other"]
    if not (isinstance(a, NestedBatch) and isinstance(b, NestedBatch)):
        return False
    return same_structure(a, b) and torch.equal(a.values, b.values.to(a.device))


@register(torch.allclose, torch.Tensor.allclose, layouts=_ANY_LAYOUT, prefer=Layout.PACKED,
          moved_ragged=True)
def _allclose(layout: Layout, func: Any, args: tuple, kwargs: dict) -> bool:
    a, b, *rest = args
    if not (isinstance(a, NestedBatch) and isinstance(b, NestedBatch)):
        return False
    if a.dtype != b.dtype:  # torch's own error, of two empty tensors of the dtypes
        return torch.allclose(torch.empty(0, dtype=a.dtype), torch.empty(0, dtype=b.dtype))
    if not same_structure(a, b):
        return False
    return torch.allclose(a.values, b.values.to(a.device), *rest, **kwargs)

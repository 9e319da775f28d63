"""``matmul`` / ``bmm`` / ``@`` with a batch.

* batch ``@`` dense: the samples' last feature dim contracts with the dense operand, on the
  packed values ``(total, *feature) @ w`` (as ``nn.Linear`` does; no padding).
* dense ``@`` batch: needs two feature dims (the matrix dims of every sample are features).
* batch ``@`` batch (``bmm``): samples are matrices ``(p_i, q_i) @ (q_i, s_i)``. Runs as one
  ``bmm`` on zero-padded data (zeros in the contracted dim add nothing); the result's ragged
  dims are ``p_i`` and, when the right operand has two ragged dims, ``s_i``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import Tensor

from nestbatch.layouts import Layout, RowPartition
from nestbatch.ops.common import PACKED_OR_PADDED, is_batch, wrap_padded
from nestbatch.ops.registry import register

if TYPE_CHECKING:
    from nestbatch.batch import NestedBatch


@register(torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.Tensor.__rmatmul__,
          torch.bmm, torch.Tensor.bmm, layouts=PACKED_OR_PADDED, prefer=Layout.PACKED)
def _matmul(layout: Layout, func: Any, args: tuple, kwargs: dict) -> Any:
    a, b = args[0], args[1] if len(args) > 1 else kwargs.get("other", kwargs.get("mat2"))
    if func is torch.Tensor.__rmatmul__:
        a, b = b, a
    if is_batch(a) and is_batch(b):
        return batch_matmul(a, b)
    if is_batch(a):
        return _batch_at_dense(a, b)
    return _dense_at_batch(a, b)


def _batch_at_dense(a: NestedBatch, w: Tensor) -> NestedBatch:
    if not a.feature_shape:
        raise ValueError("matmul of a batch with a dense tensor needs a feature dim in the batch")
    if w.dim() > 1 + len(a.feature_shape):
        raise ValueError(
            f"matmul: the dense operand has shape {tuple(w.shape)}, more dims than a sample's "
            f"matrix part (feature shape {tuple(a.feature_shape)}); its batch dims would not "
            "line up with the ragged dims"
        )
    return a.with_values(torch.matmul(a.values, w))


def _dense_at_batch(w: Tensor, b: NestedBatch) -> NestedBatch:
    if len(b.feature_shape) < 2:
        raise ValueError(
            "dense @ batch contracts a sample's second-to-last dim, which must be a feature dim: "
            f"the batch has feature shape {tuple(b.feature_shape)}"
        )
    return b.with_values(torch.matmul(w, b.values))


def batch_matmul(a: NestedBatch, b: NestedBatch) -> NestedBatch:
    """Per-sample ``a_i @ b_i`` for batches of matrices (3 dims each).

    Checks that every sample's contracted sizes agree (reads the shapes from the device when
    they are not known on the host).

    Raises
    ------
    ValueError
        If either batch is not 3-d, the batch sizes differ, or a contracted size differs.
    """
    if a.dim() != 3 or b.dim() != 3:
        raise ValueError(
            f"matmul of two batches needs samples that are matrices (3-d batches), got "
            f"{a.dim()}-d and {b.dim()}-d"
        )
    if a.batch_size != b.batch_size:
        raise ValueError(f"matmul: batch sizes differ ({a.batch_size} and {b.batch_size})")
    inner_a = _sizes(a, 1)
    inner_b = b.shape_per_sample[:, 0]
    if not torch.equal(inner_a, inner_b.to(inner_a.device)):
        raise ValueError(
            f"matmul: contracted sizes differ per sample: {inner_a.tolist()} (left) and "
            f"{inner_b.tolist()} (right)"
        )
    left, right = a.padded(0.0).data, b.padded(0.0).data
    inner = max(left.shape[2], right.shape[1])
    left = F.pad(left, (0, inner - left.shape[2]))
    right = F.pad(right, (0, 0, 0, inner - right.shape[1]))
    out = torch.bmm(left, right)
    rows = a.shape_per_sample[:, :1]
    shapes = rows if b.num_ragged_dims == 1 else torch.cat([rows, b.shape_per_sample[:, 1:]], 1)
    return wrap_padded(out, RowPartition.from_shapes(shapes))


def _sizes(batch: NestedBatch, i: int) -> Tensor:
    # Size of dim i + 1 of every sample (ragged: per sample; feature: repeated).
    if i < batch.num_ragged_dims:
        return batch.shape_per_sample[:, i]
    size = batch.feature_shape[i - batch.num_ragged_dims]
    return torch.full((batch.batch_size,), size, dtype=torch.int64, device=batch.device)

"""``F.scaled_dot_product_attention`` on batches of sequences: the padded path.

On CUDA without ``attn_mask`` the varlen kernels run instead (:mod:`nestbatch.ops.varlen_attention`
has the dispatch table). Here the batches are zero-padded and one masked attention runs, with a
mask of the valid (query, key) pairs, so every sample attends to its own keys only and gets
torch's result for the sample alone. Samples, ``attn_mask`` forms and empty rows follow
``docs/ops.rst`` and ``docs/attention.rst`` (the one statement of the rules).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from nestbatch.batch import NestedBatch
from nestbatch.layouts import Layout, Padded
from nestbatch.ops.common import check_same_structure, is_batch
from nestbatch.ops.registry import register
from nestbatch.ops.varlen_attention import choose_backend, request_for, varlen_attention

_NAMES = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")


@register(F.scaled_dot_product_attention, layouts=(Layout.PADDED,), moved_ragged=True)
def _sdpa(layout: Layout, func: Any, args: tuple, kwargs: dict) -> Any:
    params = dict(zip(_NAMES, args)) | kwargs
    q, k, v = params.pop("query"), params.pop("key"), params.pop("value")
    user_mask = params.pop("attn_mask", None)
    causal = bool(params.pop("is_causal", False))
    _check_inputs(q, k, v)
    if user_mask is not None and causal:
        # torch's own error for this combination, so code written for torch behaves the same.
        raise RuntimeError(
            "scaled_dot_product_attention: Explicit attn_mask should not be set when "
            "is_causal=True"
        )
    request = request_for(q, k, v, user_mask is not None, causal,
                          bool(params.get("enable_gqa", False)))
    backend = choose_backend(request)
    if backend != "padded":
        return varlen_attention(backend, q, k, v, params.get("dropout_p", 0.0), causal,
                                params.get("scale"))
    qd, kd, vd = (x.padded(0.0).data for x in (q, k, v))
    # Keys and values share their sizes but may be padded to different widths (one stored
    # padded by a loader, the other converted from packed rows): both widths hold every key,
    # so the narrower one fits both (a view of the wider).
    width = min(kd.shape[1], vd.shape[1])
    kd, vd = kd.narrow(1, 0, width), vd.narrow(1, 0, width)
    heads = qd.dim() == 4
    if heads:
        qd, kd, vd = (t.transpose(1, 2) for t in (qd, kd, vd))
    num_heads = qd.shape[1] if heads else None
    mask = _combined_mask(q, k, user_mask, num_heads, qd.shape[-2], kd.shape[-2], causal)
    mask, empty = _fill_empty_rows(mask)
    out = F.scaled_dot_product_attention(qd, kd, vd, attn_mask=mask, **params)
    # Rows with nothing to attend to (padded queries included) are exact zeros, as torch gives
    # for a fully masked row; masked_fill also stops their gradient.
    out = out.masked_fill(empty.unsqueeze(-1), 0.0)
    if heads:
        out = out.transpose(1, 2)
    # The output's padded slots are zeros (rows of padded queries); saying so saves a refill.
    padded = Padded(out, partition=q.padded(0.0).partition, padding_value=0.0)
    return NestedBatch(padded, q.ragged_dim)


def _check_inputs(q: Any, k: Any, v: Any) -> None:
    # Raise unless q, k, v are batches of (L, E) / (L, H, E) samples with one shared layout.
    if not (is_batch(q) and is_batch(k) and is_batch(v)):
        raise TypeError("scaled_dot_product_attention: query, key and value must all be batches")
    for x, name in ((q, "query"), (k, "key"), (v, "value")):
        if x.num_ragged_dims != 1 or len(x.feature_shape) not in (1, 2):
            raise ValueError(
                f"{name} must have samples (L, E) or (L, H, E) with one ragged dim, got "
                f"{x.num_ragged_dims} ragged dims and feature shape {tuple(x.feature_shape)}"
            )
    if len({x.ragged_dim for x in (q, k, v)}) > 1 or q.ragged_dim > 2 or (
        q.ragged_dim == 2 and len(q.feature_shape) != 2
    ):
        raise ValueError(
            "scaled_dot_product_attention: query, key and value must all be (B, L, E) / "
            "(B, L, H, E) batches (ragged_dim 1) or all (B, H, L, E) batches (ragged_dim 2), got "
            f"ragged dims {q.ragged_dim}, {k.ragged_dim}, {v.ragged_dim}"
        )
    check_same_structure(k, v, "key and value")


def _combined_mask(
    q: Any, k: Any, user_mask: Any, num_heads: int | None, lq: int, lk: int, causal: bool
) -> Tensor:
    """``(B, Lq, Lk)`` or ``(B, H or 1, Lq, Lk)``: the pairs each sample may attend.

    The valid (query, key) pairs (both in the sample; with ``causal``, the key not after the
    query, aligned at the top left as torch does), ANDed with a bool user mask, or a float user
    mask with ``-inf`` at the invalid pairs (whatever the user put there, NaN included, is
    dropped).
    """
    mask = q.partition.mask((lq,))[:, :, None] & k.partition.mask((lk,))[:, None, :]
    if causal:
        mask = mask & torch.ones(lq, lk, dtype=torch.bool, device=mask.device).tril()
    mask = mask if num_heads is None else mask.unsqueeze(1)
    if user_mask is None:
        return mask
    _check_mask_dtype_device(user_mask, q)
    if is_batch(user_mask):
        user = _padded_batch_mask(user_mask, q, k, num_heads, lq, lk)
    else:
        user = _dense_mask(user_mask, q.batch_size, num_heads, lq, lk)
    return user & mask if user.dtype == torch.bool else torch.where(mask, user, -torch.inf)


def _fill_empty_rows(mask: Tensor) -> tuple[Tensor, Tensor]:
    """``mask`` (bool, or float with ``-inf`` masked) with every fully masked row opened (all
    True / all 0), and ``(B, [H or 1,] Lq)`` bool: where those rows are.

    Not every backend promises zeros (rather than NaN) for a row with no key to attend to;
    opened, the row is finite forward and backward, and the caller overwrites its output.
    """
    if mask.dtype == torch.bool:
        empty = ~mask.any(-1)
        return mask | empty.unsqueeze(-1), empty
    empty = (mask == -torch.inf).all(-1)
    return mask.masked_fill(empty.unsqueeze(-1), 0.0), empty


def _check_mask_dtype_device(attn_mask: Any, q: Any) -> None:
    # torch accepts bool, the query's dtype and float32 (its "float") for attn_mask.
    if attn_mask.dtype not in (torch.bool, q.dtype, torch.float32):
        raise TypeError(
            f"attn_mask must be bool or have the query's dtype {q.dtype} (or float32), got "
            f"{attn_mask.dtype}"
        )
    if attn_mask.device != q.device:
        raise ValueError(
            f"attn_mask must be on the query's device {q.device}, got {attn_mask.device}"
        )


def _padded_batch_mask(
    mask: Any, q: Any, k: Any, num_heads: int | None, lq: int, lk: int
) -> Tensor:
    """A batch mask of samples ``(Lq_i, Lk_i[, H])`` as ``(B, Lq, Lk)`` / ``(B, H|1, Lq, Lk)``.

    Its padding holds anything: the caller masks padded pairs out.
    """
    heads_ok = ((), (1,), (num_heads,)) if num_heads is not None else ((),)
    feature = tuple(mask.feature_shape)
    if mask.num_ragged_dims != 2 or feature not in heads_ok:
        expected = " or ".join(f"(Lq_i, Lk_i{''.join(f', {h}' for h in f)})" for f in heads_ok)
        raise ValueError(
            f"attn_mask must have samples {expected} with two ragged dims, got "
            f"{mask.num_ragged_dims} ragged dim(s) and feature shape {feature}"
        )
    _check_mask_shapes(mask, q, k)
    padded = mask.padded(None)
    if tuple(padded.padded_shape) != (lq, lk):
        # Built with other padding than the queries / keys: re-pad to their padded lengths.
        padded = mask.padded(0, max_shape=(lq, lk))
    data = padded.data
    if num_heads is None:
        return data
    return data.permute(0, 3, 1, 2) if feature else data.unsqueeze(1)


def _check_mask_shapes(mask: Any, q: Any, k: Any) -> None:
    """Raise unless the mask's sample ``i`` is ``(Lq_i, Lk_i)`` (host check when possible)."""
    mp, qp, kp = mask.partition, q.partition, k.partition
    if mp.batch_size != qp.batch_size:
        raise ValueError(f"attn_mask has {mp.batch_size} samples but the query has {qp.batch_size}")
    if all(p.knows_host_shapes for p in (mp, qp, kp)):
        same = all(m == (a, b) for m, (a,), (b,) in zip(mp.host_shapes, qp.host_shapes,
                                                        kp.host_shapes))
    else:
        expected_shapes = torch.stack((qp.lengths, kp.lengths), 1)
        same = torch.equal(mp.shape_per_sample, expected_shapes)  # one device synchronization
    if not same:
        expected = [(a, b) for (a,), (b,) in zip(qp.host_shapes, kp.host_shapes)]
        actual = list(mp.host_shapes)
        raise ValueError(
            "attn_mask must have per-sample shapes (Lq_i, Lk_i) = (query length, key length): "
            f"expected {expected}, got {actual}"
        )


def _dense_mask(mask: Tensor, batch: int, num_heads: int | None, lq: int, lk: int) -> Tensor:
    """A dense mask checked against the padded score shape ``(B, [H,] Lq, Lk)``."""
    scores = (batch, lq, lk) if num_heads is None else (batch, num_heads, lq, lk)
    try:
        fits = torch.broadcast_shapes(mask.shape, scores) == scores
    except RuntimeError:
        fits = False
    if not fits:
        raise ValueError(
            f"a dense attn_mask must broadcast to the padded score shape {scores} "
            f"(B, {'' if num_heads is None else 'H, '}Lq, Lk), got {tuple(mask.shape)}"
        )
    return mask


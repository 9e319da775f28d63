"""``F.scaled_dot_product_attention`` on batches of sequences.

Queries, keys and values are batches with one ragged dim, the sequence: samples ``(L_i, E)`` or
``(L_i, H, E)`` (heads after the sequence, since the ragged dim comes first). Keys and values
share their row structure; queries may have other lengths. It runs once on zero-padded data with
a key mask, so every sample attends to its own keys only and the result per sample equals
running the sample alone (``is_causal`` aligns the causal mask at the top left, as torch does).
A sample with no keys gets zeros, as torch gives for an empty key sequence.

Samples ``(H, L_i, E)`` are the ``torch.nested`` jagged layout ``(B, H, j, E)``: build them with
``x.transpose(1, 2)`` of ``(L_i, H, E)`` samples (``ragged_dim == 2``). The result per sample is
then exactly torch's attention of that sample, and it keeps ``ragged_dim == 2``. The stored data
is the same ``(B, L, H, E)`` in both cases, so both run the same kernel.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from nestbatch.layouts import Layout
from nestbatch.ops.common import check_same_structure, is_batch, wrap_padded
from nestbatch.ops.registry import register

_NAMES = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")


@register(F.scaled_dot_product_attention, layouts=(Layout.PADDED,), moved_ragged=True)
def _sdpa(layout: Layout, func: Any, args: tuple, kwargs: dict) -> Any:
    params = dict(zip(_NAMES, args)) | kwargs
    q, k, v = params.pop("query"), params.pop("key"), params.pop("value")
    if not (is_batch(q) and is_batch(k) and is_batch(v)):
        raise TypeError("scaled_dot_product_attention: query, key and value must all be batches")
    if params.pop("attn_mask", None) is not None:
        raise ValueError(
            "scaled_dot_product_attention on batches builds the mask from the lengths; attn_mask "
            "is not supported (use is_causal, or pad and pass a dense mask yourself)"
        )
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
    causal = bool(params.pop("is_causal", False))
    qd, kd, vd = (x.padded(0.0).data for x in (q, k, v))
    heads = qd.dim() == 4
    if heads:
        qd, kd, vd = (t.transpose(1, 2) for t in (qd, kd, vd))
    mask = _key_mask(k, qd.shape[-2], causal)
    mask = mask.unsqueeze(1) if heads else mask
    out = F.scaled_dot_product_attention(qd, kd, vd, attn_mask=mask, **params)
    if heads:
        out = out.transpose(1, 2)
    return wrap_padded(out, q.padded(0.0).partition, q.ragged_dim)


def _key_mask(keys: Any, num_queries: int, causal: bool) -> torch.Tensor:
    # (B, Lq, S) bool: True where a query may attend to a key of its own sample.
    partition = keys.partition
    num_keys = keys.padded(0.0).data.shape[1]
    valid = partition.mask((num_keys,))
    # A sample with no keys attends to the zero padding key instead: exact zeros, no NaN.
    if num_keys:
        valid = valid.clone()
        valid[:, 0] |= partition.lengths == 0
    mask = valid[:, None, :].expand(-1, num_queries, -1)
    if causal:
        tri = torch.ones(num_queries, num_keys, dtype=torch.bool, device=mask.device).tril()
        mask = mask & tri
    return mask

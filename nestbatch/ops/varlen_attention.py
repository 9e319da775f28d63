r"""Attention over the ragged dim on the packed rows through PyTorch's variable-length kernels.

For batches whose ragged dim is at dim -2 (``(B, j, E)``, torch.nested's ``(B, *heads, j, E)``),
``aten._flash_attention_forward`` / ``_backward`` and ``aten._efficient_attention_forward`` /
``_backward`` take the packed ``(total, H, E)`` queries, keys and values (a batch stores its
samples ``(L_i, *heads, E)``, so its packed values are exactly that, heads flattened into one
dim) with cumulative sequence offsets (``cu_seqlens``, int32) and the longest lengths (host
ints): they run on the packed layout as stored, with no padding and no host sync, as
torch.nested runs them. :func:`choose_backend` picks the kernel on the host, from dtypes,
shapes and host-known sizes alone, by the table :data:`DISPATCH` (walked in order, the first
row whose conditions all hold wins):

================  =====================================================================
backend           conditions
================  =====================================================================
``padded``        not on CUDA; or an ``attn_mask``; or key lengths not known on the host,
                  or a sample with no key (the padded path gives its queries zeros); or
                  the longest query length and the totals not known on the host, or
                  2\ :sup:`31` rows or more; or query/key heads differ without
                  ``enable_gqa`` (torch's own error); or heads that do not flatten into
                  one dim (key and value heads differ, or query and key heads differ
                  over several heads dims)
``flash``         float16 / bfloat16; head dims equal, a multiple of 8, at most 256; and
                  with ``is_causal``, queries and keys of one structure (flash aligns the
                  causal mask at the bottom right where lengths differ, torch at the top left)
``efficient``     float16 / bfloat16 / float32; query/key head dims equal, every head dim a
                  multiple of 8 and at most 256 (grouped heads are repeated for it)
``padded``        everything else (float64, odd head dims, ...)
================  =====================================================================

The backward runs the matching varlen backward kernel (:func:`varlen_backward`, through
:class:`VarlenAttention`, a ``torch.autograd.Function`` that ``torch.compile`` traces).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from nestbatch.batch import NestedBatch
from nestbatch.layouts import Packed

aten = torch.ops.aten

_HALF = (torch.float16, torch.bfloat16)
_MAX_HEAD_DIM = 256


@dataclass(frozen=True)
class Request:
    """What the dispatch rule looks at, all known on the host."""

    device_type: str
    dtype: torch.dtype
    head_dim: int
    value_head_dim: int
    query_heads: int
    key_heads: int
    has_mask: bool
    is_causal: bool
    same_structure: bool
    keys_known_nonempty: bool
    sizes_on_host: bool
    enable_gqa: bool
    heads_flatten: bool = True


def _head_dims_fit(r: Request) -> bool:
    return all(d % 8 == 0 and 0 < d <= _MAX_HEAD_DIM for d in (r.head_dim, r.value_head_dim))


def _padded_first(r: Request) -> bool:
    heads_mismatch = r.query_heads != r.key_heads and not (
        r.enable_gqa and r.query_heads % r.key_heads == 0
    )
    return (r.device_type != "cuda" or r.has_mask or not r.keys_known_nonempty
            or not r.sizes_on_host or heads_mismatch or not r.heads_flatten)


def _flash(r: Request) -> bool:
    return (r.dtype in _HALF and r.head_dim == r.value_head_dim and _head_dims_fit(r)
            and (r.same_structure or not r.is_causal))


def _efficient(r: Request) -> bool:
    return r.dtype in (*_HALF, torch.float32) and _head_dims_fit(r)


#: The dispatch rule, in order: the first row whose predicate holds gives the backend.
DISPATCH: tuple[tuple[str, Callable[[Request], bool]], ...] = (
    ("padded", _padded_first),
    ("flash", _flash),
    ("efficient", _efficient),
    ("padded", lambda r: True),
)


def choose_backend(request: Request) -> str:
    """``"flash"``, ``"efficient"`` or ``"padded"`` for ``request`` (see :data:`DISPATCH`)."""
    return next(name for name, applies in DISPATCH if applies(request))


def request_for(q: NestedBatch, k: NestedBatch, v: NestedBatch, has_mask: bool,
                is_causal: bool, enable_gqa: bool) -> Request:
    """The :class:`Request` of attention over the ragged dim of ``(B, *heads, j, E)`` batches
    (stored samples ``(L_i, *heads, E)``)."""
    qh, kh, vh = (tuple(x.feature_shape[:-1]) for x in (q, k, v))
    # The kernels take one heads dim: several are flattened (a view), which keeps torch's
    # pairing of query and key heads only where they are equal (or one dim each, for GQA).
    flatten = kh == vh and (qh == kh or len(qh) == len(kh) == 1)
    keys, queries = k.partition, q.partition
    known = keys.knows_host_shapes and keys.host_has_empty is False
    # The kernels take the longest lengths as host ints and int32 offsets.
    on_host = (queries.knows_max_shape and queries.knows_total and keys.knows_total
               and max(queries.total, keys.total) < 2**31)
    return Request(
        device_type=q.device.type, dtype=q.dtype, head_dim=q.feature_shape[-1],
        value_head_dim=v.feature_shape[-1], query_heads=math.prod(qh),
        key_heads=math.prod(kh), has_mask=has_mask, is_causal=is_causal,
        same_structure=_same_lengths(queries, keys), keys_known_nonempty=known,
        sizes_on_host=on_host, enable_gqa=enable_gqa, heads_flatten=flatten,
    )


def _same_lengths(a: Any, b: Any) -> bool:
    # One partition object, or equal host sizes: a comparison on the host, never a sync.
    known = a.knows_host_shapes and b.knows_host_shapes
    return a is b or (known and a.host_shapes == b.host_shapes)


# ---------------------------------------------------------------------------------- kernels
@dataclass(frozen=True)
class Plan:
    """The host-side arguments of one varlen call."""

    backend: str
    max_q: int
    max_k: int
    dropout_p: float
    is_causal: bool
    scale: float | None


def varlen_forward(plan: Plan, q: Tensor, k: Tensor, v: Tensor, cu_q: Tensor, cu_k: Tensor
                   ) -> tuple[Tensor, tuple[Tensor, ...]]:
    """Attention of packed ``(total, H, E)`` rows: ``(output, saved for the backward)``."""
    if plan.backend == "flash":
        out, lse, rng_state, unused, _ = aten._flash_attention_forward(
            q, k, v, cu_q, cu_k, plan.max_q, plan.max_k, plan.dropout_p, plan.is_causal, False,
            scale=plan.scale,
        )
        return out, (lse, rng_state, unused)
    out, lse, seed, offset, _, _ = aten._efficient_attention_forward(
        q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), None, cu_q, cu_k, plan.max_q,
        plan.max_k, plan.dropout_p, int(plan.is_causal), True, scale=plan.scale,
    )
    return out.squeeze(0), (lse, seed, offset)


def varlen_backward(plan: Plan, grad: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor,
                    cu_q: Tensor, cu_k: Tensor, saved: tuple[Tensor, ...]
                    ) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients of :func:`varlen_forward` for ``q``, ``k``, ``v``: the matching backward
    kernel, one launch, no sync."""
    if plan.backend == "flash":
        lse, rng_state, unused = saved
        return aten._flash_attention_backward(
            grad, q, k, v, out, lse, cu_q, cu_k, plan.max_q, plan.max_k, plan.dropout_p,
            plan.is_causal, rng_state, unused, scale=plan.scale,
        )
    lse, seed, offset = saved
    dq, dk, dv, _ = aten._efficient_attention_backward(
        grad.unsqueeze(0), q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), None,
        out.unsqueeze(0), cu_q, cu_k, plan.max_q, plan.max_k, lse, plan.dropout_p, seed,
        offset, int(plan.is_causal), False, scale=plan.scale,
    )
    return dq.squeeze(0), dk.squeeze(0), dv.squeeze(0)


class VarlenAttention(torch.autograd.Function):
    """Differentiable :func:`varlen_forward`; the backward is :func:`varlen_backward`."""

    @staticmethod
    def forward(ctx: Any, q: Tensor, k: Tensor, v: Tensor, cu_q: Tensor, cu_k: Tensor,
                plan: Plan) -> Tensor:
        """:func:`varlen_forward`, saving what :func:`varlen_backward` needs."""
        out, saved = varlen_forward(plan, q, k, v, cu_q, cu_k)
        ctx.save_for_backward(q, k, v, out, cu_q, cu_k, *saved)
        ctx.plan = plan
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple:
        """:func:`varlen_backward` for ``q``, ``k``, ``v``."""
        q, k, v, out, cu_q, cu_k, *saved = ctx.saved_tensors
        dq, dk, dv = varlen_backward(ctx.plan, grad.contiguous(), q, k, v, out, cu_q, cu_k,
                                     tuple(saved))
        return dq, dk, dv, None, None, None


def varlen_attention(backend: str, q: NestedBatch, k: NestedBatch, v: NestedBatch,
                     dropout_p: float, is_causal: bool, scale: float | None) -> NestedBatch:
    """``F.scaled_dot_product_attention`` over the ragged dim of ``(B, *heads, j, E)`` batches
    (ragged dim at dim -2; stored samples ``(L_i, *heads, E)``) on their packed rows with
    ``backend`` (``"flash"`` or ``"efficient"``, from :func:`choose_backend`).

    The longest lengths come from the host-known sizes, the int32 offsets are cached on the
    partitions: besides the attention kernel, a call launches only what the first use of a
    batch needs (the offsets' copy to the device and their int32 cast).

    Returns
    -------
    NestedBatch
        ``(B, *heads, j_q, E_v)``: the query's form (ragged dim at dim -2) and partition.
    """
    qv, kv, vv = (_heads_view(x.values) for x in (q, k, v))
    if backend == "efficient" and qv.shape[1] != kv.shape[1]:
        # Grouped-query attention: the efficient kernel wants as many key heads as queries.
        groups = qv.shape[1] // kv.shape[1]
        kv, vv = kv.repeat_interleave(groups, dim=1), vv.repeat_interleave(groups, dim=1)
    plan = Plan(backend, q.partition.max_shape[0], k.partition.max_shape[0], float(dropout_p),
                bool(is_causal), scale)
    cu_q, cu_k = q.partition.offsets32, k.partition.offsets32  # (int32, cast once per partition)
    out = VarlenAttention.apply(qv, kv, vv, cu_q, cu_k, plan)  # (total, H, E_v)
    out = out.view(out.shape[0], *q.feature_shape[:-1], out.shape[-1])
    # The query's form: ragged dim at dim -2, which is valid for these feature dims.
    return NestedBatch.trusted(Packed.trusted(out, q.partition), q.ragged_dim)


def _heads_view(values: Tensor) -> Tensor:
    # (total, *heads, E) as (total, H, E), H the product of the heads (1 for none): a view when
    # the heads are contiguous. The kernels read the head dim contiguously; a strided slice (a
    # fused QKV split, say) is copied once.
    values = values.reshape(values.shape[0], math.prod(values.shape[1:-1]), values.shape[-1])
    return values if values.stride(-1) == 1 else values.contiguous()

"""``F.scaled_dot_product_attention`` on batches, with torch's convention: attention over dim -2.

torch's attention runs over dim -2 of whatever it is given (the sequence of ``L`` queries and
``S`` keys); every dim before it is a batch dim. A batch follows the same rule, wherever its
ragged dim is presented (:attr:`~nestbatch.NestedBatch.ragged_dim`), and every form equals
torch's attention applied to each sample alone:

* the ragged dim at dim -2: ``(B, j, E)``, or torch.nested's ``(B, H, j, E)`` (``x.transpose(1,
  2)`` of a ``(B, j, H, E)`` batch): attention over the ragged dim, within each sample. On CUDA
  without ``attn_mask`` the varlen kernels run on the packed rows
  (:mod:`nestbatch.ops.varlen_attention` has the dispatch table); otherwise here, on padded data
  with a mask of the valid (query, key) pairs;
* the ragged dim before dim -2, e.g. ``(B, j, H, E)``: the ragged dim is a batch dim, so
  attention runs over dim -2 (``H`` here) for every token: one plain attention on the packed
  values ``(total, H, E)``, as torch.nested does; query, key and value must then have the same
  sample lengths (batch dims of torch's attention must match);
* the ragged dim last (the dim attention contracts over): refused.

:func:`sequence_attention` keeps the sequences-first convenience under its own name: batches of
``(L_i, *heads, E)`` samples (``ragged_dim`` 1) attend over ``L_i``. The rules, ``attn_mask``
forms and empty rows are stated once, in ``docs/attention.rst``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from nestbatch.batch import NestedBatch, with_ragged_dim
from nestbatch.layouts import Layout, Packed
from nestbatch.ops.common import check_same_structure, is_batch, wrap_padded
from nestbatch.ops.registry import register
from nestbatch.ops.varlen_attention import choose_backend, request_for, varlen_attention

_NAMES = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")


@register(F.scaled_dot_product_attention, layouts=(Layout.PACKED, Layout.PADDED),
          moved_ragged=True)
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
    if user_mask is not None:
        _check_mask_dtype_device(user_mask, q)
    if q.ragged_dim == q.dim() - 2:
        return _over_ragged(q, k, v, user_mask, causal, params)
    return _over_dense_dim(q, k, v, user_mask, causal, params)


# ------------------------------------------------------------------------------ checks
def _check_batches(batches: tuple[Any, Any, Any], what: str) -> None:
    # Raise unless query, key and value are batches with one ragged dim each.
    if not all(is_batch(x) for x in batches):
        raise TypeError(f"{what}: query, key and value must all be batches")
    for x, name in zip(batches, ("query", "key", "value")):
        if x.num_ragged_dims != 1:
            raise ValueError(
                f"{what}: {name} must have one ragged dim, got {x.num_ragged_dims} ragged dims"
            )


def _check_inputs(q: Any, k: Any, v: Any) -> None:
    """Raise unless ``q``, ``k``, ``v`` are batches of one form: the same number of dims, the
    ragged dim at the same logical dim (as torch.nested requires) and not last, one batch size.
    """
    _check_batches((q, k, v), "scaled_dot_product_attention")
    if len({(x.dim(), x.ragged_dim) for x in (q, k, v)}) > 1:
        raise ValueError(
            "scaled_dot_product_attention: query, key and value must have the same number of "
            "dims and their ragged dim at the same logical dim, got dims "
            f"{q.dim()}, {k.dim()}, {v.dim()} and ragged_dim {q.ragged_dim}, {k.ragged_dim}, "
            f"{v.ragged_dim}"
        )
    if q.ragged_dim == q.dim() - 1:
        raise ValueError(
            "scaled_dot_product_attention attends over dim -2 and contracts dim -1, which is "
            f"the ragged dim of these {q.dim()}-dim batches; move the ragged dim to dim -2 to "
            "attend over it, or before dim -2 to make it a batch dim"
        )
    # (Batches of one partition skip the comparison: under torch.compile a batch size may be
    # symbolic, and hashing or comparing it would specialize the graph on it.)
    same_partition = q.partition is k.partition is v.partition
    if not same_partition and not q.batch_size == k.batch_size == v.batch_size:
        raise ValueError(
            "scaled_dot_product_attention: query, key and value must have the same batch "
            f"size, got {q.batch_size}, {k.batch_size}, {v.batch_size}"
        )


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


# ------------------------------------------------------------------- ragged dim at dim -2
def _over_ragged(q: NestedBatch, k: NestedBatch, v: NestedBatch, user_mask: Any,
                 causal: bool, params: dict) -> NestedBatch:
    """Attention over the ragged dim of ``(B, *heads, j, E)`` batches, within each sample.

    Returns
    -------
    NestedBatch
        ``(B, *heads, j_q, E_v)``: the query's form (ragged dim at dim -2) and partition.
    """
    check_same_structure(k, v, "key and value")
    request = request_for(q, k, v, user_mask is not None, causal,
                          bool(params.get("enable_gqa", False)))
    backend = choose_backend(request)
    if backend != "padded":
        return varlen_attention(backend, q, k, v, params.get("dropout_p", 0.0), causal,
                                params.get("scale"))
    return _padded_attention(q, k, v, user_mask, causal, params)


def _padded_attention(q: NestedBatch, k: NestedBatch, v: NestedBatch, user_mask: Any,
                      causal: bool, params: dict) -> NestedBatch:
    """:func:`_over_ragged` as one masked attention on the padded data.

    Every sample attends to its own keys only, so it gets torch's result for the sample alone.
    With sizes on the host nothing here reads the device. Sizes only the device knows are read
    once by the conversion to padded (the padded width, cached on the partition), and a batch
    ``attn_mask`` is then compared on the device once (:func:`_check_mask_shapes`).
    """
    qd, kd, vd = (x.padded(0.0).data for x in (q, k, v))
    # Keys and values share their sizes but may be padded to different widths (one stored
    # padded by a loader, the other converted from packed rows): both widths hold every key,
    # so the narrower one fits both (a view of the wider).
    width = min(kd.shape[1], vd.shape[1])
    kd, vd = kd.narrow(1, 0, width), vd.narrow(1, 0, width)
    # Stored (B, L, *heads, E) to torch's (B, *heads, L, E): views.
    qd, kd, vd = (t.movedim(1, -2) for t in (qd, kd, vd))
    heads = _score_heads(qd.shape[1:-2], kd.shape[1:-2])
    lq, lk = qd.shape[-2], kd.shape[-2]
    queries = _with_heads(q.partition.mask((lq,)), len(heads))  # (B, 1.., Lq)
    if user_mask is None and k.partition.host_has_empty is False:
        # Every sample has a key (known on the host): mask the padded keys only. Padded
        # queries then attend to their sample's keys (finite), and are zeroed below.
        mask = _with_heads(k.partition.mask((lk,))[:, None, :], len(heads))
        if causal:
            mask = mask & _causal(lq, lk, mask.device)
        out = F.scaled_dot_product_attention(qd, kd, vd, attn_mask=mask, **params)
        out = out.masked_fill(~queries.unsqueeze(-1), 0.0)  # (padded queries: the filler)
    else:
        mask = _combined_mask(q, k, user_mask, heads, lq, lk, causal)
        mask, empty = _fill_empty_rows(mask)
        out = F.scaled_dot_product_attention(qd, kd, vd, attn_mask=mask, **params)
        out = _unattended_rows(out, empty, queries, vd)
    # Back to stored order; the padded slots are zeros (rows of padded queries): saying so
    # saves a refill.
    return wrap_padded(out.movedim(-2, 1), q.partition, q.ragged_dim, filler=0.0)


def _unattended_rows(out: Tensor, empty: Tensor, queries: Tensor, values: Tensor) -> Tensor:
    """``out`` ``(B, *heads, Lq, E)`` with torch's result at the rows that attend to nothing
    (``empty``, ``(B, *heads, Lq)``): zero weights times the sample's values, so 0, or NaN in
    a column of ``values`` ``(B, *heads, Lk, E)`` holding NaN or an infinity (0 * inf); zeros at
    padded queries (not ``queries``), the padded layout's filler. The fill also stops those
    rows' gradient."""
    out = out.masked_fill(empty.unsqueeze(-1), 0.0)
    nonfinite = ~values.isfinite().all(-2, keepdim=True)  # (padded keys are zeros)
    if nonfinite.dim() > 2 and nonfinite.shape[1] not in (1, out.shape[1]):
        # Grouped-query heads: query head h reads value head h // (Hq / Hkv).
        nonfinite = nonfinite.repeat_interleave(out.shape[1] // nonfinite.shape[1], dim=1)
    return out.masked_fill((empty & queries).unsqueeze(-1) & nonfinite, torch.nan)


def _score_heads(query_heads: torch.Size, key_heads: torch.Size) -> tuple[int, ...]:
    # The heads of the scores (B, *heads, Lq, Lk): torch broadcasts the query's and the key's;
    # grouped-query heads (enable_gqa) do not broadcast, and the query's count.
    try:
        return tuple(torch.broadcast_shapes(query_heads, key_heads))
    except RuntimeError:
        return tuple(query_heads)


def _with_heads(mask: Tensor, num_heads: int) -> Tensor:
    """``(B, *rest)`` as ``(B, 1, ..., 1, *rest)`` with ``num_heads`` ones: a view."""
    return mask[(slice(None),) + (None,) * num_heads]


def _causal(lq: int, lk: int, device: torch.device) -> Tensor:
    # Key j allowed for query i when j <= i: aligned at the top left, as torch's is_causal.
    return torch.ones(lq, lk, dtype=torch.bool, device=device).tril()


def _combined_mask(
    q: Any, k: Any, user_mask: Any, heads: tuple[int, ...], lq: int, lk: int, causal: bool
) -> Tensor:
    """``(B, 1.., Lq, Lk)`` or ``(B, *heads, Lq, Lk)``: the pairs each sample may attend.

    The valid (query, key) pairs (both in the sample; with ``causal``, the key not after the
    query, aligned at the top left as torch does), ANDed with a bool user mask, or a float user
    mask with ``-inf`` at the invalid pairs (whatever the user put there, NaN included, is
    dropped).
    """
    mask = q.partition.mask((lq,))[:, :, None] & k.partition.mask((lk,))[:, None, :]
    if causal:
        mask = mask & _causal(lq, lk, mask.device)
    mask = _with_heads(mask, len(heads))
    if user_mask is None:
        return mask
    if is_batch(user_mask):
        user = _padded_batch_mask(user_mask, q, k, heads, lq, lk)
    else:
        # Documented over the samples' own padded shape (max Lq, max Lk), whatever width the
        # data is stored padded to (a loader's, or left padding converted to the right).
        logical = (q.batch_size, *heads, q.partition.max_shape[0], k.partition.max_shape[0])
        user = _within_padding(_dense_mask(user_mask, logical), logical, lq, lk)
    return user & mask if user.dtype == torch.bool else torch.where(mask, user, -torch.inf)


def _within_padding(user: Tensor, logical: tuple[int, ...], lq: int, lk: int) -> Tensor:
    """A dense mask of the ``logical`` score shape ``(B, *heads, max Lq, max Lk)`` at the top
    left of the stored padded one (``lq``, ``lk`` at least those; the rest False / 0, which
    the caller masks out anyway)."""
    if logical[-2:] == (lq, lk):
        return user
    out = user.new_zeros((*logical[:-2], lq, lk))
    out[..., : logical[-2], : logical[-1]] = user
    return out


def _fill_empty_rows(mask: Tensor) -> tuple[Tensor, Tensor]:
    """``mask`` (bool, or float with ``-inf`` masked) with every fully masked row opened (all
    True / all 0), and ``(B, *heads, Lq)`` bool: where those rows are.

    Not every backend promises zeros (rather than NaN) for a row with no key to attend to;
    opened, the row is finite forward and backward, and the caller overwrites its output.
    """
    if mask.dtype == torch.bool:
        empty = ~mask.any(-1)
        return mask | empty.unsqueeze(-1), empty
    empty = (mask == -torch.inf).all(-1)
    return mask.masked_fill(empty.unsqueeze(-1), 0.0), empty


def _padded_batch_mask(
    mask: Any, q: Any, k: Any, heads: tuple[int, ...], lq: int, lk: int
) -> Tensor:
    """A batch mask of samples ``(Lq_i, Lk_i[, *heads])`` as ``(B, *heads or 1.., Lq, Lk)``.

    Its padding holds anything: the caller masks padded pairs out.
    """
    feature = tuple(mask.feature_shape)
    fits = feature == () or (
        len(feature) == len(heads) and all(f in (1, h) for f, h in zip(feature, heads))
    )
    if mask.num_ragged_dims != 2 or not fits:
        per_head = f" or (Lq_i, Lk_i, {', '.join(map(str, heads))}) (heads last, each may " \
            "be 1)" if heads else ""
        raise ValueError(
            f"attn_mask must have samples (Lq_i, Lk_i){per_head} with two ragged dims, got "
            f"{mask.num_ragged_dims} ragged dim(s) and feature shape {feature}"
        )
    _check_mask_shapes(mask, q, k)
    padded = mask.padded(None)
    if tuple(padded.padded_shape) != (lq, lk):
        # Built with other padding than the queries / keys: re-pad to their padded lengths.
        padded = mask.padded(0, max_shape=(lq, lk))
    data = padded.data  # (B, Lq, Lk, *heads)
    return data.movedim((1, 2), (-2, -1)) if feature else _with_heads(data, len(heads))


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


def _dense_mask(mask: Tensor, scores: tuple[int, ...]) -> Tensor:
    """A dense mask checked against the padded score shape ``(B, *heads, Lq, Lk)``."""
    try:
        fits = torch.broadcast_shapes(mask.shape, scores) == scores
    except RuntimeError:
        fits = False
    if not fits:
        raise ValueError(
            f"a dense attn_mask must broadcast to the padded score shape {scores} "
            f"(B, {'*heads, ' if len(scores) > 3 else ''}Lq, Lk), got {tuple(mask.shape)}"
        )
    return mask


# ---------------------------------------------------------- ragged dim a batch dim (before -2)
def _over_dense_dim(q: NestedBatch, k: NestedBatch, v: NestedBatch, user_mask: Any,
                    causal: bool, params: dict) -> NestedBatch:
    """Attention over dim -2 of batches whose ragged dim comes before it, e.g. ``(B, j, H, E)``
    over ``H``: the ragged dim is a batch dim, so this is torch's attention on the packed values
    ``(total, ..., H, E)`` (as torch.nested runs it), and equals it on every sample alone.

    The sample lengths of query, key and value must agree (torch's batch dims must match; a
    batch of other lengths would silently pair the wrong tokens). They are compared on the host;
    only batches of different partition objects whose sizes only the device knows are compared
    on the device (one sync).

    Returns
    -------
    NestedBatch
        The query's form and partition, values ``(total, ..., L, E_v)``.
    """
    try:
        check_same_structure(q, k, "query and key")
        check_same_structure(k, v, "key and value")
    except ValueError as error:
        r = q.ragged_dim
        raise ValueError(
            f"scaled_dot_product_attention attends over dim -2 like torch; the ragged dim {r} "
            f"of these {q.dim()}-dim batches is a batch dim, so query, key and value must have "
            f"the same sample lengths ({error}). To attend over the ragged dim, move it to dim "
            f"-2 (x.transpose({r}, -2)) or call nestbatch.sequence_attention"
        ) from error
    mask = None if user_mask is None else _token_mask(user_mask, q)
    out = F.scaled_dot_product_attention(q.packed().values, k.packed().values,
                                         v.packed().values, attn_mask=mask, is_causal=causal,
                                         **params)
    return NestedBatch.trusted(Packed.trusted(out, q.partition), q.ragged_dim)


def _token_mask(mask: Any, q: NestedBatch) -> Tensor:
    """``attn_mask`` for :func:`_over_dense_dim`, as a mask of the packed scores ``(total, ...,
    L, S)``: a batch of the query's form and lengths (its packed values), or a dense mask
    broadcastable to the logical score shape with size 1 at the ragged dim (its batch dim, when
    it has ``B`` entries, gathered to one per packed row)."""
    n, r = q.dim(), q.ragged_dim
    if is_batch(mask):
        if mask.num_ragged_dims != 1 or (mask.dim(), mask.ragged_dim) != (n, r):
            raise ValueError(
                f"a batch attn_mask must have the query's form ({n} dims, the ragged dim at "
                f"{r}, the scores (L, S) last), got {mask.dim()} dims with "
                f"{mask.num_ragged_dims} ragged dim(s) at {mask.ragged_dim}"
            )
        check_same_structure(mask, q, "attn_mask and query")
        return mask.packed().values
    shape = (1,) * (n - mask.dim()) + tuple(mask.shape)
    if mask.dim() > n or shape[r] != 1 or shape[0] not in (1, q.batch_size):
        raise ValueError(
            f"a dense attn_mask must broadcast to the {n}-dim score shape with size 1 at the "
            f"ragged dim {r} and 1 or B={q.batch_size} at dim 0, got {tuple(mask.shape)}"
        )
    dense = mask[(None,) * (n - mask.dim())].squeeze(r)  # (B or 1, stored score dims): views
    if shape[0] == 1:
        return dense.squeeze(0)
    return dense.index_select(0, q.partition.row_ids)


# ------------------------------------------------------------------ sequences first, by name
def sequence_attention(
    query: NestedBatch,
    key: NestedBatch,
    value: NestedBatch,
    attn_mask: Tensor | NestedBatch | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> NestedBatch:
    """Attention over the sequences of sequences-first batches: samples ``(L_i, *heads, E)``.

    ``F.scaled_dot_product_attention`` attends over dim -2 like torch, so a ``(B, j, H, E)``
    batch given to it attends over ``H`` for every token. This function attends over ``L_i``
    instead: it is ``F.scaled_dot_product_attention`` of the batches with the ragged dim moved
    to dim -2 (``(B, *heads, j, E)``, views), the result moved back. Every sample gets torch's
    attention of ``(*heads, L_i, E)`` alone; the same kernels run (varlen on CUDA).

    Parameters
    ----------
    query : NestedBatch
        ``(B, j_q, *heads, E)``: samples ``(Lq_i, *heads, E)``, ``ragged_dim`` 1.
    key, value : NestedBatch
        ``(B, j_k, *heads_k, E)`` and ``(B, j_k, *heads_k, E_v)``, the same lengths ``Lk_i``
        (which may differ from the query's: cross-attention).
    attn_mask : NestedBatch or Tensor, optional
        A batch of ``(Lq_i, Lk_i)`` or ``(Lq_i, Lk_i, *heads)`` masks (heads last), or a dense
        mask broadcastable to the padded scores ``(B, *heads, max Lq, max Lk)``; bool (True =
        attend) or float (added to the scores).
    dropout_p, is_causal, scale, enable_gqa
        As torch's (``is_causal``: within each sample, aligned at the top left).

    Returns
    -------
    NestedBatch
        ``(B, j_q, *heads, E_v)``, the query's partition, ``ragged_dim`` 1.

    Raises
    ------
    ValueError
        For a batch whose ragged dim is not first (use ``F.scaled_dot_product_attention``) or
        with fewer than 3 dims.
    """
    batches = (query, key, value)
    _check_batches(batches, "sequence_attention")
    for x, name in zip(batches, ("query", "key", "value")):
        if x.ragged_dim != 1 or x.dim() < 3:
            raise ValueError(
                f"sequence_attention takes sequences-first batches (samples (L_i, *heads, E), "
                f"ragged_dim 1); {name} has {x.dim()} dims with the ragged dim at "
                f"{x.ragged_dim} (for other forms call F.scaled_dot_product_attention)"
            )
    out = F.scaled_dot_product_attention(
        *(with_ragged_dim(x, x.dim() - 2) for x in batches), attn_mask=attn_mask,
        dropout_p=dropout_p, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa,
    )
    return with_ragged_dim(out, 1)

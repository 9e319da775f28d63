"""``F.scaled_dot_product_attention`` on batches with a user ``attn_mask``.

The reference is independent of the implementation: a Python loop that calls torch's attention
on every sample alone, with that sample's own mask.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st
from torch import Tensor

import nestbatch
from nestbatch import NestedBatch

H, E = 2, 3
# Per-sample layouts of query / key / value: (L, E); (L, H, E); (H, L, E) (ragged_dim 2).
LAYOUTS = ("LE", "LHE", "HLE")
LQ, LK = (3, 0, 2, 4), (2, 3, 0, 4)  # a sample with no queries, one with no keys


def _close(actual: Sequence[Tensor], expected: Sequence[Tensor]) -> None:
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        assert a.shape == e.shape, (a.shape, e.shape)
        torch.testing.assert_close(a, e)


# ------------------------------------------------------------------------------ builders
def _qkv(lq: Sequence[int], lk: Sequence[int], layout: str, seed: int = 0) -> list[list[Tensor]]:
    """Stored samples ``(L, E)`` / ``(L, H, E)`` of query, key and value (float64)."""
    gen = torch.Generator().manual_seed(seed)
    feature = (E,) if layout == "LE" else (H, E)
    return [
        [torch.randn(n, *feature, generator=gen, dtype=torch.float64) for n in lengths]
        for lengths in (lq, lk, lk)
    ]


def _batch(samples: Sequence[Tensor], layout: str) -> NestedBatch:
    batch = nestbatch.as_nested(list(samples))  # keeps the autograd history
    return batch.transpose(1, 2) if layout == "HLE" else batch


def _torch_sample(x: Tensor, layout: str) -> Tensor:
    # A stored sample as torch's attention takes it: (L, E) or (H, L, E).
    return x if layout == "LE" else x.transpose(0, 1)


def _random_mask(shape: Sequence[int], kind: str, gen: torch.Generator) -> Tensor:
    """A bool mask (True = attend) or a float one with ``-inf`` entries (float64)."""
    if kind == "bool":
        return torch.rand(*shape, generator=gen) < 0.6
    values = torch.randn(*shape, generator=gen, dtype=torch.float64)
    return values.masked_fill(torch.rand(*shape, generator=gen) < 0.3, -torch.inf)


def _mask_off_first_row(mask: Tensor) -> Tensor:
    # Every key masked out for the first query: a fully masked row.
    fill = False if mask.dtype == torch.bool else -torch.inf
    mask = mask.clone()
    if mask.shape[-2]:
        mask[..., 0, :] = fill
    return mask


def _sample_masks(
    lq: Sequence[int], lk: Sequence[int], kind: str, per_head: bool, seed: int = 1
) -> list[Tensor]:
    """Per-sample torch masks ``(Lq_i, Lk_i)`` or ``(H, Lq_i, Lk_i)``, first rows masked off."""
    gen = torch.Generator().manual_seed(seed)
    heads = (H,) if per_head else ()
    return [_mask_off_first_row(_random_mask((*heads, a, b), kind, gen)) for a, b in zip(lq, lk)]


def _mask_batch(masks: Sequence[Tensor]) -> NestedBatch:
    # Per-head masks (H, Lq, Lk) are stored heads last, (Lq, Lk, H): ragged dims lead.
    stored = [m.permute(1, 2, 0) if m.dim() == 3 else m for m in masks]
    return nestbatch.nested(stored, num_ragged_dims=2)


def _dense_masks(
    dense: Tensor, lq: Sequence[int], lk: Sequence[int], layout: str
) -> list[Tensor]:
    """The per-sample masks a dense mask in padded coordinates stands for."""
    heads = () if layout == "LE" else (H,)
    full = dense.expand(len(lq), *heads, max(lq), max(lk))
    return [full[i, ..., :a, :b] for i, (a, b) in enumerate(zip(lq, lk))]


# ------------------------------------------------------------------------------ reference
def reference(
    q: Sequence[Tensor],
    k: Sequence[Tensor],
    v: Sequence[Tensor],
    masks: Sequence[Tensor | None],
    layout: str,
) -> list[Tensor]:
    """Torch's attention on every sample alone, in the batch's logical sample layout."""
    out = []
    for a, b, c, m in zip(q, k, v, masks):
        a, b, c = (_torch_sample(t, layout) for t in (a, b, c))
        r = F.scaled_dot_product_attention(a, b, c, attn_mask=m)
        out.append(r.transpose(0, 1) if layout == "LHE" else r)
    return out


def _attend(q, k, v, attn_mask, layout: str) -> NestedBatch:
    out = F.scaled_dot_product_attention(
        _batch(q, layout), _batch(k, layout), _batch(v, layout), attn_mask=attn_mask
    )
    _check_padding_is_zero(out)
    return out


def _check_padding_is_zero(out: NestedBatch) -> None:
    padded = out.padded(None)
    assert not bool(padded.data[~padded.mask].any())
    assert not bool(out.values.isnan().any())


# ------------------------------------------------------------------------------ batch masks
# Samples without heads take (Lq, Lk) masks only; with heads also per-head masks.
@pytest.mark.parametrize(
    ("layout", "per_head"), [("LE", False), ("LHE", False), ("LHE", True), ("HLE", False),
                             ("HLE", True)]
)
@pytest.mark.parametrize("kind", ["bool", "float"])
def test_batch_mask_matches_per_sample(layout, per_head, kind):
    q, k, v = _qkv(LQ, LK, layout)
    masks = _sample_masks(LQ, LK, kind, per_head)
    out = _attend(q, k, v, _mask_batch(masks), layout)
    expected = reference(q, k, v, masks, layout)
    _close(out.unbind(), expected)
    assert out.ragged_dim == (2 if layout == "HLE" else 1)


@pytest.mark.parametrize("kind", ["bool", "float"])
def test_fully_masked_rows_are_exact_zeros_as_torch(kind):
    q, k, v = _qkv((3, 2), (4, 2), "LHE")
    masks = _sample_masks((3, 2), (4, 2), kind, per_head=True)
    out = _attend(q, k, v, _mask_batch(masks), "LHE").unbind()
    for sample, expected in zip(out, reference(q, k, v, masks, "LHE")):
        assert torch.equal(sample[0], torch.zeros_like(sample[0]))
        assert torch.equal(expected[0], sample[0])  # torch gives zeros too, not NaN


def test_one_sample_and_a_heads_broadcast_mask():
    q, k, v = _qkv((3,), (5,), "LHE")
    masks = _sample_masks((3,), (5,), "float", per_head=False)
    stored = nestbatch.nested([masks[0][..., None]], num_ragged_dims=2)  # (Lq, Lk, 1)
    _close(_attend(q, k, v, stored, "LHE").unbind(), reference(q, k, v, masks, "LHE"))


def test_mask_given_positionally_and_queries_padded_beyond_the_longest():
    q, k, v = _qkv((2, 1), (3, 1), "LE")
    masks = _sample_masks((2, 1), (3, 1), "bool", per_head=False)
    data = torch.zeros(2, 5, E, dtype=torch.float64)  # padded to 5, longest sample is 2
    for i, s in enumerate(q):
        data[i, : len(s)] = s
    padded_q = NestedBatch.from_padded(data, [2, 1])
    out = F.scaled_dot_product_attention(
        padded_q, nestbatch.nested(k), nestbatch.nested(v), _mask_batch(masks)
    )
    _close(out.unbind(), reference(q, k, v, masks, "LE"))


def test_sizes_known_only_on_the_device():
    q, k, v = _qkv((2, 3), (3, 1), "LE")
    masks = _sample_masks((2, 3), (3, 1), "float", per_head=False)
    batches = [NestedBatch.from_lengths(torch.cat(s), torch.tensor([len(t) for t in s]))
               for s in (q, k, v)]
    flat = torch.cat([m.reshape(-1) for m in masks])
    mask = NestedBatch.from_shapes(flat, torch.tensor([[2, 3], [3, 1]]))
    assert not batches[0].partition.knows_host_shapes
    _close(F.scaled_dot_product_attention(*batches, attn_mask=mask).unbind(),
           reference(q, k, v, masks, "LE"))
    wrong = NestedBatch.from_shapes(flat, torch.tensor([[3, 2], [3, 1]]))
    with pytest.raises(ValueError, match=r"expected \[\(2, 3\), \(3, 1\)\], got \[\(3, 2\)"):
        F.scaled_dot_product_attention(*batches, attn_mask=wrong)


# ------------------------------------------------------------------------------ dense masks
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("kind", ["bool", "float"])
@pytest.mark.parametrize("broadcast", [False, True])
def test_dense_mask_in_padded_coordinates(layout, kind, broadcast):
    q, k, v = _qkv(LQ, LK, layout)
    gen = torch.Generator().manual_seed(3)
    heads = () if layout == "LE" else (H,)
    # Full (B, [H,] Lq, Lk), or broadcast over the batch (and heads): (Lq, Lk).
    shape = (max(LQ), max(LK)) if broadcast else (len(LQ), *heads, max(LQ), max(LK))
    dense = _mask_off_first_row(_random_mask(shape, kind, gen))
    out = _attend(q, k, v, dense, layout)
    _close(out.unbind(), reference(q, k, v, _dense_masks(dense, LQ, LK, layout), layout))


def test_dense_mask_entries_at_padding_are_ignored():
    q, k, v = _qkv((1, 3), (2, 3), "LE")
    dense = torch.zeros(2, 3, 3, dtype=torch.float64)
    noisy = dense.clone()
    noisy[0, 1:] = torch.nan  # padded queries of sample 0
    noisy[0, :, 2] = -torch.inf  # its padded key
    _close(_attend(q, k, v, noisy, "LE").unbind(), _attend(q, k, v, dense, "LE").unbind())


# ------------------------------------------------------------------------------ random shapes
@given(
    lengths=st.lists(st.tuples(st.integers(0, 4), st.integers(0, 4)), min_size=1, max_size=4),
    layout=st.sampled_from(LAYOUTS),
    kind=st.sampled_from(["bool", "float"]),
    dense=st.booleans(),
    per_head=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_random_ragged_shapes(lengths, layout, kind, dense, per_head, seed):
    lq, lk = zip(*lengths)
    per_head = per_head and layout != "LE"
    q, k, v = _qkv(lq, lk, layout, seed)
    if dense:
        heads = (H,) if per_head else ((1,) if layout != "LE" else ())
        shape = (len(lq), *heads, max(lq), max(lk))
        mask = _random_mask(shape, kind, torch.Generator().manual_seed(seed))
        masks = _dense_masks(mask, lq, lk, layout)
    else:
        masks = _sample_masks(lq, lk, kind, per_head, seed)
        mask = _mask_batch(masks)
    _close(_attend(q, k, v, mask, layout).unbind(), reference(q, k, v, masks, layout))


# ------------------------------------------------------------------------------ gradients
def _leaves(lq, lk, layout, seed=0):
    q, k, v = _qkv(lq, lk, layout, seed)
    return [torch.cat(s).requires_grad_() for s in (q, k, v)]


def _split(flat: Tensor, lengths: Sequence[int]) -> list[Tensor]:
    return list(torch.split(flat, list(lengths)))


@pytest.mark.parametrize("layout", ["LE", "HLE"])
def test_gradcheck_float_batch_mask(layout):
    lq, lk = (2, 1, 0), (3, 0, 2)
    masks = _sample_masks(lq, lk, "float", per_head=False)
    # Finite entries: finite differences are meaningful at every one of them.
    masks = [torch.nan_to_num(m, neginf=-2.0) for m in masks]
    flat_mask = torch.cat([m.reshape(-1) for m in masks]).requires_grad_()
    shapes = torch.tensor(list(zip(lq, lk)))

    def fn(qv, kv, vv, mv):
        q, k, v = (_batch(_split(x, n), layout) for x, n in ((qv, lq), (kv, lk), (vv, lk)))
        mask = NestedBatch.from_shapes(mv, shapes)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask).values

    assert torch.autograd.gradcheck(fn, (*_leaves(lq, lk, layout), flat_mask))


def test_gradcheck_dense_float_mask():
    lq, lk = (2, 3), (3, 1)
    dense = torch.randn(2, 3, 3, dtype=torch.float64, requires_grad=True)

    def fn(qv, kv, vv, mask):
        q, k, v = (_batch(_split(x, n), "LE") for x, n in ((qv, lq), (kv, lk), (vv, lk)))
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask).values

    assert torch.autograd.gradcheck(fn, (*_leaves(lq, lk, "LE"), dense))


def test_gradients_with_fully_masked_rows_match_per_sample():
    lq, lk = (3, 2, 1), (2, 0, 3)
    masks = _sample_masks(lq, lk, "bool", per_head=True)
    leaves = _leaves(lq, lk, "LHE")
    out = F.scaled_dot_product_attention(
        *(_batch(_split(x, n), "LHE") for x, n in zip(leaves, (lq, lk, lk))),
        attn_mask=_mask_batch(masks),
    )
    weights = torch.randn_like(out.values)
    grads = torch.autograd.grad((out.values * weights).sum(), leaves)
    ref_leaves = [x.detach().clone().requires_grad_() for x in leaves]
    samples = [_split(x, n) for x, n in zip(ref_leaves, (lq, lk, lk))]
    expected = torch.cat(reference(*samples, masks, "LHE"))
    ref_grads = torch.autograd.grad((expected * weights).sum(), ref_leaves)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r)
    assert torch.autograd.gradcheck(
        lambda *xs: F.scaled_dot_product_attention(
            *(_batch(_split(x, n), "LHE") for x, n in zip(xs, (lq, lk, lk))),
            attn_mask=_mask_batch(masks),
        ).values,
        tuple(leaves),
    )


# ------------------------------------------------------------------------------ errors
def _small(layout: str = "LE"):
    q, k, v = _qkv((2, 1), (3, 2), layout)
    return _batch(q, layout), _batch(k, layout), _batch(v, layout)


def test_is_causal_with_a_mask_raises_as_torch():
    q, k, v = _small()
    mask = torch.ones(2, 2, 3, dtype=torch.bool)
    with pytest.raises(RuntimeError, match="attn_mask should not be set when is_causal=True"):
        F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=True)
    with pytest.raises(RuntimeError, match="is_causal=True"):  # torch's own behaviour
        F.scaled_dot_product_attention(q.unbind()[0], k.unbind()[0], v.unbind()[0],
                                       attn_mask=mask[0], is_causal=True)


def test_wrong_mask_shapes():
    q, k, v = _small()
    wrong = nestbatch.nested([torch.ones(2, 3, dtype=torch.bool), torch.ones(1, 3).bool()],
                             num_ragged_dims=2)
    with pytest.raises(ValueError, match=r"expected \[\(2, 3\), \(1, 2\)\], got \[\(2, 3\), "
                                         r"\(1, 3\)\]"):
        F.scaled_dot_product_attention(q, k, v, attn_mask=wrong)
    one_ragged = nestbatch.nested([torch.ones(2, 3).bool(), torch.ones(1, 3).bool()])
    with pytest.raises(ValueError, match="two ragged dims, got 1 ragged dim"):
        F.scaled_dot_product_attention(q, k, v, attn_mask=one_ragged)
    three = nestbatch.nested([torch.ones(2, 3).bool()], num_ragged_dims=2)
    with pytest.raises(ValueError, match="attn_mask has 1 samples but the query has 2"):
        F.scaled_dot_product_attention(q, k, v, attn_mask=three)
    with pytest.raises(ValueError, match=r"padded score shape \(2, 2, 3\).*got \(2, 3, 3\)"):
        F.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(2, 3, 3).bool())
    qh, kh, vh = _small("LHE")
    heads3 = nestbatch.nested([torch.ones(2, 3, 3).bool(), torch.ones(1, 2, 3).bool()],
                              num_ragged_dims=2)
    with pytest.raises(ValueError, match=r"\(Lq_i, Lk_i, 2\).*feature shape \(3,\)"):
        F.scaled_dot_product_attention(qh, kh, vh, attn_mask=heads3)


def test_wrong_mask_dtype_and_device():
    q, k, v = _small()
    for dtype in (torch.int64, torch.float16):
        with pytest.raises(TypeError, match=f"attn_mask must be bool.*got {dtype}"):
            F.scaled_dot_product_attention(q, k, v, attn_mask=torch.zeros(2, 2, 3, dtype=dtype))
    with pytest.raises(ValueError, match="attn_mask must be on the query's device cpu"):
        F.scaled_dot_product_attention(q, k, v, attn_mask=torch.zeros(2, 2, 3, device="meta"))
    # torch also takes float32 masks for float64 queries.
    mask = torch.zeros(2, 2, 3)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    _close(out.unbind(), F.scaled_dot_product_attention(q, k, v).unbind())

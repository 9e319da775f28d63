"""``F.scaled_dot_product_attention`` on batches: torch's convention (attention over dim -2) in
every form, with and without a user ``attn_mask``, and :func:`nestbatch.sequence_attention`.

The reference is independent of the implementation: a Python loop that calls torch's attention
on every sample alone, with that sample's own mask.
"""

from __future__ import annotations

import itertools
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
# Forms that attend over the ragged dim, by their samples: (L, E) (ragged_dim 1 = dim -2);
# (H, L, E), torch.nested's (B, H, j, E) (ragged_dim 2 = dim -2); and "SEQ": sequences-first
# (L, H, E) batches (ragged_dim 1) given to nestbatch.sequence_attention. A (B, j, H, E) batch
# given to F.scaled_dot_product_attention attends over H (the tests of that form are below).
LAYOUTS = ("LE", "HLE", "SEQ")
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


def _attention(layout: str):
    return nestbatch.sequence_attention if layout == "SEQ" else F.scaled_dot_product_attention


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
        out.append(r.transpose(0, 1) if layout == "SEQ" else r)
    return out


def _attend(q, k, v, attn_mask, layout: str) -> NestedBatch:
    out = _attention(layout)(
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
    ("layout", "per_head"), [("LE", False), ("SEQ", False), ("SEQ", True), ("HLE", False),
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
    assert out.shape[-1] == E and out.dim() == (3 if layout == "LE" else 4)


@pytest.mark.parametrize("kind", ["bool", "float"])
def test_fully_masked_rows_are_exact_zeros_as_torch(kind):
    q, k, v = _qkv((3, 2), (4, 2), "SEQ")
    masks = _sample_masks((3, 2), (4, 2), kind, per_head=True)
    out = _attend(q, k, v, _mask_batch(masks), "SEQ").unbind()
    for sample, expected in zip(out, reference(q, k, v, masks, "SEQ")):
        assert torch.equal(sample[0], torch.zeros_like(sample[0]))
        assert torch.equal(expected[0], sample[0])  # torch gives zeros too, not NaN


def test_one_sample_and_a_heads_broadcast_mask():
    q, k, v = _qkv((3,), (5,), "SEQ")
    masks = _sample_masks((3,), (5,), "float", per_head=False)
    stored = nestbatch.nested([masks[0][..., None]], num_ragged_dims=2)  # (Lq, Lk, 1)
    _close(_attend(q, k, v, stored, "SEQ").unbind(), reference(q, k, v, masks, "SEQ"))


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
    batches = [NestedBatch.from_offsets(torch.cat(s), torch.tensor([0, *itertools.accumulate(
        len(t) for t in s)])) for s in (q, k, v)]
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


@pytest.mark.parametrize("layout", ["HLE", "SEQ"])
def test_gradients_with_fully_masked_rows_match_per_sample(layout):
    lq, lk = (3, 2, 1), (2, 0, 3)
    masks = _sample_masks(lq, lk, "bool", per_head=True)
    leaves = _leaves(lq, lk, layout)
    out = _attention(layout)(
        *(_batch(_split(x, n), layout) for x, n in zip(leaves, (lq, lk, lk))),
        attn_mask=_mask_batch(masks),
    )
    weights = torch.randn_like(out.values)
    grads = torch.autograd.grad((out.values * weights).sum(), leaves)
    ref_leaves = [x.detach().clone().requires_grad_() for x in leaves]
    samples = [_split(x, n) for x, n in zip(ref_leaves, (lq, lk, lk))]
    expected = torch.cat([r.transpose(0, 1) if layout == "HLE" else r  # stored order
                          for r in reference(*samples, masks, layout)])
    ref_grads = torch.autograd.grad((expected * weights).sum(), ref_leaves)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r)
    assert torch.autograd.gradcheck(
        lambda *xs: _attention(layout)(
            *(_batch(_split(x, n), layout) for x, n in zip(xs, (lq, lk, lk))),
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
    qh, kh, vh = _small("HLE")
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


# ------------------------------------------------------------------------------ no mask
def _no_empty_keys(lq: Sequence[int]) -> tuple[int, ...]:
    # Keys known non-empty on the host: the padded path masks padded keys only.
    return tuple(1 + (2 * n + 1) % 4 for n in lq)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("lk", [LK, _no_empty_keys(LQ)], ids=["empty keys", "keys"])
def test_over_the_ragged_dim_without_mask_matches_per_sample(layout, causal, lk):
    # Cross-attention (other key lengths), zero-length queries and keys, top-left causal.
    q, k, v = _qkv(LQ, lk, layout)
    out = _attention(layout)(*(_batch(x, layout) for x in (q, k, v)), is_causal=causal)
    _check_padding_is_zero(out)
    expected = [
        F.scaled_dot_product_attention(*(_torch_sample(t, layout) for t in (a, b, c)),
                                       is_causal=causal)
        for a, b, c in zip(q, k, v)
    ]
    if layout == "SEQ":
        expected = [r.transpose(0, 1) for r in expected]
    _close(out.unbind(), expected)


@pytest.mark.parametrize("lk", [(5,), (0,)])
def test_a_batch_of_one(lk):
    q, k, v = _qkv((3,), lk, "HLE")
    out = F.scaled_dot_product_attention(*(_batch(x, "HLE") for x in (q, k, v)), scale=0.7)
    expected = F.scaled_dot_product_attention(*(_torch_sample(x[0], "HLE") for x in (q, k, v)),
                                              scale=0.7)
    _close(out.unbind(), [expected])


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
def test_heads_form_equals_torch_nested():
    # torch.nested's transformer recipe: (B, j, H, E) -> transpose(1, 2) -> SDPA -> back.
    q, k, v = _qkv((3, 5, 2), (4, 1, 6), "HLE", seed=4)
    ours = F.scaled_dot_product_attention(*(_batch(x, "HLE") for x in (q, k, v)))
    njt = F.scaled_dot_product_attention(
        *(torch.nested.nested_tensor(x, layout=torch.jagged).transpose(1, 2) for x in (q, k, v))
    )
    torch.testing.assert_close(ours.transpose(1, 2).values, njt.transpose(1, 2).values())


def test_several_heads_dims_before_the_ragged_dim():
    # (B, X, H, j, E): X and H are batch dims, attention over j.
    gen = torch.Generator().manual_seed(5)
    lq, lk = (3, 0, 2), (2, 4, 1)
    q, k = ([torch.randn(n, 2, H, E, generator=gen, dtype=torch.float64) for n in ls]
            for ls in (lq, lk))
    v = [torch.randn(n, 2, H, 4, generator=gen, dtype=torch.float64) for n in lk]
    batches = [nestbatch.nested(x).permute(0, 2, 3, 1, 4) for x in (q, k, v)]
    assert batches[0].ragged_dim == 3
    masks = _sample_masks(lq, lk, "float", per_head=False)
    for mask in (None, _mask_batch(masks)):
        out = F.scaled_dot_product_attention(*batches, attn_mask=mask)
        assert out.ragged_dim == 3 and out.shape[-1] == 4
        expected = [F.scaled_dot_product_attention(*(t.permute(1, 2, 0, 3) for t in s),
                                                   attn_mask=None if mask is None else m)
                    for *s, m in zip(q, k, v, masks)]
        _close(out.unbind(), expected)
    out = nestbatch.sequence_attention(*(nestbatch.nested(x) for x in (q, k, v)))
    _close(out.unbind(), [F.scaled_dot_product_attention(*(t.permute(1, 2, 0, 3) for t in s))
                          .permute(2, 0, 1, 3) for s in zip(q, k, v)])


# ------------------------------------------------------------------ the ragged dim a batch dim
S, SK = 4, 3  # query and key "sequences" at dim -2 of every token (the heads, say)


def _tokens(lengths: Sequence[int], seed: int = 0, middle: tuple[int, ...] = ()
            ) -> list[list[Tensor]]:
    """Samples ``(L_i, *middle, S, E)`` (query) and ``(L_i, *middle, SK, E / 2E)``."""
    gen = torch.Generator().manual_seed(seed)
    return [[torch.randn(n, *middle, s, e, generator=gen, dtype=torch.float64) for n in lengths]
            for s, e in ((S, E), (SK, E), (SK, 2 * E))]


def _per_sample(q, k, v, masks=None, **options) -> list[Tensor]:
    masks = masks if masks is not None else [None] * len(q)
    return [F.scaled_dot_product_attention(a, b, c, attn_mask=m, **options)
            for a, b, c, m in zip(q, k, v, masks)]


@pytest.mark.parametrize("options", [{}, {"is_causal": True}, {"scale": 0.3},
                                     {"dropout_p": 1.0}])
def test_ragged_dim_before_dim_minus_2_is_a_batch_dim(options):
    # (B, j, S, E): attention over S for every token, as torch on each (L_i, S, E) sample.
    for lengths in ((3, 0, 5, 1), (0, 0)):
        _check_tokens(lengths, options)


def _check_tokens(lengths: Sequence[int], options: dict) -> None:
    q, k, v = _tokens(lengths)
    batches = [nestbatch.nested(x) for x in (q, k, v)]
    out = F.scaled_dot_product_attention(*batches, **options)
    assert out.ragged_dim == 1 and out.partition is batches[0].partition
    assert tuple(out.feature_shape) == (S, 2 * E)
    _close(out.unbind(), _per_sample(q, k, v, **options))


def test_ragged_dim_a_batch_dim_equals_torch_nested():
    q, k, v = _tokens((3, 5, 2), seed=1)
    ours = F.scaled_dot_product_attention(*(nestbatch.nested(x) for x in (q, k, v)))
    njt = F.scaled_dot_product_attention(
        *(torch.nested.nested_tensor(x, layout=torch.jagged) for x in (q, k, v)))
    torch.testing.assert_close(ours.values, njt.values())


@pytest.mark.parametrize("kind", ["bool", "float"])
def test_ragged_dim_a_batch_dim_with_masks(kind):
    lengths = (2, 0, 3)
    q, k, v = _tokens(lengths, seed=2)
    batches = [nestbatch.nested(x) for x in (q, k, v)]
    gen = torch.Generator().manual_seed(3)
    # Dense: broadcast over every token; with B entries at dim 0 (size 1 at the ragged dim).
    for shape in ((S, SK), (1, S, SK), (len(lengths), 1, S, SK), (1, 1, S, SK)):
        dense = _random_mask(shape, kind, gen)
        per = dense.expand(len(lengths), 1, S, SK)
        out = F.scaled_dot_product_attention(*batches, attn_mask=dense)
        _close(out.unbind(), _per_sample(q, k, v, [per[i] for i in range(len(lengths))]))
    # A batch of the query's form: one mask per token.
    masks = [_random_mask((n, S, SK), kind, gen) for n in lengths]
    out = F.scaled_dot_product_attention(*batches, attn_mask=nestbatch.nested(masks))
    _close(out.unbind(), _per_sample(q, k, v, masks))


def test_ragged_dim_a_middle_batch_dim():
    # (B, X, j, S, E) (ragged_dim 2 of 5): stored (L_i, X, S, E); a mask with B entries.
    lengths = (2, 3, 0)
    q, k, v = _tokens(lengths, seed=4, middle=(2,))
    batches = [nestbatch.nested(x).transpose(1, 2) for x in (q, k, v)]
    dense = _random_mask((3, 2, 1, S, SK), "float", torch.Generator().manual_seed(5))
    out = F.scaled_dot_product_attention(*batches, attn_mask=dense, is_causal=False)
    assert out.ragged_dim == 2
    samples = [[t.transpose(0, 1) for t in x] for x in (q, k, v)]  # (X, L_i, S, E)
    _close(out.unbind(), _per_sample(*samples, [dense[i] for i in range(3)]))


def test_ragged_dim_a_batch_dim_needs_one_structure():
    q, k, v = _tokens((3, 2))
    k2, v2 = _tokens((2, 3))[1:]
    with pytest.raises(ValueError, match=r"ragged dim 1 of these 4-dim batches is a batch dim.*"
                                         r"lengths=\[3, 2\] and lengths=\[2, 3\].*"
                                         r"transpose\(1, -2\).*sequence_attention"):
        F.scaled_dot_product_attention(nestbatch.nested(q), nestbatch.nested(k2),
                                       nestbatch.nested(v2))
    # Same lengths from other partition objects (host sizes compared) are fine.
    F.scaled_dot_product_attention(*(nestbatch.nested(x) for x in (q, k, v)))
    with pytest.raises(ValueError, match="attn_mask and query must have the same row"):
        F.scaled_dot_product_attention(
            *(nestbatch.nested(x) for x in (q, k, v)),
            attn_mask=nestbatch.nested([torch.ones(2, S, SK).bool(), torch.ones(3, S, SK).bool()]))
    with pytest.raises(ValueError, match="size 1 at the ragged dim 1 and 1 or B=2"):
        F.scaled_dot_product_attention(*(nestbatch.nested(x) for x in (q, k, v)),
                                       attn_mask=torch.ones(2, 3, S, SK).bool())
    moved = nestbatch.nested([torch.ones(3, S, SK), torch.ones(2, S, SK)]).transpose(1, 2)
    with pytest.raises(ValueError, match="a batch attn_mask must have the query's form"):
        F.scaled_dot_product_attention(*(nestbatch.nested(x) for x in (q, k, v)), attn_mask=moved)


def test_gradcheck_ragged_dim_a_batch_dim():
    lengths = (2, 0, 3)
    leaves = [torch.cat(x).requires_grad_() for x in _tokens(lengths, seed=6)]
    mask = torch.randn(SK, dtype=torch.float64, requires_grad=True)  # broadcast over queries

    def fn(qv, kv, vv, m):
        batches = (NestedBatch.from_lengths(x, list(lengths)) for x in (qv, kv, vv))
        return F.scaled_dot_product_attention(*batches, attn_mask=m).values

    assert torch.autograd.gradcheck(fn, (*leaves, mask))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("lk", [(3, 1, 2), (3, 0, 2)], ids=["keys", "empty keys"])
def test_gradcheck_heads_form(causal, lk):
    # (B, H, j, E), cross-attention, no mask: the padded path (masking padded keys only when
    # every sample has a key) on the CPU.
    lq = (2, 3, 0)
    leaves = _leaves(lq, lk, "HLE", seed=7)

    def fn(qv, kv, vv):
        q, k, v = (_batch(_split(x, n), "HLE") for x, n in ((qv, lq), (kv, lk), (vv, lk)))
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal).values

    assert torch.autograd.gradcheck(fn, tuple(leaves))


# ------------------------------------------------------------------------------ form errors
def test_forms_that_raise():
    q, k, v = _small("HLE")
    with pytest.raises(ValueError, match="ragged_dim 2, 1, 1"):
        F.scaled_dot_product_attention(q, k.transpose(1, 2), v.transpose(1, 2))
    last = nestbatch.nested([torch.randn(2, 3), torch.randn(4, 3)]).transpose(1, 2)  # (B, E, j)
    with pytest.raises(ValueError, match="contracts dim -1, which is the ragged dim"):
        F.scaled_dot_product_attention(last, last, last)
    one = _batch(_qkv((2,), (2,), "HLE")[1], "HLE")
    with pytest.raises(ValueError, match="the same batch size, got 2, 1, 2"):
        F.scaled_dot_product_attention(q, one, v)
    with pytest.raises(TypeError, match="must all be batches"):
        F.scaled_dot_product_attention(q, k.padded().data, v)
    with pytest.raises(ValueError, match="sequence_attention takes sequences-first batches"):
        nestbatch.sequence_attention(q, k, v)
    with pytest.raises(ValueError, match="sequence_attention: key must have one ragged dim"):
        nestbatch.sequence_attention(q.transpose(1, 2),
                                     nestbatch.nested([torch.ones(2, 3, 3)], num_ragged_dims=2),
                                     v.transpose(1, 2))


def test_dense_mask_is_read_over_the_samples_padded_shape_whatever_the_stored_width():
    # Samples of lengths 2 and 3 stored padded to width 5 (right, and left as a loader gives
    # them): the documented mask shape (B, max Lq, max Lk) was refused, and a (B, 5, 5) one was
    # accepted and read in other coordinates.
    from nestbatch.data import from_left_padded

    gen = torch.Generator().manual_seed(0)
    lengths, width = [2, 3], 5
    q, k, v = ([torch.randn(n, 4, dtype=torch.float64, generator=gen) for n in lengths]
               for _ in range(3))

    def stored(samples, side):
        data = torch.zeros(len(samples), width, 4, dtype=torch.float64)
        mask = torch.zeros(len(samples), width, dtype=torch.bool)
        for i, s in enumerate(samples):
            where = slice(width - len(s), width) if side == "left" else slice(0, len(s))
            data[i, where], mask[i, where] = s, True
        return data, mask

    user = torch.ones(2, 3, 3, dtype=torch.bool)
    user[:, :, 1] = False  # key 1 of every sample
    expected = [F.scaled_dot_product_attention(a, b, c, attn_mask=user[i, : len(a), : len(b)])
                for i, (a, b, c) in enumerate(zip(q, k, v))]
    builds = {
        "packed": lambda x: nestbatch.as_nested(x),
        "right, width 5": lambda x: NestedBatch.from_padded(*stored(x, "right")[:1],
                                                            mask=stored(x, "right")[1]),
        "left, width 5": lambda x: from_left_padded(*stored(x, "left")),
    }
    for name, build in builds.items():
        batches = [build(x) for x in (q, k, v)]
        for mask in (user, user.float().log()):  # bool, and float with -inf
            out = F.scaled_dot_product_attention(*batches, attn_mask=mask)
            for got, want in zip(out.unbind(), expected):
                torch.testing.assert_close(got, want, msg=name)
        with pytest.raises(ValueError, match="must broadcast to the padded score shape"):
            F.scaled_dot_product_attention(*batches, attn_mask=torch.ones(2, 5, 5,
                                                                          dtype=torch.bool))

"""A NestedBatch whose ragged dim is moved (``ragged_dim``), as torch.nested jagged's _ragged_idx.

Every check compares with the same torch op applied to each logical sample alone.
"""

from __future__ import annotations

import pickle

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import nestbatch
from nestbatch import Layout, NestedBatch

LENGTHS = (3, 0, 5, 1)


def _close(actual, expected, **kw):
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        assert a.shape == e.shape, (a.shape, e.shape)
        torch.testing.assert_close(a, e, **kw)


def _samples(*feature, lengths=LENGTHS, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, *feature, generator=g, dtype=dtype) for n in lengths]


def _heads(layout=Layout.PACKED, lengths=LENGTHS, seed=0):
    """Samples (L_i, H, D) and the batch (B, H, j, D) (ragged_dim 2) with its samples (H, L, D)."""
    samples = _samples(2, 4, lengths=lengths, seed=seed)
    batch = nestbatch.nested(samples, layout=layout).transpose(1, 2)
    return batch, [s.transpose(0, 1) for s in samples]


# ---------------------------------------------------------------------------- core and views
@pytest.mark.parametrize("layout", list(Layout))
def test_transpose_moves_the_ragged_dim_and_shares_storage(layout):
    samples = _samples(3, 4)
    x = nestbatch.nested(samples, layout=layout)
    y = x.transpose(1, 3)  # (B, j, H, D) -> (B, D, H, j)
    assert y.ragged_dim == 3 and y.feature_shape == (4, 3) and y.sample_shape == (4, 3, None)
    assert y.dim() == 4 and y.size(1) == 4 and y.size(2) == 3
    assert isinstance(y.size(3), nestbatch.RaggedSize) and y.size(3) == x.size(1)
    _close(y.unbind(), [s.permute(2, 1, 0) for s in samples])
    _close(list(y), [s.permute(2, 1, 0) for s in samples])
    _close([y[i] for i in range(len(samples))], [s.permute(2, 1, 0) for s in samples])
    assert y.values.data_ptr() == x.values.data_ptr()
    back = y.transpose(3, 1)
    assert back.ragged_dim == 1
    _close(back.unbind(), samples)
    assert torch.equal(back.values, x.values)


@given(
    perm=st.permutations([1, 2, 3]),
    then=st.permutations([1, 2, 3]),
    layout=st.sampled_from(list(Layout)),
)
@settings(max_examples=25, deadline=None)
def test_permute_round_trips(perm, then, layout):
    samples = _samples(2, 3)
    x = nestbatch.nested(samples, layout=layout)
    y = x.permute(0, *perm)
    _close(y.unbind(), [s.permute(*(d - 1 for d in perm)) for s in samples])
    z = y.permute(0, *then)
    expected = [s.permute(*(d - 1 for d in perm)).permute(*(d - 1 for d in then)) for s in samples]
    _close(z.unbind(), expected)
    _close(torch.movedim(z, 1, 3).unbind(), [e.movedim(0, 2) for e in expected])
    inverse = [0] * 4
    for position, d in enumerate((0, *perm)):
        inverse[d] = position
    restored = y.permute(*inverse)
    assert restored.ragged_dim == 1
    _close(restored.unbind(), samples)


def test_metadata_survives_copies_and_pickling():
    y, expected = _heads()
    for z in (y.clone(), y.detach(), y.to(torch.float32), y.cpu(), y.contiguous(),
              y.to(Layout.PADDED), y.to(Layout.LIST), pickle.loads(pickle.dumps(y)),
              y.with_values(y.values * 1), y.map_values(torch.neg).neg()):
        assert z.ragged_dim == 2
        _close([t.double() for t in z.unbind()], expected)
    assert "ragged_dim=2" in repr(y) and "sample_shape=(2, None, 4)" in repr(y)
    torch.testing.assert_close(y.to_padded_tensor(), y.padded().data.transpose(1, 2))
    assert y.padded().data.shape[1] == max(LENGTHS)  # stored order
    assert y.bounding_shape().tolist() == [4, 2, 5, 4]


def test_requires_grad_and_grad_keep_ragged_dim():
    y, _ = _heads()
    y = y.detach().requires_grad_()
    y.sum().backward()
    assert y.grad.ragged_dim == 2
    _close(y.grad.unbind(), [torch.ones_like(s) for s in y.unbind()])


def test_indexing_a_transposed_batch():
    samples = _samples(3, 4)
    y = nestbatch.nested(samples).transpose(1, 2)  # (B, H, j, D)
    expected = [s.transpose(0, 1) for s in samples]
    _close([y[i] for i in range(4)], expected)
    assert y[2, 1, 3, 2] == expected[2][1, 3, 2]
    z = y[1:, :2, 1:, ::2]
    assert z.ragged_dim == 2
    _close(z.unbind(), [e[:2, 1:, ::2] for e in expected[1:]])
    w = y[:, 1]  # an integer before the ragged dim moves it down
    assert w.ragged_dim == 1
    _close(w.unbind(), [e[1] for e in expected])
    v = y[..., 0]
    assert v.ragged_dim == 2
    _close(v.unbind(), [e[..., 0] for e in expected])
    _close(y[[3, 0]].unbind(), [expected[3], expected[0]])
    with pytest.raises(IndexError, match="ragged dim"):
        y[:, :, 0]
    _close(torch.select(y, 1, 1).unbind(), [e[1] for e in expected])


def test_select_on_the_moved_ragged_dim():
    samples = _samples(3, 4, lengths=(2, 4, 1))
    y = nestbatch.nested(samples).transpose(1, 2)
    torch.testing.assert_close(torch.select(y, 2, 0), torch.stack([s[0] for s in samples]))
    torch.testing.assert_close(y.select(2, -1), torch.stack([s[-1] for s in samples]))


# ------------------------------------------------------------------------------- elementwise
@pytest.mark.parametrize("layout", list(Layout))
def test_elementwise_and_broadcasting(layout):
    y, expected = _heads(layout)
    other, other_expected = _heads(layout, seed=1)
    dense = torch.randn(4, dtype=torch.float64)
    _close((y * 2 + 1).unbind(), [e * 2 + 1 for e in expected])
    _close(torch.exp(y).unbind(), [e.exp() for e in expected])
    _close((y + other).unbind(), [a + b for a, b in zip(expected, other_expected)])
    _close(torch.maximum(y, other).unbind(),
           [torch.maximum(a, b) for a, b in zip(expected, other_expected)])
    _close((y * dense).unbind(), [e * dense for e in expected])
    _close(torch.zeros_like(y).unbind(), [torch.zeros_like(e) for e in expected])
    _close(F.gelu(y).unbind(), [F.gelu(e) for e in expected])
    _close(F.dropout(y, 0.5, training=False).unbind(), expected)
    assert (y + 1).ragged_dim == 2
    z = y.clone()
    z.mul_(3)
    _close(z.unbind(), [e * 3 for e in expected])


def test_broadcasting_errors_on_a_moved_ragged_dim():
    y, _ = _heads()
    with pytest.raises(ValueError, match="reach the ragged dim"):
        y + torch.randn(5, 4, dtype=torch.float64)
    x = nestbatch.nested(_samples(2, 4))
    with pytest.raises(ValueError, match="different positions"):
        x + y
    last = nestbatch.nested(_samples(3)).transpose(1, 2)  # (B, 3, j)
    with pytest.raises(ValueError, match="reach the ragged dim"):
        last * torch.randn(1, dtype=torch.float64)


# -------------------------------------------------------------------- reductions and softmax
@pytest.mark.parametrize("layout", [Layout.PACKED, Layout.PADDED])
@pytest.mark.parametrize("dim", [1, 2, 3, -1])
@pytest.mark.parametrize("log", [False, True])
def test_softmax_over_logical_dims(layout, dim, log):
    y, expected = _heads(layout, lengths=(3, 2, 5, 1))
    fn = F.log_softmax if log else F.softmax
    out = fn(y, dim=dim)
    assert out.ragged_dim == 2
    _close(out.unbind(), [fn(e, dim=dim - 1 if dim > 0 else dim) for e in expected])


@pytest.mark.parametrize("layout", [Layout.PACKED, Layout.PADDED])
@pytest.mark.parametrize("name", ["sum", "mean", "amax", "logsumexp", "std"])
def test_reductions_over_logical_dims(layout, name):
    y, expected = _heads(layout, lengths=(3, 2, 5, 2))  # std of one element is nan
    fn = getattr(torch, name)
    # Over the ragged dim: dense (B, H, D); keepdim puts the 1 back at logical dim 2.
    torch.testing.assert_close(fn(y, 2), torch.stack([fn(e, 1) for e in expected]))
    torch.testing.assert_close(
        fn(y, 2, keepdim=True), torch.stack([fn(e, 1, keepdim=True) for e in expected])
    )
    # Over a feature dim before the ragged one: the ragged dim moves down.
    before = fn(y, 1)
    assert before.ragged_dim == 1
    _close(before.unbind(), [fn(e, 0) for e in expected])
    kept = fn(y, 1, keepdim=True)
    assert kept.ragged_dim == 2
    _close(kept.unbind(), [fn(e, 0, keepdim=True) for e in expected])
    after = fn(y, -1)
    assert after.ragged_dim == 2
    _close(after.unbind(), [fn(e, -1) for e in expected])


def test_composed_reductions_and_argmax():
    y, expected = _heads(lengths=(3, 2, 5, 1))
    torch.testing.assert_close(y.sum((2, 3)), torch.stack([e.sum((1, 2)) for e in expected]))
    torch.testing.assert_close(y.sum((1, 2)), torch.stack([e.sum((0, 1)) for e in expected]))
    torch.testing.assert_close(y.argmax(2), torch.stack([e.argmax(1) for e in expected]))
    values, index = torch.max(y, 1)
    _close(values.unbind(), [e.max(0).values for e in expected])
    torch.testing.assert_close(torch.sum(y), sum(e.sum() for e in expected))


# ------------------------------------------------------------------------------ nn layers
def test_linear_and_layer_norm_on_feature_dims():
    y, expected = _heads()
    linear = torch.nn.Linear(4, 6, dtype=torch.float64)
    norm = torch.nn.LayerNorm(4, dtype=torch.float64)
    _close(linear(y).unbind(), [linear(e) for e in expected])
    _close(norm(y).unbind(), [norm(e) for e in expected])
    assert linear(y).ragged_dim == 2
    last = nestbatch.nested(_samples(4)).transpose(1, 2)  # (B, 4, j): ragged is last
    with pytest.raises(ValueError, match="transpose the ragged dim back"):
        linear(last)
    with pytest.raises(ValueError, match="transpose the ragged dim back"):
        torch.nn.LayerNorm((5, 4), dtype=torch.float64)(y)


def test_unsupported_ops_name_the_op_and_the_fix():
    y, _ = _heads()
    indices = nestbatch.nested([torch.randint(0, 5, (n, 2)) for n in LENGTHS]).transpose(1, 2)
    with pytest.raises(TypeError, match=r"embedding_bag .*transpose the ragged dim back"):
        F.embedding_bag(indices, torch.randn(5, 3))
    with pytest.raises(ValueError, match="to_packed_sequence.*transpose the ragged dim back"):
        nestbatch.to_packed_sequence(y)
    with pytest.raises(ValueError, match="to_nested_tensor"):
        nestbatch.to_nested_tensor(y)
    with pytest.raises(ValueError, match="keeps them leading"):
        NestedBatch(nestbatch.nested([torch.ones(2, 2, 3)], num_ragged_dims=2).packed(), 2)
    with pytest.raises(ValueError, match="out of range"):
        NestedBatch(y.packed(), 4)


# ------------------------------------------------------------------------------ attention
@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_on_heads_first_batches(causal):
    q, q_samples = _heads(lengths=(3, 1, 5, 2), seed=0)
    k, k_samples = _heads(lengths=(4, 2, 5, 1), seed=1)
    v, v_samples = _heads(lengths=(4, 2, 5, 1), seed=2)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    assert out.ragged_dim == 2
    expected = [
        F.scaled_dot_product_attention(a, b, c, is_causal=causal)
        for a, b, c in zip(q_samples, k_samples, v_samples)
    ]
    _close(out.unbind(), expected)
    with pytest.raises(ValueError, match="ragged_dim 2"):
        F.scaled_dot_product_attention(q, k.transpose(1, 2), v.transpose(1, 2))


# ------------------------------------------------------------------------------ matmul / bmm
def test_bmm_with_a_transposed_right_operand():
    a_samples = _samples(3, lengths=(2, 4, 0, 3))  # (n_i, m)
    b_samples = _samples(3, lengths=(5, 1, 2, 0), seed=1)  # (p_i, m) -> transposed (m, p_i)
    a = nestbatch.nested(a_samples)
    b = nestbatch.nested(b_samples).transpose(1, 2)
    out = torch.bmm(a, b)
    assert out.num_ragged_dims == 2
    _close(out.unbind(), [x @ y.T for x, y in zip(a_samples, b_samples)])
    # (B, 3, j_i) @ (B, j_i, p_i): only the result's columns are ragged (logical dim 2).
    scores = _samples(3, lengths=(2, 4, 0, 3), seed=2)
    images = [torch.randn(n, p, dtype=torch.float64) for n, p in zip((2, 4, 0, 3), (1, 0, 2, 3))]
    c = nestbatch.nested(scores).transpose(1, 2)
    d = torch.matmul(c, nestbatch.nested(images, num_ragged_dims=2))
    assert d.ragged_dim == 2 and d.num_ragged_dims == 1
    _close(d.unbind(), [s.T @ m for s, m in zip(scores, images)])


def test_bmm_contracting_over_the_ragged_dim():
    scores, values = _samples(3, seed=0), _samples(2, seed=1)  # (j_i, 3), (j_i, 2)
    weights = nestbatch.nested(scores).transpose(1, 2)  # (B, 3, j)
    v = nestbatch.nested(values)  # (B, j, 2)
    out = weights @ v
    assert isinstance(out, torch.Tensor) and out.shape == (4, 3, 2)
    torch.testing.assert_close(out, torch.stack([s.T @ x for s, x in zip(scores, values)]))
    # Same structure from another partition object: sizes compared on the host.
    v2 = nestbatch.nested([x.clone() for x in values])
    torch.testing.assert_close(torch.bmm(weights, v2), out)
    bad = nestbatch.nested(_samples(2, lengths=(3, 0, 5, 2)))
    with pytest.raises(ValueError, match="contracted sizes differ"):
        torch.bmm(weights, bad)


def test_attention_weights_times_values():
    # softmax(q k^T) v per sample: (B, n_i, j_i) is a two-ragged-dim batch @ (B, j_i, d).
    q_samples, k_samples = _samples(4, seed=0), _samples(4, seed=1)
    q, k = nestbatch.nested(q_samples), nestbatch.nested(k_samples)
    scores = q @ k.transpose(1, 2)
    weights = torch.softmax(scores, dim=2)
    out = weights @ k
    expected = [torch.softmax(a @ b.T, 1) @ b for a, b in zip(q_samples, k_samples)]
    _close(out.unbind(), expected)


def test_matmul_of_same_structure_batches():
    a_samples = _samples(2, 3)  # (L_i, n, m)
    b_samples = _samples(3, 5, seed=1)  # (L_i, m, p)
    a, b = nestbatch.nested(a_samples), nestbatch.nested(b_samples)
    _close(torch.matmul(a, b).unbind(), [x @ y for x, y in zip(a_samples, b_samples)])
    # (H, L_i, n, m) @ (H, L_i, m, p): ragged at logical dim 2 in both.
    c = nestbatch.nested(_samples(6, 2, 3, seed=2)).transpose(1, 2)
    d = nestbatch.nested(_samples(6, 3, 1, seed=3)).transpose(1, 2)
    out = c @ d
    assert out.ragged_dim == 2
    _close(out.unbind(), [x @ y for x, y in zip(c.unbind(), d.unbind())])
    other = nestbatch.nested(_samples(3, 5, lengths=(1, 1, 1, 1)))
    with pytest.raises(ValueError, match="same row structure"):
        a @ other


def test_matmul_with_dense_operands_on_a_moved_batch():
    y, expected = _heads()
    w = torch.randn(4, 3, dtype=torch.float64)
    _close((y @ w).unbind(), [e @ w for e in expected])
    four_samples = _samples(2, 3, 4)
    four = nestbatch.nested(four_samples).transpose(1, 2)  # (B, 2, j, 3, 4)
    four_expected = [s.transpose(0, 1) for s in four_samples]
    m = torch.randn(5, 3, dtype=torch.float64)
    _close((m @ four).unbind(), [m @ e for e in four_expected])
    with pytest.raises(ValueError, match="transpose the ragged dim back"):
        w.T @ y  # y's second-to-last logical dim is ragged
    last = nestbatch.nested(_samples(4)).transpose(1, 2)
    with pytest.raises(ValueError, match="transpose the ragged dim back"):
        last @ torch.randn(5, 2, dtype=torch.float64)


# ------------------------------------------------------------------------------ gradients
def test_gradcheck_through_transpose_matmul_softmax():
    lengths = (2, 3, 1)
    a_values = torch.randn(sum(lengths), 3, dtype=torch.float64, requires_grad=True)
    b_values = torch.randn(sum(lengths), 2, dtype=torch.float64, requires_grad=True)

    def run(av, bv):
        a = NestedBatch.from_lengths(av, list(lengths))
        b = NestedBatch.from_lengths(bv, list(lengths))
        weights = torch.softmax(a.transpose(1, 2), dim=2)  # (B, 3, j), softmax over j
        return weights @ b  # (B, 3, 2), contracting over the ragged dim

    torch.autograd.gradcheck(run, (a_values, b_values))

    def heads(av):
        x = NestedBatch.from_lengths(av.view(-1, 3, 1).expand(-1, 3, 2), list(lengths))
        y = x.transpose(1, 2)  # (B, 3, j, 2)
        return F.log_softmax(y, dim=2).transpose(1, 2).values

    torch.autograd.gradcheck(heads, (a_values,))


def test_to_ragged_batch_keeps_the_logical_order():
    y, expected = _heads()
    ragged = y.to_ragged_batch()
    assert ragged.non_uniform_dim == 2
    for i, e in enumerate(expected):
        torch.testing.assert_close(ragged.tensor[i][:, : e.shape[1]], e)


# ------------------------------------------------------------- cat / stack / tile / reshape
# Logical sample shapes with None at the ragged dim: feature dims on both sides of it (ragged_dim
# 2 and 3) and after every feature dim (ragged_dim 4).
MOVED_SHAPES = [(2, None, 3, 4), (2, 3, None, 4), (2, 3, 4, None)]


def _moved(sample_shape, lengths=LENGTHS, layout=Layout.PACKED, seed=0, dtype=torch.float64):
    """A batch whose ragged dim is at ``sample_shape.index(None) + 1``, and its logical samples.

    Built independently of the ops under test: each logical sample is drawn, stored with the
    ragged dim first (``movedim``), and the batch's dim moved back to the logical position.
    """
    rd = sample_shape.index(None) + 1
    g = torch.Generator().manual_seed(seed)
    logical = [
        torch.randn(*(n if s is None else s for s in sample_shape), generator=g, dtype=dtype)
        for n in lengths
    ]
    feature = tuple(s for s in sample_shape if s is not None)
    rows = [t.movedim(rd - 1, 0).reshape(-1, *feature) for t in logical]
    values = torch.cat(rows) if rows else torch.zeros(0, *feature, dtype=dtype)
    batch = NestedBatch.from_lengths(values, list(lengths))
    if layout is not Layout.PACKED:
        batch = batch.to(layout)
    batch = batch.movedim(1, rd)
    assert batch.ragged_dim == rd and batch.sample_shape == tuple(sample_shape)
    return batch, logical


def _with(shape, at, size):
    return tuple(size if d == at else s for d, s in enumerate(shape))


@pytest.mark.parametrize("layout", list(Layout))
@pytest.mark.parametrize("sample_shape", MOVED_SHAPES)
def test_cat_along_every_logical_dim(sample_shape, layout):
    rd = sample_shape.index(None) + 1
    a, a_samples = _moved(sample_shape, layout=layout)
    ndim = a.dim()
    for dim in range(ndim):
        if dim == 0:
            b, b_samples = _moved(sample_shape, lengths=(2, 0, 1), layout=layout, seed=1)
            expected = a_samples + b_samples
        elif dim == rd:
            b, b_samples = _moved(sample_shape, lengths=(1, 2, 0, 3), layout=layout, seed=1)
            expected = [torch.cat([x, y], rd - 1) for x, y in zip(a_samples, b_samples)]
        else:  # a feature dim: b has another size there, the same lengths
            b, b_samples = _moved(_with(sample_shape, dim - 1, 5), layout=layout, seed=1)
            expected = [torch.cat([x, y], dim - 1) for x, y in zip(a_samples, b_samples)]
        for d in (dim, dim - ndim):
            out = torch.cat([a, b], d)
            assert out.ragged_dim == rd
            _close(out.unbind(), expected)
    _close(torch.concat([a, a, a], dim=rd).unbind(),
           [torch.cat([x, x, x], rd - 1) for x in a_samples])
    _close(torch.concatenate((a, a), axis=0).unbind(), a_samples + a_samples)


@pytest.mark.parametrize("sample_shape", MOVED_SHAPES)
def test_cat_with_dense_items_reads_them_in_logical_order(sample_shape):
    rd = sample_shape.index(None) + 1
    a, a_samples = _moved(sample_shape)
    dense = torch.randn(2, *_with(sample_shape, rd - 1, 3), dtype=torch.float64)
    out = torch.cat([a, dense])
    assert out.ragged_dim == rd
    _close(out.unbind(), a_samples + list(dense))
    _close(torch.cat([dense, a]).unbind(), list(dense) + a_samples)
    empty = dense[:0]
    _close(torch.cat([a, empty]).unbind(), a_samples)
    rows = torch.randn(len(LENGTHS), *_with(sample_shape, rd - 1, 2), dtype=torch.float64)
    _close(torch.cat([a, rows], rd).unbind(),
           [torch.cat([x, y], rd - 1) for x, y in zip(a_samples, rows)])


@pytest.mark.parametrize("lengths", [(0, 0), (4,), ()])
def test_cat_of_zero_length_single_and_empty_batches(lengths):
    shape = (2, None, 3)
    a, a_samples = _moved(shape, lengths=lengths)
    b, b_samples = _moved(shape, lengths=tuple(reversed(lengths)), seed=1)
    _close(torch.cat([a, b]).unbind(), a_samples + b_samples)
    _close(torch.cat([a, b], 2).unbind(), [torch.cat([x, y], 1) for x, y in zip(a_samples,
                                                                              b_samples)])
    c, c_samples = _moved((4, None, 3), lengths=lengths, seed=2)
    out = torch.cat([a, c], 1)
    assert out.ragged_dim == 2 and out.batch_size == len(lengths)
    _close(out.unbind(), [torch.cat([x, y], 0) for x, y in zip(a_samples, c_samples)])


def test_cat_needs_the_same_ragged_position():
    a, _ = _moved((2, None, 3, 4))
    b, _ = _moved((2, 3, None, 4))
    for dim in (0, 2, -1):
        with pytest.raises(ValueError, match="same logical dim, got ragged_dim 2 and 3"):
            torch.cat([a, b], dim)
    unmoved = nestbatch.nested(_samples(2, 4))
    with pytest.raises(ValueError, match="ragged_dim 1 and 2"):
        torch.cat([unmoved, _heads()[0]])
    with pytest.raises(ValueError, match="same sample shape"):
        torch.cat([a, _moved((2, None, 3, 5))[0]])
    with pytest.raises(ValueError, match="same row structure"):
        torch.cat([a, _moved((2, None, 3, 4), lengths=(1, 1, 1, 1))[0]], 3)


@pytest.mark.parametrize("layout", [Layout.PACKED, Layout.PADDED])
@pytest.mark.parametrize("sample_shape", MOVED_SHAPES)
def test_stack_at_every_allowed_position(sample_shape, layout):
    rd = sample_shape.index(None) + 1
    a, a_samples = _moved(sample_shape, layout=layout)
    b, b_samples = _moved(sample_shape, layout=layout, seed=1)
    b = b.to(Layout.PACKED)  # same structure, other layout and partition object
    ndim = a.dim() + 1
    for dim in range(1, ndim):
        if dim == rd:
            continue
        for d in (dim, dim - ndim):
            out = torch.stack([a, b, a], d)
            assert out.ragged_dim == (rd + 1 if dim < rd else rd)
            _close(out.unbind(), [torch.stack([x, y, x], dim - 1)
                                  for x, y in zip(a_samples, b_samples)])


def test_stack_of_zero_length_single_and_empty_batches():
    for lengths in [(0, 2, 0), (3,), ()]:
        a, samples = _moved((2, None, 3), lengths=lengths)
        out = torch.stack([a, a * 2], 1)
        assert out.ragged_dim == 3 and out.batch_size == len(lengths)
        _close(out.unbind(), [torch.stack([x, x * 2], 0) for x in samples])


def test_stack_refuses_the_batch_and_ragged_positions():
    y, _ = _heads()  # (B, 2, j, 4)
    for dim in (0, 2, -3):
        with pytest.raises(ValueError, match=r"cannot take the position.*ragged dim \(2\)"):
            torch.stack([y, y], dim)
    x = nestbatch.nested(_samples(3))  # never moved: unchanged, the new dim goes after j
    with pytest.raises(ValueError, match=r"ragged dim \(1\)"):
        torch.stack([x, x], 1)
    two = nestbatch.nested([torch.ones(2, 3, 4)], num_ragged_dims=2)
    with pytest.raises(ValueError, match=r"ragged dims \(1\.\.2\)"):
        torch.stack([two, two], 2)
    assert torch.stack([two, two], 3).unbind()[0].shape == (2, 3, 2, 4)
    z, _ = _moved((2, 4, None))
    with pytest.raises(ValueError, match="ragged_dim 2 and 3"):
        torch.stack([y, z], 1)
    with pytest.raises(ValueError, match="same row structure"):
        torch.stack([y, _heads(lengths=(1, 1, 1, 1))[0]], 1)
    with pytest.raises(IndexError, match="out of range"):
        torch.stack([y, y], 5)


TILE_REPS = [(1, 1, 1, 1, 1), (2, 1, 1, 1, 1), (1, 2, 1, 1, 1), (1, 1, 2, 1, 1),
             (1, 1, 1, 2, 1), (1, 1, 1, 1, 3), (3, 2, 1, 2, 2), (1, 0, 1, 1, 1),
             (1, 1, 0, 1, 1), (0, 1, 1, 1, 1), (1, 2), (2,), ()]


@pytest.mark.parametrize("layout", list(Layout))
@pytest.mark.parametrize("sample_shape", MOVED_SHAPES)
def test_tile_and_repeat_take_reps_in_logical_order(sample_shape, layout):
    rd = sample_shape.index(None) + 1
    x, samples = _moved(sample_shape, layout=layout)
    for reps in TILE_REPS:
        full = (1,) * (x.dim() - len(reps)) + reps
        expected = [torch.tile(s, full[1:]) for s in samples] * full[0]
        out = torch.tile(x, reps)
        assert out.ragged_dim == rd
        _close(out.unbind(), expected)
        _close(x.tile(reps).unbind(), expected)
        if len(reps) == x.dim():
            _close(x.repeat(*reps).unbind(), [s.repeat(*full[1:]) for s in samples] * full[0])
    with pytest.raises(ValueError, match="can't be smaller"):
        x.repeat(2, 2)


def test_tile_zero_length_single_and_empty_batches():
    for lengths in [(0, 2, 0), (3,), ()]:
        x, samples = _moved((2, None, 3), lengths=lengths)
        for reps in [(2, 2, 3, 1), (1, 1, 2, 2)]:
            _close(torch.tile(x, reps).unbind(),
                   [s.repeat(*reps[1:]) for s in samples] * reps[0])


def test_gradcheck_cat_stack_tile_on_moved_batches():
    lengths = [2, 0, 3]
    g = torch.Generator().manual_seed(0)
    a = torch.randn(5, 2, 3, generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(5, 2, 3, generator=g, dtype=torch.float64, requires_grad=True)

    def moved(values):
        return NestedBatch.from_lengths(values, lengths).movedim(1, 2)  # (B, 2, j, 3)

    ops = [
        lambda x, y: torch.cat([x, y]),
        lambda x, y: torch.cat([x, y], 2),
        lambda x, y: torch.cat([x, y], 3),
        lambda x, y: torch.cat([x, y * 2], 1),
        lambda x, y: torch.stack([x, y], 1),
        lambda x, y: torch.stack([x, y], -1),
        lambda x, y: torch.tile(x, (2, 1, 2, 3)) * 2 + torch.tile(y, (2, 1, 2, 3)),
        lambda x, y: x.repeat(1, 2, 1, 1) + y.repeat(1, 2, 1, 1),
        lambda x, y: x.reshape(3, -1, -1, 3, 1) + y.reshape(-1, 2, -1, 3, 1),
    ]
    for op in ops:
        torch.autograd.gradcheck(lambda u, v, op=op: op(moved(u), moved(v)).to_padded_tensor(),
                                 (a, b))


# ----------------------------------------------------------------------------- reshape / view
def _reshaped(samples, shape, rd):
    """The reference: every logical sample reshaped to ``shape[1:]`` (explicit sizes), with its
    own length at the ragged dim."""
    return [s.reshape(*_with(shape[1:], rd - 1, s.shape[rd - 1])) for s in samples]


@pytest.mark.parametrize("layout", list(Layout))
def test_reshape_and_view_keep_the_moved_ragged_dim(layout):
    x, samples = _moved((2, None, 3, 4), layout=layout)  # ragged_dim 2
    # (asked, the same with every size explicit): one -1 per side is inferred, several keep
    # their dims' sizes (torch.nested's rule).
    for asked, explicit in [
        ((4, 2, -1, 12), (4, 2, -1, 12)),
        ((-1, 2, -1, 12), (4, 2, -1, 12)),
        ((4, -1, -1, 2, 6), (4, 2, -1, 2, 6)),
        ((4, 2, -1, 2, 3, 2), (4, 2, -1, 2, 3, 2)),
        ((4, 2, -1, -1, -1), (4, 2, -1, 3, 4)),
        ((4, -1, -1, 3, -1), (4, 2, -1, 3, 4)),
        ((4, 2, -1, 12, 1), (4, 2, -1, 12, 1)),
        ((4, 1, 2, -1, 12), None),  # not this rule: the ragged dim must stay at dim 2
    ]:
        if explicit is None:
            with pytest.raises(ValueError, match="stays at logical dim 2"):
                x.reshape(asked)
            continue
        expected = _reshaped(samples, explicit, 2)
        out = x.reshape(asked)
        assert out.ragged_dim == 2
        _close(out.unbind(), expected)
        _close(x.view(*asked).unbind(), expected)
        _close(torch.reshape(x, asked).unbind(), expected)
    y, y_samples = _moved((2, 3, None, 4), layout=layout)  # ragged_dim 3
    for asked, explicit in [((4, 3, 2, -1, 4), (4, 3, 2, -1, 4)),
                            ((4, 6, 1, -1, 2, 2), (4, 6, 1, -1, 2, 2)),
                            ((4, -1, 3, -1, 4, 1), (4, 2, 3, -1, 4, 1))]:
        out = y.reshape(*asked)
        assert out.ragged_dim == 3
        _close(out.unbind(), _reshaped(y_samples, explicit, 3))
    z, z_samples = _moved((2, 3, 4, None), layout=layout)  # ragged last
    out = z.view(4, 6, 2, 2, -1)
    assert out.ragged_dim == 4
    _close(out.unbind(), _reshaped(z_samples, (4, 6, 2, 2, -1), 4))


def test_reshape_of_zero_length_single_and_empty_batches():
    for lengths in [(0, 0), (3,), ()]:
        x, samples = _moved((2, 3, None, 4), lengths=lengths)
        shape = (len(lengths), 6, 1, -1, 2, 2)
        _close(x.reshape(shape).unbind(), _reshaped(samples, shape, 3))


def test_reshape_as_and_view_as_on_moved_batches():
    x, samples = _moved((2, None, 3, 4))
    other, _ = _moved((2, None, 12), seed=1)
    _close(x.reshape_as(other).unbind(), _reshaped(samples, (4, 2, -1, 12), 2))
    _close(x.view_as(other).unbind(), _reshaped(samples, (4, 2, -1, 12), 2))
    dense = torch.zeros(4, 2, 7, 2, 6)  # the size at the ragged dim is ignored
    _close(x.reshape_as(dense).unbind(), _reshaped(samples, (4, 2, -1, 2, 6), 2))
    with pytest.raises(ValueError, match="ragged dim at logical dim 2 and the other at 1"):
        x.reshape_as(nestbatch.nested(_samples(2, 12)))
    with pytest.raises(ValueError, match="ragged dim at logical dim 1 and the other at 2"):
        nestbatch.nested(_samples(2, 12)).view_as(other)


def test_view_dtype_on_moved_batches():
    x, samples = _moved((2, None, 4), dtype=torch.float32)
    _close(x.view(torch.int32).unbind(), [s.view(torch.int32) for s in samples])
    _close(x.view(torch.float16).unbind(), [s.view(torch.float16) for s in samples],
           equal_nan=True)
    last, last_samples = _moved((4, None), dtype=torch.float32)
    _close(last.view(torch.int32).unbind(), [s.view(torch.int32) for s in last_samples])
    with pytest.raises(ValueError, match="last dim is the ragged dim"):
        last.view(torch.float16)


def test_reshape_errors_name_the_shapes():
    x, _ = _moved((2, None, 3, 4))
    with pytest.raises(ValueError, match=r"cannot reshape samples of shape \(2, None, 3, 4\) "
                                         r"to \(4, -1, 6\).*across the ragged dim"):
        x.reshape(4, 4, -1, 6)  # 2 * 12 elements regrouped as 4 * 6 across j
    with pytest.raises(ValueError, match="across the ragged dim"):
        x.reshape(4, 1, -1, 12)
    with pytest.raises(ValueError, match="across the ragged dim"):
        x.reshape(4, 2, -1, 5)
    with pytest.raises(ValueError, match="stays at logical dim 2.*give -1 there"):
        x.reshape(4, -1, 2, 12)  # the ragged dim cannot move
    with pytest.raises(ValueError, match="stays at logical dim 2"):
        x.reshape(4, -1)
    with pytest.raises(ValueError, match="changes the batch size"):
        x.reshape(2, 2, -1, 12)
    y, _ = _moved((2, 3, None, 4))
    with pytest.raises(ValueError, match=r"the 2 dim\(s\) before the ragged dim \(logical dim 3\)"
                                         r" hold 6 elements and the dims after it 4"):
        y.reshape(4, 3, 4, -1, 2)
    with pytest.raises(ValueError, match="stays at logical dim 3"):
        y.reshape(4, 6, -1, 4)  # merging the dims before j would move it to dim 2


# ------------------------------------------------------------------- unsqueeze / squeeze / flatten
@pytest.mark.parametrize("moved", [False, True])
@pytest.mark.parametrize("dim", [1, 2, 3, 4, -1, -4])
def test_unsqueeze_anywhere_after_the_batch_dim(moved, dim):
    if moved:
        y, expected = _heads()
    else:
        expected = _samples(2, 4)
        y = nestbatch.nested(expected)
    out = y.unsqueeze(dim)
    sample_dim = dim - 1 if dim > 0 else dim
    _close(out.unbind(), [e.unsqueeze(sample_dim) for e in expected])
    position = dim % (y.dim() + 1)
    assert out.ragged_dim == y.ragged_dim + (position <= y.ragged_dim)
    assert out.squeeze(position).ragged_dim == y.ragged_dim
    _close(out.squeeze(position).unbind(), expected)


def test_unsqueeze_refuses_the_batch_dim_and_dims_among_several_ragged_dims():
    y, _ = _heads()
    with pytest.raises(ValueError, match=r"unsqueeze\(0\)"):
        y.unsqueeze(0)
    images = nestbatch.nested([torch.randn(2, 3, 4), torch.randn(1, 5, 4)], num_ragged_dims=2)
    with pytest.raises(ValueError, match="after the 2 ragged dims"):
        images.unsqueeze(2)
    _close(images.unsqueeze(3).unbind(), [s.unsqueeze(2) for s in images.unbind()])


def test_flatten_defaults_to_torchs_start_dim_and_refuses_the_batch_dim():
    # torch's flatten() starts at dim 0 (torch.nested refuses it): it flattened the feature dims.
    b = nestbatch.nested([torch.randn(2, 3, 4), torch.randn(5, 3, 4)])
    for call in (lambda: b.flatten(), lambda: torch.flatten(b), lambda: b.flatten(end_dim=1)):
        with pytest.raises(ValueError, match=r"flatten\(0, \d\): only feature dims"):
            call()
    assert b.flatten(2).shape == b.flatten(start_dim=2, end_dim=-1).shape
    _close(b.flatten(2).unbind(), [s.flatten(1) for s in b.unbind()])


def test_flatten_before_a_moved_ragged_dim_moves_it_down():
    samples = _samples(2, 3, 4)
    y = nestbatch.nested(samples).permute(0, 2, 3, 1, 4)  # samples (2, 3, L, 4), ragged_dim 3
    out = y.flatten(1, 2)
    assert out.ragged_dim == 2
    _close(out.unbind(), [s.permute(1, 2, 0, 3).flatten(0, 1) for s in samples])


def test_unsqueeze_gradcheck_on_a_moved_batch():
    y, _ = _heads(lengths=(2, 0, 3))

    def fn(values):
        return y.with_values(values).unsqueeze(1).values

    assert torch.autograd.gradcheck(fn, (y.values.detach().clone().requires_grad_(),))

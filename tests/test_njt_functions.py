"""torch.nested's functions that nestbatch lacked: channel dropouts (``dropout1d`` / ``2d`` /
``3d``, ``feature_alpha_dropout``, ``feature_dropout``), ``native_dropout``, ``frexp``,
``argmax`` / ``argmin`` over every dim, ``broadcast_tensors`` and the ``new_*`` methods, each
against torch on every sample (or on the dense tensor of the batch's shape, for the random
ones' structure) and against torch.nested where it runs them."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from ragged_strategies import ragged_samples

import nestbatch
from nestbatch import Layout, NestedBatch

LAYOUTS = (Layout.PACKED, Layout.PADDED, Layout.LIST)


def _batch(samples, layout=Layout.PACKED, num_ragged_dims: int = 1) -> NestedBatch:
    return NestedBatch.from_list(samples, num_ragged_dims=num_ragged_dims).to(layout)


def _ones(lengths, *feature) -> NestedBatch:
    return nestbatch.nested([torch.ones(n, *feature) for n in lengths])


# ----------------------------------------------------------------------------- channel dropout
@pytest.mark.parametrize("layout", LAYOUTS)
def test_dropout1d_draws_one_value_per_row_of_a_sample(layout):
    # (B, j, D): dim 1 (the ragged dim) holds the channels, as torch's (N, C, L)
    torch.manual_seed(0)
    out = F.dropout1d(_ones([40, 30], 8).to(layout), 0.5)
    rows = out.packed().values
    assert set(rows.unique().tolist()) == {0.0, 2.0}
    assert torch.equal(rows, rows[:, :1].expand_as(rows))  # a row is all kept or all dropped
    assert 0 < (rows[:, 0] == 0).sum() < rows.shape[0]


def test_dropout1d_over_a_moved_ragged_dim_shares_a_draw_along_each_sample():
    # (B, C, j): the channels are a feature dim; one draw per sample and channel
    torch.manual_seed(1)
    out = F.dropout1d(_ones([5, 7, 6], 16).transpose(1, 2), 0.5)
    for sample in out.unbind():
        assert torch.equal(sample, sample[:, :1].expand_as(sample))
    draws = torch.cat([s[:, 0] for s in out.unbind()])
    assert set(draws.tolist()) == {0.0, 2.0}


def test_a_moved_ragged_dim_draws_as_torch_does_on_the_padded_samples():
    # (B, C, j): samples (C, L_i), one unbatched input each for dropout1d; the same seed gives
    # the draws torch gives the padded samples stacked
    samples = [torch.randn(4, 3), torch.randn(2, 3)]
    dense = torch.nn.utils.rnn.pad_sequence(samples, batch_first=True).transpose(1, 2)
    torch.manual_seed(3)
    expected = F.dropout1d(dense, 0.3)
    torch.manual_seed(3)
    got = F.dropout1d(nestbatch.nested(samples).transpose(1, 2), 0.3)
    for sample, row, n in zip(got.unbind(), expected, (4, 2)):
        assert torch.equal(sample, row[:, :n])


@pytest.mark.parametrize("func, args", [(F.feature_alpha_dropout, (0.5, True)),
                                        (torch.feature_dropout, (0.5, True)),
                                        (torch.feature_alpha_dropout, (0.5, True)),
                                        (F.dropout2d, (0.5,))])
def test_batched_samples_draw_per_row_and_channel(func, args):
    # samples (L_i, C, W): torch takes each as a batch (N=L_i, C), one draw per (row, channel)
    torch.manual_seed(10)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (dropout2d warns of 3-d inputs, as torch)
        rows = func(_ones([30, 20], 6, 5), *args).packed().values
    assert torch.equal(rows, rows[..., :1].expand_as(rows))
    assert rows[..., 0].unique().numel() == 2
    assert not torch.equal(rows[:, :1, 0].expand(-1, 6), rows[:, :, 0])  # (channels differ)


def test_samples_torch_refuses_raise_as_torch():
    # (B, j): 1-d samples, which dropout1d refuses, as torch for each sample
    with pytest.raises(RuntimeError, match="received a 1D input"):
        F.dropout1d(nestbatch.nested([torch.ones(n) for n in (5, 3)]), 0.5)


def test_dropout2d_and_3d_follow_torch_on_every_sample():
    torch.manual_seed(4)
    batch = _ones([6, 9], 4, 5)  # (B, j, 4, 5): samples (L_i, 4, 5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (torch warns of 3-d inputs to both)
        out2 = F.dropout2d(batch, 0.5)  # each sample an (N=L_i, C=4, L=5) batch
        torch.manual_seed(5)
        out3 = F.dropout3d(batch, 0.5)  # each sample one unbatched (C=L_i, D, H) input
    for sample in out2.unbind():
        assert torch.equal(sample, sample[..., :1].expand_as(sample))
    for sample in out3.unbind():
        flat = sample.flatten(1)
        assert torch.equal(flat, flat[:, :1].expand_as(flat))


def test_channel_dropout_keeps_the_batch_when_not_training_and_checks_as_torch():
    batch = _ones([3, 2], 4)
    assert F.dropout1d(batch, 0.5, training=False) is batch
    assert F.feature_alpha_dropout(batch, 0.5) is batch  # (its training defaults to False)
    with pytest.raises(ValueError, match="between 0 and 1"):
        F.dropout1d(batch, 1.5)
    with pytest.raises(RuntimeError, match="dropout1d: Expected 2D or 3D input"):
        F.dropout1d(_ones([3, 2], 4, 5, 6), 0.5)  # (4-d samples)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_channel_dropout_in_place_writes_the_stored_batch(layout):
    torch.manual_seed(6)
    batch = _ones([5, 3], 4).to(layout)
    result = F.dropout1d(batch, 0.5, inplace=True)
    assert result is batch
    rows = batch.packed().values
    assert set(rows.unique().tolist()) == {0.0, 2.0}
    torch.manual_seed(7)
    other = _ones([5, 3], 4).to(layout)
    torch.feature_dropout_(other, 0.5, True)
    assert set(other.packed().values.unique().tolist()) <= {0.0, 2.0}


def test_channel_dropout_gradient_is_the_mask_it_drew():
    torch.manual_seed(8)
    values = torch.ones(7, 3, dtype=torch.float64, requires_grad=True)
    batch = NestedBatch.from_lengths(values, [4, 3])
    out = F.dropout1d(batch, 0.5)
    out.sum().backward()
    assert torch.equal(values.grad, out.packed().values.detach())


def test_native_dropout_gives_the_output_and_its_mask_as_batches():
    torch.manual_seed(9)
    batch = _ones([4, 2], 6)
    output, mask = torch.native_dropout(batch, 0.5, True)
    assert isinstance(output, NestedBatch) and isinstance(mask, NestedBatch)
    assert mask.dtype == torch.bool and output.partition is batch.partition
    assert torch.equal(output.packed().values, mask.packed().values.double().float() * 2)


# ------------------------------------------------------------------------------------- frexp
@settings(max_examples=40, deadline=None)
@given(ragged_samples(dtypes=(torch.float16, torch.bfloat16, torch.float32, torch.float64)),
       st.sampled_from(LAYOUTS))
def test_frexp_is_torchs_on_every_sample(drawn, layout):
    samples, k = drawn
    if not samples:
        return
    specials = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, 0.0, 3.0])
    samples = [s.clone() for s in samples]
    for s in samples:
        flat = s.view(-1) if s.is_contiguous() else None
        if flat is not None and flat.numel():
            flat[: specials.numel()] = specials[: flat.numel()].to(s.dtype)
    mantissa, exponent = torch.frexp(_batch(samples, layout, k))
    for m, e, s in zip(mantissa.unbind(), exponent.unbind(), samples):
        expected = torch.frexp(s)
        torch.testing.assert_close(m, expected.mantissa, equal_nan=True, rtol=0, atol=0)
        assert torch.equal(e, expected.exponent)


def test_frexp_method_return_type_and_errors_match_torch():
    batch = nestbatch.nested([torch.tensor([8.0, 0.25]), torch.tensor([-3.0])])
    result = batch.frexp()
    assert type(result) is torch.return_types.frexp
    assert result.exponent.dtype == torch.int32
    with pytest.raises(RuntimeError, match="floating-point"):
        torch.frexp(nestbatch.nested([torch.tensor([1, 2])]))
    with pytest.raises(TypeError, match="out="):
        torch.frexp(batch, out=(torch.empty(3), torch.empty(3, dtype=torch.int32)))


# ------------------------------------------------------------------ argmax / argmin of all dims
def _flat_reference(batch: NestedBatch, func) -> torch.Tensor:
    return func(torch.cat([s.flatten() for s in batch.unbind()]))


@settings(max_examples=60, deadline=None)
@given(ragged_samples(num_ragged_dims=1, feature_dims=2, min_batch=1,
                      dtypes=(torch.float32, torch.int64, torch.float64)),
       st.sampled_from(LAYOUTS), st.integers(0, 3), st.booleans())
def test_argmax_argmin_of_all_dims_index_the_samples_flattened_in_turn(drawn, layout, order,
                                                                       nan):
    samples, _ = drawn
    if sum(s.numel() for s in samples) == 0:
        return
    samples = [(s // 8).clone() for s in samples]  # (small values: many ties)
    if nan and samples[0].dtype.is_floating_point and samples[-1].numel():
        samples[-1].view(-1)[-1] = float("nan")
    batch = _batch(samples, layout)
    permutations = ((0, 1, 2, 3), (0, 2, 1, 3), (0, 2, 3, 1), (0, 3, 1, 2))
    view = batch.permute(*permutations[order])  # (the ragged dim at every position)
    for func in (torch.argmax, torch.argmin):
        expected = _flat_reference(view, func)
        got = func(view)
        assert got.shape == () and got.dtype == torch.int64
        assert got.item() == expected.item()
        assert func(view, keepdim=True).shape == (1, 1, 1, 1)


def test_argmax_of_all_dims_matches_torch_nested():
    samples = [torch.tensor([[1.0, 5.0], [2.0, 0.0]]), torch.tensor([[7.0, 7.0]])]
    njt = torch.nested.nested_tensor(samples, layout=torch.jagged)
    batch = nestbatch.nested(samples)
    for func in (torch.argmax, torch.argmin):
        assert func(batch).item() == func(njt).item()


def test_argmax_of_no_element_raises_as_torch():
    with pytest.raises(IndexError, match="numel\\(\\) == 0"):
        torch.argmax(nestbatch.nested([torch.empty(0, 2), torch.empty(0, 2)]))


# --------------------------------------------------------------------------- broadcast_tensors
def test_broadcast_tensors_gives_every_tensor_the_common_shape():
    b = nestbatch.nested([torch.randn(2, 1, 4), torch.randn(3, 1, 4)])
    c = nestbatch.nested([torch.randn(2, 3, 1), torch.randn(3, 3, 1)])
    w, per_sample = torch.randn(4), torch.randn(2, 1, 1, 1)
    out = torch.broadcast_tensors(b, c, w, per_sample)
    assert all(isinstance(t, NestedBatch) and t.shape == (2, out[0].size(1), 3, 4) for t in out)
    for i, (sb, sc) in enumerate(zip(b.unbind(), c.unbind())):
        expected = torch.broadcast_tensors(sb, sc, w, per_sample[i])
        for got, want in zip(out, expected):
            assert torch.equal(got.unbind()[i], want)
    assert out[0].packed().values.data_ptr() == b.packed().values.data_ptr()  # (a view)


def test_broadcast_tensors_refuses_what_cannot_broadcast():
    b = nestbatch.nested([torch.randn(2, 1, 4), torch.randn(3, 1, 4)])
    with pytest.raises(ValueError, match="do not broadcast"):
        torch.broadcast_tensors(b, torch.randn(3, 1, 1, 4))  # (3 samples against 2)
    with pytest.raises(ValueError, match="keeps its dims"):
        torch.broadcast_tensors(b, torch.randn(1, 1, 1, 1, 4))
    with pytest.raises(ValueError, match="row structure"):
        torch.broadcast_tensors(b, nestbatch.nested([torch.randn(1, 1, 4)] * 2))


# ------------------------------------------------------------------------------ new_* methods
@pytest.mark.parametrize("layout", LAYOUTS)
def test_new_methods_make_plain_tensors_of_the_batchs_dtype_and_device(layout):
    batch = nestbatch.nested([torch.ones(2, 3, dtype=torch.float64)]).to(layout)
    reference = torch.ones(2, 3, dtype=torch.float64)
    for name, args, kwargs in (("new_zeros", ((2, 5),), {}), ("new_ones", (4,), {}),
                               ("new_full", ((2,), 7.0), {}), ("new_empty", ((0, 3),), {}),
                               ("new_tensor", ([1, 2],), {}),
                               ("new_empty_strided", ((2, 2), (1, 2)), {}),
                               ("new_zeros", ((3,),), {"dtype": torch.int32})):
        got = getattr(batch, name)(*args, **kwargs)
        expected = getattr(reference, name)(*args, **kwargs)
        assert type(got) is torch.Tensor
        assert got.shape == expected.shape and got.dtype == expected.dtype
        assert got.stride() == expected.stride()
        if name != "new_empty" and name != "new_empty_strided":
            assert torch.equal(got, expected)


# ------------------------------------------------------- hstack / vstack / dstack, atleast_*d
def test_stacks_are_torch_cat_of_the_tensors_made_at_least_so_many_dims():
    sa = [torch.randn(2, 3), torch.randn(1, 3), torch.randn(0, 3)]
    sb = [torch.randn(4, 3), torch.randn(2, 3), torch.randn(1, 3)]
    a, b = nestbatch.nested(sa), nestbatch.nested(sb)
    for func in (torch.hstack, torch.column_stack):  # along the ragged dim: per sample
        for got, x, y in zip(func([a, b]).unbind(), sa, sb):
            assert torch.equal(got, torch.cat([x, y]))
    for func in (torch.vstack, torch.row_stack):  # along the batch dim: the samples in turn
        assert [t.tolist() for t in func([a, b]).unbind()] == [s.tolist() for s in sa + sb]
    for got, x in zip(torch.dstack([a, a]).unbind(), sa):
        assert torch.equal(got, torch.cat([x, x], 1))
    flat = [torch.randn(2), torch.randn(3)]
    for got, x in zip(torch.dstack([nestbatch.nested(flat)] * 2).unbind(), flat):
        assert torch.equal(got, torch.stack([x, x], 1))  # ((B, j) batches gain a last dim)


def test_atleast_nd_as_torch():
    flat = nestbatch.nested([torch.randn(2), torch.randn(3)])
    assert torch.atleast_1d(flat) is flat and torch.atleast_2d(flat) is flat
    assert torch.atleast_3d(flat).shape == (2, flat.size(1), 1)
    one, dense = torch.atleast_3d(flat, torch.tensor(1.0))
    assert one.shape == (2, flat.size(1), 1) and dense.shape == (1, 1, 1)
    listed = torch.atleast_3d([flat])
    assert type(listed) is tuple and listed[0].shape == (2, flat.size(1), 1)


# ------------------------------------------------------------------------------------- .data
@pytest.mark.parametrize("layout", (Layout.PACKED, Layout.PADDED))  # (a list is not stamped)
def test_data_is_the_batch_detached_over_the_same_storage(layout):
    leaf = nestbatch.nested([torch.ones(2, 3), torch.ones(1, 3)]).to(layout).requires_grad_()
    data = leaf.data
    assert not data.requires_grad and leaf.requires_grad
    assert [t.tolist() for t in data.unbind()] == [t.tolist() for t in leaf.unbind()]
    stored = nestbatch.NestedBatch.from_padded(torch.ones(2, 3, 2), [3, 1]).to(layout)
    stored.packed()  # (a cached conversion, which the write must not leave stale)
    stored.data.mul_(2)
    assert all(bool((t == 2).all()) for t in stored.unbind())
    assert bool((stored.packed().values == 2).all())


def test_channel_dropout_of_samples_with_two_ragged_dims():
    # samples (H_i, W_i, C): each an (N=H_i, C=W_i, L=C) batch for dropout2d
    torch.manual_seed(12)
    batch = NestedBatch.from_list([torch.ones(3, 4, 5), torch.ones(2, 6, 5)],
                                  num_ragged_dims=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = F.dropout2d(batch, 0.5)
    for sample in out.unbind():
        assert torch.equal(sample, sample[..., :1].expand_as(sample))
        assert set(sample.unique().tolist()) <= {0.0, 2.0}


def test_a_dense_tensor_before_the_batch_in_a_feature_cat_is_checked_too():
    # (it skipped the check: rows of one sample landed in another when the totals matched)
    batch = NestedBatch.from_list([torch.ones(1, 2), torch.ones(2, 2), torch.ones(0, 2)])
    dense = torch.tensor([[[10.0]], [[20.0]], [[30.0]]])  # one row per sample
    for call in (lambda: torch.dstack([dense, batch]), lambda: torch.cat([dense, batch], -1),
                 lambda: torch.diff(batch, dim=2, prepend=torch.ones(3, 1, 1))):
        with pytest.raises(ValueError, match="same row structure"):
            call()


# ------------------------------------------------------------------------------- tril / triu
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name", ["tril", "triu"])
def test_tril_triu_are_torchs_on_every_sample(layout, name):
    gen = torch.Generator().manual_seed(1)
    samples = [torch.randn(n, 3, generator=gen, dtype=torch.float64) for n in (4, 1, 0, 5)]
    samples[0][1, 2] = float("nan")  # (outside the triangle: zeroed, as torch's)
    batch = NestedBatch.from_list(samples).to(layout)
    deep = NestedBatch.from_list([torch.randn(n, 2, 3, generator=gen) for n in (2, 3)])
    for diagonal in (-2, -1, 0, 1, 3):
        func = getattr(torch, name)
        for got, sample in zip(func(batch, diagonal).unbind(), samples):  # (ragged rows)
            torch.testing.assert_close(got, func(sample, diagonal), equal_nan=True)
        for got, sample in zip(func(batch.transpose(1, 2), diagonal=diagonal).unbind(),
                               samples):  # (ragged columns)
            torch.testing.assert_close(got, func(sample.T, diagonal), equal_nan=True)
        for got, sample in zip(func(deep, diagonal).unbind(), deep.unbind()):  # (features)
            assert torch.equal(got, func(sample, diagonal))
    written = batch.clone()
    getattr(written, name + "_")(1)
    for got, sample in zip(written.unbind(), samples):
        torch.testing.assert_close(got, getattr(torch, name)(sample, 1), equal_nan=True)
    values = torch.randn(10, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda v: getattr(torch, name)(
        NestedBatch.from_lengths(v, [4, 1, 0, 5])).values, (values,))
    with pytest.raises(RuntimeError, match="at least 2 dimensions"):
        getattr(torch, name)(nestbatch.nested([torch.randn(2), torch.randn(3)]))

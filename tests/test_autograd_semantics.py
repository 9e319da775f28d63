"""Gradients where a batch is written in place, cut, or handed to in-place activations, against
per-sample torch (float64); found by an audit of the batch's autograd semantics."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from nestbatch import Layout, NestedBatch

D = torch.float64
LAYOUTS = (Layout.PACKED, Layout.PADDED, Layout.LIST)


def _samples() -> list[torch.Tensor]:
    return [torch.tensor([[1.0, 2], [3, 4], [5, 6]], dtype=D), torch.tensor([[7.0, 8]], dtype=D)]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_view_made_before_a_differentiable_write_carries_its_graph(layout):
    # The view's rows are rewritten from the stored layout: with the write's graph.
    weight = torch.tensor([2.0, 3.0], dtype=D, requires_grad=True)
    batch = NestedBatch.from_list(_samples()).to(layout)
    column = batch[..., 0]
    batch.mul_(weight)
    (column * 1).sum(1).sum().backward()
    expected = torch.tensor([1.0 + 3 + 5 + 7, 0.0], dtype=D)  # d/dw of sum(x[:, 0] * w[0])
    assert torch.equal(weight.grad, expected)


@pytest.mark.parametrize("make", [
    lambda xs: NestedBatch.from_offsets(torch.cat(xs), torch.tensor([0, 3, 4])),
    lambda xs: NestedBatch.from_list(xs),
])
def test_a_write_into_a_converted_layout_reaches_the_batch_with_its_graph(make):
    weight = torch.tensor([2.0, 3.0], dtype=D, requires_grad=True)
    batch = make(_samples())
    batch.padded().data.mul_(weight)  # (copied back into the stored layout at the next read)
    (batch.packed().values.sum(0) * 1).sum().backward()
    assert torch.equal(weight.grad, torch.tensor([16.0, 20.0], dtype=D))


def test_backward_through_a_prefix_slice_of_device_offsets_is_torchs():
    rows = torch.randn(9, 4, dtype=D, requires_grad=True)
    offsets = torch.tensor([0, 3, 4, 9])  # (a tensor: sizes are not read on the host)

    def sliced(values):
        return NestedBatch.from_offsets(values, offsets)[:, :2].sum(1)

    def per_sample(values):
        return torch.stack([values[a:b][:2].sum(0) for a, b in ((0, 3), (3, 4), (4, 9))])

    assert torch.equal(sliced(rows), per_sample(rows))
    assert torch.autograd.gradcheck(sliced, (rows,))


@pytest.mark.parametrize("activation", [
    lambda t: F.silu(t, inplace=True), F.elu_, F.relu_, lambda t: F.leaky_relu(t, 0.1, True),
    F.hardtanh_, lambda t: F.mish(t, inplace=True), F.selu_, F.celu_,
    lambda t: F.threshold_(t, 0.1, -1.0), nn.ELU(inplace=True), nn.Hardswish(inplace=True),
])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_in_place_activations_backpropagate_as_torchs(activation, layout):
    torch.manual_seed(0)
    linear = nn.Linear(2, 2).double()
    samples = _samples()
    for s in samples:
        activation(linear(s)).pow(2).sum().backward()
    expected = linear.weight.grad.clone()
    linear.zero_grad()
    batch = NestedBatch.from_list(samples).to(layout)
    out = activation(linear(batch))
    out.pow(2).sum(1).sum().backward()
    torch.testing.assert_close(linear.weight.grad, expected)


def test_grad_can_be_cleared_and_set():
    batch = NestedBatch.from_list(_samples()).requires_grad_()
    (batch * 2).sum(1).sum().backward()
    assert batch.grad is not None
    batch.grad = None
    assert batch.grad is None
    batch.grad = torch.ones_like(batch) * 3
    assert torch.equal(batch.grad.to_padded_tensor(0.0),
                       (torch.ones_like(batch) * 3).to_padded_tensor(0.0))
    with pytest.raises(TypeError):
        batch.grad = torch.zeros(2)


def test_a_batch_in_another_argument_than_the_input_is_refused_clearly():
    batch = NestedBatch.from_list(_samples())
    for call in (lambda: F.linear(torch.randn(2, 2, dtype=D), batch),
                 lambda: F.embedding(torch.tensor([0]), batch),
                 lambda: F.layer_norm(torch.randn(2, 2, dtype=D), (2,), batch)):
        with pytest.raises(TypeError, match="as its input"):
            call()


def test_a_leading_python_number_keeps_its_precision():
    batch = NestedBatch.from_list(_samples())
    for func in (torch.add, torch.sub, torch.mul, torch.div, torch.pow, torch.float_power,
                 torch.remainder, torch.xlogy):
        got = func(0.1, batch).unbind()
        assert all(torch.equal(g, func(0.1, s)) for g, s in zip(got, _samples())), func
    assert torch.equal(torch.pow(3.4e39, batch).values, torch.pow(3.4e39, batch.values))


def _padded_pair():
    data = torch.tensor([[[1.0, 2], [3, 4], [5, 6]], [[7.0, 8], [0, 0], [0, 0]]], dtype=D)
    samples = [data[0].clone().requires_grad_(), data[1, :1].clone().requires_grad_()]
    return NestedBatch.from_padded(data.requires_grad_(), [3, 1]), samples


@pytest.mark.parametrize("write, write_sample", [
    (lambda y, w: y.transpose(1, 2).add_(w), lambda s, w: s.T.add_(w)),
    (lambda y, w: y[..., 0].mul_(w), lambda s, w: s[..., 0].mul_(w)),
    (lambda y, w: y.to(Layout.PACKED).add_(w), lambda s, w: s.add_(w)),
])
def test_a_write_through_a_view_of_a_batch_that_needs_a_gradient_reaches_it(write, write_sample):
    # The view runs on a conversion that is not cached (its graph could not be reused): it is
    # watched and written back with its graph, as a torch view's write reaches its base.
    batch, samples = _padded_pair()
    weight = torch.tensor(10.0, dtype=D, requires_grad=True)
    y = batch * 1
    write(y, weight)
    loss = (y * y).sum(1).sum()
    loss.backward()
    expected_weight = weight.detach().clone().requires_grad_()
    reference = 0
    for sample in samples:
        ys = sample * 1
        write_sample(ys, expected_weight)
        reference = reference + (ys * ys).sum()
    assert torch.equal(loss.detach(), reference.detach())
    reference.backward()
    assert torch.equal(weight.grad, expected_weight.grad)
    assert torch.equal(batch.grad.to_padded_tensor(0.0),
                       torch.nn.utils.rnn.pad_sequence([s.grad for s in samples], True))


def test_a_view_of_a_batch_that_needs_a_gradient_sees_its_later_writes_with_their_graph():
    batch, samples = _padded_pair()
    weight = torch.tensor(3.0, dtype=D, requires_grad=True)
    y = batch * 1
    view = y.transpose(1, 2)
    y.mul_(weight)
    (view * 1).sum(2).sum().backward()
    assert torch.equal(weight.grad, torch.tensor(1.0 + 2 + 3 + 4 + 5 + 6 + 7 + 8, dtype=D))


def test_a_write_through_a_view_of_a_leaf_that_needs_a_gradient_raises_as_torch():
    leaf = NestedBatch.from_list([torch.ones(2, 2), torch.ones(1, 2)]).requires_grad_()
    leaf.to(Layout.PADDED).add_(10.0)
    with pytest.raises(RuntimeError, match="leaf Variable"):
        leaf.unbind()  # (raised at the leaf's next read, where the write would reach it)
    assert torch.equal(leaf.unbind()[0], torch.ones(2, 2))  # (raised once; values kept)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("reduce", [
    lambda b: b.sum(1), lambda b: b.mean(1), lambda b: torch.logsumexp(b, 1),
    lambda b: b.var(1), lambda b: b.mean((1, 2)),
    lambda b: F.layer_norm(b, b.shape[1:]).to_padded_tensor(0.0),
])
def test_reductions_over_the_ragged_dim_have_a_second_derivative(layout, reduce):
    # (torch.segment_reduce's backward has none: the sums run in a Function whose backward is
    # differentiable. No sample of one row: its variance is nan, for torch too.)
    samples = [torch.randn(n, 2, dtype=D, requires_grad=True) for n in (3, 2, 4)]

    def reduced(*xs):
        return reduce(NestedBatch.from_list(list(xs)).to(layout))

    assert torch.autograd.gradgradcheck(reduced, samples)


@pytest.mark.parametrize("layout", (Layout.PACKED, Layout.LIST))
def test_prod_over_the_ragged_dim_has_torchs_second_derivative_at_zeros(layout):
    # Samples with no, one, two and three zeros in a column.
    samples = [torch.tensor([[0.5, 1.0], [-1.0, 2.0], [0.5, 3.0]], dtype=D),
               torch.tensor([[0.0, 1.0], [-1.0, 2.0], [0.5, 3.0]], dtype=D),
               torch.tensor([[0.0, 1.0], [0.0, 2.0], [0.5, 3.0]], dtype=D),
               torch.tensor([[0.0, 1.0], [0.0, 2.0], [0.0, 3.0]], dtype=D)]
    for sample in samples:
        x = sample.clone().requires_grad_()
        batch = NestedBatch.from_list([x]).to(layout)
        grad, = torch.autograd.grad(batch.prod(1).sum(), x, create_graph=True)
        second, = torch.autograd.grad(grad.sum(), x)
        y = sample.clone().requires_grad_()
        expected_grad, = torch.autograd.grad(y.prod(0).sum(), y, create_graph=True)
        expected, = torch.autograd.grad(expected_grad.sum(), y)
        assert torch.equal(grad, expected_grad) and torch.equal(second, expected)
    leaves = [s.clone().requires_grad_() for s in samples]
    assert torch.autograd.gradgradcheck(
        lambda *xs: NestedBatch.from_list(list(xs)).to(layout).prod(1), leaves)


def test_watched_conversions_live_as_long_as_a_view_holds_them():
    # A temporary view's write is kept to the batch's next read; a conversion nothing else
    # holds is let go at that read (no memory kept for it).
    batch, samples = _padded_pair()
    weight = torch.tensor(10.0, dtype=D, requires_grad=True)
    y = batch * 1
    rows = [weakref.ref(y.transpose(1, 2).values) for _ in range(3)]  # (temporaries)
    y.sum(1)
    gc.collect()
    assert all(r() is None for r in rows)
    column = y[..., 0]  # (a view held across a read, written after it)
    y.sum(1)
    column.mul_(weight)
    loss = (y * y).sum(1).sum()
    loss.backward()
    expected = sum(float((s[:, 0] ** 2).sum()) for s in samples) * 2 * 10.0
    assert weight.grad.item() == expected


def test_a_view_over_a_conversion_takes_two_backward_passes_as_torchs_views():
    # (The conversion's index tensor is kept past the first backward, as a view keeps nothing.)
    batch, samples = _padded_pair()
    moved = batch.transpose(1, 2)
    (moved * 2).sum(2).sum().backward()
    (moved * 3).sum(2).sum().backward()
    grad = batch.grad.to_padded_tensor(0.0)
    expected = torch.nn.utils.rnn.pad_sequence([torch.full_like(s, 5.0) for s in samples], True)
    assert torch.equal(grad, expected)

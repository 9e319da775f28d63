"""Autograd on the batch itself, as on torch.nested's: ``backward``, ``torch.autograd.backward``
and ``torch.autograd.grad`` with batches as outputs, gradients and inputs; ``grad``,
``is_leaf``, ``retain_grad``, ``grad_fn``; checked against the same computation on each sample
with plain torch, in every layout."""

from __future__ import annotations

import pytest
import torch

import nestbatch
from nestbatch import Layout

LAYOUTS = list(Layout)


def _samples(dtype=torch.float64):
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(n, 3, generator=gen, dtype=dtype) for n in (2, 0, 4)]


def _leaf(layout):
    return nestbatch.nested(_samples(), layout=layout, requires_grad=True)


def _reference_grads(fn, weights):
    leaves = [s.clone().requires_grad_() for s in _samples()]
    for leaf, w in zip(leaves, weights):
        fn(leaf).backward(w)
    return [leaf.grad for leaf in leaves]


def _sample_grads(batch):
    return list(batch.grad.unbind())


def _function(x):
    return (x * 2).sin() + x


@pytest.mark.parametrize("layout", LAYOUTS)
def test_backward_of_a_batch_gives_the_per_sample_gradients(layout):
    x = _leaf(layout)
    assert x.is_leaf and x.requires_grad and x.grad is None and x.grad_fn is None
    y = _function(x)
    assert not y.is_leaf and y.grad_fn is not None
    weights = [torch.randn(s.shape, dtype=s.dtype) for s in _samples()]
    y.backward(nestbatch.nested(weights))
    expected = _reference_grads(_function, weights)
    for got, want in zip(_sample_grads(x), expected):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_autograd_backward_accumulates_and_takes_inputs(layout):
    x, other = _leaf(layout), _leaf(layout)
    torch.autograd.backward([x * other], [torch.ones_like(x)], inputs=[x])
    assert other.grad is None
    torch.autograd.backward(x * 3, torch.ones_like(x))  # accumulates, as torch does
    for got, s in zip(_sample_grads(x), _samples()):
        torch.testing.assert_close(got, s + 3)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_autograd_grad_returns_batches_for_batch_inputs(layout):
    x = _leaf(layout)
    dense = torch.randn(3, dtype=torch.float64, requires_grad=True)
    out = x * dense
    gx, gd = torch.autograd.grad(out, (x, dense), torch.ones_like(out))
    assert isinstance(gx, nestbatch.NestedBatch) and x.grad is None
    for got in gx.unbind():
        torch.testing.assert_close(got, dense.detach().expand_as(got))
    torch.testing.assert_close(gd, torch.cat(_samples()).sum(0))
    unused = _leaf(layout)
    assert torch.autograd.grad(out, [unused], torch.ones_like(out), allow_unused=True) == (None,)


def test_autograd_grad_with_create_graph_differentiates_twice():
    x = _leaf(Layout.PACKED)
    (g,) = torch.autograd.grad(x.pow(3), x, torch.ones_like(x), create_graph=True)
    (gg,) = torch.autograd.grad(g, x, torch.ones_like(g))
    for got, s in zip(gg.unbind(), _samples()):
        torch.testing.assert_close(got, 6 * s)


def test_retain_grad_keeps_the_gradient_of_an_intermediate_batch():
    x = _leaf(Layout.PACKED)
    mid = x * 2
    mid.retain_grad()
    (mid * mid).backward(torch.ones_like(mid))
    for got, s in zip(mid.grad.unbind(), _samples()):
        torch.testing.assert_close(got, 4 * s)


def test_requires_grad_and_detach_on_a_batch():
    x = nestbatch.nested(_samples())
    assert not x.requires_grad and x.is_leaf
    assert x.requires_grad_() is x and x.requires_grad
    assert not x.detach().requires_grad
    x.sum(dim=1).backward(torch.ones_like(x.sum(dim=1)))
    assert all(torch.equal(g, torch.ones_like(g)) for g in x.grad.unbind())


def test_a_moved_ragged_dim_backpropagates():
    x = _leaf(Layout.PACKED)
    y = x.transpose(1, 2) * 2
    y.backward(torch.ones_like(y))
    for got in x.grad.unbind():
        torch.testing.assert_close(got, torch.full_like(got, 2.0))


def test_gradcheck_through_a_batch_output():
    samples = _samples()

    def fn(values):
        batch = nestbatch.NestedBatch.from_lengths(values, [2, 0, 4])
        return torch.autograd.grad(
            _function(batch), batch, torch.ones_like(batch), create_graph=True
        )[0].values

    values = torch.cat(samples).requires_grad_()
    assert torch.autograd.gradcheck(fn, (values,))


def test_bad_gradients_raise_as_torch_does():
    x = _leaf(Layout.PACKED)
    y = x * 2
    with pytest.raises(RuntimeError, match="implicitly created only for scalar outputs"):
        y.backward()
    with pytest.raises(TypeError, match="must be a NestedBatch"):
        y.backward(torch.ones(6, 3, dtype=torch.float64))
    other = nestbatch.nested([torch.ones(1, 3, dtype=torch.float64)] * 3)
    with pytest.raises(ValueError, match="structure|shape"):
        y.backward(other)
    with pytest.raises(RuntimeError, match="must match"):
        y.backward(nestbatch.nested([torch.ones(n, 2, dtype=torch.float64) for n in (2, 0, 4)]))
    with pytest.raises(RuntimeError, match="one per output"):
        torch.autograd.backward([y, y], [torch.ones_like(y)])

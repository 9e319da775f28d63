"""torch.compile of functions that take NestedBatches (issue #17, part): one graph
(``fullgraph=True``) for the common model vocabulary, results equal to eager, and a training
step whose gradients equal eager's."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

import nestbatch as nb
from nestbatch import NestedBatch


def _batch(features=16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return NestedBatch.from_lengths(torch.randn(20, features, generator=gen), [3, 5, 2, 10])


torch.manual_seed(0)
_LIN, _LN, _EMB = torch.nn.Linear(16, 16), torch.nn.LayerNorm(16), torch.nn.Embedding(50, 16)

VOCABULARY = {
    "elementwise": (lambda x: torch.exp(x) * 2 + 1, _batch),
    "linear_layernorm_gelu": (lambda x: F.gelu(_LN(_LIN(x))), _batch),
    "embedding": (lambda i: _EMB(i), lambda: NestedBatch.from_lengths(
        torch.randint(0, 50, (20,), generator=torch.Generator().manual_seed(1)), [3, 5, 2, 10])),
    "sum_over_ragged": (lambda x: torch.sum(torch.relu(_LIN(x)), dim=1), _batch),
    "mean_method": (lambda x: x.mean(1), _batch),
    "softmax": (lambda x: torch.softmax(x, dim=1), _batch),
    "log_softmax": (lambda x: torch.log_softmax(x, dim=1), _batch),
    "prefix_slice": (lambda x: x[:, :2], _batch),
    "to_padded": (lambda x: x.to_padded_tensor(0.0), _batch),
    "to_packed": (lambda x: x.packed().values * 2, _batch),
    "sdpa": (lambda x: F.scaled_dot_product_attention(x, x, x),
             lambda: NestedBatch.from_lengths(torch.randn(20, 2, 8), [3, 5, 2, 10])),
}


def _plain(result):
    if isinstance(result, NestedBatch):
        return result.values
    if isinstance(result, nb.RaggedBatch):
        return result.tensor
    return result


@pytest.mark.parametrize("name", sorted(VOCABULARY))
def test_vocabulary_compiles_in_one_graph_and_equals_eager(name):
    fn, make = VOCABULARY[name]
    torch._dynamo.reset()
    x = make()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")(x)
    torch.testing.assert_close(_plain(compiled), _plain(fn(x)))


def test_batched_indexing_access_compiles():
    torch._dynamo.reset()
    data = torch.randn(4, 5, 6)
    indices = nb.RaggedBatch(torch.tensor([[0, 4, 1], [-1, 2, 3], [9, 9, 9], [1, 0, 9]]),
                             sample_sizes=torch.tensor([1, 3, 0, 2]))
    fn = nb.batched_indexing_access
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")(data, indices)
    assert torch.equal(compiled.tensor, fn(data, indices).tensor)  # -1 resolved as eager


def test_training_step_gradients_equal_eager():
    torch._dynamo.reset()
    model = torch.nn.Linear(16, 4)
    batch = _batch()

    def loss_fn(b):
        scores = model(b)
        return torch.softmax(scores, dim=1).values.pow(2).sum() + torch.sum(scores, dim=1).mean()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.compile(loss_fn, fullgraph=True, backend="aot_eager")(batch).backward()
    compiled_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    loss_fn(batch).backward()
    for got, param in zip(compiled_grads, model.parameters()):
        torch.testing.assert_close(got, param.grad)


@pytest.mark.slow
def test_inductor_on_the_cpu():
    torch._dynamo.reset()
    fn, make = VOCABULARY["sum_over_ragged"]
    x = make()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled = torch.compile(fn, fullgraph=True, backend="inductor")(x)
    torch.testing.assert_close(compiled, fn(x))

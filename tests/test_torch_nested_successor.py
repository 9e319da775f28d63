"""torch.nested code on nestbatch: Python lists in the constructor, torch.nested's functional
spellings, errors catchable as torch's ``RuntimeError``, and ``layer_norm`` over whole samples,
each against torch.nested's own answer on the same inputs (or a per-sample reference)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import nestbatch
from nestbatch import NestedBatch
from nestbatch import torch_nested as tn
from nestbatch.errors import NestedIndexError, NestedTypeError, NestedValueError


def _njt(samples):
    return torch.nested.nested_tensor(samples, layout=torch.jagged)


def _same_samples(batch, njt):
    got, want = batch.unbind(), njt.unbind()
    assert len(got) == len(want)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)


# ---------------------------------------------------------------------------- the constructor
@pytest.mark.parametrize("data", [
    [[1.0, 2.0], [3.0]],
    [[[1, 2], [3, 4]], [[5, 6]]],
    [[True, False], [True]],
    [[1.5], []],
])
def test_nested_reads_python_lists_as_torch_nested_does(data):
    _same_samples(nestbatch.nested(data), _njt(data))
    _same_samples(tn.nested_tensor(data, layout=torch.jagged), _njt(data))


def test_lists_in_a_given_dtype_are_read_in_it():
    batch = nestbatch.nested([[0.1, 0.2], [0.3]], dtype=torch.float64)
    assert batch.values.tolist() == [0.1, 0.2, 0.3]  # not rounded through float32


def test_lists_mixed_with_tensors_and_the_jagged_layout_argument():
    batch = nestbatch.nested([torch.tensor([1.0, 2.0]), [3.0]], layout=torch.jagged)
    assert batch.layout is nestbatch.Layout.PACKED and batch.lengths.tolist() == [2, 1]
    with pytest.raises(ValueError, match="torch.jagged"):
        nestbatch.nested([[1.0]], layout=torch.strided)


def test_pin_memory_argument():
    batch = nestbatch.nested([[1.0, 2.0], [3.0]], pin_memory=False)
    assert not batch.is_pinned()


# ---------------------------------------------------------------- torch.nested's functions
def test_to_padded_tensor_spelled_as_torch_nested():
    samples = [torch.randn(2, 3), torch.randn(4, 3)]
    batch = nestbatch.nested(samples)
    expected = torch.nested.to_padded_tensor(_njt(samples), -1.0)
    assert torch.equal(torch.nested.to_padded_tensor(batch, -1.0), expected)
    assert torch.equal(tn.to_padded_tensor(batch, -1.0), expected)
    wide = torch.nested.to_padded_tensor(_njt(samples), 0.0, (2, 6, 3))
    assert torch.equal(torch.nested.to_padded_tensor(batch, 0.0, (2, 6, 3)), wide)
    assert torch.equal(batch.to_padded_tensor(0.0, batch.shape), torch.stack(
        [F.pad(s, (0, 0, 0, 4 - len(s))) for s in samples]))


def test_narrow_as_torch_nested_narrow():
    base = torch.randn(5, 10, 20)
    starts = torch.tensor([0, 1, 2, 3, 4])
    lengths = torch.tensor([3, 2, 2, 1, 5])
    expected = torch.nested.narrow(base, 1, starts, lengths, layout=torch.jagged)
    _same_samples(tn.narrow(base, 1, starts, lengths, layout=torch.jagged), expected)
    _same_samples(tn.narrow(base, 1, 2, 3, layout=torch.jagged),
                  torch.nested.narrow(base, 1, 2, 3, layout=torch.jagged))
    with pytest.raises(ValueError, match="dim=1"):
        tn.narrow(base, 2, 0, 1)
    with pytest.raises(ValueError, match="inside dim 1"):
        tn.narrow(base, 1, 8, 3)


@pytest.mark.parametrize("mask", [
    torch.tensor([[False, False, True], [True, False, True], [False, False, True]]),
    torch.tensor([False]),
    torch.tensor([True, False, True]),
])
def test_masked_select_as_torch_nested_masked_select(mask):
    tensor = torch.randn(3, 3)
    expected = torch.nested.masked_select(tensor, mask)
    got = tn.masked_select(tensor, mask)
    assert got.lengths.tolist() == expected.offsets().diff().tolist()
    torch.testing.assert_close(got.values, expected.values())


def test_nested_tensor_from_jagged_with_offsets_lengths_or_both():
    values = torch.randn(10, 4)
    offsets = torch.tensor([0, 3, 7, 10])
    lengths = torch.tensor([2, 1, 3])
    for kwargs in ({"offsets": offsets}, {"lengths": offsets.diff()},
                   {"offsets": offsets, "lengths": lengths}):
        expected = torch.nested.nested_tensor_from_jagged(values, **kwargs)
        got = tn.nested_tensor_from_jagged(values, **kwargs)
        for g, e in zip(got.unbind(), expected.unbind()):
            torch.testing.assert_close(g, e)
    assert tn.nested_tensor_from_jagged(values, offsets).values.data_ptr() == values.data_ptr()
    with pytest.raises(ValueError, match="offsets or lengths"):
        tn.nested_tensor_from_jagged(values)


def test_as_nested_tensor_keeps_the_autograd_history():
    leaf = torch.randn(3, 4, 2, requires_grad=True)
    batch = tn.as_nested_tensor(leaf * 2)
    assert batch.shape[0] == 3 and batch.shape[2:] == (2,) and batch.requires_grad
    batch.values.sum().backward()
    assert torch.equal(leaf.grad, torch.full_like(leaf, 2.0))
    listed = tn.as_nested_tensor([torch.ones(2, requires_grad=True), torch.ones(1)])
    assert listed.requires_grad


# ------------------------------------------------------------------------ RuntimeError
@pytest.mark.parametrize("call, kind, dtype", [
    (lambda b: torch.softmax(b, dim=0), NestedValueError, torch.float32),
    (lambda b: torch.cumsum(b, 0), NestedValueError, torch.float32),
    (lambda b: torch.kron(b, b), NestedTypeError, torch.float32),
    (lambda b: b.sum(dim=7), NestedIndexError, torch.float32),
    (lambda b: b.to_padded_tensor(2**40), NestedValueError, torch.int32),
])
def test_errors_of_torch_functions_are_also_runtime_errors(call, kind, dtype):
    batch = nestbatch.nested([torch.randn(2, 3), torch.randn(1, 3)]).to(dtype)
    with pytest.raises(RuntimeError) as caught:
        call(batch)
    assert isinstance(caught.value, kind)


def test_torch_nested_raises_runtime_error_where_nestbatch_raises_one():
    samples = [torch.randn(2, 3), torch.randn(1, 3)]
    for make in (_njt, nestbatch.nested):
        with pytest.raises(RuntimeError):
            torch.softmax(make(samples), dim=0)


# ------------------------------------------------------------------- layer norm over samples
@pytest.mark.parametrize("func", [F.layer_norm, F.rms_norm])
@pytest.mark.parametrize("features", [(4,), (2, 3)])
def test_norm_over_the_ragged_dim_normalizes_each_sample(func, features):
    gen = torch.Generator().manual_seed(0)
    samples = [torch.randn(n, *features, generator=gen, dtype=torch.float64) for n in (3, 1, 0, 5)]
    batch = nestbatch.nested(samples)
    out = func(batch, batch.shape[batch.ragged_dim:])
    for got, sample in zip(out.unbind(), samples):
        if sample.numel():
            torch.testing.assert_close(got, func(sample, sample.shape))
    if func is F.layer_norm:
        njt = _njt(samples[:2] + samples[3:])  # (torch.nested's needs no empty sample)
        expected = F.layer_norm(njt, njt.shape[njt._ragged_idx:])
        kept = nestbatch.nested(samples[:2] + samples[3:])
        _same_samples(F.layer_norm(kept, kept.shape[1:]), expected)


def test_norm_over_the_ragged_dim_gradcheck_and_refusals():
    lengths = [3, 1, 2]
    values = torch.randn(6, 4, dtype=torch.float64, requires_grad=True)

    def fn(v):
        batch = NestedBatch.from_lengths(v, lengths)
        return F.layer_norm(batch, batch.shape[1:], eps=1e-3).values

    assert torch.autograd.gradcheck(fn, (values,))
    batch = NestedBatch.from_lengths(values.detach(), lengths)
    with pytest.raises(RuntimeError, match="no weight or bias"):
        F.layer_norm(batch, batch.shape[1:], weight=torch.ones(4))
    with pytest.raises(RuntimeError, match="batch dim"):
        F.layer_norm(batch, batch.shape)
    other = nestbatch.nested([torch.randn(n, 4, dtype=torch.float64) for n in (2, 2, 2)])
    with pytest.raises(RuntimeError, match="own"):
        F.layer_norm(batch, other.shape[1:])


# ------------------------------------------------------------- torch.nested's shape methods
def _both(samples):
    return nestbatch.nested(samples), _njt(samples)


def test_unflatten_chunk_split_narrow_of_feature_dims_as_torch_nested():
    samples = [torch.randn(n, 6) for n in (2, 3, 1)]
    batch, njt = _both(samples)
    _same_samples(batch.unflatten(-1, (2, 3)), njt.unflatten(-1, (2, 3)))
    for got, want in zip(batch.chunk(3, dim=-1), njt.chunk(3, dim=-1)):
        _same_samples(got, want)
    for got, want in zip(batch.split([2, 4], dim=-1), njt.split([2, 4], dim=-1)):
        _same_samples(got, want)
    parts = torch.tensor_split(batch, 2, dim=2)
    for i, part in enumerate(parts):
        for got, sample in zip(part.unbind(), samples):
            torch.testing.assert_close(got, sample.tensor_split(2, dim=1)[i])
    _same_samples(batch.narrow(2, 1, 3), njt.narrow(2, 1, 3))
    narrowed = batch.narrow(1, 0, 1)  # the ragged dim: torch's narrow of every sample
    for got, sample in zip(narrowed.unbind(), samples):
        torch.testing.assert_close(got, sample.narrow(0, 0, 1))
    with pytest.raises(RuntimeError, match="exceeds dimension size"):
        batch.narrow(1, 1, 1)  # (past the end of the sample of length 1, as torch's)
    with pytest.raises(RuntimeError, match="only feature dims"):
        batch.chunk(2, dim=1)
    with pytest.raises(RuntimeError, match="only feature dims"):
        batch.unflatten(0, (1, 3))


def test_unflatten_before_a_moved_ragged_dim_moves_it():
    samples = [torch.randn(n, 6, 5) for n in (2, 3)]
    moved = nestbatch.nested(samples).transpose(1, 2)  # (B, 6, j, 5)
    out = moved.unflatten(1, (2, 3))
    assert out.ragged_dim == 3 and repr(out.shape) == "NestedSize([2, 2, 3, j1, 5])"
    for got, sample in zip(out.unbind(), samples):
        torch.testing.assert_close(got, sample.transpose(0, 1).unflatten(0, (2, 3)))


def test_numel_element_size_is_contiguous():
    samples = [torch.randn(n, 6) for n in (2, 3, 0)]
    batch, njt = _both(samples)
    assert batch.numel() == torch.numel(batch) == sum(s.numel() for s in samples) == 30
    assert batch.element_size() == njt.element_size() == 4
    assert batch.is_contiguous()
    strided = NestedBatch.from_lengths(torch.randn(6, 5).t(), [2, 3])
    assert not strided.is_contiguous() and strided.contiguous().is_contiguous()
    assert nestbatch.nested(samples).to(torch.float16).element_size() == 2


# ------------------------------------------- the migration guide's transformer block, compiled
class _Block(torch.nn.Module):
    """docs/migrating_from_torch_nested.rst's block, written as for torch.nested."""

    def __init__(self, dim=16, heads=4):
        super().__init__()
        self.heads, self.norm = heads, torch.nn.LayerNorm(dim)
        self.qkv, self.out = torch.nn.Linear(dim, 3 * dim), torch.nn.Linear(dim, dim)

    def forward(self, x):
        q, k, v = self.qkv(self.norm(x)).chunk(3, dim=-1)
        # (B, j, D) -> (B, j, H, E) -> (B, H, j, E)
        q, k, v = (t.unflatten(-1, (self.heads, -1)).transpose(1, 2) for t in (q, k, v))
        attended = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).flatten(-2)
        return x + self.out(attended)


def test_the_guide_s_transformer_block_eager_compiled_and_per_sample():
    torch.manual_seed(0)
    block = _Block()
    compiled = torch.compile(block, fullgraph=True, backend="aot_eager")
    for lengths in ((3, 5, 2), (4, 1, 7, 2)):
        samples = [torch.randn(n, 16) for n in lengths]
        batch = nestbatch.nested(samples)
        out = block(batch)
        for got, sample in zip(out.unbind(), samples):
            torch.testing.assert_close(got, block(sample[None])[0])
        torch.testing.assert_close(compiled(batch).values, out.values)


# ------------------------------------------------------- found by the NJT conformance audit
def _pair():
    gen = torch.Generator().manual_seed(0)
    samples = [torch.randn(2, 4, generator=gen), torch.randn(3, 4, generator=gen)]
    return samples, nestbatch.nested(samples), _njt(samples)


@pytest.mark.parametrize("call", [
    lambda x: torch.sum(input=x, dim=1),
    lambda x: torch.mean(input=x, dim=1, keepdim=True),
    lambda x: torch.softmax(input=x, dim=-1),
    lambda x: torch.transpose(input=x, dim0=1, dim1=2),
    lambda x: torch.matmul(input=x, other=torch.ones(4, 2)),
    lambda x: F.linear(input=x, weight=torch.ones(5, 4)),
    lambda x: F.gelu(input=x),
    lambda x: torch.narrow(input=x, dim=2, start=1, length=2),
    lambda x: torch.nested.to_padded_tensor(input=x, padding=0.0),
])
def test_the_input_by_keyword_as_njt(call):
    # Every argument by keyword: the implementations read the batch from the positional
    # arguments, which were empty (an IndexError).
    samples, batch, njt = _pair()
    got, want = call(batch), call(njt)
    if isinstance(got, NestedBatch):
        _same_samples(got, want)
    else:
        torch.testing.assert_close(got, want)
    assert torch.equal(torch.unbind(input=batch)[1], samples[1])


@pytest.mark.parametrize("call", [
    lambda x: torch.addcmul(input=x, tensor1=x, tensor2=x, value=2),
    lambda x: torch.div(input=x, other=0.3, rounding_mode="floor"),
    lambda x: torch.polygamma(n=1, input=x.abs() + 1),
    lambda x: torch.zeros_like(input=x, dtype=torch.float64),
    lambda x: F.gelu(input=x, approximate="tanh"),
    lambda x: torch.prod(input=x, dtype=torch.float64),
    lambda x: torch.permute(input=x, dims=(0, 2, 1)),
    lambda x: torch.linalg.vector_norm(x=x, dim=2),
    lambda x: torch.where(condition=x > 0, input=x, other=torch.zeros(())),
    lambda x: F.layer_norm(input=x, normalized_shape=(4,), eps=1e-3),
])
def test_every_argument_by_keyword_as_per_sample(call):
    # Only the required parameters move into the positional arguments (keyword-only ones such
    # as value= or rounding_mode= stay keywords), named as torch's own signature names them.
    samples, batch, _ = _pair()
    got = call(batch)
    parts = got.unbind() if isinstance(got, NestedBatch) else [got]
    wants = [call(s[None])[0] for s in samples] if isinstance(got, NestedBatch) else [
        call(batch.values)]
    for part, want in zip(parts, wants):
        torch.testing.assert_close(part, want)


@pytest.mark.parametrize("name", ["sum", "amax", "any", "mean", "logsumexp", "var", "std"])
@pytest.mark.parametrize("dim", [None, (), []])
def test_a_reduction_of_every_dim_keeps_them_as_torch(name, dim):
    # dim=None / () with keepdim=True kept no dim (torch and NJT keep every one as 1).
    samples, batch, _ = _pair()
    x = batch > 0 if name == "any" else batch
    kwargs = {"keepdim": True} if dim is None and name in ("var", "std") else {
        "dim": dim, "keepdim": True}
    if name == "logsumexp" and dim is None:
        return  # (torch's logsumexp takes no dim=None)
    got = getattr(torch, name)(x, **kwargs)
    dense = torch.cat([s.flatten() for s in samples])
    dense = dense > 0 if name == "any" else dense
    want = getattr(torch, name)(dense, **({"dim": tuple(range(dense.dim()))}
                                          if name == "logsumexp" else {}))
    assert got.shape == (1, 1, 1)
    torch.testing.assert_close(got.flatten()[0], want)
    assert torch.linalg.vector_norm(batch, keepdim=True).shape == (1, 1, 1)


def test_flatten_refuses_a_start_after_the_end_as_torch():
    batch = nestbatch.nested([torch.randn(2, 3, 4), torch.randn(3, 3, 4)])
    with pytest.raises(RuntimeError, match="start_dim cannot come after end_dim"):
        batch.flatten(2, 1)  # (it gave the batch back unchanged)


def test_none_in_an_index_adds_a_feature_dim_as_njt():
    samples, batch, njt = _pair()
    for index in ((..., None), (..., 1, None)):
        _same_samples(batch[index], njt[index])
    for index in ((slice(None), slice(None), None),  # (NJT refuses these: dim 0 slices)
                  (slice(None), slice(1, None), None, slice(0, 2))):
        for got, s in zip(batch[index].unbind(), samples):
            assert torch.equal(got, s[None][index][0])
    moved = batch.transpose(1, 2)  # (B, 4, j): None before the ragged dim moves it
    got = moved[:, None]
    assert got.ragged_dim == 3
    for g, s in zip(got.unbind(), samples):
        assert torch.equal(g, s.T[None])
    with pytest.raises(TypeError, match="ragged dim 1 accepts only slices"):
        batch[:, None]


@pytest.mark.parametrize("dense", [(5, 4), (2, 5, 4), (1, 5, 4)])
def test_dense_at_a_batch_whose_ragged_dim_is_last_as_njt(dense):
    # torch.matmul(w, x.transpose(1, 2)): refused; NJT's answer is per-sample torch's.
    samples, batch, njt = _pair()
    w = torch.randn(*dense, generator=torch.Generator().manual_seed(2))
    got = torch.matmul(w, batch.transpose(1, 2))
    assert got.ragged_dim == 2
    for i, (g, s) in enumerate(zip(got.unbind(), samples)):
        torch.testing.assert_close(g, (w if w.dim() == 2 else w[min(i, w.shape[0] - 1)]) @ s.T)
    _same_samples(got, torch.matmul(w, njt.transpose(1, 2)))
    leaves = [s.double().requires_grad_() for s in samples]
    assert torch.autograd.gradcheck(
        lambda *xs: (w.double() @ NestedBatch.from_list(list(xs)).transpose(1, 2)
                     ).to_padded_tensor(0.0), leaves)


def test_more_pointwise_functions_as_njt():
    gen = torch.Generator().manual_seed(3)
    samples = [torch.rand(2, 3, generator=gen, dtype=torch.float64) + 0.5,
               torch.rand(0, 3, dtype=torch.float64)]
    batch = NestedBatch.from_list(samples)
    special = torch.special
    for call in (special.erfcx, special.bessel_j0, special.modified_bessel_k1,
                 special.spherical_bessel_j0, special.airy_ai,
                 lambda x: special.xlog1py(x, x + 1), lambda x: special.zeta(x + 1, x),
                 lambda x: special.chebyshev_polynomial_t(x, 3),
                 lambda x: special.polygamma(1, x), lambda x: torch.polygamma(2, x),
                 lambda x: x.polygamma(1), lambda x: torch.mvlgamma(x + 2, p=2),
                 lambda x: torch.logaddexp(x, x * 2), lambda x: torch.logaddexp2(x, x),
                 lambda x: torch.nextafter(x, x + 1), lambda x: torch.igamma(x, x * 2),
                 lambda x: torch.ldexp(x, torch.tensor(2)), torch.conj_physical):
        for got, s in zip(call(batch).unbind(), samples):
            torch.testing.assert_close(got, call(s))
    ints = NestedBatch.from_list([torch.tensor([[4, 6]]), torch.tensor([[9, 12], [5, 10]])])
    for got, s in zip(torch.gcd(ints, ints + 2).unbind(), ints.unbind()):
        assert torch.equal(got, torch.gcd(s, s + 2))
    copy = ints.clone()
    copy.lcm_(ints + 1)
    assert torch.equal(copy.values, torch.lcm(ints.values, ints.values + 1))

"""The ``nestbatch::*`` operators on the CPU: registrations (opcheck), agreement with the
pure-PyTorch references, wrapper validation, and tracing with ``torch.compile``."""

from __future__ import annotations

import pytest
import torch

from nestbatch import kernels
from nestbatch.compat import batched_indexing as bi
from nestbatch.conversions import packed_padded
from nestbatch.kernels import operators
from nestbatch.kernels import torch_impl as reference
from nestbatch.layouts import RowPartition

ops = torch.ops.nestbatch
DTYPES = [
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.int32,
    torch.int64,
    torch.bool,
]


def random_values(shape, dtype, generator, device="cpu"):
    if dtype == torch.bool:
        return torch.rand(shape, generator=generator) > 0.5
    if dtype.is_floating_point:
        return torch.randn(shape, generator=generator).to(dtype)
    return torch.randint(-1000, 1000, shape, generator=generator).to(dtype)


def ragged_case(seed, *, batch=5, feature=(3,), dtype=torch.float32, device="cpu"):
    """Random packed values, offsets (int64, some empty samples) and the max length."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 7, (batch,), generator=gen)
    lengths[0] = 0
    offsets = torch.zeros(batch + 1, dtype=torch.int64)
    torch.cumsum(lengths, 0, out=offsets[1:])
    total = int(offsets[-1])
    values = random_values((total, *feature), dtype, gen)
    max_len = int(lengths.max()) + 2
    return values.to(device), offsets.to(device), max_len


def index_case(
    seed,
    *,
    batch=4,
    sources=6,
    width=5,
    feature=(2,),
    dtype=torch.float32,
    unique=False,
    device="cpu",
    index_dtype=torch.int64,
):
    """Data ``(B, N, *D)``, indices ``(B, M)`` (garbage in padded slots), sizes ``(B,)``."""
    gen = torch.Generator().manual_seed(seed)
    data = random_values((batch, sources, *feature), dtype, gen)
    if unique:
        indices = torch.stack(
            [torch.randperm(sources, generator=gen)[:width] for _ in range(batch)]
        )
    else:
        indices = torch.randint(0, sources, (batch, width), generator=gen)
    sizes = torch.randint(0, width + 1, (batch,), generator=gen)
    valid = torch.arange(width) < sizes[:, None]
    # Padded slots may hold anything, even out-of-range values: they must never be read.
    indices = torch.where(valid, indices, torch.full_like(indices, 10_000))
    return (data.to(device), indices.to(device=device, dtype=index_dtype), sizes.to(device))


def mask_case(seed, *, batch=4, width=9, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    mask = torch.rand((batch, width), generator=gen) > 0.6
    mask[0] = False
    return mask.to(device)


def sample_inputs(device="cpu"):
    """One (op, args) pair per operator, float data requiring grad where differentiable."""
    values, offsets, max_len = ragged_case(0, device=device)
    values.requires_grad_()
    padded = ops.packed_to_padded(values.detach(), offsets, max_len, 0.5).requires_grad_()
    data, indices, sizes = index_case(1, device=device)
    data.requires_grad_()
    udata, uindices, usizes = index_case(2, unique=True, device=device)
    udata = udata[:, :5].contiguous()  # (B, M, *D) rows to scatter
    into = torch.randn(4, 7, 2, device=device, requires_grad=True)
    target = torch.randn(4, 8, 2, device=device, requires_grad=True)
    _, tindices, tsizes = index_case(3, sources=8, unique=True, device=device)
    mask = mask_case(4, width=6, device=device)
    return [
        (ops.packed_to_padded, (values, offsets, max_len, -1.0)),
        (ops.padded_to_packed, (padded, offsets, values.shape[0])),
        (ops.fill_padding, (padded, offsets.diff(), 7)),
        (ops.indexing_access, (data, indices, sizes, -2.0)),
        (ops.indexing_write, (udata.requires_grad_(), uindices, usizes, into)),
        (ops.inverse_indexing_access, (udata, uindices, usizes, 9, 3.0)),
        (ops.index_mapping, (data, indices, tindices, sizes.minimum(tsizes), target)),
        (ops.mask_to_indices, (mask, 5)),
        (ops.indices_to_mask, (uindices, usizes, 6)),
        (ops.bool_compaction, (data, mask, 5)),
    ]


@pytest.mark.parametrize("index", range(10))
def test_opcheck(index):
    op, args = sample_inputs()[index]
    torch.library.opcheck(op, args)


# ------------------------------------------------------------------- agreement with references
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", range(3))
def test_conversions_match_reference(dtype, seed):
    values, offsets, max_len = ragged_case(seed, dtype=dtype, feature=(2, 3))
    partition = RowPartition.from_offsets(offsets, max_len=max_len - 2)
    shape = (max_len,)
    padded = packed_padded.packed_values_to_padded(values, partition, shape, 1)
    expected = packed_padded.reference_packed_values_to_padded(values, partition, shape, 1)
    assert padded.dtype == dtype and torch.equal(padded, expected)
    packed = packed_padded.padded_data_to_packed(padded, partition)
    assert torch.equal(packed, packed_padded.reference_padded_data_to_packed(padded, partition))
    assert torch.equal(packed, values)
    refilled = kernels.fill_padding(padded, partition.lengths, 0)
    assert torch.equal(refilled, bi.fill_padding(padded, partition.lengths, 0))


@pytest.mark.parametrize("seed", range(3))
def test_conversion_gradients_match_reference(seed):
    values, offsets, max_len = ragged_case(seed, dtype=torch.float64)
    partition = RowPartition.from_offsets(offsets, max_len=max_len)
    a = values.clone().requires_grad_()
    b = values.clone().requires_grad_()
    weight = torch.randn(offsets.shape[0] - 1, max_len, 3, dtype=torch.float64)
    (packed_padded.packed_values_to_padded(a, partition, (max_len,), 2.0) * weight).sum().backward()
    (
        packed_padded.reference_packed_values_to_padded(b, partition, (max_len,), 2.0) * weight
    ).sum().backward()
    assert torch.equal(a.grad, b.grad)
    padded = weight.clone().requires_grad_()
    reference = weight.clone().requires_grad_()
    out = packed_padded.padded_data_to_packed(padded, partition)
    ref = packed_padded.reference_padded_data_to_packed(reference, partition)
    grad = torch.randn_like(out)
    out.backward(grad)
    ref.backward(grad)
    assert torch.equal(padded.grad, reference.grad)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_indexing_wrappers_match_reference(dtype, index_dtype):
    data, indices, sizes = index_case(5, dtype=dtype, index_dtype=index_dtype)
    assert torch.equal(
        kernels.indexing_access(data, indices, sizes, 1),
        bi.indexing_access(data, indices, sizes, 1),
    )
    udata, uindices, usizes = index_case(6, dtype=dtype, unique=True, index_dtype=index_dtype)
    udata = udata[:, :5].contiguous()
    into = random_values((4, 6, 2), dtype, torch.Generator().manual_seed(7))
    assert torch.equal(
        kernels.indexing_write(udata, uindices, usizes, into),
        bi.indexing_write(udata, uindices, usizes, into),
    )
    assert torch.equal(
        kernels.inverse_indexing_access(udata, uindices, usizes, 8, 0),
        bi.inverse_indexing_access(udata, uindices, usizes, 8, 0),
    )
    assert torch.equal(
        kernels.index_mapping(data, indices, uindices, usizes.minimum(sizes), into),
        bi.index_mapping(data, indices, uindices, usizes.minimum(sizes), into),
    )
    assert torch.equal(
        kernels.indices_to_mask(uindices, usizes, 7), bi.indices_to_mask(uindices, usizes, 7)
    )


@pytest.mark.parametrize("seed", range(4))
def test_mask_ops_match_reference(seed):
    mask = mask_case(seed, width=11)
    data = torch.randn(4, 11, 3)
    indices, counts = kernels.mask_to_indices(mask)
    ref_indices, ref_counts = bi.mask_to_indices(mask)
    assert torch.equal(indices, ref_indices) and torch.equal(counts, ref_counts)
    wide, _ = kernels.mask_to_indices(mask, max_count=20)
    assert wide.shape == (4, 20) and torch.equal(wide[:, : indices.shape[1]], indices)
    assert not wide[:, indices.shape[1] :].any()
    out, counts = kernels.bool_compaction(data, mask)
    ref_out, ref_counts = bi.bool_compaction(data, mask)
    assert torch.equal(out, ref_out) and torch.equal(counts, ref_counts)


def test_mask_to_indices_long_rows():
    mask = torch.rand(3, 5000, generator=torch.Generator().manual_seed(0)) > 0.3
    indices, counts = kernels.mask_to_indices(mask)
    ref_indices, ref_counts = bi.mask_to_indices(mask)
    assert torch.equal(indices, ref_indices) and torch.equal(counts, ref_counts)


def test_indexing_gradients_match_reference():
    data, indices, sizes = index_case(8, dtype=torch.float64)
    udata, uindices, usizes = index_case(9, dtype=torch.float64, unique=True)
    udata = udata[:, :5].contiguous()
    into = torch.randn(4, 6, 2, dtype=torch.float64)
    mask = mask_case(10, width=6)
    cases = [
        (
            lambda d, t: ops.indexing_access(d, indices, sizes, 3.0),
            lambda d, t: bi.indexing_access(d, indices, sizes, 3.0),
            data,
            into,
        ),
        (
            lambda d, t: ops.indexing_write(d, uindices, usizes, t),
            lambda d, t: bi.indexing_write(d, uindices, usizes, t),
            udata,
            into,
        ),
        (
            lambda d, t: ops.inverse_indexing_access(d, uindices, usizes, 7, 1.0),
            lambda d, t: bi.inverse_indexing_access(d, uindices, usizes, 7, 1.0),
            udata,
            into,
        ),
        (
            lambda d, t: ops.index_mapping(d, indices, uindices, sizes.minimum(usizes), t),
            lambda d, t: bi.index_mapping(d, indices, uindices, sizes.minimum(usizes), t),
            data,
            into,
        ),
        (
            lambda d, t: ops.bool_compaction(d, mask, 6)[0],
            lambda d, t: bi.bool_compaction(d, mask)[0],
            data,
            into,
        ),
        (
            lambda d, t: ops.fill_padding(d, sizes, 4.0),
            lambda d, t: bi.fill_padding(d, sizes, 4.0),
            data,
            into,
        ),
    ]
    for op, ref, first, second in cases:
        a, b = first.clone().requires_grad_(), second.clone().requires_grad_()
        c, d = first.clone().requires_grad_(), second.clone().requires_grad_()
        out, expected = op(a, b), ref(c, d)
        grad = torch.randn(expected.shape, dtype=expected.dtype)
        grad_out = (
            grad
            if out.shape == expected.shape
            else torch.nn.functional.pad(grad, (0, 0, 0, out.shape[1] - expected.shape[1]))
        )
        out.backward(grad_out)
        expected.backward(grad)
        assert torch.equal(a.grad, c.grad)
        assert (b.grad is None and d.grad is None) or torch.equal(b.grad, d.grad)


# ----------------------------------------------------------------------------------- validation
def test_out_of_range_index_raises():
    data, indices, sizes = index_case(11)
    bad = indices.clone()
    bad[1, 0] = 6
    sizes = sizes.clamp(min=1)
    with pytest.raises(IndexError, match="out of range"):
        kernels.indexing_access(data, bad, sizes)
    bad[1, 0] = -1
    with pytest.raises(IndexError):
        kernels.inverse_indexing_access(data[:, :5], bad, sizes, 6)
    with pytest.raises(IndexError):
        kernels.indices_to_mask(bad, sizes, 6)


def test_wrapper_argument_errors():
    data, indices, sizes = index_case(12)
    with pytest.raises(TypeError):
        kernels.indexing_access(data, indices.float(), sizes)
    with pytest.raises(TypeError):
        kernels.indexing_access(data.tolist(), indices, sizes)
    with pytest.raises(ValueError):
        kernels.indexing_access(data, indices[:2], sizes)
    with pytest.raises(ValueError):
        kernels.packed_to_padded(torch.randn(3, 2), torch.tensor([0, 3]), -1)
    with pytest.raises(TypeError):
        kernels.packed_to_padded(torch.randn(3, 2), torch.tensor([0, 3]), 2.5)
    with pytest.raises(ValueError):
        kernels.padded_to_packed(torch.randn(2, 3), torch.tensor([0, 1, 2, 3]), 3)
    with pytest.raises(ValueError):
        kernels.bool_compaction(data, torch.ones(4, 3, dtype=torch.bool))
    with pytest.raises(TypeError):
        kernels.fill_padding(data, sizes, "x")


def test_fallback_is_the_reference_on_cpu():
    # The device-agnostic implementation is the reference function itself.
    values, offsets, max_len = ragged_case(13)
    direct = operators.packed_to_padded_torch(values, offsets, max_len, 0)
    assert torch.equal(ops.packed_to_padded(values, offsets, max_len, 0), direct)


# ------------------------------------------------------------------------------ torch.compile
def _pipeline(values, offsets, indices, sizes):
    padded = ops.packed_to_padded(values, offsets, 6, 0.0)
    picked = ops.indexing_access(padded, indices, sizes, -1.0)
    refilled = ops.fill_padding(picked, sizes, 0.0)
    packed = ops.padded_to_packed(padded * 2, offsets, values.shape[0])
    return packed.sum() + refilled.sum()


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compile_fullgraph(backend):
    torch._dynamo.reset()
    values, offsets, _ = ragged_case(14, batch=3)
    offsets = torch.tensor([0, 2, 2, 6])
    values = torch.randn(6, 3, requires_grad=True)
    indices = torch.tensor([[1, 0, 3], [0, 0, 0], [5, 2, 2]])
    sizes = torch.tensor([2, 0, 3])
    compiled = torch.compile(_pipeline, fullgraph=True, backend=backend)
    out = compiled(values, offsets, indices, sizes)
    out.backward()
    expected_values = values.detach().clone().requires_grad_()
    expected = _pipeline(expected_values, offsets, indices, sizes)
    expected.backward()
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(values.grad, expected_values.grad)


def test_compile_wrappers_fullgraph():
    torch._dynamo.reset()
    values = torch.randn(6, 3)
    offsets = torch.tensor([0, 2, 2, 6])

    def roundtrip(values, offsets):
        padded = kernels.packed_to_padded(values, offsets, 4, 0.0)
        return kernels.padded_to_packed(padded, offsets, 6)

    compiled = torch.compile(roundtrip, fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(values, offsets), values)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
def test_cpu_block_copy_path_matches_gather(dtype):
    # Large samples take the whole-sample block-copy path on the CPU; it must equal the gather.
    values, offsets, max_len = ragged_case(15, batch=3, feature=(4096,), dtype=dtype)
    assert reference._blocks_pay_off(values, offsets)
    bounds = offsets.tolist()
    for length in (max_len, max_len + 2):
        padded = ops.packed_to_padded(values, offsets, length, 1)
        expected = values.new_full((3, length, 4096), 1)
        for b, (start, stop) in enumerate(zip(bounds, bounds[1:])):
            expected[b, : stop - start] = values[start:stop]
        assert torch.equal(padded, expected)
        assert torch.equal(ops.padded_to_packed(padded, offsets, values.shape[0]), values)

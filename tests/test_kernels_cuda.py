"""The compiled CUDA kernels against the PyTorch implementation: exactly equal outputs and
gradients on random ragged inputs over every supported dtype, opcheck on CUDA, bounds errors as
Python exceptions. Skipped without a CUDA device."""

from __future__ import annotations

import pytest
import torch
from test_kernels import DTYPES, index_case, mask_case, ragged_case, sample_inputs

from nestbatch import kernels
from nestbatch.compat import batched_indexing as bi
from nestbatch.kernels import operators

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
ops = torch.ops.nestbatch


@pytest.fixture(scope="module", autouse=True)
def compiled():
    assert kernels.load_extension(), kernels.extension_status()
    return torch.ops.nestbatch_cuda


def _equal(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape and a.device == b.device
    assert torch.equal(a, b)


@pytest.mark.parametrize("index", range(10))
def test_opcheck_cuda(index):
    op, args = sample_inputs("cuda")[index]
    torch.library.opcheck(op, args)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("feature", [(), (1,), (3,), (8,), (2, 5), (64,)])
@pytest.mark.parametrize("seed", range(2))
def test_conversions_exact(compiled, dtype, feature, seed):
    values, offsets, max_len = ragged_case(
        seed, batch=9, feature=feature, dtype=dtype, device="cuda"
    )
    padded = compiled.packed_to_padded(values, offsets, max_len, 1)
    _equal(padded, operators.packed_to_padded_torch(values, offsets, max_len, 1))
    packed = compiled.padded_to_packed(padded, offsets, values.shape[0])
    _equal(packed, operators.padded_to_packed_torch(padded, offsets, values.shape[0]))
    _equal(packed, values)
    sizes = offsets.diff().int()
    _equal(compiled.fill_padding(padded, sizes, 0), bi.fill_padding(padded, sizes, 0))
    # Misaligned views (no 16-byte vector path) and non-contiguous inputs.
    if values.shape[0] > 1:
        shifted = values[1:]
        shifted_offsets = (offsets - 1).clamp(min=0)
        _equal(
            compiled.packed_to_padded(shifted, shifted_offsets, max_len, 0),
            operators.packed_to_padded_torch(shifted, shifted_offsets, max_len, 0),
        )
    transposed = padded.transpose(0, 1).contiguous().transpose(0, 1)
    _equal(compiled.padded_to_packed(transposed, offsets, values.shape[0]), values)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("feature", [(), (3,), (16,)])
def test_indexing_exact(compiled, dtype, index_dtype, feature):
    data, indices, sizes = index_case(
        1,
        batch=6,
        sources=40,
        width=30,
        feature=feature,
        dtype=dtype,
        device="cuda",
        index_dtype=index_dtype,
    )
    _equal(
        compiled.indexing_access(data, indices, sizes, 1),
        bi.indexing_access(data, indices, sizes, 1),
    )
    udata, uindices, usizes = index_case(
        2,
        batch=6,
        sources=40,
        width=30,
        feature=feature,
        dtype=dtype,
        unique=True,
        device="cuda",
        index_dtype=index_dtype,
    )
    to_write = udata[:, :30].contiguous()
    into = data
    _equal(
        compiled.indexing_write(to_write, uindices, usizes, into),
        bi.indexing_write(to_write, uindices, usizes, into),
    )
    _equal(
        compiled.inverse_indexing_access(to_write, uindices, usizes, 45, 0),
        bi.inverse_indexing_access(to_write, uindices, usizes, 45, 0),
    )
    pair_sizes = usizes.minimum(sizes)
    _equal(
        compiled.index_mapping(data, indices, uindices, pair_sizes, into),
        bi.index_mapping(data, indices, uindices, pair_sizes, into),
    )
    _equal(compiled.indices_to_mask(uindices, usizes, 41), bi.indices_to_mask(uindices, usizes, 41))


@pytest.mark.parametrize("width", [1, 7, 255, 256, 257, 1000, 70_000])
def test_mask_ops_exact(compiled, width):
    mask = mask_case(width, batch=5, width=width, device="cuda")
    ref_indices, ref_counts = bi.mask_to_indices(mask)
    indices, counts = compiled.mask_to_indices(mask, ref_indices.shape[1])
    _equal(indices, ref_indices)
    _equal(counts, ref_counts)
    wide, _ = compiled.mask_to_indices(mask, ref_indices.shape[1] + 3)
    _equal(wide, operators.mask_to_indices_torch(mask, ref_indices.shape[1] + 3)[0])
    for dtype in DTYPES:
        data = torch.arange(5 * width * 2, device="cuda").reshape(5, width, 2).to(dtype)
        out, counts = compiled.bool_compaction(data, mask, ref_indices.shape[1])
        ref_out, ref_counts = bi.bool_compaction(data, mask)
        _equal(out, ref_out)
        _equal(counts, ref_counts)


@pytest.mark.parametrize(
    ("batch", "width"), [(1, 16_384), (2, 10_000_000), (3, 70_001), (3, 1_000_003)]
)
def test_mask_ops_on_few_long_rows(compiled, batch, width):
    """Few long rows take the chunked scan of csrc/mask_indices.cu (rows of 4 chunks of 4096
    entries and more, fewer than 8 rows per SM): counts, cumsum, scatter and a zeroed tail."""
    gen = torch.Generator().manual_seed(width)
    position = torch.arange(width)
    patterns = [
        torch.rand(width, generator=gen) < 0.3,
        position >= width - 100,  # True only in the last chunk
        torch.ones(width, dtype=torch.bool),
    ]
    mask = torch.stack(patterns[:batch]).cuda()
    # One byte into its allocation: byte loads instead of 16-byte ones.
    misaligned = torch.empty(batch * width + 1, dtype=torch.bool, device="cuda")[1:]
    misaligned = misaligned.view(batch, width).copy_(mask)
    longest = int(mask.sum(1).max())
    for max_count in (0, longest // 2, longest, longest + 3):
        expected = operators.mask_to_indices_torch(mask, max_count)
        for source in (mask, misaligned):
            indices, counts = compiled.mask_to_indices(source, max_count)
            _equal(indices, expected[0])
            _equal(counts, expected[1])
    data = torch.arange(batch * width, device="cuda", dtype=torch.int32).view(batch, width, 1)
    out, counts = compiled.bool_compaction(data, mask, longest)
    ref_out, ref_counts = operators.bool_compaction_torch(data, mask, longest)
    _equal(out, ref_out)
    _equal(counts, ref_counts)


@pytest.mark.parametrize("feature", [(), (3,), (64,)])
def test_duplicate_targets_resolve_to_the_last_slot(compiled, feature):
    gen = torch.Generator().manual_seed(11)
    batch, width, targets = 4, 300, 5  # many slots per target: real contention on the GPU
    indices = torch.randint(0, targets, (batch, width), generator=gen)
    sizes = torch.tensor([300, 70, 0, 3])
    rows = torch.randn(batch, width, *feature, generator=gen)
    into = torch.randn(batch, targets, *feature, generator=gen)
    expected = into.clone()
    for b in range(batch):
        for j in range(int(sizes[b])):
            expected[b, int(indices[b, j])] = rows[b, j]
    args = [t.cuda() for t in (rows, indices, sizes, into)]
    _equal(compiled.indexing_write(*args), expected.cuda())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_gradients_exact(dtype):
    """Autograd through the compiled kernels vs through the PyTorch references."""
    values, offsets, max_len = ragged_case(3, batch=7, feature=(4,), dtype=dtype, device="cuda")
    data, indices, sizes = index_case(
        4, batch=5, sources=12, width=9, feature=(4,), dtype=dtype, device="cuda"
    )
    udata, uindices, usizes = index_case(
        5, batch=5, sources=12, width=9, feature=(4,), dtype=dtype, unique=True, device="cuda"
    )
    to_write = udata[:, :9].contiguous()
    mask = mask_case(6, batch=5, width=12, device="cuda")
    count = int(mask.sum(1).max())
    pair_sizes = sizes.minimum(usizes)
    cases = [
        (
            lambda a, b: ops.packed_to_padded(a, offsets, max_len, 2.0),
            lambda a, b: operators.packed_to_padded_torch(a, offsets, max_len, 2.0),
            values,
            data,
        ),
        (
            lambda a, b: ops.indexing_access(a, indices, sizes, 3.0),
            lambda a, b: bi.indexing_access(a, indices, sizes, 3.0),
            data,
            data,
        ),
        (
            lambda a, b: ops.indexing_write(a, uindices, usizes, b),
            lambda a, b: bi.indexing_write(a, uindices, usizes, b),
            to_write,
            data,
        ),
        (
            lambda a, b: ops.inverse_indexing_access(a, uindices, usizes, 13, 1.0),
            lambda a, b: bi.inverse_indexing_access(a, uindices, usizes, 13, 1.0),
            to_write,
            data,
        ),
        (
            lambda a, b: ops.index_mapping(a, indices, uindices, pair_sizes, b),
            lambda a, b: bi.index_mapping(a, indices, uindices, pair_sizes, b),
            data,
            data,
        ),
        (
            lambda a, b: ops.bool_compaction(a, mask, count)[0],
            lambda a, b: bi.bool_compaction(a, mask)[0],
            data,
            data,
        ),
        (
            lambda a, b: ops.fill_padding(a, sizes, 4.0),
            lambda a, b: bi.fill_padding(a, sizes, 4.0),
            data,
            data,
        ),
    ]
    for op, ref, first, second in cases:
        a, b = first.clone().requires_grad_(), second.clone().requires_grad_()
        c, d = first.clone().requires_grad_(), second.clone().requires_grad_()
        out, expected = op(a, b), ref(c, d)
        _equal(out.detach(), expected.detach())
        grad = torch.randn(out.shape, device="cuda").to(dtype)
        out.backward(grad)
        expected.backward(grad)
        _equal(a.grad, c.grad)
        assert (b.grad is None and d.grad is None) or torch.equal(b.grad, d.grad)
    padded = ops.packed_to_padded(values, offsets, max_len, 0).requires_grad_()
    reference = padded.detach().clone().requires_grad_()
    out = ops.padded_to_packed(padded, offsets, values.shape[0])
    expected = operators.padded_to_packed_torch(reference, offsets, values.shape[0])
    grad = torch.randn(out.shape, device="cuda").to(dtype)
    out.backward(grad)
    expected.backward(grad)
    _equal(padded.grad, reference.grad)


def test_out_of_range_index_raises_python_exception():
    data, indices, sizes = index_case(7, device="cuda")
    sizes = sizes.clamp(min=1)
    bad = indices.clone()
    bad[2, 0] = data.shape[1]
    with pytest.raises(IndexError):
        kernels.indexing_access(data, bad, sizes)
    with pytest.raises(IndexError):
        kernels.indexing_write(data[:, :5], bad, sizes, data)
    with pytest.raises(IndexError):
        kernels.index_mapping(data, bad, indices, sizes, data)
    # Unchecked, the kernels stay memory-safe (the slot reads the filler) and CUDA stays usable.
    out = kernels.indexing_access(data, bad, sizes, -5, check_bounds=False)
    torch.cuda.synchronize()
    assert (out[2, 0] == -5).all()


def test_device_guard_on_another_device():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA devices")
    values, offsets, max_len = ragged_case(8, device="cuda:1")
    out = kernels.packed_to_padded(values, offsets, max_len, 0)
    assert out.device == values.device
    assert torch.equal(kernels.padded_to_packed(out, offsets, values.shape[0]), values)


@pytest.mark.slow
def test_more_than_2_31_elements():
    """int64 index math: an output of more than 2**31 bytes (bool) round-trips."""
    rows, feature = 3 * 2**20, 800  # 2.5e9 elements of one byte in the padded output
    lengths = torch.tensor([rows // 2, rows // 2 - 7, rows // 2 - 1], device="cuda")
    offsets = torch.zeros(4, dtype=torch.int64, device="cuda")
    torch.cumsum(lengths, 0, out=offsets[1:])
    total = int(offsets[-1])
    values = torch.ones(total, feature, dtype=torch.bool, device="cuda")
    values[-1] = False
    padded = kernels.packed_to_padded(values, offsets, rows // 2, 0)
    assert padded.numel() > 2**31
    assert bool(padded[2, rows // 2 - 2].logical_not().all())
    assert int(padded[:, :, 0].sum()) == total - 1
    del values
    packed = kernels.padded_to_packed(padded, offsets, total)
    assert int(packed[:, 0].sum()) == total - 1 and not bool(packed[-1].any())


@pytest.mark.slow
@pytest.mark.parametrize("width", [2**31 - 1, 2**31 + 4096])
def test_scatters_past_int32_slot_indices(compiled, width):
    """csrc/batched_indexing.cu claims target rows in an int32 map up to an index width of
    INT32_MAX and in an int64 one past it. Slot j targets row j % 1000, every slot but the last
    three is valid: each row goes to one of the last 1000 valid slots, all past INT32_MAX for the
    wider width, where an int32 slot index would wrap. Two (1, width) int64 index tensors (16 GB
    each) and 1-byte rows: about 35 GB of GPU memory."""
    if torch.cuda.get_device_properties(0).total_memory < 40 * 2**30:
        pytest.skip("needs about 35 GB of GPU memory")
    num_targets, valid = 1000, width - 3
    targets = torch.arange(width, device="cuda").remainder_(num_targets).view(1, width)
    winners = torch.arange(valid - num_targets, valid, device="cuda")  # one per target row
    rows = torch.zeros(1, width, dtype=torch.int8, device="cuda")
    rows[0, winners] = (winners % 100 + 1).to(torch.int8)  # the losing slots hold 0
    sizes = torch.tensor([valid], device="cuda")
    into = torch.full((1, num_targets), -7, dtype=torch.int8, device="cuda")
    expected = torch.empty_like(into)
    expected[0, winners % num_targets] = rows[0, winners]
    _equal(compiled.indexing_write(rows, targets, sizes, into), expected)
    _equal(compiled.inverse_indexing_access(rows, targets, sizes, num_targets, -7), expected)
    del rows
    # The winning pairs read source rows 1..1000, every other pair source row 0.
    sources = torch.zeros(1, width, dtype=torch.int64, device="cuda")
    sources[0, winners] = torch.arange(1, num_targets + 1, device="cuda")
    source = torch.arange(num_targets + 1, device="cuda").view(1, -1).to(torch.int16)
    mapped = torch.empty(1, num_targets, dtype=torch.int16, device="cuda")
    mapped[0, winners % num_targets] = source[0, 1:]
    _equal(compiled.index_mapping(source, sources, targets, sizes, into.to(torch.int16)), mapped)


def test_dtypes_outside_the_kernels_fall_back_on_cuda():
    # complex64 is outside the kernels' dtype dispatch: the operators run the PyTorch path.
    values = torch.randn(7, 3, dtype=torch.complex64, device="cuda")
    offsets = torch.tensor([0, 4, 4, 7], device="cuda")
    padded = ops.packed_to_padded(values, offsets, 5, 0)
    assert padded.shape == (3, 5, 3) and padded.dtype == torch.complex64
    assert torch.equal(padded[0, :4], values[:4]) and torch.equal(padded[2, :3], values[4:])
    assert torch.equal(ops.padded_to_packed(padded, offsets, 7), values)

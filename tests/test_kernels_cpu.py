"""The CPU implementations of the conversion operators (:mod:`nestbatch.kernels.cpu`) against the
pure-PyTorch references, on each of their paths (the C library of
:mod:`nestbatch.kernels.host_library`, and without it whole-sample blocks and row indices), and
the huge-page output buffers of :mod:`nestbatch.kernels.host_memory`."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from ragged_strategies import ALL_DTYPES, make_tensor

import nestbatch as nb
from nestbatch import kernels
from nestbatch.kernels import cpu, host_library, host_memory, operators

# The settings forcing each path of the conversions (with _force_one_write): the C library,
# and without it whole-sample blocks, row indices computed with tensor ops, row indices listed
# on the host.
PATHS = {
    "C": {},
    "blocks": {"BLOCK_ROWS": 0, "LISTED_ROWS": -1},
    "rows": {"BLOCK_ROWS": 1 << 40, "LISTED_ROWS": -1},
    "listed": {"LISTED_ROWS": 1 << 20, "LISTED_FROM_SAMPLES": 0},
}


def _force_one_write(patch) -> None:
    """Let small test inputs take the one-write paths (normally for large outputs only)."""
    for name in ("LARGE_OUTPUT_BYTES", "ONE_WRITE_PADDED_BYTES", "ONE_WRITE_FILL_BYTES",
                 "ONE_WRITE_ACCESS_BYTES"):
        patch.setattr(cpu, name, 0)


def _take(patch, path: str) -> None:
    if path == "C":
        if host_library.library() is None:
            pytest.skip(f"no C conversions here: {host_library.status()}")
    else:
        patch.setattr(host_library, "library", lambda: None)
    for name, value in PATHS[path].items():
        patch.setattr(cpu, name, value)


@pytest.fixture
def every_size(monkeypatch):
    """Let small test inputs take the one-write path (normally for large outputs only)."""
    _force_one_write(monkeypatch)


def _lengths_and_offsets(lengths: list[int], index_dtype: torch.dtype):
    offsets = torch.zeros(len(lengths) + 1, dtype=torch.int64)
    torch.cumsum(torch.tensor(lengths, dtype=torch.int64), 0, out=offsets[1:])
    return offsets.to(index_dtype)


def _assert_same(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    assert actual.is_contiguous()
    assert torch.equal(actual, expected)


@st.composite
def conversion_cases(draw):
    lengths = draw(st.lists(st.integers(0, 6), min_size=0, max_size=6))
    feature = draw(st.sampled_from([(), (1,), (3,), (2, 2)]))
    dtype = draw(st.sampled_from(ALL_DTYPES))
    extra = draw(st.integers(0, 2))
    index_dtype = draw(st.sampled_from([torch.int32, torch.int64]))
    fill = draw(st.sampled_from([0, 1, -3, 2.5, True])) if dtype != torch.bool else True
    if not (dtype.is_floating_point or dtype.is_complex) and isinstance(fill, float):
        fill = 7
    if dtype == torch.uint8 and fill == -3:
        fill = 3
    noncontiguous = draw(st.booleans())
    path = draw(st.sampled_from(sorted(PATHS)))
    return lengths, feature, dtype, extra, index_dtype, fill, noncontiguous, path


@settings(max_examples=80, deadline=None)
@given(conversion_cases())
def test_conversions_match_reference(case):
    lengths, feature, dtype, extra, index_dtype, fill, noncontiguous, path = case
    offsets = _lengths_and_offsets(lengths, index_dtype)
    total = sum(lengths)
    generator = torch.Generator().manual_seed(total)
    values = make_tensor((total, *feature), dtype, generator)
    if noncontiguous:
        values = make_tensor((*feature, total), dtype, generator).movedim(-1, 0)
    max_len = max(lengths, default=0) + extra
    with pytest.MonkeyPatch.context() as patch:
        _force_one_write(patch)
        _take(patch, path)
        padded = operators._packed_to_padded_cpu(values, offsets, max_len, fill)
        expected = operators.packed_to_padded_torch(values, offsets, max_len, fill)
        _assert_same(padded, expected)
        source = padded.transpose(0, 1).contiguous().transpose(0, 1) if noncontiguous else padded
        _assert_same(operators._padded_to_packed_cpu(source, offsets, total), values.contiguous())
        sizes = torch.tensor(lengths, dtype=index_dtype) - (1 if extra else 0)
        _assert_same(
            operators._fill_padding_cpu(padded, sizes, fill),
            operators.fill_padding_torch(padded, sizes, fill),
        )


@pytest.mark.parametrize("path", sorted(PATHS))
def test_irregular_offsets_follow_the_reference(every_size, monkeypatch, path):
    _take(monkeypatch, path)
    values = torch.arange(24.0).view(12, 2)
    # Offsets that start past row 0 and stop before the end: rows outside them are unused.
    offsets = torch.tensor([2, 5, 5, 9])
    _assert_same(
        operators._packed_to_padded_cpu(values, offsets, 5, -1.0),
        operators.packed_to_padded_torch(values, offsets, 5, -1.0),
    )
    # A sample longer than max_len is truncated (the reference's behaviour).
    _assert_same(
        operators._packed_to_padded_cpu(values, offsets, 3, 0.0),
        operators.packed_to_padded_torch(values, offsets, 3, 0.0),
    )
    # Padded -> packed: a sample longer than the width, decreasing offsets, offsets not
    # ending at the total, or not starting at 0.
    data = torch.arange(24.0).view(3, 4, 2)
    for odd, total in (([0, 5, 6, 8], 8), ([0, 3, 2, 6], 6), ([0, 1, 2, 3], 2), ([1, 2, 3, 4], 4)):
        odd = torch.tensor(odd)
        try:
            expected = operators.padded_to_packed_torch(data, odd, total)
        except (RuntimeError, IndexError) as error:
            with pytest.raises(type(error)):
                operators._padded_to_packed_cpu(data, odd, total)
        else:
            _assert_same(operators._padded_to_packed_cpu(data, odd, total), expected)
    # Sizes outside [0, N] in fill_padding: negative means all padding, past N none.
    data = torch.arange(24.0).view(3, 4, 2)
    sizes = torch.tensor([-1, 9, 2])
    _assert_same(
        operators._fill_padding_cpu(data, sizes, 5.0),
        operators.fill_padding_torch(data, sizes, 5.0),
    )


@pytest.mark.parametrize("feature", [(), (64,)])
@pytest.mark.parametrize("one_write", [True, False])
def test_samples_longer_than_max_len_are_cut(monkeypatch, feature, one_write):
    # Long samples take the block paths (pad_sequence, or the one-write blocks).
    if one_write:
        _force_one_write(monkeypatch)
    lengths = [1500, 200, 1000]
    values = torch.randn(sum(lengths), *feature)
    padded = kernels.packed_to_padded(values, _lengths_and_offsets(lengths, torch.int64), 1000, 0.5)
    assert padded.shape == (3, 1000, *feature)
    for sample, length, row in zip(values.split(lengths), lengths, padded):
        kept = min(length, 1000)
        assert torch.equal(row[:kept], sample[:kept])
        assert bool((row[kept:] == 0.5).all())


@pytest.mark.parametrize("path", sorted(PATHS))
def test_empty_batch_and_empty_samples(every_size, monkeypatch, path):
    _take(monkeypatch, path)
    no_offsets = torch.zeros(1, dtype=torch.long)
    empty = operators._packed_to_padded_cpu(torch.zeros(0, 3), no_offsets, 4, 1)
    assert empty.shape == (0, 4, 3)
    zeros = torch.zeros(3, dtype=torch.long)
    padded = operators._packed_to_padded_cpu(torch.zeros(0, 3), zeros, 2, 7.0)
    _assert_same(padded, torch.full((2, 2, 3), 7.0))
    _assert_same(operators._padded_to_packed_cpu(padded, zeros, 0), torch.zeros(0, 3))


def test_autograd_runs_the_reference(every_size):
    values = torch.randn(7, 2, dtype=torch.float64, requires_grad=True)
    offsets = torch.tensor([0, 3, 3, 7])
    assert torch.autograd.gradcheck(lambda v: kernels.packed_to_padded(v, offsets, 5, 1.5), values)
    padded = torch.randn(3, 5, 2, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda p: kernels.padded_to_packed(p, offsets, 7), padded)
    sizes = offsets.diff()
    assert torch.autograd.gradcheck(lambda p: kernels.fill_padding(p, sizes, 0.0), padded)
    # Through the operator, autograd uses its formula and the CPU kernel computes the values.
    assert torch.autograd.gradcheck(
        lambda v: torch.ops.nestbatch.packed_to_padded(v, offsets, 5, 1.5), values
    )
    with torch.no_grad():
        out = kernels.packed_to_padded(values, offsets, 5, 1.5)
    assert out.grad_fn is None


@pytest.mark.parametrize("index", range(3))
def test_opcheck_on_the_one_write_path(every_size, index):
    op, args = operators_sample_inputs()[index]
    torch.library.opcheck(op, args)


def operators_sample_inputs():
    values = torch.randn(9, 3, requires_grad=True)
    offsets = torch.tensor([0, 4, 4, 9])
    padded = torch.randn(3, 6, 3, requires_grad=True)
    return [
        (torch.ops.nestbatch.packed_to_padded, (values, offsets, 6, -1.0)),
        (torch.ops.nestbatch.padded_to_packed, (padded, offsets, 9)),
        (torch.ops.nestbatch.fill_padding, (padded, offsets.diff(), 2.0)),
    ]


@pytest.mark.parametrize(("batch", "max_len", "feature"), [(64, 256, (64,)), (64, 16384, ())])
def test_medium_outputs_at_default_thresholds(batch, max_len, feature):
    # 2-24 MB packed -> padded outputs of many samples take the one-write path at the real
    # thresholds (row indices for short samples, blocks for long ones), few samples aten's.
    generator = torch.Generator().manual_seed(1)
    for samples in (batch, 8):
        lengths = torch.randint(0, max_len + 1, (samples,), generator=generator).tolist()
        lengths[-1] = max_len
        offsets = _lengths_and_offsets(lengths, torch.int64)
        values = torch.randn(sum(lengths), *feature, generator=generator)
        padded = kernels.packed_to_padded(values, offsets, max_len, -2.0)
        expected = torch.nn.utils.rnn.pad_sequence(
            values.split(lengths), batch_first=True, padding_value=-2.0
        )
        _assert_same(padded, expected)
    size = batch * max_len * math.prod(feature) * 4
    assert cpu.ONE_WRITE_PADDED_BYTES <= size < cpu.LARGE_OUTPUT_BYTES


@pytest.mark.parametrize("feature", [(64,), ()])
def test_large_outputs_at_default_thresholds(feature):
    # 24+ MB outputs take the one-write path at the real thresholds: blocks for the long
    # samples of (), row indices for the short ones of (64,).
    batch, max_len = (96, 1024) if feature else (8, 1 << 20)
    generator = torch.Generator().manual_seed(0)
    lengths = torch.randint(max_len // 2, max_len + 1, (batch,), generator=generator).tolist()
    lengths[0] = max_len
    offsets = _lengths_and_offsets(lengths, torch.int64)
    values = torch.randn(sum(lengths), *feature, generator=generator)
    padded = kernels.packed_to_padded(values, offsets, max_len, -2.0)
    assert padded.numel() * 4 >= cpu.LARGE_OUTPUT_BYTES
    expected = torch.nn.utils.rnn.pad_sequence(
        values.split(lengths), batch_first=True, padding_value=-2.0
    )
    _assert_same(padded, expected)
    _assert_same(kernels.padded_to_packed(padded, offsets, values.shape[0]), values)
    refilled = kernels.fill_padding(padded, offsets.diff(), 0.0)
    _assert_same(refilled, expected.masked_fill(expected == -2.0, 0.0))


# ---------------------------------------------------------------------------------- host memory
def test_empty_for_write_matches_new_empty():
    like = torch.zeros(1, dtype=torch.float16)
    out = host_memory.empty_for_write((3, 4), like)
    assert out.shape == (3, 4) and out.dtype == torch.float16 and out.is_contiguous()


def _vm_flags(address: int) -> list[str]:
    """The VmFlags of the mapping of this process that contains ``address``."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            start, end = (int(part, 16) for part in head.split("-"))
            inside = start <= address < end
        elif inside and head == "VmFlags:":
            return line.split()[1:]
    return []


def test_large_outputs_are_advised_as_huge_pages():
    page = host_memory.huge_page_size()
    if not page:
        pytest.skip("transparent huge pages are not in madvise mode here")
    like = torch.zeros(1)
    out = host_memory.empty_for_write((host_memory.MIN_HUGE_PAGES * page,), like)
    inner = -(-out.data_ptr() // page) * page
    assert "hg" in _vm_flags(inner)  # the kernel's mark of MADV_HUGEPAGE
    small = host_memory.empty_for_write((16,), like)
    assert small.numel() == 16


def test_huge_pages_can_be_turned_off(monkeypatch):
    monkeypatch.setenv("NESTBATCH_HUGE_PAGES", "0")
    host_memory.huge_page_size.cache_clear()
    try:
        assert host_memory.huge_page_size() == 0
        out = host_memory.empty_for_write((1 << 22,), torch.zeros(1))
        assert out.numel() == 1 << 22
    finally:
        monkeypatch.delenv("NESTBATCH_HUGE_PAGES")
        host_memory.huge_page_size.cache_clear()


# ------------------------------------------------------------------------------------------ out=
@pytest.mark.parametrize("path", [*sorted(PATHS), "small output", "small output, blocks"])
@pytest.mark.parametrize("offsets", [[0, 3, 3, 7], [1, 3, 3, 7]])
def test_out_receives_the_result(monkeypatch, path, offsets):
    if path in PATHS:  # the one-write path for large outputs
        _take(monkeypatch, path)
        _force_one_write(monkeypatch)
    # Small outputs of long samples are copied into out= as blocks; those of short samples are
    # computed, then copied in.
    small_blocks = 0 if path == "small output, blocks" else 1 << 40
    monkeypatch.setattr(cpu, "SMALL_BLOCK_ELEMENTS", small_blocks)
    values = torch.arange(16.0).view(8, 2)
    offsets = torch.tensor(offsets, dtype=torch.int32)
    buffer = torch.full((3, 5, 2), 99.0)
    padded = kernels.packed_to_padded(values, offsets, 5, -1.0, out=buffer)
    assert padded.data_ptr() == buffer.data_ptr()
    _assert_same(buffer, operators.packed_to_padded_torch(values, offsets, 5, -1.0))
    if int(offsets[0]) == 0:
        rows = torch.full((7, 2), 99.0)
        packed = kernels.padded_to_packed(buffer, offsets, 7, out=rows)
        assert packed.data_ptr() == rows.data_ptr()
        _assert_same(rows, values[:7])


def test_out_is_checked():
    values = torch.randn(7, 2)
    offsets = torch.tensor([0, 3, 3, 7])
    cases = [
        (ValueError, torch.empty(3, 4, 2)),  # shape
        (ValueError, torch.empty(3, 5, 2, dtype=torch.float64)),  # dtype
        (ValueError, torch.empty(3, 2, 5).transpose(1, 2)),  # not contiguous
        (TypeError, [[0.0]]),
    ]
    for error, out in cases:
        with pytest.raises(error, match="out"):
            kernels.packed_to_padded(values, offsets, 5, out=out)
    with pytest.raises(ValueError, match="out"):
        kernels.padded_to_packed(torch.randn(3, 5, 2), offsets, 7, out=torch.empty(6, 2))
    with pytest.raises(RuntimeError, match="not differentiable"):
        kernels.packed_to_padded(values.requires_grad_(), offsets, 5, out=torch.empty(3, 5, 2))
    with torch.no_grad():
        kernels.packed_to_padded(values, offsets, 5, out=torch.empty(3, 5, 2))


# ------------------------------------------------------------------------------------- gathers
@settings(max_examples=60, deadline=None)
@given(
    batch=st.integers(0, 5),
    sources=st.integers(0, 6),
    width=st.integers(0, 7),
    feature=st.sampled_from([(), (1,), (3,), (2, 2)]),
    dtype=st.sampled_from(ALL_DTYPES),
    index_dtype=st.sampled_from([torch.int32, torch.int64]),
    seed=st.integers(0, 2**16),
)
def test_gathers_match_reference(batch, sources, width, feature, dtype, index_dtype, seed):
    generator = torch.Generator().manual_seed(seed)
    data = make_tensor((batch, sources, *feature), dtype, generator)
    sizes = torch.randint(0, width + 2, (batch,), generator=generator)  # may exceed width
    if sources == 0:
        sizes.zero_()  # nothing can be indexed
    # Valid slots in range; padded slots hold garbage, out of range too.
    indices = torch.randint(0, max(sources, 1), (batch, width), generator=generator)
    padded = torch.arange(width) >= sizes.unsqueeze(1)
    indices = indices.masked_fill(padded, 10**6).to(index_dtype)
    sizes = sizes.to(index_dtype)
    fill = True if dtype == torch.bool else 3
    with pytest.MonkeyPatch.context() as patch:
        _force_one_write(patch)
        _assert_same(
            operators._indexing_access_cpu(data, indices, sizes, fill),
            operators.indexing_access_torch(data, indices, sizes, fill),
        )
        mask = make_tensor((batch, sources), torch.bool, generator)
        count = int(mask.sum(1).max()) if batch else 0
        for actual, expected in zip(
            operators._bool_compaction_cpu(data, mask, count),
            operators.bool_compaction_torch(data, mask, count),
        ):
            _assert_same(actual, expected)


def test_gather_autograd_runs_the_reference(every_size):
    data = torch.randn(3, 4, 2, dtype=torch.float64, requires_grad=True)
    indices = torch.tensor([[0, 3, 3], [1, 0, 9], [2, 2, 2]])
    sizes = torch.tensor([3, 2, 0])
    assert torch.autograd.gradcheck(lambda d: kernels.indexing_access(d, indices, sizes, 1.0), data)


# ------------------------------------------------------------- small index operators (selection)
def _unique_indices(batch, width, targets, generator, index_dtype):
    """``(batch, width)`` indices, valid slots unique per sample in ``[0, targets)``; sizes
    (possibly above ``width``: every slot is then valid); padding slots hold garbage."""
    size_cap = min(width, targets)
    sizes = torch.randint(0, size_cap + 1, (batch,), generator=generator)
    indices = torch.zeros(batch, width, dtype=torch.int64)
    for b in range(batch):  # a permutation's prefix: unique
        indices[b, :size_cap] = torch.randperm(targets, generator=generator)[:size_cap]
    indices = torch.where(torch.arange(width) < sizes.unsqueeze(1), indices, -(10**6))
    return indices.to(index_dtype), sizes.to(index_dtype)


@settings(max_examples=60, deadline=None)
@given(
    batch=st.integers(0, 5),
    targets=st.integers(0, 7),
    width=st.integers(0, 6),
    feature=st.sampled_from([(), (1,), (3,), (2, 2)]),
    dtype=st.sampled_from(ALL_DTYPES),
    index_dtype=st.sampled_from([torch.int32, torch.int64]),
    seed=st.integers(0, 2**16),
)
def test_selection_path_matches_reference(batch, targets, width, feature, dtype, index_dtype,
                                          seed):
    """The host operators' selection path (nonzero + one indexed write) against the
    references, on unique valid indices, garbage in padding slots, every dtype."""
    generator = torch.Generator().manual_seed(seed)
    indices, sizes = _unique_indices(batch, width, targets, generator, index_dtype)
    values = make_tensor((batch, width, *feature), dtype, generator)
    into = make_tensor((batch, targets, *feature), dtype, generator)
    source = make_tensor((batch, targets + 1, *feature), dtype, generator)
    source_indices = torch.randint(0, targets + 1, (batch, width), generator=generator)
    source_indices = source_indices.to(index_dtype)
    fill = True if dtype == torch.bool else 3
    pairs = [
        (cpu.indexing_access(source, source_indices, sizes, fill, None),
         operators.indexing_access_torch(source, source_indices, sizes, fill)),
        (cpu.indexing_write(values, indices, sizes, into, None),
         operators.indexing_write_torch(values, indices, sizes, into)),
        (cpu.inverse_indexing_access(values, indices, sizes, targets, fill, None),
         operators.inverse_indexing_access_torch(values, indices, sizes, targets, fill)),
        (cpu.index_mapping(source, source_indices, indices, sizes, into, None),
         operators.index_mapping_torch(source, source_indices, indices, sizes, into)),
        (cpu.indices_to_mask(indices, sizes, targets, None),
         operators.indices_to_mask_torch(indices, sizes, targets)),
    ]
    mask = make_tensor((batch, targets), torch.bool, generator)
    most = int(mask.sum(1).max()) if batch else 0
    counts = cpu.row_counts(mask)
    for count in {most, max(most - 1, 0)}:  # the largest count, and one that drops entries
        pairs += zip(cpu.mask_to_indices(mask, count, None),
                     operators.mask_to_indices_torch(mask, count))
        pairs += zip(cpu.mask_to_indices(mask, count, None, counts=counts),
                     operators.mask_to_indices_torch(mask, count))
        pairs += zip(cpu.bool_compaction(into, mask, count, None),
                     operators.bool_compaction_torch(into, mask, count))
    for actual, expected in pairs:
        _assert_same(actual, expected)


def test_selection_path_leaves_autograd_to_the_reference():
    data = torch.randn(2, 3, 2, dtype=torch.float64, requires_grad=True)
    into = torch.randn(2, 4, 2, dtype=torch.float64, requires_grad=True)
    indices = torch.tensor([[3, 0, 7], [1, 2, 0]])
    sizes = torch.tensor([2, 3])
    assert torch.autograd.gradcheck(
        lambda d, i: kernels.indexing_write(d, indices, sizes, i), (data, into))
    assert torch.autograd.gradcheck(
        lambda d: kernels.inverse_indexing_access(d, indices, sizes, 4), (data,))


@pytest.mark.parametrize("bad", [5, -6])
def test_selection_paths_check_every_index_they_touch(bad):
    """:func:`cpu.call_validating` runs a selection path only: each raises for a valid slot out
    of range (and reads a negative one from the end of the dim, or raises), whatever the
    padding slots hold; elsewhere it computes nothing."""
    data = torch.arange(2 * 5 * 2.0).view(2, 5, 2)
    sizes = torch.tensor([2, 1])
    good = torch.tensor([[4, -1, 10**6], [0, -(10**6), 7]])
    bad_slot = torch.tensor([[4, bad, 10**6], [0, -(10**6), 7]])
    calls = {
        "indexing_access": lambda i: (data, i, sizes, 0.0),
        "indexing_write": lambda i: (data[:, :3], i, sizes, data),
        "inverse_indexing_access": lambda i: (data[:, :3], i, sizes, 5, 0.0),
        "index_mapping": lambda i: (data, i, i, sizes, data),
        "indices_to_mask": lambda i: (i, sizes, 5),
    }
    for name, args_for in calls.items():
        expected = getattr(operators, f"{name}_torch")(*args_for(good.remainder(5)))
        try:
            got = cpu.call_validating(name, args_for(good))
        except RuntimeError:  # a negative index may raise instead
            assert name == "indexing_access"
        else:
            assert torch.equal(got, expected), name
        with pytest.raises((IndexError, RuntimeError)):
            cpu.call_validating(name, args_for(bad_slot))
    assert cpu.call_validating("packed_to_padded", (data, sizes, 3, 0.0)) is None
    with torch.enable_grad():  # autograd records the call: the reference's job
        grad_data = data.clone().requires_grad_()
        assert cpu.call_validating("indexing_access", (grad_data, good, sizes, 0.0)) is None


def test_access_and_fill_padding_at_default_thresholds():
    # Outputs past ONE_WRITE_ACCESS_BYTES / ONE_WRITE_FILL_BYTES take the one-write paths at the
    # real thresholds (the gather's path checks no index itself: the public call still raises).
    generator = torch.Generator().manual_seed(2)
    batch, entries, slots, feature = 64, 64, 32, 64
    data = torch.randn(batch, entries, feature, generator=generator)
    indices = torch.randint(-entries, entries, (batch, slots), generator=generator)
    sizes = torch.randint(0, slots + 1, (batch,), generator=generator)
    assert batch * slots * feature * 4 >= cpu.ONE_WRITE_ACCESS_BYTES
    out = nb.batched_indexing_access(data, nb.RaggedBatch(indices, sample_sizes=sizes)).tensor
    for b in range(batch):
        n = int(sizes[b])
        assert torch.equal(out[b, :n], data[b, indices[b, :n]])
        assert bool((out[b, n:] == 0).all())
    indices[5, 0], sizes[5] = entries, slots
    with pytest.raises(IndexError):
        nb.batched_indexing_access(data, nb.RaggedBatch(indices, sample_sizes=sizes))

    padded = torch.randn(256, 64, feature, generator=generator)
    lengths = torch.randint(0, 65, (256,), generator=generator)
    assert padded.numel() * 4 >= cpu.ONE_WRITE_FILL_BYTES
    filled = kernels.fill_padding(padded, lengths, 0.5)
    expected = padded.clone()
    for b, n in enumerate(lengths.tolist()):
        expected[b, n:] = 0.5
    _assert_same(filled, expected)


@pytest.mark.parametrize("feature", [1, 64])
def test_write_both_sides_of_its_selection_limit(feature):
    # 2048 slots of 1 float take the selection path, of 64 floats (512 KB) the reference.
    generator = torch.Generator().manual_seed(3)
    batch, entries, slots = 64, 64, 32
    into = torch.randn(batch, entries, feature, generator=generator)
    indices = torch.stack([torch.randperm(entries, generator=generator)[:slots]
                           for _ in range(batch)])
    sizes = torch.randint(0, slots + 1, (batch,), generator=generator)
    to_write = torch.randn(batch, slots, feature, generator=generator)
    selects = batch * slots * feature * 4 <= cpu.WRITE_SELECTION_BYTES
    assert selects == (feature == 1)
    out = nb.batched_indexing_write(to_write, nb.RaggedBatch(indices, sample_sizes=sizes), into)
    expected = into.clone()
    for b in range(batch):
        n = int(sizes[b])
        expected[b, indices[b, :n]] = to_write[b, :n]
    assert torch.equal(out, expected)
    indices[7, 0], sizes[7] = entries, slots
    with pytest.raises(IndexError):
        nb.batched_indexing_write(to_write, nb.RaggedBatch(indices, sample_sizes=sizes), into)


def test_one_write_access_of_unchecked_indices_matches_the_reference(monkeypatch):
    # check_bounds=False promises in-range indices; a broken promise reads a clamped row of the
    # sample itself on every CPU path (never another sample's row).
    _force_one_write(monkeypatch)
    monkeypatch.setattr(cpu, "GATHER_SELECTION_SLOTS", -1)
    data = torch.arange(2 * 3 * 2, dtype=torch.float32).view(2, 3, 2)
    indices = torch.tensor([[5, -4, 1], [3, 0, 9]])
    sizes = torch.tensor([3, 2])
    out = kernels.indexing_access(data, indices, sizes, -1.0, check_bounds=False)
    expected = operators.indexing_access_torch(data, indices, sizes, -1.0)
    _assert_same(out, expected)
    assert out[0, 0].tolist() == data[0, 2].tolist() and out[1, 0].tolist() == data[1, 2].tolist()

"""The CUDA kernels of ``csrc/`` executed on the CPU by a host emulation of the CUDA execution
model (``tests/cuda_emulation``), compared bit for bit with the PyTorch references.

No GPU needed: the real kernel sources are compiled with the host compiler against shim CUDA
headers; their launches run block after block, the threads of a block as fibers that meet at
``__syncthreads()`` and at warp shuffles. What this checks: the index arithmetic of every kernel,
the choice of the vector unit, the fill patterns of every dtype, the grid-stride loops (with
grids forced small through the emulated SM count), the block scan of ``mask_to_indices``, and
the host wrappers. What it cannot check: races between threads beyond the orders tried here,
memory coalescing and speed, and anything nvcc compiles differently from g++.

Mirrors the equality tests of ``test_kernels_cuda.py`` (skipped without a GPU), plus the edge
cases a GPU run would only catch by chance: misaligned and non-contiguous inputs, empty batches
and samples, fillers of every kind, out-of-range indices and offsets (next to inaccessible
pages, in a child process), mismatched shapes, and tiny emulated grids. Skipped where no C++
compiler can build the emulation.
"""

from __future__ import annotations

import math
import mmap
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext, suppress
from pathlib import Path

import pytest
import torch
from cuda_emulation import build
from cuda_emulation.build import emulation_settings
from hypothesis import given, settings
from hypothesis import strategies as st
from test_kernels import DTYPES, index_case, mask_case, ragged_case, random_values
from torch import Tensor

from nestbatch.compat import batched_indexing as bi
from nestbatch.kernels import operators

pytestmark = pytest.mark.emulation

#: Every dtype the kernels dispatch over (AT_ALL_TYPES plus Half, BFloat16 and Bool).
KERNEL_DTYPES = [*DTYPES, torch.uint8, torch.int8, torch.int16]
#: Feature shapes whose rows take every vector unit: 1/2/4/8/16-byte units, one or many per row.
FEATURES = [(), (1,), (3,), (8,), (2, 5), (64,)]
INDEX_DTYPES = [torch.int32, torch.int64]
OP_NAMES = [
    "packed_to_padded",
    "padded_to_packed",
    "fill_padding",
    "indexing_access",
    "indexing_write",
    "inverse_indexing_access",
    "index_mapping",
    "mask_to_indices",
    "indices_to_mask",
    "bool_compaction",
]
#: The bits of each float dtype, so that -0.0, NaN payloads and infinities compare exactly.
_BITS = {
    torch.float16: torch.int16,
    torch.bfloat16: torch.int16,
    torch.float32: torch.int32,
    torch.float64: torch.int64,
    torch.bool: torch.uint8,
}


@pytest.fixture(scope="module")
def kern() -> object:
    """``torch.ops.nestbatch_emulated``: the csrc/ kernels running on CPU tensors."""
    try:
        build.load()
    except build.EmulationUnavailable as why:
        pytest.skip(f"the CUDA emulation cannot be built here: {why}")
    return torch.ops.nestbatch_emulated


@pytest.fixture(scope="module")
def engine(kern: object) -> object:
    """``torch.ops.nestbatch_emulation``: the emulation's own operators."""
    return torch.ops.nestbatch_emulation


# ---------------------------------------------------------------------------------- helpers
def assert_same(actual: Tensor, expected: Tensor) -> None:
    """Same dtype, shape and device, contiguous, and the same bits."""
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert actual.device == expected.device
    assert actual.is_contiguous()
    bits = _BITS.get(actual.dtype)
    if bits is not None:
        actual, expected = actual.view(bits), expected.contiguous().view(bits)
    assert torch.equal(actual, expected)


def shifted(t: Tensor, elements: int = 1) -> Tensor:
    """A contiguous copy of ``t`` starting ``elements`` elements into a fresh allocation, so its
    address is aligned to the element size only (misaligned for the wider vector units)."""
    buffer = torch.empty(t.numel() + elements, dtype=t.dtype)
    view = buffer[elements:].view(t.shape)
    view.copy_(t)
    return view


def noncontiguous(t: Tensor) -> Tensor:
    """``t`` as a non-contiguous view (dims 0 and 1 swapped in memory)."""
    if t.dim() < 2:
        return t
    return t.transpose(0, 1).contiguous().transpose(0, 1)


def expected_unit(row_bytes: int, *tensors: Tensor) -> int:
    """The vector unit ``pick_unit_bytes`` must choose: the widest of 16/8/4/2 bytes dividing
    the row size and the address of every tensor the kernel reads or writes directly (inputs
    that are not contiguous are copied first, into fresh, aligned memory)."""
    addresses = [t.data_ptr() if t.is_contiguous() else 0 for t in tensors]
    for unit in (16, 8, 4, 2):
        if row_bytes % unit == 0 and all(a % unit == 0 for a in addresses):
            return unit
    return 1


def row_bytes(t: Tensor, lead_dims: int) -> int:
    return math.prod(t.shape[lead_dims:]) * t.element_size()


def run_row_copy(call: Callable[[], Tensor], unit: int | None, launches: int = 1) -> Tensor:
    """Run an operator whose last launch is the row copy, and check the vector unit it used
    (``unit=None``: nothing to copy, so no launch may happen). ``launches`` counts the operator's
    launches: 2 for the scatters, whose slots claim their target rows first."""
    return _run_kernel(call, unit, launches, "row_copy_kernel<Unit, Map>", lambda u: [u, u, u])


def run_conversion(call: Callable[[], Tensor], unit: int | None) -> Tensor:
    """Run a packed <-> padded conversion and check the vector unit of its one launch
    (``unit=None``: nothing to copy, so no launch may happen)."""
    # The kernel's pointers: source, destination (both in units), offsets (int64).
    return _run_kernel(call, unit, 1, "packed_padded_kernel<Unit, kToPadded>", lambda u: [u, u, 8])


def _run_kernel(call, unit, launches, kernel, pointees) -> Tensor:
    before = build.state()["launches"]
    out = call()
    state = build.state()
    if unit is None:
        assert state["launches"] == before
    else:
        assert state["launches"] == before + launches
        assert state["last_kernel"] == kernel
        assert state["last_pointee_bytes"] == pointees(unit)
    return out


def same_or_both_raise(kernel: Callable[[], Tensor], reference: Callable[[], Tensor]) -> None:
    """The kernel equals the reference, or both refuse the arguments."""
    try:
        expected = reference()
    except (RuntimeError, ValueError, OverflowError):
        with pytest.raises(RuntimeError):
            kernel()
        return
    assert_same(kernel(), expected)


def offsets_of(lengths: list[int], dtype: torch.dtype = torch.int64) -> Tensor:
    offsets = torch.zeros(len(lengths) + 1, dtype=torch.int64)
    torch.cumsum(torch.tensor(lengths, dtype=torch.int64), 0, out=offsets[1:])
    return offsets.to(dtype)


def _gather_oracle(data: Tensor, indices: Tensor, sizes: Tensor, filler: float) -> Tensor:
    """``out[b, j] = data[b, indices[b, j]]`` where the slot is valid and the index in range,
    the filler elsewhere (batched_indexing.cu: "a gather writes the filler")."""
    out = torch.full(
        (indices.shape[0], indices.shape[1], *data.shape[2:]), filler, dtype=data.dtype
    )
    for b in range(indices.shape[0]):
        for j in range(min(int(sizes[b]), indices.shape[1])):
            if 0 <= int(indices[b, j]) < data.shape[1]:
                out[b, j] = data[b, int(indices[b, j])]
    return out


def _padded_oracle(values: Tensor, offsets: Tensor, max_len: int, filler: float) -> Tensor:
    """Padded rows read their packed row when it exists, else get the filler (also for offsets
    pointing outside the packed values)."""
    batch = offsets.shape[0] - 1
    out = torch.full((batch, max_len, *values.shape[1:]), filler, dtype=values.dtype)
    for b in range(batch):
        start, length = int(offsets[b]), int(offsets[b + 1] - offsets[b])
        for t in range(min(length, max_len)):
            if 0 <= start + t < values.shape[0]:
                out[b, t] = values[start + t]
    return out


# ---------------------------------------------------------------------------- launch rewriting
def test_every_csrc_launch_is_rewritten():
    counts = {}
    for path in sorted(build.CSRC_DIR.iterdir()):
        if path.suffix not in {".cu", ".cuh", ".h"}:
            continue
        text = path.read_text()
        rewritten, counts[path.name] = build.rewrite_launches(text, path)
        assert rewritten.startswith(f'#line 1 "{path.as_posix()}"\n')
        # One line was added (the #line directive); every other line stays where it was.
        assert rewritten.count("\n") == text.count("\n") + 1
        assert counts[path.name] == build._code_only(text).count("<<<")
    assert counts["common.cuh"] == 1 and counts["mask_indices.cu"] == 5


def test_launch_parsing_of_tricky_sources():
    source = """
    // a comment mentioning kernel<<<1, 2>>>(x) is no launch
    const char* text = "nor is k<<<a, b>>>(c) in a string";
    ns::deep::kernel<Unit, std::pair<int, (2 > 1)>>
        <<<grid_for(rows, std::max<int>(1, per_block)), dim3(32, 4),
           bytes, stream>>>(a, f(b, c), /* ) */ d);
    plain<<<1, 256>>>();
    other<<<blocks, threads>>>  (x[1, 2] , y)  ;
    """
    launches = build.find_launches(source)
    assert [launch.kernel for launch in launches] == [
        "ns::deep::kernel<Unit, std::pair<int, (2 > 1)>>",
        "plain",
        "other",
    ]
    first = launches[0]
    assert first.config == [
        "grid_for(rows, std::max<int>(1, per_block))",
        "dim3(32, 4)",
        "bytes",
        "stream",
    ]
    assert first.args == "a, f(b, c), /* ) */ d"
    assert first.line == 4
    assert launches[1].config == ["1", "256"] and launches[1].args == ""
    rewritten, count = build.rewrite_launches(source, "x.cu")
    assert count == 3 and rewritten.count("\n") == source.count("\n") + 1
    assert "::nestbatch_emulation::launch(" in rewritten and "<<<1, 2>>>" in rewritten
    assert "::nestbatch_emulation::LaunchConfig(1, 256))" in rewritten


@pytest.mark.parametrize(
    "launch", ["k<<<1>>>(x);", "k<<<1, 2, 3, 4, 5>>>(x);", "<<<1, 2>>>(x);", "k<<<1, 2>>> x;"]
)
def test_malformed_launches_are_rejected(launch):
    with pytest.raises(ValueError, match="line 1"):
        build.find_launches(launch)


def test_bindings_are_registered_for_the_emulation():
    path = build.CSRC_DIR / "bindings.cpp"
    rewritten = build.rewrite_bindings(path.read_text(), path)
    assert "TORCH_LIBRARY(nestbatch_emulated," in rewritten
    assert "TORCH_LIBRARY_IMPL(nestbatch_emulated, CPU," in rewritten
    assert not re.search(r"TORCH_LIBRARY\w*\(\s*nestbatch_cuda", rewritten)
    with pytest.raises(ValueError, match="TORCH_LIBRARY"):
        build.rewrite_bindings("TORCH_LIBRARY(other, m) {}", path)


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (RuntimeError("x.cpp:3: fatal error: Python.h: No such file or directory"), "unavailable"),
        (RuntimeError("/usr/bin/ld: cannot find -lc10: No such file"), "unavailable"),
        (FileNotFoundError("ninja"), "unavailable"),
        (RuntimeError("csrc/common.cuh:9: fatal error: ops.h: No such file or directory"), "error"),
        (RuntimeError("csrc/mask_indices.cu:40:3: error: 'foo' was not declared"), "error"),
        (RuntimeError("undefined reference to `nestbatch_emulation::sync_block()'"), "error"),
    ],
)
def test_build_failures_are_told_apart(error, kind):
    """What the environment lacks skips the tests; an error of the sources fails them."""
    expected = build.EmulationUnavailable if kind == "unavailable" else build.EmulationBuildError
    assert isinstance(build._classify(error), expected)


@pytest.mark.skipif(torch.cuda.is_available(),
                    reason="a CUDA device makes the emulation unavailable before any compiler "
                           "is looked for")
def test_no_compiler_means_unavailable(monkeypatch):
    monkeypatch.setenv("CXX", "no-such-compiler-here")
    with pytest.raises(build.EmulationUnavailable, match="no C\\+\\+ compiler"):
        build.load.__wrapped__()


def test_schemas_match_the_cuda_bindings_and_the_public_operators(kern):
    bindings = (build.CSRC_DIR / "bindings.cpp").read_text()
    defined = {
        re.match(r"\w+", schema).group(0): schema
        for schema in (
            "".join(re.findall(r'"([^"]*)"', call))
            for call in re.findall(r"m\.def\((.*?)\);", bindings, flags=re.S)
        )
    }
    assert sorted(defined) == sorted(OP_NAMES)
    for name in OP_NAMES:
        emulated = str(torch._C._get_schema(f"nestbatch_emulated::{name}", ""))
        assert emulated == f"nestbatch_emulated::{defined[name]}"
        public = str(getattr(torch.ops.nestbatch, name).default._schema)
        assert public.replace("SymInt", "int") == f"nestbatch::{defined[name]}"


# --------------------------------------------------------------------------------- conversions
@pytest.mark.parametrize("dtype", KERNEL_DTYPES)
@pytest.mark.parametrize("feature", FEATURES)
@pytest.mark.parametrize("seed", range(2))
def test_conversions_exact(kern, dtype, feature, seed):
    values, offsets, max_len = ragged_case(seed, batch=9, feature=feature, dtype=dtype)
    if seed == 1:
        offsets = offsets.int()  # int32 offsets take the host-side widening
    total = values.shape[0]
    unit = expected_unit(row_bytes(values, 1), values)
    padded = run_conversion(lambda: kern.packed_to_padded(values, offsets, max_len, 1), unit)
    assert_same(padded, operators.packed_to_padded_torch(values, offsets, max_len, 1))
    packed = run_conversion(
        lambda: kern.padded_to_packed(padded, offsets, total),
        expected_unit(row_bytes(padded, 2), padded) if total else None,
    )
    assert_same(packed, operators.padded_to_packed_torch(padded, offsets, total))
    assert_same(packed, values)
    sizes = offsets.diff()
    refilled = run_row_copy(
        lambda: kern.fill_padding(padded, sizes, 0), expected_unit(row_bytes(padded, 2), padded)
    )
    assert_same(refilled, bi.fill_padding(padded, sizes, 0))

    # Views starting one element into their memory: the vector unit narrows to fit them.
    moved = shifted(values)
    assert_same(
        run_conversion(
            lambda: kern.packed_to_padded(moved, offsets, max_len, 0),
            expected_unit(row_bytes(moved, 1), moved) if total or max_len else None,
        ),
        operators.packed_to_padded_torch(values, offsets, max_len, 0),
    )
    moved_padded = shifted(padded)
    assert_same(kern.padded_to_packed(moved_padded, offsets, total), values)
    assert_same(kern.fill_padding(moved_padded, sizes, 0), refilled)
    # A view of packed rows that starts at row 1, as in test_kernels_cuda.
    if total > 1:
        tail, tail_offsets = values[1:], (offsets - 1).clamp(min=0)
        assert_same(
            kern.packed_to_padded(tail, tail_offsets, max_len, 0),
            operators.packed_to_padded_torch(tail, tail_offsets, max_len, 0),
        )
    # Non-contiguous inputs are made contiguous by the host wrappers.
    assert_same(kern.padded_to_packed(noncontiguous(padded), offsets, total), values)
    assert_same(kern.fill_padding(noncontiguous(padded), sizes, 0), refilled)
    strided = torch.stack([values, values], dim=-1)[..., 0]
    assert_same(kern.packed_to_padded(strided, offsets, max_len, 1), padded)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool, torch.int8])
@pytest.mark.parametrize("feature", [(), (3,), (2, 5)])
def test_conversion_edge_cases(kern, dtype, feature):
    gen = torch.Generator().manual_seed(0)
    cases = {
        "empty batch": [],
        "only empty samples": [0, 0, 0],
        "one sample": [5],
        "empty samples around": [0, 4, 0, 0, 2, 0],
    }
    for lengths in cases.values():
        values = random_values((sum(lengths), *feature), dtype, gen)
        longest = max(lengths, default=0)
        for offsets_dtype in INDEX_DTYPES:
            offsets = offsets_of(lengths, offsets_dtype)
            for max_len in {longest, longest + 1, longest + 40}:
                padded = kern.packed_to_padded(values, offsets, max_len, -3)
                assert_same(
                    padded, operators.packed_to_padded_torch(values, offsets, max_len, -3)
                )
                assert_same(kern.padded_to_packed(padded, offsets, values.shape[0]), values)
                for sizes in (offsets.diff(), torch.full((len(lengths),), max_len + 3)):
                    assert_same(
                        kern.fill_padding(padded, sizes.to(offsets_dtype), 5),
                        bi.fill_padding(padded, sizes, 5),
                    )
    # Zero-size feature rows move nothing, and no launch happens.
    values = torch.zeros(4, 0, dtype=dtype)
    out = run_conversion(lambda: kern.packed_to_padded(values, offsets_of([1, 3]), 3, 1), None)
    assert out.shape == (2, 3, 0)


@pytest.mark.parametrize("dtype", KERNEL_DTYPES)
def test_fill_values_of_every_kind(kern, dtype):
    """Each filler is cast to the dtype on the host and repeated over the vector unit; the
    result equals the reference bit for bit, or both refuse the value."""
    values, offsets, max_len = ragged_case(3, batch=6, feature=(3,), dtype=dtype)
    padded = operators.packed_to_padded_torch(values, offsets, max_len, 0)
    sizes = offsets.diff()
    data, indices, index_sizes = index_case(4, batch=3, sources=7, width=6, dtype=dtype)
    rows = data[:, :6]  # (B, M, *D) rows to scatter
    fills = [0, 1, -1, 7, -129, 300, 2**40, 2.5, -0.0, 1e10, True, False]
    fills += [float("inf"), float("-inf"), float("nan")]
    for fill in fills:
        same_or_both_raise(
            lambda fill=fill: kern.packed_to_padded(values, offsets, max_len, fill),
            lambda fill=fill: operators.packed_to_padded_torch(values, offsets, max_len, fill),
        )
        same_or_both_raise(
            lambda fill=fill: kern.fill_padding(padded, sizes, fill),
            lambda fill=fill: bi.fill_padding(padded, sizes, fill),
        )
        same_or_both_raise(
            lambda fill=fill: kern.indexing_access(data, indices, index_sizes, fill),
            lambda fill=fill: bi.indexing_access(data, indices, index_sizes, fill),
        )
        same_or_both_raise(
            lambda fill=fill: kern.inverse_indexing_access(rows, indices, index_sizes, 9, fill),
            lambda fill=fill: bi.inverse_indexing_access(rows, indices, index_sizes, 9, fill),
        )


# ------------------------------------------------------------------------------------ indexing
@pytest.mark.parametrize("dtype", KERNEL_DTYPES)
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("feature", [*FEATURES, (16,)])
def test_indexing_exact(kern, dtype, index_dtype, feature):
    data, indices, sizes = index_case(
        1, batch=6, sources=40, width=30, feature=feature, dtype=dtype, index_dtype=index_dtype
    )
    expected = bi.indexing_access(data, indices, sizes, 1)
    unit = expected_unit(row_bytes(data, 2), data)
    assert_same(run_row_copy(lambda: kern.indexing_access(data, indices, sizes, 1), unit), expected)
    moved = shifted(data)
    assert_same(
        run_row_copy(
            lambda: kern.indexing_access(moved, indices, sizes, 1),
            expected_unit(row_bytes(moved, 2), moved),
        ),
        expected,
    )
    assert_same(kern.indexing_access(noncontiguous(data), indices, sizes.int(), 1), expected)

    udata, uindices, usizes = index_case(
        2,
        batch=6,
        sources=40,
        width=30,
        feature=feature,
        dtype=dtype,
        unique=True,
        index_dtype=index_dtype,
    )
    to_write = udata[:, :30].contiguous()
    into = data
    expected = bi.indexing_write(to_write, uindices, usizes, into)
    assert_same(
        run_row_copy(
            lambda: kern.indexing_write(to_write, uindices, usizes, into),
            expected_unit(row_bytes(to_write, 2), to_write, into),
            launches=2,
        ),
        expected,
    )
    assert_same(
        kern.indexing_write(shifted(to_write), uindices, usizes, noncontiguous(into)), expected
    )
    assert_same(
        kern.inverse_indexing_access(to_write, uindices, usizes, 45, 0),
        bi.inverse_indexing_access(to_write, uindices, usizes, 45, 0),
    )
    assert_same(
        kern.inverse_indexing_access(noncontiguous(to_write), uindices, usizes, 45, 1),
        bi.inverse_indexing_access(to_write, uindices, usizes, 45, 1),
    )
    pair_sizes = usizes.minimum(sizes)
    expected = bi.index_mapping(data, indices, uindices, pair_sizes, into)
    assert_same(kern.index_mapping(data, indices, uindices, pair_sizes, into), expected)
    assert_same(
        kern.index_mapping(shifted(data), indices, uindices, pair_sizes, noncontiguous(into)),
        expected,
    )
    assert_same(
        kern.indices_to_mask(uindices, usizes, 41), bi.indices_to_mask(uindices, usizes, 41)
    )
    assert_same(kern.indices_to_mask(indices, sizes, 40), bi.indices_to_mask(indices, sizes, 40))


@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
def test_indexing_edge_cases(kern, index_dtype):
    gen = torch.Generator().manual_seed(5)
    for batch, sources, width in [(0, 4, 3), (3, 0, 4), (3, 5, 0), (1, 1, 1), (4, 3, 9)]:
        data = random_values((batch, sources, 2), torch.float32, gen)
        indices = torch.randint(0, max(sources, 1), (batch, width), generator=gen)
        sizes = torch.randint(0, width + 1, (batch,), generator=gen)
        if sources == 0:
            sizes.zero_()  # nothing can be indexed
        indices, sizes = indices.to(index_dtype), sizes.to(index_dtype)
        assert_same(
            kern.indexing_access(data, indices, sizes, 4.0),
            bi.indexing_access(data, indices, sizes, 4.0),
        )
        assert_same(
            kern.indices_to_mask(indices, sizes, sources),
            bi.indices_to_mask(indices, sizes, sources),
        )
        # Scatters into `targets` rows, through unique indices that are all in range.
        targets = max(sources, width)
        unique = torch.stack(
            [torch.randperm(targets, generator=gen)[:width] for _ in range(batch)]
            or [torch.empty(0, width, dtype=torch.int64)]
        ).view(batch, width)
        unique = unique.to(index_dtype)
        rows = random_values((batch, width, 2), torch.float32, gen)
        into = random_values((batch, targets, 2), torch.float32, gen)
        assert_same(
            kern.indexing_write(rows, unique, sizes, into),
            bi.indexing_write(rows, unique, sizes, into),
        )
        assert_same(
            kern.inverse_indexing_access(rows, unique, sizes, targets, -1.0),
            bi.inverse_indexing_access(rows, unique, sizes, targets, -1.0),
        )
        assert_same(
            kern.index_mapping(data, indices, unique, sizes, into),
            bi.index_mapping(data, indices, unique, sizes, into),
        )
    # Sizes beyond the width make every slot valid.
    data, indices, sizes = index_case(6, batch=3, sources=5, width=4, index_dtype=index_dtype)
    big = torch.full((3,), 99, dtype=index_dtype)
    assert_same(
        kern.indexing_access(data, indices.clamp(max=4), big, 0),
        bi.indexing_access(data, indices.clamp(max=4), big, 0),
    )


def _last_slot_wins(rows: Tensor, indices: Tensor, sizes: Tensor, background: Tensor) -> Tensor:
    """Plain loop: scatter ``rows[b, j]`` to ``indices[b, j]`` in slot order (later slots win)."""
    out = background.clone()
    for b in range(indices.shape[0]):
        for j in range(min(int(sizes[b]), indices.shape[1])):
            out[b, int(indices[b, j])] = rows[b, j]
    return out


def claimed_scatter(call: Callable[[], Tensor]) -> tuple[Tensor, int]:
    """Run a scatter; returns its output and the element size of its claim map (what the last
    pointer parameter of the claim kernel points to), after checking that it launched the claim
    and then the row copy."""
    before = build.state()["launches"]
    out = call()
    state = build.state()
    assert state["launches"] == before + 2
    claim, copy = state["recent_launches"][-2:]
    assert claim["kernel"] == "claim_rows_kernel<Claim>"
    assert copy["kernel"] == "row_copy_kernel<Unit, Map>"
    return out, claim["pointee_bytes"][-1]


@pytest.mark.parametrize("schedule", ["forward", "reverse", "shuffled"])
@pytest.mark.parametrize("feature", [(), (3,), (64,)])
def test_duplicate_targets_resolve_to_the_last_slot(kern, schedule, feature):
    """Scatters claim their target rows first, so a target written by several slots receives the
    whole row of the highest slot, whatever order the threads run in. Index widths up to
    INT32_MAX claim in an int32 map."""
    gen = torch.Generator().manual_seed(11)
    batch, width, targets = 4, 12, 5  # more slots than targets: duplicates for sure
    indices = torch.randint(0, targets, (batch, width), generator=gen)
    sizes = torch.tensor([12, 7, 0, 3])
    rows = random_values((batch, width, *feature), torch.float32, gen)
    into = random_values((batch, targets, *feature), torch.float32, gen)
    filler = torch.full_like(into, -1.0)
    sources = torch.randint(0, 6, (batch, width), generator=gen)
    source = random_values((batch, 6, *feature), torch.float32, gen)
    gathered = torch.stack([source[b, sources[b]] for b in range(batch)])
    cases = [
        (
            lambda: kern.indexing_write(rows, indices, sizes, into),
            _last_slot_wins(rows, indices, sizes, into),
        ),
        (
            lambda: kern.inverse_indexing_access(rows, indices, sizes, targets, -1.0),
            _last_slot_wins(rows, indices, sizes, filler),
        ),
        (
            lambda: kern.index_mapping(source, sources, indices, sizes, into),
            _last_slot_wins(gathered, indices, sizes, into),
        ),
    ]
    with emulation_settings(schedule=schedule, seed=3, sms=1):
        for call, expected in cases:
            out, claim_bytes = claimed_scatter(call)
            assert_same(out, expected)
            assert claim_bytes == 4


def test_scatters_with_nothing_to_write_launch_nothing(kern):
    """No claim map is filled, and no kernel launched, for an output without bytes; without
    slots, every row shows the background (one row copy, no claims)."""
    rows, indices = torch.ones(2, 3, 4), torch.zeros(2, 3, dtype=torch.int64)
    sizes = torch.full((2,), 3)
    cases = [
        lambda: kern.indexing_write(rows, indices, sizes, torch.ones(2, 0, 4)),
        lambda: kern.indexing_write(rows[..., :0], indices, sizes, torch.ones(2, 5, 0)),
        lambda: kern.inverse_indexing_access(rows, indices, sizes, 0, 1.0),
        lambda: kern.index_mapping(rows, indices, indices, sizes, torch.ones(2, 0, 4)),
        lambda: kern.indexing_write(rows[:0], indices[:0], sizes[:0], torch.ones(0, 5, 4)),
    ]
    for call in cases:
        before = build.state()["launches"]
        assert call().numel() == 0
        assert build.state()["launches"] == before
    into = torch.randn(2, 5, 4)
    no_slots = (rows[:, :0], indices[:, :0], sizes)
    assert_same(run_row_copy(lambda: kern.indexing_write(*no_slots, into), 16), into)


def lazy_zeros(shape: tuple[int, ...], dtype: torch.dtype) -> Tensor:
    """Zeros on anonymous memory reserving nothing: a page costs memory only once written (reads
    map the kernel's shared zero page), so a tensor of 2**31 slots costs its few written pages.
    Huge pages, where the kernel allows them, cut the read faults of a pass over it by 512."""
    nbytes = math.prod(shape) * torch.empty(0, dtype=dtype).element_size()
    map_noreserve = 0x4000  # Linux; mmap.MAP_NORESERVE only exists from Python 3.13
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | map_noreserve
    try:
        memory = mmap.mmap(-1, nbytes, flags=flags)
    except OSError as why:
        pytest.skip(f"cannot map {nbytes} bytes of address space: {why}")
    with suppress(AttributeError, OSError):
        memory.madvise(mmap.MADV_HUGEPAGE)
    return torch.frombuffer(memory, dtype=dtype).view(shape)  # keeps the mapping alive


INT32_MAX = 2**31 - 1


@pytest.mark.slow
@pytest.mark.parametrize(
    ("op", "width", "schedule"),
    [
        ("indexing_write", 2**31 + 8, "forward"),
        ("inverse_indexing_access", 2**31 + 8, "reverse"),
        ("index_mapping", 2**31 + 8, "shuffled"),
        ("indexing_write", INT32_MAX, "shuffled"),
    ],
)
def test_scatters_past_int32_slot_indices(kern, op, width, schedule):
    """An index width past INT32_MAX claims in an int64 map (csrc/batched_indexing.cu,
    claim_type_for); INT32_MAX is the widest that claims in int32. The indices, rows and source
    indices are lazily mapped zeros but for the last slots: every slot is valid and all but those
    target row 0, so with 2**31 + 8 slots rows 0 and 1 go to slots past INT32_MAX, which an int32
    map would wrap to negative, unclaimed, values. 10-15 s each (2**31 emulated slots)."""
    targets, rows = lazy_zeros((1, width), torch.int64), lazy_zeros((1, width), torch.int8)
    # Row 0: slot width - 3 (width - 4 for the mapping); row 1: the last slot; rows 2 and 3:
    # nobody (the out-of-range target of slot width - 2 is skipped).
    targets[0, -1], targets[0, -2] = 1, 9
    rows[0, -1], rows[0, -2], rows[0, -3] = 11, 22, 33
    sizes = torch.tensor([width])
    into = torch.tensor([[1, 2, 3, 4]], dtype=torch.int8)
    if op == "indexing_write":
        expected = [33, 11, 3, 4]
        args = (rows, targets, sizes, into)
    elif op == "inverse_indexing_access":
        expected = [33, 11, -1, -1]
        args = (rows, targets, sizes, 4, -1)
    else:
        # Slot width - 3 names a source out of range: the pair is skipped, width - 4 wins row 0.
        sources = lazy_zeros((1, width), torch.int64)
        sources[0, -1], sources[0, -3], sources[0, -4] = 2, 7, 1
        expected = [20, 30, 3, 4]
        args = (torch.tensor([[10, 20, 30]], dtype=torch.int8), sources, targets, sizes, into)
    with emulation_settings(schedule=schedule, seed=5):
        out, claim_bytes = claimed_scatter(lambda: getattr(kern, op)(*args))
    assert claim_bytes == (4 if width <= INT32_MAX else 8)
    assert_same(out, torch.tensor([expected], dtype=torch.int8))


def _out_of_range(index_dtype: torch.dtype, bound: int) -> list[int]:
    big = 2**31 - 1 if index_dtype == torch.int32 else 2**62
    return [bound, bound + 3, -1, -bound - 1, big, -big]


@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.int16, torch.bool])
def test_out_of_range_indices_are_never_dereferenced(kern, index_dtype, dtype):
    """Valid slots holding out-of-range indices: the gather writes the filler, the scatters skip
    the slot, as batched_indexing.cu states (the wrappers raise on them before launching; the
    kernels only guarantee memory safety, see docs/kernels.rst). The oracle is a plain loop."""
    gen = torch.Generator().manual_seed(7)
    batch, sources, width = 4, 5, 6
    data = random_values((batch, sources, 3), dtype, gen)
    indices = torch.randint(0, sources, (batch, width), generator=gen)
    bad = _out_of_range(index_dtype, sources)
    indices[0, 0], indices[3, 5], indices[2, 1], indices[1, 4] = bad[0], bad[2], bad[4], bad[5]
    indices[1, 2], indices[3, 1] = bad[1], bad[3]
    indices = indices.to(index_dtype)
    sizes = torch.tensor([6, 5, 6, 6])
    filler = True if dtype == torch.bool else 9

    def in_range(i: int, bound: int) -> bool:
        return 0 <= i < bound

    expected = _gather_oracle(data, indices, sizes, filler)
    assert_same(kern.indexing_access(data, indices, sizes, filler), expected)

    # The scatters write unique targets (for duplicates the winner is unspecified).
    rows = random_values((batch, width, 3), dtype, gen)
    unique = torch.tensor([[0, 1, 2, 3, 4, 0]] * batch)
    unique[0, 0], unique[1, 2], unique[2, 4], unique[3, 1] = bad[0], bad[2], bad[4], bad[5]
    unique = unique.to(index_dtype)
    usizes = torch.tensor([5, 5, 5, 4])
    written, mask = data.clone(), torch.zeros(batch, sources, dtype=torch.bool)
    filled = torch.full((batch, sources, 3), filler, dtype=dtype)
    for b in range(batch):
        for j in range(int(usizes[b])):
            target = int(unique[b, j])
            if in_range(target, sources):
                written[b, target] = rows[b, j]
                filled[b, target] = rows[b, j]
                mask[b, target] = True
    assert_same(kern.indexing_write(rows, unique, usizes, data), written)
    assert_same(kern.inverse_indexing_access(rows, unique, usizes, sources, filler), filled)
    assert_same(kern.indices_to_mask(unique, usizes, sources), mask)

    # index_mapping skips a pair when either of its indices is out of range.
    source_indices = indices[:, :5]
    mapped = data.clone()
    for b in range(batch):
        for j in range(int(usizes[b])):
            s, t = int(source_indices[b, j]), int(unique[b, j])
            if in_range(s, sources) and in_range(t, sources):
                mapped[b, t] = data[b, s]
    assert_same(kern.index_mapping(data, source_indices, unique[:, :5], usizes, data), mapped)


# ---------------------------------------------------------------------------------------- masks
@pytest.mark.parametrize("width", [1, 7, 255, 256, 257, 1000, 70_000])
def test_mask_ops_exact(kern, width):
    mask = mask_case(width, batch=5, width=width)
    ref_indices, ref_counts = bi.mask_to_indices(mask)
    count = ref_indices.shape[1]
    indices, counts = kern.mask_to_indices(mask, count)
    assert_same(indices, ref_indices)
    assert_same(counts, ref_counts)
    for max_count in {0, count // 2, count + 3}:
        expected = operators.mask_to_indices_torch(mask, max_count)
        indices, counts = kern.mask_to_indices(mask, max_count)
        assert_same(indices, expected[0])
        assert_same(counts, expected[1])
    dtypes = KERNEL_DTYPES if width <= 1000 else [torch.float64, torch.int8, torch.bool]
    for dtype in dtypes:
        data = torch.arange(5 * width * 2).reshape(5, width, 2).to(dtype)
        out, counts = kern.bool_compaction(data, mask, count)
        ref_out, ref_counts = bi.bool_compaction(data, mask)
        assert_same(out, ref_out)
        assert_same(counts, ref_counts)


@pytest.mark.parametrize("width", [0, 1, 31, 32, 33, 300, 513])
def test_mask_patterns(kern, width):
    """Rows whose True entries sit at every tile and warp boundary of the block scan."""
    rows = [
        torch.zeros(width, dtype=torch.bool),
        torch.ones(width, dtype=torch.bool),
        torch.arange(width) % 2 == 0,
        torch.arange(width) % 32 == 31,
        torch.arange(width) % 256 == 255,
        torch.arange(width) >= width // 2,
    ]
    mask = torch.stack(rows)
    for max_count in (0, 1, width // 3, width, width + 2):
        expected = operators.mask_to_indices_torch(mask, max_count)
        indices, counts = kern.mask_to_indices(mask, max_count)
        assert_same(indices, expected[0])
        assert_same(counts, expected[1])
        data = torch.randn(6, width, 3, generator=torch.Generator().manual_seed(width))
        out, counts = kern.bool_compaction(data, mask, max_count)
        ref_out, ref_counts = operators.bool_compaction_torch(data, mask, max_count)
        assert_same(out, ref_out)
        assert_same(counts, ref_counts)
    empty = torch.zeros(0, width, dtype=torch.bool)
    indices, counts = kern.mask_to_indices(empty, 4)
    assert indices.shape == (0, 4) and counts.shape == (0,)
    noncontig = noncontiguous(mask.T.contiguous().T) if width else mask
    assert_same(kern.mask_to_indices(noncontig, width)[0], bi.mask_to_indices(mask, width)[0])


# ---------------------------------------------------------------- masks: the chunked scan path
#: csrc/mask_indices.cu, use_chunks(): rows are cut into chunks of CHUNK entries when each spans
#: at least MIN_CHUNKS_PER_ROW chunks and there are fewer rows than ROWS_PER_SM per emulated SM.
CHUNK = 256 * 16
MIN_CHUNKS_PER_ROW = 4
ROWS_PER_SM = 8
#: The launches each path makes: (count, last kernel) -> path. The chunked path with
#: max_count == 0 only counts (pass 1); otherwise it counts, scatters and fills the tail.
_MASK_PATHS = {
    (1, "mask_to_indices_kernel"): "rows",
    (1, "count_chunks_kernel<kVector>"): "chunks",
    (3, "zero_tail_kernel"): "chunks",
}


def chunked_by_rule(batch: int, width: int, sms: int) -> bool:
    return width >= MIN_CHUNKS_PER_ROW * CHUNK and batch < ROWS_PER_SM * sms


def mask_to_indices_path(kern, mask: Tensor, max_count: int) -> tuple[Tensor, Tensor, str]:
    """``kern.mask_to_indices`` and the path it took, told by the kernels it launched."""
    before = build.state()["launches"]
    indices, counts = kern.mask_to_indices(mask, max_count)
    state = build.state()
    return indices, counts, _MASK_PATHS[(state["launches"] - before, state["last_kernel"])]


def long_rows(batch: int, width: int, seed: int) -> Tensor:
    """Rows whose True entries sit where the chunked path can go wrong: none, all, only in the
    last (partial) chunk, at both sides of every chunk boundary, and at random."""
    gen = torch.Generator().manual_seed(seed)
    position = torch.arange(width)
    patterns = [
        torch.rand(width, generator=gen) < 0.3,
        torch.zeros(width, dtype=torch.bool),
        torch.ones(width, dtype=torch.bool),
        position >= (width - 1) // CHUNK * CHUNK,
        (position % CHUNK == 0) | (position % CHUNK == CHUNK - 1) | (position == width - 1),
        torch.rand(width, generator=gen) < 0.98,
    ]
    return torch.stack([patterns[(seed + b) % len(patterns)] for b in range(batch)])


@contextmanager
def poisoned_empty() -> Iterator[None]:
    """``at::empty`` fills what it returns (int64: its largest value, floats: NaN), so that an
    output slot that no kernel writes shows, instead of reading as the zeros of fresh pages."""
    previous = (
        torch.are_deterministic_algorithms_enabled(),
        torch.utils.deterministic.fill_uninitialized_memory,
    )
    torch.use_deterministic_algorithms(True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(previous[0])
        torch.utils.deterministic.fill_uninitialized_memory = previous[1]


def assert_mask_ops_match(kern, mask: Tensor, max_count: int, path: str) -> None:
    """mask_to_indices and bool_compaction equal the PyTorch implementation, through ``path``,
    with every output slot written (outputs start poisoned)."""
    with poisoned_empty():
        indices, counts, taken = mask_to_indices_path(kern, mask, max_count)
    assert taken == path
    expected = operators.mask_to_indices_torch(mask, max_count)
    assert_same(indices, expected[0])
    assert_same(counts, expected[1])
    data = torch.arange(mask.numel() * 2, dtype=torch.int32).view(*mask.shape, 2)
    with poisoned_empty():
        out, counts = kern.bool_compaction(data, mask, max_count)
    ref_out, ref_counts = operators.bool_compaction_torch(data, mask, max_count)
    assert_same(out, ref_out)
    assert_same(counts, ref_counts)


@pytest.mark.parametrize("schedule", ["forward", "reverse", "shuffled"])
@pytest.mark.parametrize(
    ("batch", "width", "sms"),
    [
        (1, MIN_CHUNKS_PER_ROW * CHUNK, 1),  # exactly 4 chunks, 16-byte loads
        (2, 70_001, 2),  # a partial last chunk, byte loads (width % 16 != 0)
        (3, 70_000, 3),  # a partial last chunk, 16-byte loads
        (3, 5 * CHUNK + 16, 1),  # a last chunk of one thread's entries
    ],
)
def test_mask_ops_on_few_long_rows(kern, schedule, batch, width, sms):
    """Few long rows take the chunked path: count, cumsum, scatter, zero the tail. With grids of
    32 blocks per SM the chunk loops stride; the output equals the one-block-per-row path."""
    mask = long_rows(batch, width, seed=width + batch)
    longest = int(mask.sum(1).max())
    with emulation_settings(sms=sms, schedule=schedule, seed=batch):
        assert chunked_by_rule(batch, width, sms)
        for max_count in sorted({0, 1, longest // 2, longest, longest + 5, width + 3}):
            assert_mask_ops_match(kern, mask, max_count, "chunks")
        # One element into its allocation: the 16-byte loads give way to byte loads.
        assert_mask_ops_match(kern, shifted(mask), longest, "chunks")


@pytest.mark.parametrize(
    ("batch", "width", "sms"),
    [
        (2, MIN_CHUNKS_PER_ROW * CHUNK, 1),
        (2, MIN_CHUNKS_PER_ROW * CHUNK - 1, 1),
        (ROWS_PER_SM - 1, MIN_CHUNKS_PER_ROW * CHUNK, 1),
        (ROWS_PER_SM, MIN_CHUNKS_PER_ROW * CHUNK, 1),
        (ROWS_PER_SM, MIN_CHUNKS_PER_ROW * CHUNK, 2),
        (2 * ROWS_PER_SM, MIN_CHUNKS_PER_ROW * CHUNK + 1, 2),
    ],
)
def test_mask_path_follows_the_host_rule(kern, batch, width, sms):
    """Each side of both thresholds of the rule takes its path and gives the same output; the
    SM count read through the cached device properties follows the emulated one between runs."""
    mask = long_rows(batch, width, seed=batch)
    path = "chunks" if chunked_by_rule(batch, width, sms) else "rows"
    with emulation_settings(sms=sms):
        assert_mask_ops_match(kern, mask, int(mask.sum(1).max()), path)


@settings(max_examples=15, deadline=None)
@given(
    batch=st.integers(1, 3),
    chunks=st.integers(MIN_CHUNKS_PER_ROW, 6),
    remainder=st.integers(-CHUNK + 1, 0),
    density=st.floats(0, 1),
    extra=st.integers(-50, 5),
    sms=st.integers(1, 3),
    seed=st.integers(0, 2**16),
)
def test_chunked_mask_property(kern, batch, chunks, remainder, density, extra, sms, seed):
    width = max(chunks * CHUNK + remainder, MIN_CHUNKS_PER_ROW * CHUNK)
    gen = torch.Generator().manual_seed(seed)
    mask = torch.rand((batch, width), generator=gen) < density
    max_count = max(0, int(mask.sum(1).max()) + extra)
    with emulation_settings(sms=sms):
        assert_mask_ops_match(kern, mask, max_count, "chunks")


# ------------------------------------------------------------------ grid-stride loops, schedules
def assert_grid_strides(rows: int, rows_per_block: int, cap: int) -> None:
    """The last launch ran the capped grid, too small to give every row its own thread group."""
    assert build.state()["last_grid"][0] == cap
    assert rows > cap * rows_per_block


@pytest.mark.parametrize("sms", [1, 3])
def test_grid_stride_loops(kern, sms):
    """With few SMs the grids are capped at 32 blocks per SM, so every loop strides."""
    gen = torch.Generator().manual_seed(sms)
    cap = 32 * sms
    with emulation_settings(sms=sms):
        assert build.state()["sm_count"] == sms
        # One-byte rows: one thread per row, 256 rows per block.
        lengths = torch.randint(0, 1000, (60,), generator=gen).tolist()
        offsets = offsets_of(lengths)
        values = torch.rand(sum(lengths), generator=gen) > 0.5
        max_len = max(lengths) + 1
        padded = kern.packed_to_padded(values, offsets, max_len, True)
        assert build.state()["last_grid"] == [1, 60, 1]  # one grid row per sample
        assert_same(padded, operators.packed_to_padded_torch(values, offsets, max_len, True))
        assert_same(kern.padded_to_packed(padded, offsets, values.shape[0]), values)
        sizes = offsets.diff()
        assert_same(kern.fill_padding(padded, sizes, False), bi.fill_padding(padded, sizes, False))
        assert_grid_strides(60 * max_len, 256, cap)
        # 256-byte rows (16 units): a sample's span of up to 400 * 16 units wants 7 blocks of
        # 1024 units along x; the grid caps x at 8 waves over the 60 samples, so with one SM
        # (5 blocks) the blocks stride over their sample.
        lengths = torch.randint(0, 401, (60,), generator=gen).tolist()
        wide = torch.randn(sum(lengths), 64, generator=gen)
        wide_offsets = offsets_of(lengths)
        for direction in ("to padded", "to packed"):
            if direction == "to padded":
                out = kern.packed_to_padded(wide, wide_offsets, 400, 0.5)
                expected = operators.packed_to_padded_torch(wide, wide_offsets, 400, 0.5)
            else:
                out = kern.padded_to_packed(expected, wide_offsets, wide.shape[0])
                expected = wide
            assert build.state()["last_grid"] == [min(7, -(-8 * cap // 60)), 60, 1]
            assert_same(out, expected)

        batch = 20 * sms
        data, indices, sizes = index_case(
            sms, batch=batch, sources=700, width=600, feature=(), dtype=torch.int32
        )
        expected = bi.indexing_access(data, indices, sizes, -1)
        assert_same(kern.indexing_access(data, indices, sizes, -1), expected)
        assert_grid_strides(batch * 600, 256, cap)
        assert_same(
            kern.indices_to_mask(indices, sizes, 700), bi.indices_to_mask(indices, sizes, 700)
        )
        assert_grid_strides(batch * 600, 256, cap)
        mask = mask_case(sms, batch=cap * 2 + 5, width=300)
        indices, counts = kern.mask_to_indices(mask, 300)
        assert_grid_strides(cap * 2 + 5, 1, cap)
        expected = operators.mask_to_indices_torch(mask, 300)
        assert_same(indices, expected[0])
        assert_same(counts, expected[1])


@pytest.mark.parametrize(("schedule", "seed"), [("reverse", 0), ("shuffled", 1), ("shuffled", 2)])
def test_results_do_not_depend_on_the_thread_order(kern, schedule, seed):
    """The blocks, and the threads of a block between two barriers, in other orders: a kernel
    whose result depended on the order (a race the barriers do not cover) would differ."""
    with emulation_settings(schedule=schedule, seed=seed, sms=1):
        assert build.state()["schedule"] == schedule
        for feature in [(), (3,), (64,)]:
            values, offsets, max_len = ragged_case(seed, batch=40, feature=feature)
            assert_same(
                kern.packed_to_padded(values, offsets, max_len, 2.0),
                operators.packed_to_padded_torch(values, offsets, max_len, 2.0),
            )
            data, indices, sizes = index_case(seed, batch=9, sources=30, width=20, feature=feature)
            assert_same(
                kern.indexing_access(data, indices, sizes, 1),
                bi.indexing_access(data, indices, sizes, 1),
            )
        for width in [1, 257, 1000]:
            mask = mask_case(width + seed, batch=40, width=width)
            expected = bi.mask_to_indices(mask)
            indices, counts = kern.mask_to_indices(mask, expected[0].shape[1])
            assert_same(indices, expected[0])
            assert_same(counts, expected[1])


# ---------------------------------------------------------------------------------- properties
@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 40), max_size=7),
    feature=st.sampled_from(FEATURES),
    dtype=st.sampled_from(KERNEL_DTYPES),
    extra=st.integers(0, 3),
    shift=st.integers(0, 3),
    sms=st.sampled_from([None, 1, 2]),
    seed=st.integers(0, 2**16),
)
def test_conversions_property(kern, lengths, feature, dtype, extra, shift, sms, seed):
    gen = torch.Generator().manual_seed(seed)
    values = random_values((sum(lengths), *feature), dtype, gen)
    if shift:
        values = shifted(values, shift)
    offsets = offsets_of(lengths)
    max_len = max(lengths, default=0) + extra
    with emulation_settings(sms=sms) if sms else nullcontext():
        padded = kern.packed_to_padded(values, offsets, max_len, 3)
        assert_same(padded, operators.packed_to_padded_torch(values, offsets, max_len, 3))
        assert_same(kern.padded_to_packed(shifted(padded, shift), offsets, values.shape[0]), values)
        sizes = torch.randint(-1, max_len + 2, (len(lengths),), generator=gen)
        assert_same(kern.fill_padding(padded, sizes, 0), bi.fill_padding(padded, sizes, 0))


@settings(max_examples=30, deadline=None)
@given(
    batch=st.integers(0, 5),
    width=st.integers(0, 600),
    density=st.floats(0, 1),
    extra=st.integers(-5, 5),
    sms=st.sampled_from([None, 1]),
    seed=st.integers(0, 2**16),
)
def test_mask_property(kern, batch, width, density, extra, sms, seed):
    gen = torch.Generator().manual_seed(seed)
    mask = torch.rand((batch, width), generator=gen) < density
    max_count = max(0, int(mask.sum(1).max()) + extra if batch else extra)
    data = torch.randint(-9, 9, (batch, width, 2), generator=gen, dtype=torch.int16)
    with emulation_settings(sms=sms) if sms else nullcontext():
        expected = operators.mask_to_indices_torch(mask, max_count)
        indices, counts = kern.mask_to_indices(mask, max_count)
        assert_same(indices, expected[0])
        assert_same(counts, expected[1])
        out, counts = kern.bool_compaction(data, mask, max_count)
        assert_same(out, operators.bool_compaction_torch(data, mask, max_count)[0])


# ---------------------------------------------------------------------------------- the engine
def test_shuffles_follow_cuda_semantics(engine):
    out = engine.selftest("shuffles", torch.empty(0), 0)
    for t in range(64):
        lane, warp_base = t % 32, t - t % 32

        def value(source_lane: int, lane: int = lane, warp_base: int = warp_base) -> int:
            return 100 * (warp_base + source_lane)

        def segment(offset: int, width: int, lane: int = lane) -> int:
            source = lane + offset
            start = lane - lane % width
            return value(source if start <= source < start + width else lane)

        expected = [
            segment(-1, 32),
            segment(-5, 32),
            segment(3, 32),
            value(lane ^ 6),
            value(7),
            segment(-2, 8),
            segment(2, 8),
            value(1),
        ]
        assert out[t].tolist() == expected, t


def test_builtin_variables_of_a_3d_launch(engine):
    out = engine.selftest("thread_ids", torch.empty(0), 0)
    assert out[..., 0].tolist() == [[block] * 24 for block in range(12)]
    assert out[..., 1].tolist() == [list(range(24))] * 12


@pytest.mark.parametrize("schedule", ["forward", "reverse", "shuffled"])
def test_barriers_order_shared_memory(engine, schedule):
    data = torch.arange(4 * 256, dtype=torch.int32)
    with emulation_settings(schedule=schedule, seed=3):
        out = engine.selftest("block_reverse", data, 256)
    assert torch.equal(out, data.view(4, 256).flip(1).reshape(-1))


def test_a_race_shows_as_a_schedule_dependence(engine):
    """Without its barrier the reversal reads slots not yet written: the orders disagree."""
    data = torch.arange(2 * 128, dtype=torch.int32)
    correct = data.view(2, 128).flip(1).reshape(-1)
    results = []
    for schedule in ("forward", "reverse"):
        engine.selftest("block_reverse", torch.full_like(data, -1), 128)  # known stale tile
        with emulation_settings(schedule=schedule):
            results.append(engine.selftest("racy_block_reverse", data, 128))
    assert not torch.equal(results[0], results[1])
    assert not any(torch.equal(r, correct) for r in results)


@pytest.mark.parametrize(
    ("case", "message"),
    [
        (
            "divergent_barrier",
            r"divergent __syncthreads.*threads 0-15: at __syncthreads; "
            r"threads 16-63: exited",
        ),
        (
            "warp_deadlock",
            r"deadlock.*threads 0-15: at __shfl_up_sync \(mask 0xffffffff\); "
            r"threads 16-31: at __syncthreads",
        ),
        ("exited_lane", r"lane 0 of warp 0 exited before joining __shfl_up_sync"),
        ("misaligned", r"copy_units_kernel .*pointer argument 0 is not aligned to 16 bytes"),
        ("empty_grid", r"invalid configuration argument"),
        ("oversized_block", r"invalid configuration argument"),
    ],
)
def test_broken_kernels_raise_instead_of_hanging(kern, engine, case, message):
    with pytest.raises(RuntimeError, match=message):
        engine.selftest(case, torch.empty(0), 0)
    # The engine recovers: its fibers are reset, and the next launches run normally.
    mask = mask_case(0, batch=3, width=300)
    expected = bi.mask_to_indices(mask)
    assert_same(kern.mask_to_indices(mask, expected[0].shape[1])[0], expected[0])


def test_barrier_free_kernels_run_each_thread_once(kern, engine):
    engine.reset_stats()
    values, offsets, max_len = ragged_case(0, batch=40, feature=(3,))
    kern.packed_to_padded(values, offsets, max_len, 0)
    state = build.state()
    assert state["launches"] == 1
    assert state["threads"] == state["blocks"] * 256
    assert state["switches"] == state["threads"]  # one suspension each: at exit
    assert state["block_barriers"] == state["warp_syncs"] == 0


def test_sm_count_from_the_environment(engine, monkeypatch):
    monkeypatch.setenv("NESTBATCH_EMULATED_SMS", "7")
    assert build.state()["sm_count"] == 7
    with emulation_settings(sms=2):
        assert build.state()["sm_count"] == 2
    assert build.state()["sm_count"] == 7
    monkeypatch.delenv("NESTBATCH_EMULATED_SMS")
    assert build.state()["sm_count"] == 132
    with pytest.raises(RuntimeError, match="unknown schedule"):
        engine.set_schedule("sideways", 0)


def test_the_build_is_cached(kern):
    """A later process finds the library of these sources and loads it without compiling."""
    library = build.load()
    assert library.parent.parent == build.BUILD_ROOT
    assert (library.parent / "COMPLETE").is_file()
    built = library.stat().st_mtime_ns
    assert build.load.__wrapped__() == library  # what a new process does
    assert library.stat().st_mtime_ns == built


# ------------------------------------------------------------------------------ memory safety
def _guarded_gathers(kern) -> None:
    from cuda_emulation.guarded import guarded

    gen = torch.Generator().manual_seed(11)
    batch, sources, width = 4, 5, 6
    data = torch.randn(batch, sources, 3, generator=gen)
    indices = torch.randint(0, sources, (batch, width), generator=gen)
    # Just past the end of the data, and just before its start.
    indices[-1, 0], indices[-1, 1], indices[0, 2], indices[1, 3] = sources, sources + 1, -1, -6
    sizes = torch.full((batch,), width)
    expected = _gather_oracle(data, indices, sizes, 7.0)
    for side in ("after", "before"):
        args = [guarded(t, side) for t in (data, indices, sizes)]
        assert_same(kern.indexing_access(*args, 7.0), expected)
        mapped = data.clone()
        targets = torch.arange(width).expand(batch, width) % sources
        for b in range(batch):
            for j in range(width):
                if 0 <= int(indices[b, j]) < sources:
                    mapped[b, int(targets[b, j])] = data[b, int(indices[b, j])]
        pairs = (args[0], args[1], guarded(targets.contiguous(), side), args[2], data)
        assert_same(kern.index_mapping(*pairs), mapped)


def _guarded_scatters(kern) -> None:
    from cuda_emulation.guarded import guarded

    gen = torch.Generator().manual_seed(12)
    batch, width, targets = 3, 4, 6
    rows = torch.randint(-50, 50, (batch, width, 5), generator=gen, dtype=torch.int16)
    indices = torch.tensor([[0, 5, 6, 2], [-1, 3, 1, 4], [2, 7, 0, -6]])
    sizes = torch.tensor([4, 3, 4])
    into = torch.zeros(batch, targets, 5, dtype=torch.int16)
    expected, mask = into.clone(), torch.zeros(batch, targets, dtype=torch.bool)
    for b in range(batch):
        for j in range(int(sizes[b])):
            if 0 <= int(indices[b, j]) < targets:
                expected[b, int(indices[b, j])] = rows[b, j]
                mask[b, int(indices[b, j])] = True
    for side in ("after", "before"):
        args = [guarded(t, side) for t in (rows, indices, sizes)]
        assert_same(kern.indexing_write(*args, into), expected)
        assert_same(kern.inverse_indexing_access(*args, targets, 0), expected)
        assert_same(kern.indices_to_mask(args[1], args[2], targets), mask)


def _guarded_conversions(kern) -> None:
    from cuda_emulation.guarded import guarded

    values = torch.randn(7, 3, generator=torch.Generator().manual_seed(13))
    consistent = torch.tensor([0, 3, 3, 7])
    # Offsets past the packed values, or before them: the kernel must not read them.
    for offsets in (consistent, torch.tensor([0, 4, 10]), torch.tensor([-2, 3, 7])):
        expected = _padded_oracle(values, offsets, 8, -1.0)
        for side in ("after", "before"):
            moved = (guarded(values, side), guarded(offsets, side))
            assert_same(kern.packed_to_padded(*moved, 8, -1.0), expected)
    padded = _padded_oracle(values, consistent, 5, 0.0)
    sizes = consistent.diff()
    for side in ("after", "before"):
        data = guarded(padded, side)
        assert_same(kern.padded_to_packed(data, guarded(consistent, side), 7), values)
        # Lengths over the padded length and a total past the offsets stay inside the data.
        assert kern.padded_to_packed(data, torch.tensor([0, 9, 9, 12]), 15).shape == (15, 3)
        assert_same(
            kern.fill_padding(data, guarded(sizes, side), 2.0),
            padded.masked_fill((torch.arange(5) >= sizes[:, None])[..., None], 2.0),
        )


def _guarded_masks(kern) -> None:
    from cuda_emulation.guarded import guarded

    # The last two take the chunked path (3 rows of 4 chunks and more), with 16-byte loads
    # (16400 entries) and with byte loads (16401).
    for width in (1, 300, 513, 16_400, 16_401):
        mask = mask_case(width, batch=3, width=width)
        mask[1, -1] = True  # the very last entry is read, and selected
        data = torch.arange(3 * width * 2, dtype=torch.int64).view(3, width, 2)
        expected = bi.mask_to_indices(mask)
        count = expected[0].shape[1]
        path = "chunks" if chunked_by_rule(3, width, build.state()["sm_count"]) else "rows"
        assert path == ("chunks" if width > 1000 else "rows")
        for side in ("after", "before"):
            indices, _, taken = mask_to_indices_path(kern, guarded(mask, side), count)
            assert taken == path
            assert_same(indices, expected[0])
            out, _ = kern.bool_compaction(guarded(data, side), guarded(mask, side), count)
            assert_same(out, bi.bool_compaction(data, mask)[0])


def run_guarded_cases() -> None:
    """Every operator on inputs bordered by inaccessible pages (run in a child process by
    :func:`test_no_out_of_bounds_reads`): a read outside an input faults."""
    build.load()
    kern = torch.ops.nestbatch_emulated
    for case in (_guarded_gathers, _guarded_scatters, _guarded_conversions, _guarded_masks):
        print(f"running {case.__name__}", flush=True)
        case(kern)
    print("all guarded cases passed", flush=True)


def test_no_out_of_bounds_reads(kern):
    """docs/kernels.rst: "the kernels themselves never touch memory out of bounds whatever the
    indices". Out-of-range indices and offsets next to inaccessible pages, in a child process."""
    from cuda_emulation.guarded import describe_fault, run_in_child

    result = run_in_child(Path(__file__).stem, "run_guarded_cases", Path(__file__).parent)
    assert result.returncode == 0, describe_fault(result)
    assert "all guarded cases passed" in result.stdout


def _mismatched_shapes() -> list[tuple[str, tuple, tuple]]:
    """(operator, arguments) pairs whose shapes disagree with the documented ones."""
    batch, width, sources, feature = 3, 4, 5, 2
    indices = torch.tensor([[0, 1, 2, 3]] * batch)
    sizes = torch.tensor([4, 2, 3])

    def rows(b=batch, m=width, d=feature):
        return torch.randn(b, m, d)

    into = torch.randn(batch, sources, feature)
    cases = []
    for name, bad in [
        ("more rows than indices", rows(m=width + 1)),
        ("fewer rows than indices", rows(m=width - 1)),
        ("more samples", rows(b=batch + 1)),
        ("fewer samples", rows(b=batch - 1)),
        ("wider features", rows(d=feature + 1)),
        ("narrower features", rows(d=feature - 1)),
    ]:
        cases.append((f"indexing_write, {name}", "indexing_write", (bad, indices, sizes, into)))
    for name, bad in [("wider", rows(m=width + 1)), ("narrower", rows(m=width - 1))]:
        args = (bad, indices, sizes, sources, 0)
        cases.append((f"inverse_indexing_access, {name} data", "inverse_indexing_access", args))
    for name, target in [
        ("more samples", torch.randn(batch + 1, sources, feature)),
        ("fewer samples", torch.randn(batch - 1, sources, feature)),
        ("wider features", torch.randn(batch, sources, feature + 1)),
        ("narrower features", torch.randn(batch, sources, feature - 1)),
    ]:
        args = (into, indices, indices, sizes, target)
        cases.append((f"index_mapping, target with {name}", "index_mapping", args))
    return cases


@pytest.mark.parametrize(
    ("name", "op", "args"),
    _mismatched_shapes(),
    ids=[re.sub(r"\W+", "-", case[0]) for case in _mismatched_shapes()],
)
def test_mismatched_shapes_raise_like_the_reference(kern, name, op, args):
    """The host wrappers check the shapes their messages document: the kernels would otherwise
    pair rows with the wrong indices, or read and write past the tensors."""
    reference = getattr(bi, op)
    with pytest.raises(RuntimeError):
        reference(*args)
    with pytest.raises(RuntimeError, match=op):
        getattr(kern, op)(*args)


def test_emulation_refuses_a_machine_with_a_cuda_device(monkeypatch):
    # Its stand-ins for at::cuda clash with a CUDA build's once a GPU is in use (crashes seen
    # on an H100 machine): there it skips, with the reason, and the real kernels run in the
    # tests marked cuda. A CUDA build without a GPU runs it.
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(build.EmulationUnavailable, match="without a CUDA device"):
        build.load.__wrapped__()  # past the per-process cache of an earlier load

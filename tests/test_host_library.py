"""The C conversions of :mod:`nestbatch.kernels.host_library`: built on first use, bit-exact
against the PyTorch references (special fillers included), and absent cleanly (no compiler,
turned off), leaving the PyTorch path."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nestbatch.kernels import host_library, operators

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(host_library.library() is None,
                                reason=f"no C conversions here: {host_library.status()}")


def _same_bits(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    as_bytes = [t.contiguous().view(torch.uint8) for t in (actual, expected)]
    assert torch.equal(*as_bytes)


@pytest.mark.parametrize("filler", [0.0, -0.0, float("nan"), float("-inf"), 2.5])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_special_fillers_are_written_bit_for_bit(dtype, filler):
    values = torch.tensor([[1.0, -0.0], [float("nan"), float("inf")], [3.0, 4.0]], dtype=dtype)
    offsets = torch.tensor([0, 1, 1, 3])
    padded = host_library.packed_to_padded(values, offsets, 4, filler)
    _same_bits(padded, operators.packed_to_padded_torch(values, offsets, 4, filler))
    sizes = torch.tensor([0, 1, 3])
    _same_bits(host_library.fill_padding(padded, sizes, filler),
               operators.fill_padding_torch(padded, sizes, filler))
    _same_bits(host_library.padded_to_packed(padded, offsets, 3), values)


@pytest.mark.parametrize("dtype", [torch.bool, torch.uint8, torch.int32, torch.int64])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_integer_dtypes_and_their_extremes(dtype, index_dtype):
    info = (0, 1) if dtype == torch.bool else (torch.iinfo(dtype).min, torch.iinfo(dtype).max)
    values = torch.tensor([[info[0]], [info[1]], [info[1]]], dtype=dtype)
    offsets = torch.tensor([0, 2, 3], dtype=index_dtype)
    for filler in info:
        _same_bits(host_library.packed_to_padded(values, offsets, 3, filler),
                   operators.packed_to_padded_torch(values, offsets, 3, filler))


def test_out_of_contract_offsets_are_left_to_the_reference():
    values = torch.arange(8.0).view(4, 2)
    # Past the rows, decreasing, a sample longer than the width: nothing computed.
    for offsets, width in (([0, 2, 5], 4), ([0, 3, 2], 4), ([0, 4, 4], 3)):
        assert host_library.packed_to_padded(values, torch.tensor(offsets), width, 0) is None
    data = torch.zeros(2, 3, 2)
    for offsets, total in (([1, 2, 3], 3), ([0, 2, 3], 4), ([0, 4, 5], 5)):
        assert host_library.padded_to_packed(data, torch.tensor(offsets), total) is None


def test_empty_batch_and_empty_outputs():
    values = torch.empty(0, 3)
    assert host_library.packed_to_padded(values, torch.zeros(1, dtype=torch.int64), 0, 1).shape \
        == (0, 0, 3)
    padded = host_library.packed_to_padded(values, torch.zeros(3, dtype=torch.int64), 2, 1.0)
    assert torch.equal(padded, torch.ones(2, 2, 3))
    assert host_library.padded_to_packed(padded, torch.zeros(3, dtype=torch.int64), 0).shape \
        == (0, 3)


def test_large_outputs_match_the_reference():
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(0, 300, (64,), generator=gen)
    offsets = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)])
    values = torch.randn(int(offsets[-1]), 40, generator=gen)
    padded = host_library.packed_to_padded(values, offsets, 300, -1.0)
    _same_bits(padded, operators.packed_to_padded_torch(values, offsets, 300, -1.0))
    _same_bits(host_library.padded_to_packed(padded, offsets, values.shape[0]), values)


def _status_in_a_fresh_process(**env: str) -> str:
    code = "from nestbatch.kernels import host_library; print(host_library.status())"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT), **env}, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_absent_library_leaves_the_pytorch_path(tmp_path):
    assert _status_in_a_fresh_process(NESTBATCH_DISABLE_HOST_KERNELS="1") == \
        "PyTorch: NESTBATCH_DISABLE_HOST_KERNELS=1"
    status = _status_in_a_fresh_process(CC="no-such-compiler", NESTBATCH_CACHE_DIR=str(tmp_path))
    assert status.startswith("PyTorch") and "no-such-compiler" in status
    # A fresh cache directory gets the library built into it.
    assert str(tmp_path) in _status_in_a_fresh_process(NESTBATCH_CACHE_DIR=str(tmp_path))


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("dtype", [torch.bool, torch.bfloat16, torch.float64, torch.int64])
def test_row_gathers_and_scatters_match_the_references(dtype, index_dtype):
    gen = torch.Generator().manual_seed(1)
    data = (torch.randn(3, 5, 2, generator=gen) * 4).to(dtype)
    indices = torch.randint(0, 5, (3, 4), generator=gen, dtype=torch.int64).to(index_dtype)
    indices[0, 1] = indices[0, 0]  # a repeated target: the later slot wins, as in the reference
    sizes = torch.tensor([4, 0, 9], dtype=index_dtype)  # clamped to [0, width]
    _same_bits(host_library.gather_rows(data, indices, sizes, 1),
               operators.indexing_access_torch(data, indices, sizes, 1))
    to_write = data[:, :4].contiguous()
    out = host_library.scatter_rows(to_write, None, indices, sizes, data.clone())
    _same_bits(out, operators.indexing_write_torch(to_write, indices, sizes, data))
    mapped = host_library.scatter_rows(data, indices.flip(1).contiguous(), indices, sizes,
                                       data.clone())
    _same_bits(mapped, operators.index_mapping_torch(data, indices.flip(1), indices, sizes, data))


def test_indices_outside_their_dim_are_left_to_the_reference():
    data = torch.zeros(2, 3, 1)
    sizes = torch.tensor([2, 2])
    for bad in (3, -1):
        indices = torch.tensor([[0, bad], [1, 2]])
        assert host_library.gather_rows(data, indices, sizes, 0) is None
        assert host_library.scatter_rows(data, None, indices, sizes, data.clone()) is None
    # A padded slot's index is never read.
    assert host_library.gather_rows(data, torch.tensor([[0, 99], [1, 2]]), torch.tensor([1, 2]),
                                    0) is not None


@pytest.mark.skipif(not hasattr(os, "getuid"), reason="POSIX permissions")
def test_a_cache_directory_others_can_write_is_not_used(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # another user could place a library there: never loaded
    status = _status_in_a_fresh_process(NESTBATCH_CACHE_DIR=str(shared))
    assert status.startswith("PyTorch") and "private" in status
    assert not list(shared.iterdir())


def test_every_dtype_and_exact_integer_fillers_take_the_c_path():
    """Rows are bytes: complex rows and int64 fillers beyond 2**53 (which a double would round)
    are written bit for bit by the C path, not handed back."""
    offsets = torch.tensor([0, 2, 3])
    values = torch.tensor([[1 + 2j], [3 - 4j], [5j]], dtype=torch.complex64)
    padded = host_library.packed_to_padded(values, offsets, 3, 1.5)
    _same_bits(padded, operators.packed_to_padded_torch(values, offsets, 3, 1.5))
    _same_bits(host_library.padded_to_packed(padded, offsets, 3), values)
    big = 2**53 + 1
    values = torch.tensor([[1], [2], [3]])
    padded = host_library.packed_to_padded(values, offsets, 3, big)
    assert padded is not None and padded[1, 2, 0].item() == big


def test_outputs_and_fillers_outside_the_c_path_are_handed_back():
    values, offsets = torch.ones(3, 2), torch.tensor([0, 2, 3])
    assert host_library.packed_to_padded(values, offsets, 2, 0.0, torch.empty(2, 2, 2).double()) \
        is None  # out of another dtype
    assert host_library.packed_to_padded(values, offsets, 2, 0.0,
                                         torch.empty(2, 2, 4)[..., ::2]) is None  # strided out
    assert host_library.packed_to_padded(values.long(), offsets, 2, 0.5) is None
    assert host_library.packed_to_padded(values.to(torch.uint8), offsets, 2, -1) is None
    assert host_library.packed_to_padded(values.t().contiguous().t(), offsets, 2, 0.0) is None


def test_host_sizes_reads_lists_of_ints_in_one_pass():
    if host_library.library() is None:
        pytest.skip("no C module here")
    offsets, total, smallest, largest = host_library.host_sizes([3, 0, 5, 2])
    assert torch.frombuffer(offsets, dtype=torch.int64).tolist() == [0, 3, 3, 8, 10]
    assert (total, smallest, largest) == (10, 0, 5)
    offsets, *stats = host_library.host_sizes(())
    assert torch.frombuffer(offsets, dtype=torch.int64).tolist() == [0] and stats == [0, 0, 0]
    assert host_library.host_sizes((4, -2))[1:] == (2, -2, 4)  # the caller raises for -2
    # Everything else is left to the Python checks, which raise the right error or convert.
    for other in ([1, True], [1, 2.0], [1, torch.tensor(2)], range(3), [2**63], [2**62] * 2,
                  "12", None):
        assert host_library.host_sizes(other) is None


def test_absent_python_headers_leave_the_pytorch_path(tmp_path):
    code = ("import sysconfig; paths = sysconfig.get_paths(); paths['include'] = '/nonexistent';"
            "sysconfig.get_paths = lambda *a, **k: paths;"
            "from nestbatch.kernels import host_library; print(host_library.status())")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT),
                                 "NESTBATCH_CACHE_DIR": str(tmp_path)}, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("PyTorch") and "Python.h" in result.stdout


def test_lazy_conjugation_and_negation_are_resolved_not_copied_as_bytes():
    # x.conj() of a complex tensor is contiguous and its bytes are x's: the C functions copied
    # them, so every imaginary part came out with the wrong sign (the same for the neg bit).
    import nestbatch
    from nestbatch import NestedBatch

    gen = torch.Generator().manual_seed(0)
    complex_data = torch.randn(2, 3, 2, dtype=torch.complex64, generator=gen)
    mask = torch.tensor([[True, True, True], [True, True, False]])
    for lazy in (complex_data.conj(), torch._neg_view(torch.randn(2, 3, 2, generator=gen))):
        assert lazy.is_contiguous()
        resolved = lazy.resolve_conj().resolve_neg()
        assert torch.equal(NestedBatch.from_padded(lazy, [3, 2]).packed().values,
                           resolved[mask])
        rows = lazy.reshape(6, 2)[:5]
        padded = NestedBatch.from_lengths(rows, [3, 2]).padded().data
        assert torch.equal(padded[0], rows.resolve_conj().resolve_neg()[:3])
        picked = nestbatch.RaggedBatch(torch.tensor([[2, 0], [1, 0]]),
                                       sample_sizes=torch.tensor([2, 1]))
        got = nestbatch.batched_indexing_access(lazy, picked).tensor
        assert torch.equal(got[0], resolved[0, [2, 0]]) and torch.equal(got[1, 0], resolved[1, 1])

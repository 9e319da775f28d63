"""GPU-path budgets: launches and host syncs per public call, on fake CUDA tensors (CPU-only).

Each test runs a public call under :mod:`gpu_path` (``FakeTensorMode`` with ``device="cuda"``)
and asserts the number of device ops (a faithful proxy for kernel launches, checked on an H100)
and of host syncs, for batch sizes from 4 to 4096: the same count for every size, so no call
launches per sample or loops over samples on the device. Counts are deterministic; timings live
in ``benchmarks/bench_overhead.py``.
"""

from __future__ import annotations

import pytest
import torch
from gpu_path import CudaRuntimeCall, HostSyncError, count, fake_cuda, trace

import nestbatch as nb
from nestbatch import NestedBatch, RaggedBatch

SIZES = (4, 64, 4096)
FEATURES = 16


def _lengths(batch_size: int) -> list[int]:
    return [(i * 7) % 9 + 1 for i in range(batch_size)]  # 1..9, no empty sample


def _offsets(lengths: list[int]) -> list[int]:
    out = [0]
    for n in lengths:
        out.append(out[-1] + n)
    return out


def _values(lengths: list[int]) -> torch.Tensor:
    return torch.randn(sum(lengths), FEATURES, device="cuda")


def _check(trace_, ops: int, syncs: int = 0) -> None:
    assert len(trace_.ops) <= ops, str(trace_)
    assert len(trace_.syncs) == syncs, str(trace_)


# ------------------------------------------------------------------------------ the harness
def test_harness_counts_launches_not_views_or_allocations():
    with fake_cuda():
        x = torch.randn(8, 4, device="cuda")
        t = count(lambda: (x[:, :2].t().contiguous() + 1, torch.empty(3, device="cuda")))
    assert t.ops == ["aten.clone.default", "aten.add.Tensor"]


def test_harness_host_ops_are_not_launches():
    with fake_cuda():
        t = count(lambda: torch.arange(5) * 2)
    assert t.ops == []


@pytest.mark.parametrize(
    "sync",
    [
        lambda x: bool((x > 0).any()),
        lambda x: x.sum().item(),
        lambda x: x.tolist(),
        lambda x: x.cpu(),
        lambda x: x.nonzero(),
        lambda x: x[x > 0],
        lambda x: torch.equal(x, x),
        lambda x: torch.repeat_interleave(x.long(), x.long()),
    ],
)
def test_harness_fails_on_a_host_sync(sync):
    with fake_cuda():
        x = torch.randn(8, device="cuda")
        with pytest.raises((HostSyncError, CudaRuntimeCall)):
            count(sync, x)


def test_harness_answers_allowed_reads_and_counts_them():
    with fake_cuda():
        x = torch.randn(8, device="cuda")
        t = count(lambda: (bool((x > 0).all()), x.amax().cpu().tolist()), allow_syncs=True)
    assert len(t.syncs) == 2 and len(t.ops) == 3


@pytest.mark.parametrize("spelling", ["device=", ".to"])
def test_harness_counts_host_to_device_copies(spelling):
    """One copy each way it is written (``torch.tensor(..., device=)`` copies below the
    dispatcher on a CUDA build of torch; the harness counts it there too)."""
    with fake_cuda():
        if spelling == "device=":
            t = count(lambda: torch.tensor([1, 2, 3], device="cuda"))
        else:
            t = count(lambda: torch.tensor([1, 2, 3]).to("cuda"))
    assert len(t.host_to_device) == 1 and len(t.ops) == 1, str(t)


def test_harness_refuses_torch_cuda_calls_from_nestbatch(monkeypatch):
    import nestbatch.kernels as kernels

    def asks_the_runtime():
        return kernels.torch.cuda.current_device()

    monkeypatch.setattr(kernels, "asks_the_runtime", asks_the_runtime, raising=False)
    asks_the_runtime.__globals__["__name__"] = "nestbatch.kernels"
    with fake_cuda(), pytest.raises(CudaRuntimeCall):
        count(kernels.asks_the_runtime)


# ------------------------------------------------------------------------------ conversions
@pytest.mark.parametrize("batch_size", SIZES)
def test_from_lengths_padded_packed_round_trip(batch_size):
    lengths = _lengths(batch_size)
    with fake_cuda():
        values = _values(lengths)

        def call():
            batch = NestedBatch.from_lengths(values, lengths)
            padded = batch.padded()
            return padded, NestedBatch(padded).packed(), batch.packed()

        (padded, packed, _), t = trace(call)
    _check(t, 3)
    assert padded.data.shape == (batch_size, max(lengths), FEATURES)
    assert padded.data.device.type == "cuda"
    assert packed.values.shape == values.shape
    assert len(t.host_to_device) == 1  # the offsets, once


@pytest.mark.parametrize("batch_size", SIZES)
def test_from_offsets_padded_without_validation(batch_size):
    lengths = _lengths(batch_size)
    with fake_cuda():
        values = _values(lengths)
        offsets = torch.tensor(_offsets(lengths), device="cuda")
        padded, t = trace(
            lambda: NestedBatch.from_offsets(values, offsets, max_len=9, validate=False).padded()
        )
    _check(t, 3)
    assert padded.data.shape == (batch_size, 9, FEATURES)


@pytest.mark.parametrize("batch_size", SIZES)
def test_from_offsets_padded_with_validation_reads_once(batch_size):
    lengths = _lengths(batch_size)
    with fake_cuda():
        values = _values(lengths)
        offsets = torch.tensor(_offsets(lengths), device="cuda")
        t = count(
            lambda: NestedBatch.from_offsets(values, offsets, max_len=9).padded(),
            allow_syncs=True,
        )
        with pytest.raises(HostSyncError):
            count(lambda: NestedBatch.from_offsets(values, offsets, max_len=9))
    _check(t, 5, syncs=1)


@pytest.mark.parametrize("batch_size", SIZES)
def test_from_padded_host_lengths_packed(batch_size):
    lengths = _lengths(batch_size)
    with fake_cuda():
        data = torch.randn(batch_size, 9, FEATURES, device="cuda")
        packed, t = trace(lambda: NestedBatch.from_padded(data, lengths).packed())
    _check(t, 3)
    assert packed.values.shape == (sum(lengths), FEATURES)


# ------------------------------------------------------------------------------ reductions
@pytest.mark.parametrize("batch_size", SIZES)
@pytest.mark.parametrize("name", ["sum", "mean", "amax", "amin"])
def test_ragged_reduction(batch_size, name):
    lengths = _lengths(batch_size)
    with fake_cuda():
        batch = NestedBatch.from_lengths(_values(lengths), lengths)
        out, first = trace(getattr(torch, name), batch, dim=1)
        second = count(getattr(torch, name), batch, dim=1)
    _check(first, 3)
    _check(second, 3)
    assert second.host_to_device == []  # offsets cached on the batch: CUDA-graph capturable
    assert out.shape == (batch_size, FEATURES)


def test_ragged_reduction_with_empty_samples_fills_them_once():
    lengths = [3, 0, 2, 0]
    with fake_cuda():
        batch = NestedBatch.from_lengths(_values(lengths), lengths)
        count(torch.amax, batch, dim=1)
        t = count(torch.amax, batch, dim=1)
    _check(t, 2)  # segment_reduce + masked_fill of the cached empty-sample mask


@pytest.mark.parametrize("batch_size", SIZES)
@pytest.mark.parametrize("log", [False, True])
def test_ragged_softmax(batch_size, log):
    lengths = _lengths(batch_size)
    fn = torch.log_softmax if log else torch.softmax
    with fake_cuda():
        batch = NestedBatch.from_lengths(_values(lengths), lengths)
        out, t = trace(fn, batch, dim=1)
    _check(t, 8)
    assert out.batch_size == batch_size and out.feature_shape == (FEATURES,)


@pytest.mark.parametrize("log", [False, True])
def test_ragged_softmax_on_packed_rows_for_long_tails(log):
    lengths = [1] * 63 + [512]  # padding would be 64x the rows: segment softmax
    fn = torch.log_softmax if log else torch.softmax
    with fake_cuda():
        batch = NestedBatch.from_lengths(_values(lengths), lengths)
        count(fn, batch, dim=1)
        t = count(fn, batch, dim=1)
    _check(t, 8)
    assert "aten.segment_reduce.default" in t.ops


def test_half_precision_reductions_widen_with_two_more_ops():
    # float16 / bfloat16 sums are computed in float32 (torch.segment_reduce would sum in half
    # precision): the widening and the cast back, nothing per sample.
    lengths = [1] * 63 + [512]
    with fake_cuda():
        batch = NestedBatch.from_lengths(_values(lengths).bfloat16(), lengths)
        count(torch.sum, batch, dim=1)
        total = count(torch.sum, batch, dim=1)
        count(torch.softmax, batch, dim=1)
        softmax = count(torch.softmax, batch, dim=1)
    _check(total, 3)
    _check(softmax, 9)  # the segment softmax's 7, widened


# ------------------------------------------------------------------------------ elementwise
@pytest.mark.parametrize("batch_size", SIZES)
def test_elementwise_ops(batch_size):
    lengths = _lengths(batch_size)
    with fake_cuda():
        a = NestedBatch.from_lengths(_values(lengths), lengths)
        b = a.with_values(_values(lengths))
        _check(count(torch.exp, a), 2)
        _check(count(lambda: a * b), 2)
        _check(count(lambda: torch.nn.functional.relu(a) + 1), 2)


# ------------------------------------------------------------------------------ selection
@pytest.mark.parametrize("batch_size", SIZES)
@pytest.mark.parametrize(
    "index", [(slice(None), slice(None, 2)), (slice(None), slice(-2, None)), "host_tensor"]
)
def test_selection(batch_size, index):
    lengths = _lengths(batch_size)
    with fake_cuda():
        batch = NestedBatch.from_lengths(_values(lengths), lengths)
        if index == "host_tensor":
            index = torch.tensor([0, batch_size - 1])
        out, t = trace(lambda: batch[index])
    _check(t, 4)
    assert isinstance(out, NestedBatch)


# ------------------------------------------------------------------------------ RaggedBatch API
def _index_batch(batch_size: int, width: int) -> RaggedBatch:
    sizes = torch.full((batch_size,), width // 2, dtype=torch.int64, device="cuda")
    indices = torch.zeros(batch_size, width, dtype=torch.int64, device="cuda")
    return RaggedBatch(indices, sample_sizes=sizes)


_HELPERS = {
    "access": lambda d, i, j, o, v, m, cb: nb.batched_indexing_access(d, i, check_bounds=cb),
    "write": lambda d, i, j, o, v, m, cb: nb.batched_indexing_write(v, i, o, check_bounds=cb),
    "inverse": lambda d, i, j, o, v, m, cb: nb.batched_inverse_indexing_access(
        v, i, 64, check_bounds=cb
    ),
    "mapping": lambda d, i, j, o, v, m, cb: nb.batched_index_mapping(d, i, j, o, check_bounds=cb),
    "indices_to_mask": lambda d, i, j, o, v, m, cb: nb.get_mask_from_indices(
        64, i, check_bounds=cb
    ),
    "bool_indexing": lambda d, i, j, o, v, m, cb: nb.batched_bool_indexing(d, m),
    "mask_to_indices": lambda d, i, j, o, v, m, cb: nb.get_indices_from_mask(m),
}
_NO_CHECK = ("bool_indexing", "mask_to_indices")  # the sync there sizes the output
#: Ops with the bounds check: one ``aminmax`` per index batch (written in place into the one
#: tensor that is read), then the operator; the mask helpers sum and take the largest count.
_CHECKED_OPS = {"access": 2, "write": 2, "inverse": 2, "mapping": 3, "indices_to_mask": 2,
                "bool_indexing": 3, "mask_to_indices": 3}


@pytest.mark.parametrize("batch_size", (8, 64, 256, 4096))
@pytest.mark.parametrize("name", sorted(_HELPERS))
@pytest.mark.parametrize("check_bounds", [True, False])
def test_ragged_batch_helpers(batch_size, name, check_bounds):
    if name in _NO_CHECK and not check_bounds:
        pytest.skip("no check_bounds keyword: the output width is read from the device")
    with fake_cuda():
        width, num_entries = 16, 64
        data = torch.randn(batch_size, num_entries, 8, device="cuda")
        into = torch.randn(batch_size, num_entries, 8, device="cuda")
        to_write = torch.randn(batch_size, width, 8, device="cuda")
        mask = torch.zeros(batch_size, num_entries, dtype=torch.bool, device="cuda")
        indices = _index_batch(batch_size, width)
        other = RaggedBatch(torch.zeros_like(indices.tensor), sample_sizes=indices.sample_sizes)
        args = (data, indices, other, into, to_write, mask, check_bounds)
        t = count(_HELPERS[name], *args, allow_syncs=True)
        if not (check_bounds or name in _NO_CHECK):
            count(_HELPERS[name], *args)  # no sync at all: the strict harness passes
    _check(t, 4, syncs=1 if check_bounds or name in _NO_CHECK else 0)
    assert len(t.ops) == (_CHECKED_OPS[name] if check_bounds or name in _NO_CHECK else 1), str(t)


@pytest.mark.parametrize("batch_size", (8, 4096))
def test_index_mapping_with_two_sizes_tensors_checks_them_in_the_same_read(batch_size):
    """Index batches with their own (equal) sample sizes: one comparison and one count more,
    read with the bounds, still one sync."""
    with fake_cuda():
        data = torch.randn(batch_size, 64, 8, device="cuda")
        source, target = _index_batch(batch_size, 16), _index_batch(batch_size, 16)
        assert source.sample_sizes is not target.sample_sizes
        t = count(lambda: nb.batched_index_mapping(data, source, target, data), allow_syncs=True)
    assert len(t.ops) == 5 and len(t.syncs) == 1, str(t)

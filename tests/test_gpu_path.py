"""GPU-path budgets: launches and host syncs per public call, on fake CUDA tensors (CPU-only).

Each test runs a public call under :mod:`gpu_path` (``FakeTensorMode`` with ``device="cuda"``)
and asserts the number of device ops (a faithful proxy for kernel launches, checked on an H100)
and of host syncs, for batch sizes from 4 to 4096: the same count for every size, so no call
launches per sample or loops over samples on the device. Counts are deterministic; timings live
in ``benchmarks/bench_overhead.py``.
"""

from __future__ import annotations

import operator

import pytest
import torch
from gpu_path import CudaRuntimeCall, HostSyncError, count, fake_cuda, real_values, trace
from torch.nn.utils.rnn import pack_sequence

import nestbatch as nb
from nestbatch import NestedBatch, RaggedBatch

_INVERT = torch.Tensor.__invert__  # a reference taken before any harness runs, as a registry's

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
        with pytest.raises(HostSyncError):
            count(sync, x)


def test_harness_answers_allowed_reads_and_counts_them():
    with fake_cuda():
        x = torch.randn(8, device="cuda")
        t = count(lambda: (bool((x > 0).all()), x.amax().cpu().tolist()), allow_syncs=True)
    assert len(t.syncs) == 2 and len(t.ops) == 3


def test_harness_data_dependent_ops_on_host_tensors_are_host_work():
    """nonzero, repeat_interleave, bool masks and masked_select of host tensors neither sync
    nor launch (issue #25 item 14, defect 1)."""
    with fake_cuda():
        host = torch.tensor([3, 0, 2, 5])
        out, t = trace(lambda: (host.nonzero(), torch.nonzero(host), torch.repeat_interleave(host),
                                host[host > 1], torch.masked_select(host, host > 2)))
    assert t.syncs == [] and t.ops == [], str(t)
    nonzero, also, repeated, masked, selected = (o.tolist() for o in out)
    assert nonzero == also == [[0], [2], [3]]
    assert repeated == [0, 0, 0, 2, 2, 3, 3, 3, 3, 3]
    assert masked == [3, 2, 5] and selected == [3, 5]


def test_harness_host_tensors_keep_their_values():
    """Host tensors are real tensors under the harness (defect 2)."""
    with fake_cuda():
        lengths = torch.tensor([3, 5, 2])
        assert int(lengths.sum()) == 10 and lengths.tolist() == [3, 5, 2]
        assert torch.arange(4).cumsum(0).tolist() == [0, 1, 3, 6]
        assert not isinstance(torch.zeros(2), torch._subclasses.FakeTensor)


def test_harness_runs_the_packed_sequence_path_of_host_lengths():
    """Lengths given as a list become host tensors the library sorts and counts: the call takes
    its real path (no sync, one copy of the indices) and gives torch's PackedSequence
    (defect 2: host sizes read as 0 sent it to an error path)."""
    lengths = [3, 5, 2]
    samples = [torch.randn(n, 4) for n in lengths]
    expected = pack_sequence(samples, enforce_sorted=False)
    with fake_cuda():
        batch = NestedBatch.from_lengths(torch.cat(samples).cuda(), lengths)
        sequence, t = trace(nb.to_packed_sequence, batch)
    assert t.syncs == [] and len(t.host_to_device) == 1, str(t)
    assert sequence.batch_sizes.tolist() == expected.batch_sizes.tolist()
    assert sequence.data.device.type == "cuda"
    assert torch.equal(real_values(sequence.data), expected.data)
    assert real_values(sequence.unsorted_indices).tolist() == expected.unsorted_indices.tolist()


@pytest.mark.filterwarnings("ignore:PyTorch was compiled without cuDNN")
def test_harness_lstm_on_a_batch_computes_torch_values():
    """nn.LSTM on a batch with host lengths: no sync; its CUDA path (fused cells, computed on
    the host by the harness) gives the CPU module's outputs."""
    torch.manual_seed(0)
    lengths = [3, 5, 2]
    samples = [torch.randn(n, 4) for n in lengths]
    module = torch.nn.LSTM(4, 3, batch_first=True).requires_grad_(False)
    expected, _ = module(pack_sequence(samples, enforce_sorted=False))
    with fake_cuda():
        on_device = torch.nn.LSTM(4, 3, batch_first=True, device="cuda").requires_grad_(False)
        on_device.load_state_dict(module.state_dict())
        batch = NestedBatch.from_lengths(torch.cat(samples).cuda(), lengths)
        (out, _), t = trace(on_device, batch)
        got = [real_values(sample) for sample in out.unbind()]
    assert t.syncs == [], str(t)
    padded, _ = torch.nn.utils.rnn.pad_packed_sequence(expected, batch_first=True)
    for i, n in enumerate(lengths):
        torch.testing.assert_close(got[i], padded[i, :n])


def test_harness_tolist_is_one_copy():
    """One device-to-host copy, not one read per element (defect 3)."""
    with fake_cuda():
        x = torch.arange(6, device="cuda").view(2, 3)
        out, t = trace(lambda: x.tolist(), allow_syncs=True)
    assert out == [[0, 1, 2], [3, 4, 5]]
    assert t.syncs == ["aten._to_copy.default"], str(t)


@pytest.mark.parametrize(
    "read, value",
    [(int, 3), (float, 3.0), (bool, True), (complex, 3 + 0j), (operator.index, 3),
     (lambda t: t.item(), 3)],
)
def test_harness_python_reads_are_syncs(read, value):
    """int(t), float(t), bool(t), complex(t), t.__index__(), t.item(): a sync, answered with the
    true value (defect 4: they crashed as CUDA runtime calls)."""
    with fake_cuda():
        x = torch.tensor([3], device="cuda")
        with pytest.raises(HostSyncError):
            count(read, x)
        out, t = trace(read, x, allow_syncs=True)
    assert out == value and type(out) is type(value)
    assert len(t.syncs) == 1, str(t)


@pytest.mark.parametrize(
    "nonzero",
    [lambda x: x.nonzero(), lambda x: torch.nonzero(x),
     lambda x: torch.nonzero(x, as_tuple=True)[0], lambda x: x.nonzero(as_tuple=True)[0],
     lambda x: torch.where(x)[0], torch.argwhere],
)
def test_harness_nonzero_is_a_sync_with_the_true_shape(nonzero):
    """(defect 4: .nonzero() / torch.nonzero crashed as CUDA runtime calls)"""
    with fake_cuda():
        x = torch.tensor([0, 3, 0, 2], device="cuda")
        with pytest.raises(HostSyncError):
            count(nonzero, x)
        out, t = trace(nonzero, x, allow_syncs=True)
    assert t.syncs == ["aten.nonzero.default"], str(t)
    assert out.device.type == "cuda" and real_values(out).flatten().tolist() == [1, 3]


def test_harness_answers_reads_with_true_values():
    """Reads are answered with the true values, data-dependent shapes are the true ones
    (defect 5: every read answered True / 0)."""
    with fake_cuda():
        x = torch.tensor([1.0, -2.0, 3.0], device="cuda")
        repeats = torch.tensor([1, 0, 2], device="cuda")
        out, t = trace(lambda: (bool((x > 0).all()), x.sum().item(), x[x > 0], x.nonzero(),
                                torch.repeat_interleave(x, repeats), torch.masked_select(x, x < 0)),
                       allow_syncs=True)
    flag, total, positive, rows, repeated, negative = out
    assert flag is False and total == 2.0
    assert real_values(positive).tolist() == [1.0, 3.0] and positive.device.type == "cuda"
    assert rows.shape == (3, 1) and real_values(repeated).tolist() == [1.0, 3.0, 3.0]
    assert real_values(negative).tolist() == [-2.0]
    assert len(t.syncs) == 6, str(t)


def test_harness_validation_sees_true_values():
    """Device checks read the true values: bad offsets raise, good ones pass with one read
    (defect 5: the answers True / 0 passed every check)."""
    with fake_cuda():
        values = torch.randn(10, 4, device="cuda")
        with pytest.raises(ValueError):
            count(NestedBatch.from_offsets, values, torch.tensor([0, 6, 4, 10], device="cuda"),
                  allow_syncs=True)
        batch, t = trace(NestedBatch.from_offsets, values,
                         torch.tensor([0, 4, 6, 10], device="cuda"), allow_syncs=True)
        lengths = real_values(batch.lengths)
    assert len(t.syncs) == 1, str(t)
    assert lengths.tolist() == [4, 2, 4]


def test_harness_values_follow_views_and_in_place_ops():
    host = torch.arange(12.0).view(3, 4)
    expected = host.clone()
    expected[:, 1] = -1.0
    expected[expected > 8] = 0.0
    expected = expected.t().contiguous() * 2
    with fake_cuda():
        x = host.cuda()
        x[:, 1] = -1.0
        x[x > 8] = 0.0
        y = x.t().contiguous() * 2
        assert torch.equal(real_values(y), expected)
        assert torch.equal(y.cpu(), expected)


def test_harness_routes_methods_referenced_before_it_started():
    """A reference to a device-guarded method taken at import (a registry's key) works too."""
    with fake_cuda():
        x = torch.tensor([0, 3], device="cuda")
        out, t = trace(_INVERT, x > 0)
    assert t.ops == ["aten.bitwise_not.default"]
    assert real_values(out).tolist() == [True, False]


def test_harness_copies_of_nothing_are_neither_syncs_nor_launches():
    with fake_cuda():
        t = count(lambda: (torch.empty(0, device="cuda").cpu(), torch.empty(0).cuda()))
    assert t.syncs == [] and t.ops == [], str(t)


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
    import nestbatch.kernels.dispatch as kernels

    def asks_the_runtime():
        return kernels.torch.cuda.current_device()

    monkeypatch.setattr(kernels, "asks_the_runtime", asks_the_runtime, raising=False)
    asks_the_runtime.__globals__["__name__"] = "nestbatch.kernels.dispatch"
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
@pytest.mark.parametrize("name, check_bounds", [  # (_NO_CHECK: no check_bounds keyword)
    (name, check) for name in sorted(_HELPERS) for check in (True, False)
    if check or name not in _NO_CHECK
])
def test_ragged_batch_helpers(batch_size, name, check_bounds):
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


def test_graph_capture_keeps_the_pinned_host_sizes_alive():
    # Under CUDA-graph capture a host-to-device copy must come from pinned memory that lives as
    # long as the graph: the partition keeps every such buffer (here: the offsets).
    from unittest import mock

    lengths = [3, 1, 4]
    with fake_cuda():
        values = _values(lengths)
        # (The harness's fake mode would take the tracing branch, which copies no host buffer.)
        with mock.patch.object(torch.cuda, "is_current_stream_capturing", lambda: True), \
                mock.patch("nestbatch.layouts.partition.making_fake_tensors", lambda: False):
            b = NestedBatch.from_lengths(values, lengths)
        kept = b.partition._pinned_for_graphs
        assert len(kept) == 1 and kept[0].is_pinned()
        assert kept[0].tolist() == _offsets(lengths)
        assert real_values(b.offsets).tolist() == _offsets(lengths)

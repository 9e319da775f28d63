"""The hot paths on a real CUDA device (skipped without one): no sync where the budgets say
none, CUDA-graph capture, the direct kernel road of ``kernels.call`` and the bounds check that
reads after the kernel launched. Their op counts are checked on fake CUDA in test_gpu_path.py."""

from __future__ import annotations

import pytest
import torch

import nestbatch as nb
from nestbatch import NestedBatch, RaggedBatch, kernels

pytestmark = pytest.mark.cuda


def _batch(batch_size: int = 33, features: int = 16):
    gen = torch.Generator().manual_seed(batch_size)
    lengths = torch.randint(0, 40, (batch_size,), generator=gen).tolist()
    values = torch.randn(sum(lengths), features, generator=gen).cuda()
    return lengths, values


def _no_sync(fn):
    """Run ``fn`` with CUDA's sync debug mode raising on any synchronizing call."""
    fn()  # first use: extension load, allocator warm-up
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        return fn()
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize("batch_size", [4, 4096])
def test_host_sizes_never_sync(batch_size):
    lengths, values = _batch(batch_size)
    padded = _no_sync(lambda: NestedBatch.from_lengths(values, lengths).padded())
    packed = _no_sync(lambda: NestedBatch.from_padded(padded.data, lengths).packed())
    assert torch.equal(packed.values, values)
    b = NestedBatch.from_lengths(values, lengths)
    for fn in (lambda: torch.sum(b, dim=1), lambda: torch.softmax(b, dim=1), lambda: b[:, :2]):
        _no_sync(fn)


def test_kernels_call_runs_the_compiled_kernel_and_keeps_autograd():
    lengths, values = _batch()
    offsets = NestedBatch.from_lengths(values, lengths).offsets
    direct = kernels.call("packed_to_padded", values, offsets, max(lengths), 0.0)
    through_op = torch.ops.nestbatch.packed_to_padded(values, offsets, max(lengths), 0.0)
    assert torch.equal(direct, through_op)
    leaf = values.double().requires_grad_()
    out = kernels.call("packed_to_padded", leaf, offsets, max(lengths), 0.0)
    out.sum().backward()
    assert torch.equal(leaf.grad, torch.ones_like(leaf))


def test_bounds_check_after_the_launch_still_raises_and_resolves_negatives():
    data = torch.randn(3, 10, 4, device="cuda")
    sizes = torch.tensor([2, 0, 3], device="cuda")
    indices = torch.tensor([[1, -1, 99], [5, 5, 5], [0, -10, 9]], device="cuda")
    batch = RaggedBatch(indices, sample_sizes=sizes)
    out = nb.batched_indexing_access(data, batch)
    on_cpu = RaggedBatch(indices.cpu(), sample_sizes=sizes.cpu())
    cpu = nb.batched_indexing_access(data.cpu(), on_cpu)
    assert torch.equal(out.tensor.cpu(), cpu.tensor)
    bad = RaggedBatch(torch.tensor([[1, 10, 0]] * 3, device="cuda"), sample_sizes=sizes)
    with pytest.raises(IndexError, match="out of range"):
        nb.batched_indexing_access(data, bad)
    with pytest.raises(IndexError):
        nb.batched_indexing_write(torch.randn(3, 3, 4, device="cuda"), bad, data)
    torch.cuda.synchronize()  # the device is healthy after the refused calls


def test_graph_capture_of_conversions_reductions_and_softmax():
    lengths, values = _batch(256)
    b = NestedBatch.from_lengths(values, lengths)
    padded = b.padded().data
    calls = {
        "to padded": lambda: NestedBatch.from_lengths(values, lengths).padded().data,
        "to packed": lambda: NestedBatch.from_padded(padded, lengths).packed().values,
        "sum": lambda: torch.sum(b, dim=1),
        "amax": lambda: torch.amax(b, dim=1),
        "softmax": lambda: torch.softmax(b, dim=1).packed().values,
    }
    for name, fn in calls.items():
        eager = fn()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = fn()
        captured.fill_(float("nan"))  # poisoned: only the replay can write it back
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(captured, eager), name

"""The GPU path per public call, on a real CUDA device: kernels launched, syncs, wall time.

The method of the GPU report (``shared/gpu/README.md``): for each hot path, the GPU kernels and
copies one call launches (``torch.profiler``), the device->host copies among them, the syncs the
call makes (``torch.cuda.set_sync_debug_mode``), the wall time per call (synchronized after each
call, median) and back-to-back (many calls, one synchronize), beside the bare kernel or the plain
torch call. Then whether CUDA-graph capture works for conversions, reductions and softmax, and
whether a call made while the stream is busy returns at once (host sizes are copied to the device
from pageable memory, which the CUDA driver may stage only after the stream drains).
Usage::

    python benchmarks/bench_gpu_path.py [--quick]

Targets of issue #11: the front-object conversion within 1.3x of the bare kernel's wall time at
B=32 and B=4096; ``sum`` over the ragged dim within 1.2x of ``torch.segment_reduce``; the
``RaggedBatch`` helpers at or under the reference implementation's wall time (0.072 ms at B=8,
0.079 ms at B=64, 0.459 ms at B=256 for ``batched_indexing_access`` on the report's H100).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import nestbatch as nb  # noqa: E402
from benchmarks.common import print_table  # noqa: E402
from nestbatch import NestedBatch, RaggedBatch, kernels  # noqa: E402

#: ``batched_indexing_access`` wall ms of the reference implementation on the report's H100,
#: by (B, N, M, F); from ``shared/gpu/2026-11-23-reference-impl.txt``.
REFERENCE_ACCESS_MS = {(8, 256, 128, 32): 0.0719, (64, 1024, 512, 64): 0.0792,
                       (256, 2048, 1024, 64): 0.4586}
REFERENCE_WRITE_MS = {(8, 256, 128, 32): 0.0703, (64, 1024, 512, 64): 0.0831,
                      (256, 2048, 1024, 64): 0.4472}


def wall_ms(fn: Callable[[], object], repeat: int) -> tuple[float, float]:
    """``(wall, back_to_back)`` ms per call: synchronized after each call, and in one run."""
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        began = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - began)
    began = time.perf_counter()
    for _ in range(repeat):
        fn()
    torch.cuda.synchronize()
    return statistics.median(times) * 1e3, (time.perf_counter() - began) / repeat * 1e3


def launches(fn: Callable[[], object]) -> tuple[int, int, list[str]]:
    """``(kernels and copies, device->host copies, names)`` of one call, from the profiler."""
    fn()
    torch.cuda.synchronize()
    activities = [torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        fn()
        torch.cuda.synchronize()
    names = [
        e.name for e in prof.events()
        if e.device_type == torch.autograd.DeviceType.CUDA
    ]
    d2h = sum("DtoH" in n or "Device -> Pageable" in n or "Device -> Pinned" in n for n in names)
    return len(names), d2h, names


def syncs(fn: Callable[[], object]) -> int:
    """Synchronizing calls one call makes, as ``torch.cuda.set_sync_debug_mode`` reports them."""
    fn()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fn()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)


def conversion_rows(batch: int, length: int, features: int):
    """``(name, call)`` for the front-object conversions and their bare kernels."""
    gen = torch.Generator().manual_seed(batch)
    lengths = torch.randint(1, length + 1, (batch,), generator=gen).tolist()
    values = torch.randn(sum(lengths), features, device="cuda")
    offsets = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], device="cuda")
    max_len = max(lengths)
    padded = kernels.packed_to_padded(values, offsets, max_len, 0.0)
    b = NestedBatch.from_lengths(values, lengths)
    b.padded()
    seg = torch.tensor(lengths, device="cuda")
    mask = torch.arange(max_len, device="cuda") < seg[:, None]
    return [
        ("kernels.packed_to_padded", lambda: kernels.packed_to_padded(values, offsets, max_len,
                                                                       0.0)),
        ("aten._jagged_to_padded_dense_forward",
         lambda: torch.ops.aten._jagged_to_padded_dense_forward(values, [offsets], [max_len],
                                                                0.0)),
        ("from_lengths(host).padded()",
         lambda: NestedBatch.from_lengths(values, lengths).padded()),
        ("from_offsets(dev, validate=False).padded()",
         lambda: NestedBatch.from_offsets(values, offsets, max_len=max_len,
                                          validate=False).padded()),
        ("from_offsets(dev, validate=True).padded()",
         lambda: NestedBatch.from_offsets(values, offsets, max_len=max_len).padded()),
        ("kernels.padded_to_packed",
         lambda: kernels.padded_to_packed(padded, offsets, values.shape[0])),
        ("from_padded(host lengths).packed()",
         lambda: NestedBatch.from_padded(padded, lengths).packed()),
        ("torch.segment_reduce(sum)",
         lambda: torch.segment_reduce(values, "sum", offsets=offsets, axis=0)),
        ("torch.sum(b, dim=1)", lambda: torch.sum(b, dim=1)),
        ("torch.amax(b, dim=1)", lambda: torch.amax(b, dim=1)),
        ("masked dense softmax",
         lambda: torch.softmax(padded.masked_fill(~mask[..., None], float("-inf")), dim=1)),
        ("torch.softmax(b, dim=1)", lambda: torch.softmax(b, dim=1)),
        ("values + 1", lambda: values + 1),
        ("b + 1", lambda: b + 1),
        ("b[:, :2]", lambda: b[:, :2]),
    ]


def helper_rows(batch: int, entries: int, width: int, features: int):
    """``(name, call)`` for the RaggedBatch helpers at one of the reference's sizes."""
    data = torch.randn(batch, entries, features, device="cuda")
    sizes = torch.randint(width // 2, width + 1, (batch,), device="cuda")
    idx = torch.randint(0, entries, (batch, width), device="cuda")
    idx_batch = RaggedBatch(idx, sample_sizes=sizes)
    to_write = torch.randn(batch, width, features, device="cuda")
    bool_mask = torch.rand(batch, entries, device="cuda") > 0.5
    return [
        ("kernels.indexing_access (operator)",
         lambda: kernels.indexing_access(data, idx, sizes, check_bounds=False)),
        ("batched_indexing_access", lambda: nb.batched_indexing_access(data, idx_batch)),
        ("batched_indexing_access(check_bounds=False)",
         lambda: nb.batched_indexing_access(data, idx_batch, check_bounds=False)),
        ("batched_indexing_write", lambda: nb.batched_indexing_write(to_write, idx_batch, data)),
        ("batched_indexing_write(check_bounds=False)",
         lambda: nb.batched_indexing_write(to_write, idx_batch, data, check_bounds=False)),
        ("batched_bool_indexing", lambda: nb.batched_bool_indexing(data, bool_mask)),
    ]


def profile(rows, repeat: int, title: str) -> dict[str, float]:
    table, walls = [], {}
    for name, fn in rows:
        n_launch, n_d2h, _ = launches(fn)
        n_sync = syncs(fn)
        wall, back = wall_ms(fn, repeat)
        walls[name] = wall
        table.append((name, n_launch, n_d2h, n_sync, wall, back))
    print_table(["call", "GPU kernels+copies", "D2H copies", "syncs", "wall ms", "back-to-back ms"],
                table, title=title)
    return walls


def graph_capture(batch: int) -> list[tuple[str, str]]:
    """Whether each call can be captured in a CUDA graph and replayed with the same result."""
    lengths = torch.randint(1, 65, (batch,)).tolist()
    values = torch.randn(sum(lengths), 16, device="cuda")
    b = NestedBatch.from_lengths(values, lengths)
    b.padded(), b.packed()
    calls = {
        "b.padded() (uncached, from packed)":
            lambda: NestedBatch.from_lengths(values, lengths).padded().data,
        "from_padded(..).packed()": lambda: NestedBatch.from_padded(
            b.padded().data, lengths).packed().values,
        "torch.sum(b, dim=1)": lambda: torch.sum(b, dim=1),
        "torch.amax(b, dim=1)": lambda: torch.amax(b, dim=1),
        "torch.mean(b, dim=1)": lambda: torch.mean(b, dim=1),
        "torch.softmax(b, dim=1)": lambda: torch.softmax(b, dim=1).packed().values,
        "torch.log_softmax(b, dim=1)": lambda: torch.log_softmax(b, dim=1).packed().values,
    }
    out = []
    for name, fn in calls.items():
        try:
            eager = fn()
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(3):
                    fn()
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                captured = fn()
            graph.replay()
            torch.cuda.synchronize()
            same = torch.equal(_tensor(captured), _tensor(eager))
            out.append((name, "captured, replay equal" if same else "captured, replay DIFFERS"))
        except Exception as error:  # the table reports any failure, whatever its kind
            out.append((name, f"FAILS: {type(error).__name__}: {str(error)[:90]}"))
    return out


def _sleep_cycles(ms: float) -> int:
    """``torch.cuda._sleep`` cycles that keep the device busy for about ``ms`` milliseconds."""
    cycles = 1_000_000
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(cycles)
    stop.record()
    torch.cuda.synchronize()
    return int(cycles * ms / start.elapsed_time(stop))


def behind_queued_work(batch: int, busy_ms: float = 5.0, repeat: int = 20):
    """Host ms of one call made while the stream still runs a ``busy_ms`` kernel.

    About 0 when the call only queues its work; about ``busy_ms`` when it waits for the stream,
    a sync no debug mode reports: the CUDA driver may make a copy from pageable host memory
    wait for the stream before staging it. Host sizes reach the device by such a copy (the
    offsets of ``from_lengths``), so this shows whether a pipeline keeps running past them.
    """
    lengths = torch.randint(1, 65, (batch,)).tolist()
    values = torch.randn(sum(lengths), 16, device="cuda")
    host = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    pinned = host.pin_memory()
    offsets = host.cuda()
    max_len = max(lengths)
    calls = {
        "kernels.packed_to_padded (no copy)":
            lambda: kernels.packed_to_padded(values, offsets, max_len, 0.0),
        "pageable offsets .to(cuda, non_blocking=True)":
            lambda: host.to("cuda", non_blocking=True),
        "pinned offsets .to(cuda, non_blocking=True)":
            lambda: pinned.to("cuda", non_blocking=True),
        "from_lengths(host)": lambda: NestedBatch.from_lengths(values, lengths),
        "from_lengths(host).padded()": lambda: NestedBatch.from_lengths(values, lengths).padded(),
    }
    cycles = _sleep_cycles(busy_ms)
    rows = []
    for name, fn in calls.items():
        fn()
        times = []
        for _ in range(repeat):
            torch.cuda.synchronize()
            torch.cuda._sleep(cycles)
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e3)
        torch.cuda.synchronize()
        rows.append((name, statistics.median(times), busy_ms))
    return rows


def _tensor(result) -> torch.Tensor:
    return result.packed().values if isinstance(result, NestedBatch) else result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_gpu_path: needs a CUDA device")
    repeat = 200 if args.quick else 1000
    print(torch.__version__, torch.cuda.get_device_name())
    verdicts = []
    for batch, length, features in ((32, 128, 64), (4096, 64, 16)):
        walls = profile(conversion_rows(batch, length, features), repeat,
                        f"B={batch} L<={length} D={features}")
        for ours, bare, limit in (
            ("from_lengths(host).padded()", "kernels.packed_to_padded", 1.3),
            ("from_offsets(dev, validate=False).padded()", "kernels.packed_to_padded", 1.3),
            ("from_padded(host lengths).packed()", "kernels.padded_to_packed", 1.3),
            ("torch.sum(b, dim=1)", "torch.segment_reduce(sum)", 1.2),
        ):
            ratio = walls[ours] / walls[bare]
            verdicts.append((f"B={batch} {ours} / {bare}", ratio, limit,
                             "ok" if ratio <= limit else "OVER"))
    for key in REFERENCE_ACCESS_MS:
        batch, entries, width, features = key
        walls = profile(helper_rows(*key), repeat,
                        f"RaggedBatch helpers B={batch} N={entries} M={width} F={features}")
        for ours, ref in (("batched_indexing_access", REFERENCE_ACCESS_MS[key]),
                          ("batched_indexing_write", REFERENCE_WRITE_MS[key])):
            ratio = walls[ours] / ref
            verdicts.append((f"B={batch} {ours} / reference {ref:.4f} ms", ratio, 1.0,
                             "ok" if ratio <= 1.0 else "OVER"))
    print_table(["capture", "result"], graph_capture(256), title="CUDA-graph capture")
    print_table(["call", "host ms", "queued kernel ms"], behind_queued_work(256),
                title="host time of a call behind queued work (about 0: no wait for the stream)")
    print_table(["target", "ratio", "limit", ""], verdicts, title="targets (wall time ratios)")


if __name__ == "__main__":
    main()

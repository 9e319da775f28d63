"""nestbatch's public calls beside the CPU ops a user would otherwise call, in one run.

For every size (B samples of 1 to L rows, the last of length L, D float32 features) and every
operation, the nestbatch public call and each peer are timed interleaved (a block of calls of
each in turn, up to 20 calls for the small sizes, for a number of rounds that falls with the
size; the median per call of each), so all see the same machine state. Every round takes the
calls in a fresh order (seeded): a call's time depends on the one before it (which left the
caches and the allocator's free blocks as they are), and a fixed order favours whichever call
always follows the same one (one call of FBGEMM's measured 65 and 84 us at 1 MB in two
positions of one round):

* packed -> padded: ``NestedBatch.from_offsets(values, offsets, max_len=L,
  validate=False).padded()`` (the peers too are told the longest length) against aten's
  ``_jagged_to_padded_dense_forward``, FBGEMM's ``jagged_to_padded_dense``, torch.nested
  (``nested_tensor_from_jagged(...).to_padded_tensor``) and ``pad_sequence``;
* padded -> packed: ``NestedBatch.from_padded(data, host lengths).packed()`` against aten's
  ``_padded_dense_to_jagged_forward``, FBGEMM's ``dense_to_jagged`` and a boolean-mask index;
* sum / mean / amax / amin over the ragged dim of a packed batch against
  ``torch.segment_reduce`` (and FBGEMM's ``segment_sum_csr`` for the sum);
* ``b * 2 + 1`` against the same on the packed values.

The "copy" column is the copy limit: one ``copy_`` of the output's bytes between two buffers
made beforehand (not a peer; what memory bandwidth allows). The ratio is nestbatch's time over
the fastest peer's. With ``--busy N`` (default: as many as this machine has cores), the
conversions are timed again while N other processes each keep a core busy (what DataLoader
workers or a second job do).

FBGEMM is optional: ``pip install nestbatch[bench]`` (``fbgemm-gpu-cpu``, the release that loads
with the pinned torch); without it its columns say "-". Usage::

    python benchmarks/bench_peers.py [--quick] [--busy N] [--only NAME]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch.nn.utils.rnn import pad_sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import print_table  # noqa: E402
from nestbatch import NestedBatch  # noqa: E402

try:  # registers torch.ops.fbgemm
    import fbgemm_gpu  # noqa: F401

    HAS_FBGEMM = True
except Exception:  # noqa: BLE001 (absent, or built against another torch: the peer is skipped)
    HAS_FBGEMM = False

#: (batch, longest sample, features): from 2 KB to 256 MB of padded float32.
SIZES = [(4, 8, 16), (16, 64, 16), (32, 128, 64), (512, 32, 16), (64, 256, 64),
         (256, 512, 64), (1024, 1024, 64)]
#: Sizes timed again with the cores busy.
BUSY_SIZES = [(4, 8, 16), (32, 128, 64), (512, 32, 16), (256, 512, 64)]
REDUCTIONS = ("sum", "mean", "amax", "amin")


def interleaved_medians(calls: dict[str, Callable[[], object]], repeat: int, block: int = 1
                        ) -> dict[str, float]:
    """Median seconds per call of every call, timed in turn: ``repeat`` rounds, each timing a
    block of ``block`` consecutive calls of each in a fresh order (so that the short ones run
    warm, as in a loop, while all see the same machine state and none always follows the same
    call)."""
    for fn in calls.values():
        for _ in range(2):
            fn()
    times: dict[str, list[float]] = {name: [] for name in calls}
    order = list(calls.items())
    shuffle = random.Random(0).shuffle
    for _ in range(repeat):
        shuffle(order)  # a fresh order every round: no call always follows the same one
        for name, fn in order:
            began = time.perf_counter()
            for _ in range(block):
                fn()
            times[name].append((time.perf_counter() - began) / block)
    return {name: statistics.median(t) for name, t in times.items()}


def _case(batch: int, longest: int, features: int):
    gen = torch.Generator().manual_seed(batch * longest)
    lengths = torch.randint(1, longest + 1, (batch,), generator=gen)
    lengths[-1] = longest
    offsets = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)])
    values = torch.randn(int(offsets[-1]), features, generator=gen)
    return lengths, offsets, values


def _copy_limit(like: torch.Tensor) -> Callable[[], object]:
    source, target = torch.empty_like(like), torch.empty_like(like)
    return lambda: target.copy_(source)


def to_padded_calls(batch: int, longest: int, features: int) -> dict[str, Callable[[], object]]:
    """packed -> padded: nestbatch first, then its peers, then the copy limit."""
    lengths, offsets, values = _case(batch, longest, features)
    split = lengths.tolist()
    calls = {
        "nestbatch": lambda: NestedBatch.from_offsets(values, offsets, max_len=longest,
                                                   validate=False).padded(),
        "aten": lambda: torch.ops.aten._jagged_to_padded_dense_forward(
            values, [offsets], [longest], 0.0),
        "torch.nested": lambda: torch.nested.nested_tensor_from_jagged(
            values, offsets, min_seqlen=1, max_seqlen=longest).to_padded_tensor(0.0),
        "pad_sequence": lambda: pad_sequence(values.split(split), batch_first=True),
    }
    if HAS_FBGEMM:
        calls["fbgemm"] = lambda: torch.ops.fbgemm.jagged_to_padded_dense(
            values, [offsets], [longest], 0.0)
    calls["copy"] = _copy_limit(torch.empty(batch, longest, features))
    return calls


def to_packed_calls(batch: int, longest: int, features: int) -> dict[str, Callable[[], object]]:
    """padded -> packed: nestbatch first, then its peers, then the copy limit."""
    lengths, offsets, values = _case(batch, longest, features)
    host = lengths.tolist()
    total = values.shape[0]
    data = torch.ops.aten._jagged_to_padded_dense_forward(values, [offsets], [longest], 0.0)
    mask = torch.arange(longest) < lengths[:, None]
    calls = {
        "nestbatch": lambda: NestedBatch.from_padded(data, host).packed(),
        "aten": lambda: torch.ops.aten._padded_dense_to_jagged_forward(data, [offsets], total),
        "data[mask]": lambda: data[mask],
    }
    if HAS_FBGEMM:
        calls["fbgemm"] = lambda: torch.ops.fbgemm.dense_to_jagged(data, [offsets], total)[0]
    calls["copy"] = _copy_limit(values)
    return calls


def reduction_calls(batch: int, longest: int, features: int, how: str
                    ) -> dict[str, Callable[[], object]]:
    """A reduction over the ragged dim of a packed batch, beside ``segment_reduce``."""
    lengths, offsets, values = _case(batch, longest, features)
    nested = NestedBatch.from_offsets(values, offsets)
    nested.packed()
    reduce = getattr(torch, how)
    peer = {"amax": "max", "amin": "min"}.get(how, how)
    calls = {
        "nestbatch": lambda: reduce(nested, dim=1),
        "segment_reduce": lambda: torch.segment_reduce(values, peer, lengths=lengths),
    }
    if HAS_FBGEMM and how == "sum" and features == 1:  # (segment_sum_csr sums 1-d segments)
        calls["fbgemm"] = lambda: torch.ops.fbgemm.segment_sum_csr(1, offsets, values[:, 0])
    calls["copy"] = _copy_limit(torch.empty(batch, features))
    return calls


def elementwise_calls(batch: int, longest: int, features: int) -> dict[str, Callable[[], object]]:
    """``b * 2 + 1`` on a packed batch, beside the same on its values."""
    _, offsets, values = _case(batch, longest, features)
    nested = NestedBatch.from_offsets(values, offsets)
    return {"nestbatch": lambda: nested * 2 + 1, "values": lambda: values * 2 + 1,
            "copy": _copy_limit(values)}


def rows(sizes, operations, repeat_for) -> list[tuple]:
    """One table row per (operation, size): every call's median in us and nestbatch's ratio."""
    table = []
    for batch, longest, features in sizes:
        megabytes = batch * longest * features * 4 / 2**20
        for name, make in operations:
            calls = make(batch, longest, features)
            block = max(1, min(20, int(1 / max(megabytes, 1e-9))))  # ~1 MB of work a block
            times = interleaved_medians(calls, repeat_for(megabytes), block)
            peers = {k: v for k, v in times.items() if k not in ("nestbatch", "copy")}
            best = min(peers, key=peers.get)
            table.append((
                name, f"B={batch} L<={longest} D={features}", f"{megabytes:.3g}",
                times["nestbatch"] * 1e6, best, times[best] * 1e6,
                times["nestbatch"] / times[best], times["copy"] * 1e6,
                "  ".join(f"{k} {v * 1e6:.1f}" for k, v in peers.items() if k != best),
            ))
            print(f"  {name} B={batch}: {times['nestbatch'] * 1e6:.1f} us", file=sys.stderr,
                  flush=True)
    return table


def operations(only: str) -> list[tuple[str, Callable]]:
    ops = [("->padded", to_padded_calls), ("->packed", to_packed_calls)]
    ops += [(how, lambda b, n, d, how=how: reduction_calls(b, n, d, how)) for how in REDUCTIONS]
    ops.append(("b * 2 + 1", elementwise_calls))
    return [op for op in ops if only in op[0]]


def busy_processes(count: int) -> list[subprocess.Popen]:
    """``count`` processes that each keep one core busy until killed."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


HEADERS = ["op", "size", "MB", "nestbatch us", "fastest peer", "peer us", "ratio", "copy us",
           "other peers (us)"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds (~1 minute)")
    parser.add_argument("--busy", type=int, default=os.cpu_count() or 2,
                        help="busy processes for the loaded table (0: skip it)")
    parser.add_argument("--only", default="", help="only the operations whose name has this "
                        "(->padded, ->packed, sum, mean, amax, amin, 'b * 2 + 1'; a name that "
                        "starts with '-' goes as --only=NAME)")
    parser.add_argument("--max-mb", type=float, default=300.0, help="skip larger sizes")
    args = parser.parse_args()
    scale = 0.25 if args.quick else 1.0

    def repeat_for(megabytes: float) -> int:
        return max(5, int(scale * min(400, 400 / max(megabytes, 1e-9) ** 0.5)))

    sizes = [s for s in SIZES if s[0] * s[1] * s[2] * 4 / 2**20 <= args.max_mb]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, FBGEMM "
          f"{'present' if HAS_FBGEMM else 'absent (pip install nestbatch[bench])'}")
    print_table(HEADERS, rows(sizes, operations(args.only), repeat_for),
                title="quiet machine: median us of interleaved calls")
    if args.busy:
        busy = busy_processes(args.busy)
        try:
            time.sleep(0.5)
            loaded = operations(args.only)[:2]
            print_table(HEADERS, rows([s for s in BUSY_SIZES if s in sizes], loaded, repeat_for),
                        title=f"{args.busy} other processes each keeping a core busy")
        finally:
            for process in busy:
                process.kill()


if __name__ == "__main__":
    main()

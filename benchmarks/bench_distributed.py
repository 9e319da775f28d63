"""Ragged all-to-all across processes: bytes sent and time per call, three ways.

Every rank holds ``B`` samples of long-tailed lengths (most of a few rows, a few up to
``--max-len``; Pareto from 8 rows, shape 1.2) of ``D`` float32 features and sends an even share
of them to every rank (itself included):

* **nestbatch**: ``nestbatch.distributed.all_to_all(batch, send_counts)``: two small exchanges
  of ints (counts and a description of the batch, then the samples' lengths), then the packed
  rows in one ``all_to_all_single`` with uneven splits;
* **pad + all_to_all_single**: what one writes with plain torch: the longest length over the
  ranks (``all_reduce``), every sample padded to it, the counts and the lengths exchanged, then
  the padded samples in one ``all_to_all_single`` split by samples;
* **all_gather_object**: every rank pickles its samples for every destination and gathers
  every rank's; each keeps its part (what "send Python objects" costs).

"MB sent" counts the bytes a rank sends to the other ranks per call (its own share stays put),
averaged over the ranks: sizes, values and padding, or the pickles. The time is the median per
call of the slowest rank, over repeated calls. gloo over loopback on the CPU (processes beyond
the machine's cores share them). Usage::

    python benchmarks/bench_distributed.py [--quick] [--worlds 2,3,4] [--samples 256]
"""

from __future__ import annotations

import argparse
import io
import pickle
import socket
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import nestbatch as nb  # noqa: E402
from benchmarks.common import median_time, print_table  # noqa: E402
from nestbatch import distributed as nbd  # noqa: E402

HEADERS = ("processes", "method", "MB sent / rank", "ms / call", "x nestbatch time")


def make_batch(rank: int, samples: int, dim: int, max_len: int) -> nb.NestedBatch:
    """Long-tailed lengths: Pareto (shape 1.2) from 8 rows, cut at ``max_len``."""
    gen = torch.Generator().manual_seed(rank)
    uniform = torch.rand(samples, generator=gen)
    lengths = (8 * uniform.pow(-1 / 1.2)).floor().clamp(max=max_len).long().tolist()
    return nb.nested([torch.randn(n, dim, generator=gen) for n in lengths])


def even_counts(samples: int, world: int) -> list[int]:
    return [samples // world + (r < samples % world) for r in range(world)]


def padded_all_to_all(batch: nb.NestedBatch, counts: list[int]) -> tuple[torch.Tensor, list]:
    """The plain-torch way: pad every sample to the longest over the ranks, then exchange."""
    world = len(counts)
    longest = torch.tensor([batch.max_shape[0]])
    dist.all_reduce(longest, op=dist.ReduceOp.MAX)
    data = batch.to_padded_tensor(0.0, (batch.batch_size, int(longest), batch.values.shape[1]))
    recv_counts = torch.empty(world, dtype=torch.int64)
    dist.all_to_all_single(recv_counts, torch.tensor(counts))
    recv = recv_counts.tolist()
    lengths = torch.empty(sum(recv), dtype=torch.int64)
    dist.all_to_all_single(lengths, batch.lengths, recv, counts)
    out = data.new_empty((sum(recv), *data.shape[1:]))
    dist.all_to_all_single(out, data, recv, counts)
    return out, lengths.tolist()


def object_all_to_all(batch: nb.NestedBatch, counts: list[int]) -> list[torch.Tensor]:
    """The Python-object way: gather every rank's per-destination lists, keep this rank's."""
    rank, world = dist.get_rank(), len(counts)
    # Copies: a pickled view carries its whole storage (every sample's rows).
    samples, start, mine = [s.clone() for s in batch.unbind()], 0, []
    per_rank = []
    for count in counts:
        per_rank.append(list(samples[start: start + count]))
        start += count
    everyone: list = [None] * world
    dist.all_gather_object(everyone, per_rank)
    for theirs in everyone:
        mine += theirs[rank]
    return mine


def bytes_sent(rank: int, world: int, batch: nb.NestedBatch, counts: list[int]) -> dict:
    """Bytes this rank sends to the other ranks per call, by method."""
    row = batch.values[0].numel() * batch.values.element_size()
    lengths = batch.partition.host_lengths
    bounds = [0]
    for count in counts:
        bounds.append(bounds[-1] + count)
    others = [r for r in range(world) if r != rank]
    rows = sum(sum(lengths[bounds[r]:bounds[r + 1]]) for r in others)
    samples = sum(counts[r] for r in others)
    longest = torch.tensor([batch.max_shape[0]])
    dist.all_reduce(longest, op=dist.ReduceOp.MAX)
    copies = [s.clone() for s in batch.unbind()]
    per_rank = [copies[bounds[r]:bounds[r + 1]] for r in range(world)]
    buffer = io.BytesIO()
    pickle.Pickler(buffer).dump(per_rank)  # what all_gather_object sends
    ints = 8  # bytes of an int64
    return {
        # counts + description (8 ints), then the lengths and the feature shape
        "nestbatch": rows * row + (len(others) * (8 + 1) + samples) * ints,
        "pad + all_to_all_single": (samples * int(longest) * row
                                    + (len(others) + samples + 1) * ints),
        "all_gather_object": len(others) * (buffer.getbuffer().nbytes + ints),
    }


def worker(rank: int, world: int, port: int, args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    batch = make_batch(rank, args.samples, args.dim, args.max_len)
    counts = even_counts(args.samples, world)
    reference = object_all_to_all(batch, counts)
    got = nbd.all_to_all(batch, counts).unbind()
    assert len(got) == len(reference) and all(map(torch.equal, got, reference))
    calls = {
        "nestbatch": lambda: nbd.all_to_all(batch, counts),
        "pad + all_to_all_single": lambda: padded_all_to_all(batch, counts),
        "all_gather_object": lambda: object_all_to_all(batch, counts),
    }
    repeat = 5 if args.quick else 20
    times = {name: median_time(call, warmup=2, repeat=repeat) for name, call in calls.items()}
    sizes = bytes_sent(rank, world, batch, counts)
    everyone: list = [None] * world
    dist.all_gather_object(everyone, (times, sizes))
    if rank == 0:
        base = max(t["nestbatch"] for t, _ in everyone)
        rows = []
        for name in calls:
            seconds = max(t[name] for t, _ in everyone)
            sent = sum(s[name] for _, s in everyone) / world / 1e6
            rows.append((world, name, sent, seconds * 1e3, seconds / base))
        total = sum(len(make_batch(r, args.samples, 1, args.max_len).values)
                    for r in range(world))
        print_table(HEADERS, rows, f"{world} processes: {args.samples} samples a rank "
                    f"({total} rows in all, lengths 8-{args.max_len}), {args.dim} float32 "
                    "features, gloo on loopback")
        sys.stdout.flush()
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions, 2 processes")
    parser.add_argument("--worlds", default="2,3,4", help="process counts (default: 2,3,4)")
    parser.add_argument("--samples", type=int, default=256, help="samples a rank (default 256)")
    parser.add_argument("--dim", type=int, default=64, help="features a row (default 64)")
    parser.add_argument("--max-len", type=int, default=1024, help="longest sample (default 1024)")
    args = parser.parse_args()
    worlds = [2] if args.quick else [int(w) for w in args.worlds.split(",")]
    for world in worlds:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        mp.spawn(worker, args=(world, port, args), nprocs=world, join=True)


if __name__ == "__main__":
    main()

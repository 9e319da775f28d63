"""Benchmark packed <-> padded conversions against what a user would otherwise write.

Compared, for one ragged dim and sizes from B=8 to a 256 MB padded tensor:

* ``nestbatch``: :func:`nestbatch.kernels.packed_to_padded` / ``padded_to_packed`` (the CUDA
  kernel on GPU; :mod:`nestbatch.kernels.cpu` on CPU), returning a new tensor, and the same
  writing into a reused buffer (``out=``);
* ``torch.nested``: ``nested_tensor_from_jagged`` + ``to_padded_tensor``, and back the aten jagged
  op that nested tensors use (``_padded_dense_to_jagged_forward``);
* ``pad_sequence`` on a ready list of samples, and ``padded[mask]`` for the way back;
* a per-sample Python loop;
* a plain copy of the output's bytes into a reused buffer (``dst.copy_(src)``): the
  memory-bandwidth limit;
* an allocating copy of the same bytes (``src.clone()``): what any function returning a new
  tensor pays. On the CPU the first touch of freshly allocated pages costs more than the copy
  itself; on a GPU the caching allocator makes both limits the same;
* on the CPU, a copy into fresh memory advised as huge pages (what nestbatch's large CPU outputs
  use, :mod:`nestbatch.kernels.host_memory`): the limit for an allocating function here.

Bandwidth counts the bytes read plus the bytes written (for the conversion: packed input plus
padded output; for the copy: twice the output). Usage::

    python benchmarks/bench_conversions.py [--device cuda] [--quick]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch.nn.utils.rnn import pad_sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import add_common_args, gbps, median_time, print_table, sync_for  # noqa: E402
from nestbatch import kernels  # noqa: E402
from nestbatch.kernels import host_memory  # noqa: E402

# (B, max_len, feature) in float32; the last two are 256 MB padded tensors, one of wide rows and
# one of long samples of scalars.
SIZES = [(8, 128, 64), (64, 256, 128), (64, 1024, 256), (256, 1024, 256), (1024, 65536, 1)]


def aten_padded_to_jagged(padded, offsets, total: int):
    """``aten._padded_dense_to_jagged_forward`` as torch.nested calls it: with a feature dim.

    On CUDA the op needs 3-D padded data (given 2-D ``(1024, 4096)`` it asked for 48 GiB);
    torch.nested unsqueezes scalar samples first, and so does this.
    """
    out = torch.ops.aten._padded_dense_to_jagged_forward(
        *aten_padded_to_jagged_args(padded, offsets, total)
    )
    return out.squeeze(-1) if padded.dim() == 2 else out


def aten_padded_to_jagged_args(padded, offsets, total: int) -> tuple:
    """The arguments :func:`aten_padded_to_jagged` gives the aten op (3-D padded data)."""
    return (padded.unsqueeze(-1) if padded.dim() == 2 else padded, [offsets], total)


def make_case(batch: int, max_len: int, feature: int, device: str):
    gen = torch.Generator().manual_seed(batch * max_len)
    lengths = torch.randint(max_len // 2, max_len + 1, (batch,), generator=gen)
    lengths[0] = max_len
    offsets = torch.zeros(batch + 1, dtype=torch.int64)
    torch.cumsum(lengths, 0, out=offsets[1:])
    total = int(offsets[-1])
    values = torch.randn(total, feature, generator=gen).to(device)
    if feature == 1:
        values = values.view(total)
    return values, offsets.to(device), lengths.tolist(), total


def bench_size(batch, max_len, feature, device, warmup, repeat):
    values, offsets, lengths, total = make_case(batch, max_len, feature, device)
    cuda = sync_for(device)
    timing = {"warmup": warmup, "repeat": repeat, "cuda_sync": cuda}
    samples = list(values.split(lengths))
    padded = kernels.packed_to_padded(values, offsets, max_len, 0.0)
    mask = torch.arange(max_len, device=device) < offsets.diff()[:, None]
    out_bytes = padded.numel() * padded.element_size()
    in_bytes = values.numel() * values.element_size()
    nested_size = tuple(padded.shape)

    def loop_to_padded():
        out = values.new_zeros(nested_size)
        for b, n in enumerate(lengths):
            out[b, :n] = samples[b]
        return out

    def loop_to_packed():
        return torch.cat([padded[b, :n] for b, n in enumerate(lengths)])

    def nested_to_padded():
        nt = torch.nested.nested_tensor_from_jagged(values, offsets)
        return torch.nested.to_padded_tensor(nt, 0.0, output_size=nested_size)

    padded_buffer = torch.empty_like(padded)
    packed_buffer = torch.empty_like(values)
    source = torch.empty_like(padded)
    target = torch.empty_like(padded)
    copy_time = median_time(lambda: target.copy_(source), **timing)
    copy_bw = gbps(2 * out_bytes, copy_time)
    clone_time = median_time(source.clone, **timing)
    clone_bw = gbps(2 * out_bytes, clone_time)
    references = [
        ["copy_ into a buffer", copy_time, copy_bw],
        ["clone (allocating)", clone_time, clone_bw],
    ]
    if device == "cpu":

        def fresh_copy():
            return host_memory.empty_for_write(source.shape, source).copy_(source)

        fresh_time = median_time(fresh_copy, **timing)
        fresh_bw = gbps(2 * out_bytes, fresh_time)
        references.append(["copy into fresh huge pages", fresh_time, fresh_bw])

    to_padded = {
        "nestbatch": lambda: kernels.packed_to_padded(values, offsets, max_len, 0.0),
        "nestbatch, out= a reused buffer": lambda: kernels.packed_to_padded(
            values, offsets, max_len, 0.0, out=padded_buffer
        ),
        "torch.nested": nested_to_padded,
        "pad_sequence (list)": lambda: pad_sequence(samples, batch_first=True),
        "per-sample loop": loop_to_padded,
    }
    to_packed = {
        "nestbatch": lambda: kernels.padded_to_packed(padded, offsets, total),
        "nestbatch, out= a reused buffer": lambda: kernels.padded_to_packed(
            padded, offsets, total, out=packed_buffer
        ),
        "torch.nested (aten jagged)": lambda: aten_padded_to_jagged(padded, offsets, total),
        "padded[mask]": lambda: padded[mask],
        "per-sample loop": loop_to_packed,
    }
    rows = []
    features = f"F={feature}" if feature > 1 else "scalars"
    label = f"B={batch} L={max_len} {features} ({out_bytes / 2**20:.0f} MB)"
    for direction, methods in (("packed->padded", to_padded), ("padded->packed", to_packed)):
        times = {name: median_time(fn, **timing) for name, fn in methods.items()}
        ours = times["nestbatch"]
        for name, seconds in times.items():
            bw = gbps(in_bytes + out_bytes, seconds)
            rows.append([
                label, direction, name, seconds * 1e3, seconds / ours, bw,
                100 * bw / copy_bw, 100 * bw / clone_bw,
            ])
    for name, seconds, bw in references:
        rows.append([
            label, "copy", name, seconds * 1e3, float("nan"), bw, 100 * bw / copy_bw,
            100 * bw / clone_bw,
        ])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(parser)
    args = parser.parse_args()
    device = args.device
    warmup, repeat = (1, 3) if args.quick else (3, 15)
    if sync_for(device):
        kernels.load_extension()
    print(f"device={device} torch={torch.__version__} kernels: {kernels.extension_status()}")
    for size in SIZES:  # each size's table as soon as it is measured
        print_table(
            ["size", "direction", "method", "median ms", "x nestbatch", "GB/s", "% of copy_",
             "% of clone"],
            bench_size(*size, device, warmup, repeat),
            title="packed <-> padded (float32; 'x nestbatch' > 1 means slower than nestbatch)",
        )


if __name__ == "__main__":
    main()

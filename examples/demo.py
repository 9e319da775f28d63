"""nestbatch demo: a batch of sentences and a batch of point clouds, built, converted and timed.

Run with ``bash scripts/demo.sh`` (sets up a virtual environment first) or
``python examples/demo.py`` inside one.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

import nestbatch
from nestbatch import Layout, NestedBatch


def median_ms(fn: Callable[[], object], repeat: int = 15) -> float:
    """Median wall time of ``fn`` in milliseconds, after one warm-up call."""
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def show_sentences() -> None:
    print("=" * 72)
    print("A batch of sentences (token ids), as in the NestedTensor RFC")
    print("=" * 72)
    sentences = [torch.tensor([0, 3, 1]), torch.tensor([5, 1, 2, 4]), torch.tensor([3, 2])]
    batch = nestbatch.nested(sentences)
    print(batch)
    print("lengths:", batch.lengths.tolist(), " offsets:", batch.offsets.tolist())
    print("packed values:", batch.values.tolist())
    print("padded with -1:\n", batch.padded(padding_value=-1).data)
    print("mask:\n", batch.mask)
    print("first two tokens of every sentence:", batch[:, :2].tolist())
    print("last token of every sentence:     ", batch[:, -1:].tolist())
    print("layouts materialized so far:", [layout.value for layout in batch.materialized_layouts])


def show_point_clouds() -> None:
    print()
    print("=" * 72)
    print("A batch of point clouds (N_i x 3) and of textures ragged in H and W")
    print("=" * 72)
    generator = torch.Generator().manual_seed(0)
    clouds = [torch.randn(n, 3, generator=generator) for n in (5, 2, 4)]
    batch = nestbatch.as_nested(clouds)
    padded = batch.padded()
    print("clouds:", batch.batch_size, "points per cloud:", batch.lengths.tolist())
    print("padded data shape:", tuple(padded.data.shape), " packed values shape:",
          tuple(batch.values.shape))
    print("padded centroid of every cloud (masked mean):")
    centroid = padded.data.sum(1) / batch.lengths[:, None]
    print(centroid)
    textures = [torch.randn(32, 32, 3, generator=generator),
                torch.randn(64, 16, 3, generator=generator)]
    images = nestbatch.nested(textures, num_ragged_dims=2)
    print("textures: shape_per_sample =", images.shape_per_sample.tolist(),
          " padded =", tuple(images.padded().data.shape),
          " packed =", tuple(images.values.shape),
          " offsets =", images.offsets.tolist())


def time_conversions(batch_size: int, max_len: int, features: int) -> None:
    print()
    print("=" * 72)
    print(f"Conversion timings on the CPU (B={batch_size}, lengths up to {max_len}, "
          f"{features} features, float32)")
    print("=" * 72)
    generator = torch.Generator().manual_seed(0)
    lengths = torch.randint(0, max_len + 1, (batch_size,), generator=generator)
    samples = [torch.randn(int(n), features, generator=generator) for n in lengths]
    packed = NestedBatch.from_list(samples).packed()
    padded_data = NestedBatch.from_list(samples).padded().data
    megabytes = packed.values.numel() * packed.values.element_size() / 1e6

    rows = [
        ("list -> packed", lambda: NestedBatch.from_list(samples).packed()),
        ("list -> padded", lambda: NestedBatch.from_list(samples).padded()),
        ("packed -> padded", lambda: NestedBatch(packed).padded()),
        ("padded -> packed", lambda: NestedBatch.from_padded(padded_data, lengths).packed()),
        ("packed -> list", lambda: NestedBatch(packed).unbind()),
        ("torch pad_sequence (reference)",
         lambda: torch.nn.utils.rnn.pad_sequence(samples, batch_first=True)),
        ("plain copy of the values (reference)", lambda: packed.values.clone()),
    ]
    print(f"{'conversion':40s} {'median ms':>10s}")
    for name, fn in rows:
        print(f"{name:40s} {median_ms(fn):10.3f}")
    print(f"(packed values: {megabytes:.1f} MB)")
    batch = NestedBatch.from_list(samples)
    start = time.perf_counter()
    batch.padded()
    first = time.perf_counter() - start
    start = time.perf_counter()
    batch.padded()
    second = time.perf_counter() - start
    print(f"cached: first .padded() {1e3 * first:.3f} ms, second {1e6 * second:.1f} us")
    assert batch.to(Layout.PADDED).padded() is batch.padded()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--max-len", type=int, default=512)
    parser.add_argument("--features", type=int, default=64)
    args = parser.parse_args()
    torch.set_printoptions(precision=3, sci_mode=False)
    show_sentences()
    show_point_clouds()
    time_conversions(args.batch_size, args.max_len, args.features)


if __name__ == "__main__":
    main()

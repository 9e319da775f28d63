"""Training a small causal LM padded, bucketed and packed: tokens per second and peak memory.

The comparison of ``examples/train_lm_packed.py`` (its model, data and three ways) at larger
sizes: sequences of long-tailed lengths (most near 8 tokens, a few up to ``max_len``), one epoch
per way from the same initial weights, float32.

* **padded**: random batches of as many samples as the budget holds on average, padded to the
  batch's longest, with a padding + causal attention mask;
* **bucketed**: ``TokenBudgetBatchSampler(cost="padded")``, each batch padded to its longest;
* **packed**: ``TokenBudgetBatchSampler(cost="packed")``, a ``NestedBatch`` end to end (on CUDA
  the varlen attention kernels; on the CPU attention pads inside each batch).

Tokens per second count real tokens, timed after each epoch's first step. Peak memory: on CUDA
``torch.cuda.max_memory_allocated``; on the CPU the largest total of the tensors autograd saves
for one step's backward (the activation memory, which padding inflates; parameters left out).
Usage::

    python benchmarks/bench_training.py [--device cuda] [--quick] [--seed 0]
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import add_common_args, print_table  # noqa: E402

#: (samples, longest length, token budget per batch).
SIZES = ((512, 256, 2048), (512, 1024, 8192))
CUDA_SIZES = ((4096, 1024, 16384), (4096, 4096, 65536))


def load_example():
    """``examples/train_lm_packed.py`` as a module (the examples are scripts, not a package)."""
    path = ROOT / "examples" / "train_lm_packed.py"
    spec = importlib.util.spec_from_file_location("train_lm_packed", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(parser)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    device = torch.device(args.device)
    example = load_example()
    sizes = CUDA_SIZES if device.type == "cuda" else SIZES
    if args.quick:
        sizes = sizes[:1]
    memory = "allocated" if device.type == "cuda" else "saved activations"
    for count, max_len, budget in sizes:
        samples = example.make_dataset(count, max_len, args.seed)
        tokens = sum(len(s) for s in samples)
        rows = example.compare_float32(samples, max_len, budget, args.seed, device)
        title = (f"{count} sequences of 8-{max_len} tokens ({tokens} in all), {budget} tokens "
                 f"per batch, float32 on {device.type} (peak MB: {memory})")
        print_table(example.HEADERS, rows, title)


if __name__ == "__main__":
    main()

"""Per-rank detections of different counts, gathered on every rank without padding samples.

Spawns two processes (gloo backend on the loopback address); each holds the detections of its
own images, and ``nestbatch.distributed.all_gather`` gives every rank all of them, in rank order.

Run: ``python examples/distributed_gather.py``
"""

from __future__ import annotations

import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import nestbatch as nb
from nestbatch import distributed as nbd


def worker(rank: int, world: int, port: int) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    gen = torch.Generator().manual_seed(rank)
    # Rank 0 saw 2 images (3 and 0 boxes), rank 1 saw 3 images (1, 4, 2 boxes).
    counts = [[3, 0], [1, 4, 2]][rank]
    boxes = nb.nested([torch.rand(n, 4, generator=gen) for n in counts])
    everything = nbd.all_gather(boxes)
    if rank == 0:
        print("boxes per image on every rank:", everything.lengths.tolist())
        print("rows sent per rank:", [sum(c) for c in ([3, 0], [1, 4, 2])])
    dist.destroy_process_group()


def main() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(2, port), nprocs=2, join=True)


if __name__ == "__main__":
    main()

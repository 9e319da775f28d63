"""Run a function on several processes joined by gloo over loopback (the distributed tests)."""

from __future__ import annotations

import socket
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_on_ranks(worker, world: int, *args) -> None:
    """``worker(rank, world, *args)`` on ``world`` processes joined by gloo.

    gloo sometimes aborts a process while tearing down (``terminate called without an active
    exception``, seen under load) after every rank has finished: that crash is not the test's.
    A rank marks its work done after a barrier, so a crash of a marked rank comes after every
    rank's work and checks; any other failure fails the test.
    """
    with tempfile.TemporaryDirectory() as done:
        try:
            mp.spawn(_spawned, args=(worker, world, free_port(), done, args), nprocs=world,
                     join=True)
        except mp.ProcessExitedException as error:
            if error.signal_name is None or not (Path(done) / str(error.error_index)).exists():
                raise


def _spawned(rank: int, worker, world: int, port: int, done: str, args: tuple) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    try:
        worker(rank, world, *args)
        dist.barrier()  # no rank tears gloo down while another still talks to it
        (Path(done) / str(rank)).touch()
    finally:
        dist.destroy_process_group()

"""This process's place in a data-parallel (torchrun + DDP) job: joining the process group,
and what rank 0 tells the others.

Every process plans the same runs and trains its share of each global batch; only rank 0 reads
and writes the results store, and it tells the others which runs are already done.
"""

from __future__ import annotations

import datetime
import logging
import os
import signal
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def world() -> World:
    """This process's place in a torchrun job (rank 0 of 1 when not under torchrun)."""
    return World(
        int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("LOCAL_RANK", 0))
    )


def setup(device: torch.device) -> tuple[World, torch.device]:
    """Join the process group when under torchrun: NCCL on GPUs (one per process, by local rank),
    gloo on CPU. Returns this process's world and the device it trains on."""
    w = world()
    if w.size == 1:
        return w, device
    if device.type == "cuda":
        device = torch.device("cuda", w.local_rank)
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        # rank 0 scores the test split alone while the others wait: allow a long evaluation
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, timeout=datetime.timedelta(hours=2))
    if not w.is_main:  # one copy of each progress line: the other ranks report warnings only
        logging.getLogger("vitbench").setLevel(logging.WARNING)
    # torchrun stops the other ranks with SIGTERM when one dies; Python's default ends a process
    # there without unwinding, so rank 0's leases stayed behind (a flaky CI failure) whenever the
    # signal came before gloo's own error did. Raised as SystemExit, the `with` blocks release them
    signal.signal(signal.SIGTERM, _exit_on_terminate)
    return w, device


def _exit_on_terminate(signum, frame) -> None:
    raise SystemExit(128 + signum)


def broadcast(value, w: World):
    """Rank 0's `value` on every process (e.g. the run keys already in the store)."""
    if w.size == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def barrier(w: World) -> None:
    if w.size > 1:
        dist.barrier()

"""Data parallelism over the devices of one machine: torchrun + DDP.

`vitbench run --devices N` re-launches the same command under `torchrun --standalone
--nproc_per_node N`; a user's own `torchrun ... -m vitbench run ...` works the same way. Every
process plans the same runs and trains its share of each global batch; only rank 0 reads and
writes the results store, and it tells the others which runs are already done.
"""

from __future__ import annotations

import datetime
import logging
import os
import subprocess
from dataclasses import dataclass

import torch
import torch.distributed as dist

from vitbench.errors import UserError

LAUNCHED_ENV = "VITBENCH_TORCHRUN"  # set by `--devices`: the children must not launch again


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
    return w, device


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


LAUNCH_OPTIONS = ("--devices", "--nnodes", "--node-rank", "--rdzv-endpoint", "--rdzv-id", "--rdzv-backend")


@dataclass(frozen=True)
class Rendezvous:
    """torchrun's multi-node options, passed through as given (`--nnodes 1`: one machine, standalone)."""

    nnodes: int = 1
    node_rank: int = 0
    endpoint: str | None = None
    run_id: str | None = None
    backend: str = "c10d"


def launch(devices: int, argv: list[str], rdzv: Rendezvous | None = None) -> int:
    """Run `vitbench <argv>` (without the launch options) under torchrun with `devices` processes
    on this node; across nodes with the rendezvous options."""
    from vitbench.cluster import torchrun_command

    if os.environ.get(LAUNCHED_ENV) or world().size > 1:
        raise UserError("--devices: already running under torchrun; give the process count to torchrun only")
    if devices > 1 and torch.cuda.is_available() and devices > torch.cuda.device_count():
        raise UserError(f"--devices {devices}: only {torch.cuda.device_count()} CUDA device(s) are visible")
    r = rdzv or Rendezvous()
    command = torchrun_command(
        devices, ["-m", "vitbench", *argv], r.nnodes, r.node_rank, r.endpoint, r.run_id, r.backend
    )
    return subprocess.call(command, env={**os.environ, LAUNCHED_ENV: "1"})


def strip_devices(argv: list[str]) -> list[str]:
    """The command line without the options the launcher consumes (`--devices N`, the rendezvous)."""
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in LAUNCH_OPTIONS:
            skip = True
        elif not arg.startswith(tuple(f"{o}=" for o in LAUNCH_OPTIONS)):
            kept.append(arg)
    return kept

"""Starting the same command once per device under torchrun: `vitbench run --devices N` re-launches
itself as `torchrun --standalone --nproc_per_node N`, across nodes with the rendezvous options;
a user's own `torchrun ... -m vitbench run ...` works the same way."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from vitbench.engine.distributed import world
from vitbench.errors import UserError
from vitbench.execution.supervise import supervise

LAUNCHED_ENV = "VITBENCH_TORCHRUN"  # set by `--devices`: the children must not launch again

LAUNCH_OPTIONS = ("--devices", "--nnodes", "--node-rank", "--rdzv-endpoint", "--rdzv-id", "--rdzv-backend")


@dataclass(frozen=True)
class Rendezvous:
    """torchrun's multi-node options, passed through as given (`--nnodes 1`: one machine, standalone)."""

    nnodes: int = 1
    node_rank: int = 0
    endpoint: str | None = None
    run_id: str | None = None
    backend: str = "c10d"


def launch(devices: int, argv: list[str], rdzv: Rendezvous | None = None, log_dir: Path | None = None) -> int:
    """Run `vitbench <argv>` (without the launch options) under torchrun with `devices` processes
    on this node; across nodes with the rendezvous options. torchrun's own report and the ranks'
    tracebacks go to a log file in `log_dir` (where given), not the terminal: a rank that dies is
    one line naming it (supervise.py)."""
    if os.environ.get(LAUNCHED_ENV) or world().size > 1:
        raise UserError("--devices: already running under torchrun; give the process count to torchrun only")
    if devices > 1 and torch.cuda.is_available() and devices > torch.cuda.device_count():
        raise UserError(f"--devices {devices}: only {torch.cuda.device_count()} CUDA device(s) are visible")
    r = rdzv or Rendezvous()
    command = torchrun_command(
        devices, ["-m", "vitbench", *argv], r.nnodes, r.node_rank, r.endpoint, r.run_id, r.backend
    )
    env = {**os.environ, LAUNCHED_ENV: "1"}
    if log_dir is None:
        return subprocess.call(command, env=env)
    return supervise(command, env, log_dir, devices * r.nnodes)


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


def torchrun_command(
    nproc_per_node: int,
    target: list[str],
    nnodes: int = 1,
    node_rank: int = 0,
    rdzv_endpoint: str | None = None,
    rdzv_id: str | None = None,
    rdzv_backend: str = "c10d",
) -> list[str]:
    """torchrun's command line: `--standalone` on one node, the rendezvous options across nodes."""
    command = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc_per_node}"]
    if nnodes == 1 and rdzv_endpoint is None:
        command.append("--standalone")
    else:
        if rdzv_endpoint is None:
            raise UserError(f"--nnodes {nnodes}: give --rdzv-endpoint HOST:PORT (the rendezvous every node joins)")
        command += [
            f"--nnodes={nnodes}",
            f"--node_rank={node_rank}",
            f"--rdzv_backend={rdzv_backend}",
            f"--rdzv_endpoint={rdzv_endpoint}",
            f"--rdzv_id={rdzv_id or 'vitbench'}",
        ]
    return command + target

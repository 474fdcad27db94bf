"""What a cluster job asks Slurm for when `--cpus-per-job` and `--mem-gb` are not given: what its
plan needs, not Slurm's defaults (one CPU, and, on a node that tracks memory, all of it: one job
held a whole node's memory, and the next job waited for it).

- CPUs: each process of the job (torchrun's ranks, one without) gets one for its own work and one
  per DataLoader worker (`--workers`); torch's threads are then the job's CPUs (job_process.py).
- Memory: each process's resident size, estimated as a sum of parts measured on this machine's
  jobs, times a margin, in whole GB:
    * the process itself, Python, torch, timm and the plan: PROCESS_BYTES;
    * each DataLoader worker (forked; its decoded batches in flight): WORKER_BYTES;
    * the network's parameters, 4 bytes each, held TRAINING_COPIES times by a trainer (weights,
      gradients, momentum, the best or averaged copy, the checkpoint being written) and
      FROZEN_COPIES by a frozen protocol (the weights file read, the model);
    * on the CPU, a trainer's activations: ACTIVATION_BYTES_PER_FLOP of the forward FLOPs of an
      image, times the images of a step;
    * a frozen protocol's features, width x 4 bytes x the images of its splits, twice (the cache
      entry and the copy the solve reads).
  A data-parallel job adds its launcher (torchrun: LAUNCHER_BYTES). `--mem-gb` overrides it; the
  planned figure is said when the jobs go out.
"""

from __future__ import annotations

import functools
import math
from dataclasses import replace

from vitbench.models.backend import ModelSpec
from vitbench.protocols.base import Group, Request, Trainer
from vitbench.protocols.registry import get_protocol

GIB = 2**30
PROCESS_BYTES = 1.5 * GIB
WORKER_BYTES = 0.5 * GIB
TRAINING_COPIES = 6
FROZEN_COPIES = 2
ACTIVATION_BYTES_PER_FLOP = 0.012  # ViT-B/16 at 224 px: ~200 MB kept for the backward pass per 17.6 GFLOP image
MARGIN = 1.25
# torchrun, the launcher of a data-parallel job's ranks: Python and torch, resident beside them (a
# 2-rank CPU fine-tune asked for 4 GB without it and Slurm killed it for exceeding that, issue 88)
LAUNCHER_BYTES = 0.75 * GIB


def default_cpus(processes: int, workers: int) -> int:
    return max(1, processes) * (1 + max(0, workers))


def process_bytes(group: Group, workers: int, processes: int, on_cpu: bool) -> float:
    """One process's estimated resident size for `group`'s runs (a step's images split over `processes`)."""
    backend, spec = group.model.backend, group.model
    if backend is None:
        return PROCESS_BYTES
    trains = isinstance(get_protocol(group.protocol), Trainer)
    total = PROCESS_BYTES + max(0, workers) * WORKER_BYTES
    total += _parameters(group) * 4 * (TRAINING_COPIES if trains else FROZEN_COPIES)
    if trains and on_cpu:
        batch = max(int(s.hparams.get("batch") or 1) for s in group.specs)
        total += ACTIVATION_BYTES_PER_FLOP * backend.flops_per_image(spec, group.res) * math.ceil(batch / processes)
    if not trains:
        images = sum(len(split) for split in group.splits.values())
        total += 2 * 4 * images * backend.representation_width(spec, group.res)
    return total


def _parameters(group: Group) -> int:
    return _parameter_count(group.model, group.res)


@functools.cache
def _parameter_count(spec: ModelSpec, res: int) -> int:
    """The network's parameter count, built on the meta device (no memory, no weights read), once
    per model and size (VTAB's 19 groups share one)."""
    import torch

    assert spec.backend is not None
    with torch.device("meta"):
        model = spec.backend.create(spec, num_classes=1000, img_size=res)
    return sum(p.numel() for p in model.parameters())


def default_mem_gb(groups: list[Group], processes: int, workers: int, on_cpu: bool) -> int:
    """The memory a job of the plan asks for: its largest group's, for each process, with MARGIN."""
    processes = max(1, processes)
    per_process = max((process_bytes(g, workers, processes, on_cpu) for g in groups), default=PROCESS_BYTES)
    launcher = LAUNCHER_BYTES if processes > 1 else 0.0  # torchrun, itself a process of the job
    return max(1, math.ceil((per_process * processes + launcher) * MARGIN / GIB))


def with_defaults(opts, req: Request, groups: list[Group]):
    """`opts` with the CPUs and memory the plan needs where the command gave none."""
    processes = opts.processes_per_node
    cpus = opts.cpus_per_task or default_cpus(processes, req.workers)
    mem = opts.mem_gb or default_mem_gb(groups, processes, req.workers, opts.gpus_per_job == 0)
    return replace(opts, cpus_per_task=cpus, mem_gb=mem)

"""Fit the paper's batch 512 into one device: how many images per forward/backward pass, and
whether to recompute activations in the backward pass (activation checkpointing), chosen from
the memory the device has free and what this model at this resolution takes per image.

Accumulating micro-batches costs nothing but smaller matrix products; checkpointing costs a
second forward pass (about a third more compute), so it is chosen only when no micro-batch of
at least MIN_EFFICIENT_MICRO images fits without it. Neither changes a number: the accumulated
gradient is the global-batch mean either way, and checkpointing replays dropout's RNG.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from vitbench.errors import UserError
from vitbench.host.devices import autocast

if TYPE_CHECKING:
    from vitbench.engine.distributed import World
    from vitbench.engine.train_settings import Settings

log = logging.getLogger("vitbench")

MIN_EFFICIENT_MICRO = 16  # below this, a ViT's matrix products leave an H100 idle: checkpoint instead
HEADROOM = 0.9  # of the free memory: the allocator fragments, cuDNN/cuBLAS take workspaces
PROBE_SIZES = (4, 8)  # micro-batches measured to get memory per image (a line through two points)


@dataclass(frozen=True)
class Footprint:
    """Device bytes a training pass takes: `fixed` (gradients, optimizer state, workspaces) plus
    `per_image` times the micro-batch (activations kept for the backward pass)."""

    fixed: float
    per_image: float

    def largest_micro(self, per_process: int, budget: float) -> int:
        """The largest divisor of `per_process` whose pass fits in `budget` bytes (0: none does)."""
        fitting = [m for m in range(1, per_process + 1) if per_process % m == 0]
        fitting = [m for m in fitting if self.fixed + m * self.per_image <= budget]
        return max(fitting, default=0)


@dataclass(frozen=True)
class MemoryPlan:
    micro: int
    checkpointing: bool
    reason: str


def plan(per_process: int, free: float, plain: Footprint, checkpointed: Footprint | None) -> MemoryPlan:
    """The micro-batch and checkpointing for `per_process` images per step, given `free` bytes."""
    budget = free * HEADROOM
    gib = 2**30
    without = plain.largest_micro(per_process, budget)
    if without >= min(per_process, MIN_EFFICIENT_MICRO):
        return MemoryPlan(without, False, f"{without} images per pass fit in {budget / gib:.1f} GiB")
    with_ckpt = checkpointed.largest_micro(per_process, budget) if checkpointed else 0
    if with_ckpt > without:
        return MemoryPlan(
            with_ckpt,
            True,
            f"only {without} images per pass fit without activation checkpointing, {with_ckpt} with it "
            f"({budget / gib:.1f} GiB)",
        )
    if without:
        return MemoryPlan(without, False, f"only {without} images per pass fit in {budget / gib:.1f} GiB")
    raise UserError(
        f"out of device memory: not even one image per pass fits in {budget / gib:.1f} GiB free "
        "(with activation checkpointing); use a smaller --res or a larger device"
    )


def choose(model: nn.Module, settings: Settings, micro: int, device: torch.device, world: World) -> MemoryPlan:
    """The plan for this run: what was asked for, the CPU default, or measured on the GPU."""
    asked = settings.checkpointing
    if device.type != "cuda" or settings.micro_batch is not None:
        reason = "--micro-batch given" if settings.micro_batch is not None else f"{device.type} default"
        return MemoryPlan(micro, bool(asked), reason)
    per_process = settings.batch // world.size
    can_checkpoint = hasattr(model, "set_grad_checkpointing")
    plain = measure_footprint(model, settings, device, checkpointing=False) if asked is not True else None
    ckpt = (
        measure_footprint(model, settings, device, checkpointing=True)
        if can_checkpoint and asked is not False
        else None
    )
    torch.cuda.empty_cache()
    free_bytes, _ = torch.cuda.mem_get_info(device)
    # the momentum buffer (and the EMA copy) are not allocated until the first step
    state = sum(p.numel() * p.element_size() for p in model.parameters()) * (1 + bool(settings.polyak))
    free = float(free_bytes) - state
    if plain is None:
        assert ckpt is not None
        found = plan(per_process, free, ckpt, None)
        return MemoryPlan(found.micro, True, found.reason + " (checkpointing asked for)")
    found = plan(per_process, free, plain, ckpt)
    log.info(
        "memory plan: micro-batch %d, activation checkpointing %s (%s)", found.micro, found.checkpointing, found.reason
    )
    return found


def measure_footprint(model: nn.Module, settings: Settings, device: torch.device, checkpointing: bool) -> Footprint:
    """Peak bytes of one forward+backward at two micro-batch sizes, fitted with a line. The RNG is
    forked so the probe's dropout draws leave the run's random stream untouched."""
    toggle = getattr(model, "set_grad_checkpointing", None)  # timm models have it; others run plain
    if toggle is not None:
        toggle(checkpointing)
    sizes = sorted({min(m, settings.batch) for m in PROBE_SIZES})
    peaks = []
    with torch.random.fork_rng(devices=[device]):
        for m in sizes:
            torch.cuda.synchronize(device)
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
            base = torch.cuda.memory_allocated(device)
            x = torch.randn(m, 3, settings.res, settings.res, device=device)
            if settings.channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            with autocast(device, settings.precision):
                out = model(x)
            out.float().sum().backward()
            peaks.append(torch.cuda.max_memory_allocated(device) - base)
            del x, out
            model.zero_grad(set_to_none=True)
    if toggle is not None:
        toggle(False)
    if len(sizes) == 1:
        return Footprint(0.0, peaks[0] / sizes[0])
    per_image = max(0.0, (peaks[1] - peaks[0]) / (sizes[1] - sizes[0]))
    return Footprint(max(0.0, peaks[0] - sizes[0] * per_image), per_image)

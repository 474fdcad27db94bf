"""A fine-tune's resumable checkpoint: everything a restarted process needs to continue exactly
where the run was (weights, optimizer, schedule, EMA, RNG, curves, images and device-seconds so
far), written atomically by rank 0 so that a restart finds the previous checkpoint or this one."""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from vitbench.errors import one_line
from vitbench.files.atomic import write_atomic

log = logging.getLogger("vitbench")


@dataclass
class Progress:
    """Where a run stands: what a checkpoint carries besides the weights and optimizer state."""

    step: int = 0
    restarts: int = 0
    curves: dict[str, list[float]] = field(default_factory=lambda: {"train_loss": [], "lr": [], "grad_norm": []})
    train_images: int = 0  # images through forward+backward before `step`, over every process
    seconds: float = 0.0  # device-seconds x devices before `step`
    # early stopping: (step, validation accuracy) so far, and the best weights (on the CPU) with their step
    validation: list[list[float]] = field(default_factory=list)
    best_step: int = 0
    best_state: dict[str, torch.Tensor] | None = None

    @property
    def best_value(self) -> float:
        return max((v for _, v in self.validation), default=float("-inf"))


@dataclass
class Trainables:
    """The objects a checkpoint saves and restores."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any  # timm's scheduler (step_update, state_dict, load_state_dict)
    ema: Any  # timm's ModelEmaV3 with --polyak, else None


def _load(path: Path, run_key: str) -> dict | None:
    if not path.exists():
        return None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # the file is replaced atomically; unreadable means damaged on disk
        log.warning("%s: unreadable checkpoint (%s); starting this run from step 0", path, one_line(e, 120))
        return None
    if state.get("run_key") != run_key:
        log.warning("%s: belongs to another run; starting this run from step 0", path)
        return None
    return state


def restore(path: Path, run_key: str, parts: Trainables, device: torch.device) -> Progress:
    """Load this run's checkpoint into `parts`, if there is one; the progress it records (step 0 if none)."""
    state = _load(path, run_key)
    if state is None:
        return Progress()
    parts.model.load_state_dict(state["model"])
    parts.optimizer.load_state_dict(state["optimizer"])
    if state.get("scheduler"):
        parts.scheduler.load_state_dict(state["scheduler"])
    if parts.ema is not None:
        parts.ema.module.load_state_dict(state["ema"])
    torch.set_rng_state(state["rng_cpu"])
    if device.type == "cuda" and state.get("rng_cuda") is not None:
        torch.cuda.set_rng_state(state["rng_cuda"], device)
    return Progress(
        state["step"],
        state["restarts"] + 1,
        state["curves"],
        state["train_images"],
        state["seconds"],
        state.get("validation") or [],
        state.get("best_step", 0),
        state.get("best_state"),
    )


def save(path: Path, run_key: str, parts: Trainables, device: torch.device, progress: Progress, settings: dict) -> None:
    """Write the checkpoint of a run at `progress.step` (atomically: temp file, then rename)."""
    saved = {
        "run_key": run_key,
        "step": progress.step,
        "restarts": progress.restarts,
        "model": parts.model.state_dict(),
        "optimizer": parts.optimizer.state_dict(),
        "scheduler": parts.scheduler.state_dict(),
        "ema": parts.ema.module.state_dict() if parts.ema is not None else None,
        "rng_cpu": torch.get_rng_state(),
        "rng_cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
        "curves": progress.curves,
        "train_images": progress.train_images,
        "seconds": progress.seconds,
        "validation": progress.validation,
        "best_step": progress.best_step,
        "best_state": progress.best_state,
        "settings": settings,
    }
    write_atomic(path, functools.partial(torch.save, saved))


def discard(path: Path) -> None:
    """The run's result is stored: its checkpoint, and the run's folder once empty, have done their job."""
    path.unlink(missing_ok=True)
    if path.parent.is_dir() and not any(path.parent.iterdir()):
        path.parent.rmdir()

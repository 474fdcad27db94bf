"""The fine-tuning loop: SGD with momentum 0.9, no weight decay, global-norm gradient clipping at
1, linear warmup then cosine decay to 0 (vit_jax's `create_learning_rate_schedule`), gradient
accumulation where memory is short. The recipe around it (Table 4's steps and LR grid, batch 512,
384 px, the dev sweep) is the fine-tuning protocol's (protocols/finetune.py).

One entry point, `train`, runs one fine-tune: resumable from an atomic checkpoint (model,
optimizer, schedule, EMA, RNG, data position, accelerator clock), data-parallel under torchrun.
"""

from __future__ import annotations

import functools
import logging
import math
import sys
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
from torch import nn

from vitbench.datasets import Split
from vitbench.engine import memory, stopping, train_checkpoint
from vitbench.engine.distributed import World
from vitbench.engine.optimization import (  # noqa: F401  (the loop's public names)
    CLIP_NORM,
    MOMENTUM,
    classification_loss,
    make_optimizer,
    schedule,
)
from vitbench.engine.progress import track
from vitbench.engine.train_feed import Feed, Objective
from vitbench.engine.train_settings import Settings, micro_batch_size  # noqa: F401  (the loop's public types)
from vitbench.errors import UserError
from vitbench.host.devices import Clock, autocast
from vitbench.models.backend import Preprocessing

log = logging.getLogger("vitbench")


Validate = Callable[[nn.Module], float]  # the weights -> a validation accuracy (higher is better)


@dataclass
class Outcome:
    """What `train` leaves for the caller: the weights to evaluate and the run's record."""

    model: nn.Module  # the EMA weights with --polyak, else the trained ones
    curves: dict[str, list[float]]  # per step: train_loss, lr, grad_norm
    train_images: int  # images through forward+backward, over every process and restart
    seconds: float  # device-seconds x devices, across restarts (the clock is saved with each checkpoint)
    restarts: int
    micro_batch: int  # what the run ended with (smaller than asked for after an out-of-memory error)
    skipped: list[str] = field(default_factory=list)
    checkpointing: bool = False  # activation checkpointing was on
    peak_memory_bytes: int | None = None  # the device's peak allocation while training (CUDA only)
    memory_plan: str = ""  # why this micro-batch and checkpointing (memory.plan's reason)
    timed_seconds: float = 0.0  # wall-clock seconds from step `Settings.timed_from` to the end
    # early stopping (Settings.eval_every): (step, validation accuracy) pairs, the best step and its weights
    validation: list[list[float]] = field(default_factory=list)
    best_step: int = 0
    best_state: dict[str, torch.Tensor] | None = None


def logits_fn(device: torch.device, precision: str):
    """The evaluation forward, in the precision the run trained in."""

    def logits(model: nn.Module, images: torch.Tensor) -> torch.Tensor:
        with autocast(device, precision):
            return model(images)

    return logits


def train(
    model: nn.Module,
    split: Split,
    settings: Settings,
    preprocessing: Preprocessing,
    device: torch.device,
    world: World,
    checkpoint: Path,
    run_key: str,
    skip_corrupt: bool = False,
    description: str = "fine-tune",
    objective: Objective | None = None,
    validate: Validate | None = None,
) -> Outcome:
    """Train `model` on `split` (fine-tuning: its head already zero-initialised); resume from
    `checkpoint` if one of this run is there. `preprocessing` gives the value range (its mean/std).
    `objective` turns the model's outputs and the labels into the summed loss (default: cross-entropy);
    `validate(model)` scores the weights every `settings.eval_every` steps, and the best are kept."""
    from timm.utils import ModelEmaV3

    torch.manual_seed(settings.seed)  # dropout; the head is zeros and the data stream has its own seeds
    model.to(device).train()
    if settings.channels_last:
        model.to(memory_format=torch.channels_last)
    plan = memory.choose(model, settings, settings.micro(world.size, device.type), device, world)
    if plan.checkpointing:
        model.set_grad_checkpointing(True)  # type: ignore[operator]  # timm: recompute blocks in backward
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = make_optimizer(params, settings)
    ema = ModelEmaV3(model, decay=settings.polyak, use_warmup=settings.polyak_warmup) if settings.polyak else None
    lr_schedule = schedule(optimizer, settings.steps, settings.warmup, settings.decay_steps, settings.decay)
    parts = train_checkpoint.Trainables(model, optimizer, lr_schedule, ema)
    progress = train_checkpoint.restore(checkpoint, run_key, parts, device)
    if progress.restarts:
        log.info(
            "%s: resumed at step %d of %d (restart %d)", description, progress.step, settings.steps, progress.restarts
        )
    forward: nn.Module = model
    if world.size > 1:
        forward = nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None
        )
    step_model: nn.Module = torch.compile(forward) if settings.compile else forward  # type: ignore[assignment]
    loss = objective or classification_loss(settings.label_smoothing)
    feed = Feed(model, split, settings, preprocessing, device, world, skip_corrupt, forward, step_model, loss)
    feed.start(progress.step, plan.micro)
    start = progress.step
    clock = Clock(device, world.size, progress.seconds)
    timed_seconds = _steps(feed, parts, params, progress, clock, settings, checkpoint, run_key, description, validate)
    eval_model = ema.module if ema is not None else model
    if plan.checkpointing:
        model.set_grad_checkpointing(False)  # type: ignore[operator]
    return Outcome(
        eval_model.eval(),
        progress.curves,
        progress.train_images + (settings.steps - start) * settings.batch,
        clock.seconds,
        progress.restarts,
        feed.micro,
        feed.skipped,
        checkpointing=plan.checkpointing,
        peak_memory_bytes=torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None,
        memory_plan=plan.reason,
        timed_seconds=timed_seconds,
        validation=progress.validation,
        best_step=progress.best_step,
        best_state=progress.best_state,
    )


def _steps(
    feed: Feed,
    parts: train_checkpoint.Trainables,
    params: list[nn.Parameter],
    progress: train_checkpoint.Progress,
    clock: Clock,
    settings: Settings,
    checkpoint: Path,
    run_key: str,
    description: str,
    validate: Validate | None = None,
) -> float:
    """The steps from `progress.step` to the end: one optimizer update each, the curves read back at
    logging intervals only, a checkpoint every `checkpoint_every` steps. Returns the wall-clock
    seconds from step `settings.timed_from` on."""
    device, world, optimizer = feed.device, feed.world, parts.optimizer
    start, curves = progress.step, progress.curves
    losses: list[torch.Tensor] = []  # device tensors: read back only at logging intervals (no per-step sync)
    norms: list[torch.Tensor] = []
    report_every = max(1, settings.steps // 4)  # a log line with the loss at each quarter
    steps = range(start, settings.steps)
    if sys.stderr.isatty():
        steps = track(steps, settings.steps - start, description)  # type: ignore[assignment]
    timer = time.perf_counter()
    with clock:
        for step in steps:
            if step == settings.timed_from:  # one sync, at the end of the warm-up
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                timer = time.perf_counter()
            parts.scheduler.step_update(step)
            losses.append(feed.step_loss(step, optimizer, description))
            # the norm is measured either way (curves, divergence check); max_norm inf scales by 1
            norms.append(nn.utils.clip_grad_norm_(params, settings.clip_norm or math.inf))
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if parts.ema is not None:  # without a step ModelEmaV3 keeps the decay constant (the default here)
                parts.ema.update(parts.model, step=step + 1 if settings.polyak_warmup else None)
            curves["lr"].append(optimizer.param_groups[0]["lr"])
            done = step + 1
            validating = settings.eval_every and (done % settings.eval_every == 0 or done == settings.steps)
            if validate is not None and validating:
                _validate(parts.model, validate, progress, done, description)
            report = done % report_every == 0 or done == settings.steps
            if report or done % settings.log_every == 0 or done % settings.checkpoint_every == 0:
                read = len(curves["train_loss"])
                _flush(losses, norms, curves, world)
                _stop_if_diverged(curves, read, description, checkpoint)
            if report:
                loss_now, lr_now = curves["train_loss"][-1], curves["lr"][-1]
                log.info("%s: step %d/%d, loss %.4f, lr %.4g", description, done, settings.steps, loss_now, lr_now)
            if done % settings.checkpoint_every == 0 and done < settings.steps and world.is_main:
                images = progress.train_images + (done - start) * settings.batch
                at = replace(progress, step=done, curves=curves, train_images=images, seconds=clock.elapsed())
                train_checkpoint.save(checkpoint, run_key, parts, device, at, asdict(settings))
            if _stop_agreed(world, done, settings):  # the scheduler asked the job to stop: checkpoint here
                _flush(losses, norms, curves, world)
                images = progress.train_images + (done - start) * settings.batch
                at = replace(progress, step=done, curves=curves, train_images=images, seconds=clock.elapsed())
                save = functools.partial(train_checkpoint.save, checkpoint, run_key, parts, device, at,
                                         asdict(settings))  # fmt: skip
                stopping.reached(f"{description} at step {done} of {settings.steps}, checkpointed",
                                 save if world.is_main else None)  # fmt: skip
    return time.perf_counter() - timer  # the clock synchronised the device on exit


def _stop_agreed(world: World, done: int, settings: Settings) -> bool:
    """Whether the scheduler's stop request is taken up after step `done`: at once in one process;
    under torchrun at a logging step, where every rank asks the others (each got the signal itself,
    maybe a step apart, and all must save and stop at the same step)."""
    if world.size == 1:
        return stopping.requested() is not None
    if done % settings.log_every:
        return False
    import torch.distributed as dist

    flag = torch.tensor([float(stopping.requested() is not None)], device=_collective_device(world))
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def _collective_device(world: World) -> torch.device:
    import torch.distributed as dist

    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def _stop_if_diverged(curves: dict, since: int, description: str, checkpoint: Path) -> None:
    """A loss or gradient norm that is no longer finite ends the run here, at the first read-back
    after it (within log_every steps: no per-step sync): nothing is stored, and the checkpoint goes
    too, since resuming it would diverge the same way. Only the steps read back now (from `since`)
    are looked at: every earlier one passed this check, so a long run's cost stays linear."""
    first = [
        (step, name, curves[name][step])
        for name in ("train_loss", "grad_norm")
        for step in range(since, len(curves[name]))
        if not math.isfinite(curves[name][step])
    ]
    if not first:
        return
    step, name, value = min(first)
    checkpoint.unlink(missing_ok=True)
    with suppress(OSError):
        checkpoint.parent.rmdir()  # the run's own folder, when nothing else is in it
    what = "training loss" if name == "train_loss" else "gradient norm"
    raise UserError(
        f"{description}: the {what} is {value} at step {step + 1}; the run stopped and stored nothing "
        "(a learning rate too high for this model? try a lower --lr)"
    )


def _validate(model: nn.Module, validate: Validate, progress: train_checkpoint.Progress, step: int, what: str) -> None:
    """Early stopping's bookkeeping: score the weights now and keep a CPU copy when they are the
    best so far (every process scores the same weights: no gather, the same choice on each)."""
    model.eval()
    with torch.no_grad():
        value = float(validate(model))
    model.train()
    if value > progress.best_value:
        progress.best_step = step
        progress.best_state = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
    progress.validation.append([step, value])
    log.info("%s: step %d, validation accuracy %.4f (best %.4f at step %d)", what, step, value,
             progress.best_value, progress.best_step)  # fmt: skip


def _flush(losses: list[torch.Tensor], norms: list[torch.Tensor], curves: dict, world: World) -> None:
    """Move the steps' losses and gradient norms to the host: the only syncs of the loop. The loss
    is averaged over processes (each holds the mean over its share of the global batch)."""
    if not losses:
        return
    loss = torch.stack(losses)
    if world.size > 1:
        import torch.distributed as dist

        dist.all_reduce(loss)
        loss /= world.size
    curves["train_loss"] += loss.tolist()
    curves["grad_norm"] += torch.stack(norms).tolist()
    losses.clear()
    norms.clear()

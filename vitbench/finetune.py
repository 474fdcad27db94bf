"""The paper's fine-tuning protocol (App. B.1.1, Table 4; PROTOCOLS.md §1).

SGD with momentum 0.9, no weight decay, global-norm gradient clipping at 1, batch 512 (gradient
accumulation gives the same effective batch where memory is short), linear warmup then cosine
decay to 0 (vit_jax's `create_learning_rate_schedule`), 384 px, the pre-training head replaced
by one zero-initialised linear layer, position embeddings zoomed bilinearly on the grid (the
backend's `adapt_state_dict`), BiT's inception crop + flip for training and a plain resize for
evaluation. The LR is chosen on the dev split from Table 4's grid; the final runs (3 seeds) train
on the full train split and report test accuracy.

One entry point, `train`, runs one fine-tune: resumable from an atomic checkpoint (model,
optimizer, schedule, EMA, RNG, data position, accelerator clock), data-parallel under torchrun.
"""

from __future__ import annotations

import functools
import logging
import math
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from vitbench.backend import Preprocessing
from vitbench.datasets import DatasetSpec, Split
from vitbench.device_data import (
    Augmentation,
    DeviceImages,
    streamed_train_batches,
    synthetic_batches,
    train_batches,
)
from vitbench.distributed import World
from vitbench.errors import UserError
from vitbench.provenance import Clock, write_atomic
from vitbench.train_data import Stream, train_loader, train_transform

log = logging.getLogger("vitbench")

PROTOCOL = "finetune"
VERSION = "finetune/1"
SEEDS = (0, 1, 2)
BATCH = 512
RES = 384
MOMENTUM = 0.9
CLIP_NORM = 1.0
GRID = (0.001, 0.003, 0.01, 0.03)
# Table 4: steps and base-LR grid. (ImageNet's 0.06 is the ResNet/hybrid addition of B.1.1; it sits
# in the ImageNet row of the table, so it is swept here too.)
TABLE4: dict[str, tuple[int, tuple[float, ...]]] = {
    "imagenet": (20_000, (0.003, 0.01, 0.03, 0.06)),
    "cifar10": (10_000, GRID),
    "cifar100": (10_000, GRID),
    "pets": (500, GRID),
    "flowers102": (500, GRID),
}
VTAB_SETTING = (2_500, (0.01,))  # one setting for all 19 tasks (B.1.1)
# --smoke: big_vision's `runlocal` in spirit. A pipeline check, never a number to compare.
SMOKE_STEPS, SMOKE_BATCH, SMOKE_RES = 20, 32, 64
# A CPU cannot report running out of memory (the kernel kills the process), so it accumulates
# micro-batches of at most this size unless told otherwise
CPU_MICRO_BATCH = 32


def table4(dataset: DatasetSpec, n_train: int) -> tuple[int, tuple[float, ...]]:
    """(steps, LR grid) for a dataset: Table 4's row; VTAB's one setting; for a dataset the paper
    does not have, BiT-HyperRule's size rule (< 20k images: 500 steps, < 500k: 10k, else 20k)."""
    if dataset.name in TABLE4:
        return TABLE4[dataset.name]
    if dataset.group is not None:
        return VTAB_SETTING
    return (500 if n_train < 20_000 else 10_000 if n_train < 500_000 else 20_000), GRID


def warmup_steps(steps: int) -> int:
    """vit_jax / big_vision defaults (not in the paper): 500 steps, 100 for the 500-step datasets;
    at most a fifth of a shorter custom run, so that there is a decay phase at all."""
    return min(100 if steps <= 500 else 500, steps // 5)


def checkpoint_interval(steps: int) -> int:
    """Steps between checkpoints by default: a tenth of the run, at least 50 (a 500-step run
    still checkpoints) and at most 500 (a ViT-H step can take seconds; a checkpoint, gigabytes)."""
    return min(500, max(50, steps // 10))


def smoke_res(input_multiple: int) -> int:
    """The smallest multiple of the patch size that is at least SMOKE_RES."""
    return input_multiple * math.ceil(SMOKE_RES / input_multiple)


def schedule(optimizer: torch.optim.Optimizer, total: int, warmup: int):
    """timm's cosine scheduler set up to equal vit_jax's `create_learning_rate_schedule` (cosine):
    linear warmup from 0, then cosine to 0; the update at step k (from 0) uses the LR of step k, as
    optax's schedules count updates from 0 (tests/test_finetune.py checks every step)."""
    from timm.scheduler import CosineLRScheduler

    return CosineLRScheduler(
        optimizer,
        t_initial=total - warmup,
        warmup_t=warmup,
        warmup_lr_init=0.0,
        warmup_prefix=True,
        lr_min=0.0,
        t_in_epochs=False,
    )


@dataclass(frozen=True)
class Settings:
    """One fine-tune. Everything that changes the numbers goes into the run's hparams (and key);
    `micro_batch`, `compile`, `channels_last`, `workers` and the intervals only change speed."""

    steps: int
    batch: int
    lr: float
    warmup: int
    res: int
    crop: bool  # BiT's train-time random crop (off for some structured VTAB tasks)
    flip: bool  # BiT's train-time random flip (off for some structured VTAB tasks)
    precision: str  # bf16 (autocast) or fp32
    polyak: float | None = None  # parameter EMA, evaluated in place of the raw weights
    seed: int = 0
    # images per forward/backward pass per process; None: the whole per-process batch on a GPU
    # (halved on an out-of-memory error until it fits), CPU_MICRO_BATCH on a CPU
    micro_batch: int | None = None
    compile: bool = False
    channels_last: bool = False
    workers: int = 1
    # where augmentation runs: "workers" (DataLoader processes, PIL), "device" (device_data: the
    # same draws on the accelerator) or "synthetic" (one random batch on the device: `vitbench bench`)
    input_pipeline: str = "workers"
    # activation checkpointing: None chooses it with the micro-batch from free memory (memory.py)
    checkpointing: bool | None = None
    log_every: int = 50
    checkpoint_every: int = 500
    timed_from: int = 0  # Outcome.timed_seconds counts from this step (a benchmark's warm-up excluded)

    def micro(self, world: int, device_type: str = "cpu") -> int:
        return micro_batch_size(self.batch, world, self.micro_batch, device_type)


def micro_batch_size(batch: int, world: int, asked: int | None, device_type: str) -> int:
    """Images per forward/backward pass per process, or a one-line error when `batch` does not
    split evenly over the processes and into passes of that size."""
    if batch % world:
        raise UserError(f"--batch {batch}: must split evenly over the {world} processes (--devices)")
    per_process = batch // world
    default = per_process if device_type == "cuda" else math.gcd(per_process, CPU_MICRO_BATCH)
    micro = min(asked or default, per_process)
    if per_process % micro:
        raise UserError(
            f"--batch {batch}: must split evenly over {world} process(es) and into micro-batches of {micro}"
        )
    return micro


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


def _autocast(device: torch.device, precision: str):
    if precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return nullcontext()


def logits_fn(device: torch.device, precision: str):
    """The evaluation forward, in the precision the run trained in."""

    def logits(model: nn.Module, images: torch.Tensor) -> torch.Tensor:
        with _autocast(device, precision):
            return model(images)

    return logits


def _load_checkpoint(path: Path, run_key: str) -> dict | None:
    if not path.exists():
        return None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # the file is replaced atomically; unreadable means damaged on disk
        log.warning(
            "%s: unreadable checkpoint (%s); starting this run from step 0", path, " ".join(str(e).split())[:120]
        )
        return None
    if state.get("run_key") != run_key:
        log.warning("%s: belongs to another run; starting this run from step 0", path)
        return None
    return state


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
) -> Outcome:
    """Fine-tune `model` (head already zero-initialised) on `split`; resume from `checkpoint` if
    one of this run is there. `preprocessing` gives the value range (its mean/std)."""
    from timm.utils import ModelEmaV3

    from vitbench import memory

    micro = settings.micro(world.size, device.type)
    torch.manual_seed(settings.seed)  # dropout; the head is zeros and the data stream has its own seeds
    model.to(device).train()
    if settings.channels_last:
        model.to(memory_format=torch.channels_last)
    plan = memory.choose(model, settings, micro, device, world)
    micro = plan.micro
    if plan.checkpointing:
        model.set_grad_checkpointing(True)  # type: ignore[operator]  # timm: recompute blocks in backward
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(params, lr=settings.lr, momentum=MOMENTUM, weight_decay=0.0)
    scheduler = schedule(optimizer, settings.steps, settings.warmup)
    ema = ModelEmaV3(model, decay=settings.polyak) if settings.polyak else None

    state = _load_checkpoint(checkpoint, run_key)
    curves: dict[str, list[float]] = {"train_loss": [], "lr": [], "grad_norm": []}
    start, restarts, images_done, seconds_done = 0, 0, 0, 0.0
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        if state.get("scheduler"):
            scheduler.load_state_dict(state["scheduler"])
        if ema is not None:
            ema.module.load_state_dict(state["ema"])
        torch.set_rng_state(state["rng_cpu"])
        if device.type == "cuda" and state.get("rng_cuda") is not None:
            torch.cuda.set_rng_state(state["rng_cuda"], device)
        start, restarts = state["step"], state["restarts"] + 1
        curves, images_done, seconds_done = state["curves"], state["train_images"], state["seconds"]
        log.info("%s: resumed at step %d of %d (restart %d)", description, start, settings.steps, restarts)

    forward: nn.Module = model
    if world.size > 1:
        forward = nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None
        )
    step_model = torch.compile(forward) if settings.compile else forward
    transform = train_transform(settings.res, settings.crop, settings.flip, preprocessing.interpolation)

    images = None  # the split on the device, put there once (device pipeline)

    def stream_from(step: int, micro: int):
        nonlocal images
        stream = Stream(len(split), settings.batch, micro, settings.seed, world.rank, world.size)
        if settings.input_pipeline == "synthetic":
            remaining = settings.steps - step
            return stream, synthetic_batches(micro, settings.res, _num_classes(model), device, remaining, stream.accum)
        if settings.input_pipeline == "device":
            aug = Augmentation(settings.res, settings.crop, settings.flip, preprocessing.interpolation)
            if not DeviceImages.fits(split):  # too large to hold: stream the files, decode on the device
                return stream, streamed_train_batches(
                    split, stream, step, settings.steps, aug, device, settings.workers
                )
            if images is None:
                images = DeviceImages(split, device, skip_corrupt)
            return stream, train_batches(images, split.labels, stream, step, settings.steps, aug)
        pin = device.type == "cuda"
        return stream, iter(train_loader(split, stream, step, settings.steps, transform, settings.workers, pin))

    stream, batches = stream_from(start, micro)
    per_process = settings.batch // world.size
    clock = Clock(device, world.size, seconds_done)
    skipped: list[str] = []
    losses, norms = [], []  # device tensors: read back only at logging intervals (no per-step sync)
    report_every = max(1, settings.steps // 4)  # a log line with the loss at each quarter
    steps = range(start, settings.steps)
    if sys.stderr.isatty():
        from vitbench.progress import track

        steps = track(steps, settings.steps - start, description)  # type: ignore[assignment]

    def accumulate(accum: int) -> torch.Tensor:
        """Forward and backward over the step's micro-batches; the gradient is the global-batch mean."""
        total = torch.zeros((), device=device)
        for m in range(accum):
            images, labels, _, bad = next(batches)
            if bad and not skip_corrupt:
                raise UserError(bad[0][1])
            skipped.extend(message for _, message in bad)
            if images is None:
                continue
            x = preprocessing.normalize(images.to(device, non_blocking=True))
            if settings.channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            y = labels.to(device, non_blocking=True)
            # DDP all-reduces gradients on the last micro-batch of a step only
            last = world.size == 1 or m == accum - 1
            with nullcontext() if last else forward.no_sync():  # type: ignore[operator]
                with _autocast(device, settings.precision):
                    logits = step_model(x)
                # summed over the micro-batch, divided by the per-process batch: the accumulated
                # gradient is the mean over the global batch once DDP averages the processes
                loss = F.cross_entropy(logits.float(), y, reduction="sum") / per_process
                loss.backward()
            total += loss.detach()
        return total

    timer = time.perf_counter()
    with clock:
        for step in steps:
            if step == settings.timed_from:  # one sync, at the end of the warm-up
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                timer = time.perf_counter()
            scheduler.step_update(step)
            while True:
                kept = len(skipped)
                try:
                    total_loss = accumulate(stream.accum)
                    break
                except torch.OutOfMemoryError:
                    # the same step again in smaller micro-batches: the same images, the same gradient
                    del skipped[kept:]
                    optimizer.zero_grad(set_to_none=True)
                    torch.cuda.empty_cache()
                    micro = _halved(micro, settings, world)
                    log.warning("%s: out of device memory; accumulating micro-batches of %d", description, micro)
                    stream, batches = stream_from(step, micro)
            norms.append(nn.utils.clip_grad_norm_(params, CLIP_NORM))
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if ema is not None:
                ema.update(model)  # no step: a plain EMA from the initial weights (no warm-up of the decay)
            losses.append(total_loss)
            curves["lr"].append(optimizer.param_groups[0]["lr"])
            done = step + 1
            report = done % report_every == 0 or done == settings.steps
            if report or done % settings.log_every == 0 or done % settings.checkpoint_every == 0:
                _flush(losses, norms, curves, world)
            if report:
                loss_now, lr_now = curves["train_loss"][-1], curves["lr"][-1]
                log.info("%s: step %d/%d, loss %.4f, lr %.4g", description, done, settings.steps, loss_now, lr_now)
            if done % settings.checkpoint_every == 0 and done < settings.steps and world.is_main:
                saved = {
                    "run_key": run_key,
                    "step": done,
                    "restarts": restarts,
                    "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "scheduler": scheduler.state_dict(),
                    "ema": ema.module.state_dict() if ema is not None else None,
                    "rng_cpu": torch.get_rng_state(),
                    "rng_cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
                    "curves": curves,
                    "train_images": images_done + (done - start) * settings.batch,
                    "seconds": clock.elapsed(),
                    "settings": asdict(settings),
                }
                # atomic: a restarted run finds the previous checkpoint or this one, never half of one
                write_atomic(checkpoint, functools.partial(torch.save, saved))
    timed_seconds = time.perf_counter() - timer  # the clock synchronised the device on exit
    eval_model = ema.module if ema is not None else model
    if plan.checkpointing:
        model.set_grad_checkpointing(False)  # type: ignore[operator]
    return Outcome(
        eval_model.eval(),
        curves,
        images_done + (settings.steps - start) * settings.batch,
        clock.seconds,
        restarts,
        micro,
        skipped,
        checkpointing=plan.checkpointing,
        peak_memory_bytes=torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None,
        memory_plan=plan.reason,
        timed_seconds=timed_seconds,
    )


def _num_classes(model: nn.Module) -> int:
    head: Any = model
    return int(head.num_classes) if hasattr(head, "num_classes") else 1000


def _halved(micro: int, settings: Settings, world: World) -> int:
    """The next micro-batch size after an out-of-memory error, or a one-line error where there is none."""
    if world.size > 1:  # the other processes are already waiting in the gradient all-reduce
        raise UserError(f"out of device memory at micro-batch {micro}; give a smaller --micro-batch")
    if settings.micro_batch is not None or micro == 1 or micro % 2:
        raise UserError(f"out of device memory at micro-batch {micro}; give a smaller --micro-batch or --res")
    return micro // 2


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

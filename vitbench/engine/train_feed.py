"""A fine-tune's training batches and the forward/backward over each step's micro-batches, the
engine of `training.train`'s loop: the input pipeline a run asked for (DataLoader workers, the
device pipeline, synthetic batches), BiT-HyperRule's MixUp, DDP's gradient sync on a step's last
micro-batch only, and after an out-of-memory error the same step again in micro-batches half the size."""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import torch
from torch import nn

from vitbench.datasets import Split
from vitbench.engine import bit_hyperrule
from vitbench.engine.device_data import (
    Augmentation,
    DeviceImages,
    streamed_train_batches,
    synthetic_batches,
    train_batches,
)
from vitbench.engine.distributed import World
from vitbench.engine.loader_workers import started
from vitbench.engine.train_data import Stream, TrainTransform, train_loader
from vitbench.engine.train_settings import Settings
from vitbench.errors import UserError
from vitbench.host.devices import autocast
from vitbench.models.backend import Preprocessing

log = logging.getLogger("vitbench")

Objective = Callable[[Any, torch.Tensor], torch.Tensor]  # (model outputs, labels) -> loss summed over the batch


class Feed:
    """The training batches of one run and the forward/backward over a step's micro-batches; after
    an out-of-memory error it restarts the same step in smaller micro-batches (the same images)."""

    def __init__(
        self,
        model: nn.Module,
        split: Split,
        settings: Settings,
        preprocessing: Preprocessing,
        device: torch.device,
        world: World,
        skip_corrupt: bool,
        forward: nn.Module,
        step_model: nn.Module,
        objective: Objective,
    ):
        self.model, self.split, self.settings, self.preprocessing = model, split, settings, preprocessing
        self.device, self.world, self.skip_corrupt = device, world, skip_corrupt
        self.forward, self.step_model = forward, step_model  # DDP wrapper (or the model), and its compiled form
        self.objective = objective  # (model outputs, labels) -> loss summed over the micro-batch
        self.per_process = settings.batch // world.size
        self.skipped: list[str] = []
        self.images: DeviceImages | None = None  # the split on the device, put there once (device pipeline)
        self.transform = TrainTransform(settings.res, settings.crop, settings.flip, settings.precrop)

    def start(self, step: int, micro: int) -> None:
        """Batches from `step` on, in micro-batches of `micro`."""
        s, split, device = self.settings, self.split, self.device
        self.micro = micro
        groups = split.file_groups() if s.train_order == "shards" else None
        self.stream = Stream(len(split), s.batch, micro, s.seed, self.world.rank, self.world.size, groups)
        if s.input_pipeline == "synthetic":
            remaining = s.steps - step
            self.batches = synthetic_batches(
                micro, s.res, _num_classes(self.model), device, remaining, self.stream.accum
            )
        elif s.input_pipeline == "device":
            aug = Augmentation(s.res, s.crop, s.flip, s.precrop)
            if not DeviceImages.fits(split):  # too large to hold: stream the files
                self.batches = streamed_train_batches(
                    split, self.stream, step, s.steps, aug, device, s.workers, s.decode_on_device
                )
            else:
                if self.images is None:
                    self.images = DeviceImages(split, device, self.skip_corrupt, s.decode_on_device, s.workers)
                self.batches = train_batches(self.images, split.labels, self.stream, step, s.steps, aug)
        else:
            pin = device.type == "cuda"
            self.batches = started(train_loader(split, self.stream, step, s.steps, self.transform, s.workers, pin))

    def step_loss(self, step: int, optimizer: torch.optim.Optimizer, description: str) -> torch.Tensor:
        """Forward and backward over one step's micro-batches (the gradient is the global-batch mean);
        the step's summed loss, on the device."""
        while True:
            kept = len(self.skipped)
            try:
                return self._accumulate(step)
            except torch.OutOfMemoryError:
                del self.skipped[kept:]
                optimizer.zero_grad(set_to_none=True)
                torch.cuda.empty_cache()
                micro = _halved(self.micro, self.settings, self.world)
                log.warning("%s: out of device memory; accumulating micro-batches of %d", description, micro)
                self.start(step, micro)

    def _accumulate(self, step: int) -> torch.Tensor:
        total = torch.zeros((), device=self.device)
        accum = self.stream.accum
        # BiT-HyperRule's MixUp: one weight per step, each image mixed with the batch reversed
        mix = bit_hyperrule.mixup_lambda(self.settings.mixup, self.settings.seed, step) if self.settings.mixup else 1.0
        for m in range(accum):
            images, labels, _, bad = next(self.batches)
            if bad and not self.skip_corrupt:
                raise UserError(bad[0][1])
            self.skipped.extend(message for _, message in bad)
            if images is None:
                continue
            x = self.preprocessing.normalize(images.to(self.device, non_blocking=True))  # (B, 3, H, W)
            if self.settings.channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            y = labels.to(self.device, non_blocking=True)
            if mix != 1.0:
                x = mix * x + (1 - mix) * x.flip(0)
            # DDP all-reduces gradients on the last micro-batch of a step only
            last = self.world.size == 1 or m == accum - 1
            with nullcontext() if last else self.forward.no_sync():  # type: ignore[operator]
                with autocast(self.device, self.settings.precision):
                    outputs = self.step_model(x)
                # summed over the micro-batch, divided by the per-process batch: the accumulated
                # gradient is the mean over the global batch once DDP averages the processes
                loss = self.objective(outputs, y) / self.per_process
                if mix != 1.0:
                    loss = mix * loss + (1 - mix) * self.objective(outputs, y.flip(0)) / self.per_process
                loss.backward()
            total += loss.detach()
        return total


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

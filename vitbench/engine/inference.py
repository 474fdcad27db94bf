"""One pass of a model over a split, the way every protocol feeds it: decoding and preprocessing
in DataLoader workers, batches to the device, outputs back in split order. Corrupt images stop the
run with a one-line error naming the file, or, with `skip_corrupt`, are left out and counted."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from vitbench.backend import Preprocessing
from vitbench.datasets import Split
from vitbench.datasets.transformed import TransformedSplit
from vitbench.engine import device_data
from vitbench.engine.progress import track
from vitbench.errors import UserError

log = logging.getLogger("vitbench")


@dataclass
class Outputs:
    """What a pass returns, aligned row by row: `indices` are positions in the split (skipped
    images have none), `skipped` the messages naming each corrupt file left out."""

    values: np.ndarray  # (N, D) float32
    labels: np.ndarray  # (N,) int64
    indices: np.ndarray  # (N,) int64
    skipped: list[str] = field(default_factory=list)


def loader(split: Split, transform: Callable, batch_size: int, workers: int, device: torch.device):
    return torch.utils.data.DataLoader(
        TransformedSplit(split, transform),
        batch_size=batch_size,
        shuffle=False,
        num_workers=workers,
        pin_memory=device.type == "cuda",
        collate_fn=TransformedSplit.collate,
    )


def _to_host(values: torch.Tensor) -> torch.Tensor:
    """A GPU batch's outputs copied into page-locked host memory without waiting: `.cpu()` waited
    for each batch, so the device sat idle while the host prepared the next one (the caller
    synchronises once, before reading them)."""
    if values.device.type != "cuda":
        return values.cpu()
    host = torch.empty(values.shape, dtype=values.dtype, pin_memory=True)
    return host.copy_(values, non_blocking=True)


@torch.inference_mode()
def run_over(
    fn: Callable[[nn.Module, torch.Tensor], torch.Tensor],
    model: nn.Module,
    split: Split,
    preprocessing: Preprocessing,
    device: torch.device,
    batch_size: int,
    workers: int,
    description: str,
    skip_corrupt: bool = False,
    pipeline: str = "workers",
    allow_empty: bool = False,
) -> Outputs:
    """`fn(model, images)` for every image of the split, in split order. Workers decode, resize and
    crop to uint8 (or, with `pipeline="device"`, the device does: device_data.py); the batch is
    normalised on the device (bit-identical to doing it per image)."""

    batches: Iterable
    # a split cropped on decoding (ObjectNet's PNGs, which the device decodes on the CPU anyway) stays with the workers
    if not split.border and device_data.choose(pipeline, device, preprocessing) == "device":
        batches = device_data.eval_batches(split, preprocessing, batch_size, device, workers, skip_corrupt)
    else:
        batches = loader(split, preprocessing.transform(uint8=True), batch_size, workers, device)
    total = math.ceil(len(split) / batch_size)
    model.eval().to(device)
    values, labels, indices, skipped = [], [], [], []
    for images, y, idx, bad in track(batches, total=total, description=description):
        if bad and not skip_corrupt:
            raise UserError(bad[0][1])
        skipped += [message for _, message in bad]
        if images is None:
            continue
        images = preprocessing.normalize(images.to(device, non_blocking=True))
        values.append(_to_host(fn(model, images).float()))
        labels.append(y)
        indices.append(idx)
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # the outputs' copies to the host were asynchronous
    if skipped:
        log.warning("%s: skipped %d corrupt image(s), first: %s", description, len(skipped), skipped[0])
    if not values and allow_empty:  # a part of a split that held only unreadable images (--skip-corrupt)
        return Outputs(np.empty((0, 0), np.float32), np.empty(0, np.int64), np.empty(0, np.int64), skipped)
    if not values:
        raise UserError(f"{split.dataset} {split.name}: no readable images")
    return Outputs(
        torch.cat(values).numpy(),
        torch.cat(labels).numpy().astype(np.int64),
        torch.cat(indices).numpy().astype(np.int64),
        skipped,
    )

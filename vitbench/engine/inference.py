"""One pass of a model over a split, the way every protocol feeds it: decoding and preprocessing
in DataLoader workers, batches to the device, outputs back in split order. Corrupt images stop the
run with a one-line error naming the file, or, with `skip_corrupt`, are left out and counted."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from vitbench.datasets import Split
from vitbench.datasets.transformed import TransformedSplit
from vitbench.engine import device_data, device_eval
from vitbench.engine.loader_workers import started, worker_options
from vitbench.engine.progress import track
from vitbench.errors import UserError
from vitbench.models.backend import Preprocessing

log = logging.getLogger("vitbench")


@dataclass
class Outputs:
    """What a pass returns, aligned row by row: `indices` are positions in the split (skipped
    images have none), `skipped` the messages naming each corrupt file left out, `unreadable`
    their positions."""

    values: np.ndarray  # (N, D) float32
    labels: np.ndarray  # (N,) int64
    indices: np.ndarray  # (N,) int64
    skipped: list[str] = field(default_factory=list)
    unreadable: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    # (N,) device-seconds each row's pass took, its share of it (features.py fills it; empty where unknown:
    # a cache entry written before it was kept)
    seconds: np.ndarray = field(default_factory=lambda: np.empty(0, np.float64))


def loader(split: Split, transform: Callable, batch_size: int, workers: int, device: torch.device):
    data = TransformedSplit(split, transform, batched=hasattr(transform, "batch"))
    return torch.utils.data.DataLoader(
        data,
        batch_size=batch_size,
        shuffle=False,
        **worker_options(workers),
        pin_memory=device.type == "cuda",
        collate_fn=data.collate_batch,
    )


def _to_host(values: torch.Tensor) -> torch.Tensor:
    """A GPU batch's outputs copied into page-locked host memory without waiting: `.cpu()` waited
    for each batch, so the device sat idle while the host prepared the next one (the caller
    synchronises once, before reading them). On the CPU, a view is copied out of the batch it
    views: timm's pre-logits are the CLS token of every token's output, and a chunk's rows, kept
    until it is handed out, held their batches' tokens with them (197x the features at 224 px: a
    k-NN pass over 200,000 images at 32 px peaked at 1.5x the memory of one over 2,000; issue 89)."""
    if values.device.type != "cuda":
        values = values.cpu()
        return (
            values.clone(memory_format=torch.contiguous_format)
            if values.untyped_storage().nbytes() > values.nbytes
            else values
        )
    host = torch.empty(values.shape, dtype=values.dtype, pin_memory=True)
    return host.copy_(values, non_blocking=True)


def _full_batch(fn: Callable, model: nn.Module, images: torch.Tensor, batch_size: int) -> torch.Tensor:
    """`fn(model, images)` for a batch padded (with copies of its last image) to `batch_size`:
    every image goes through matrix products of the same shape, so its outputs do not depend on
    which images shared its batch. A matrix product over fewer rows may take another kernel and sum
    in another order: few-shot's 50 drawn digits, extracted 8 at a time, ended in a batch of 2 whose
    features were 2e-6 off, enough to move a linear-probe prediction (issue 46, goal 5)."""
    short = batch_size - len(images)
    if short <= 0:
        return fn(model, images)
    padded = torch.cat([images, images[-1:].expand(short, *images.shape[1:])])
    return fn(model, padded)[: len(images)]


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
    """`fn(model, images)` for every image of the split, in split order (`run_over_parts` in one part)."""
    found = next(run_over_parts(fn, model, split, preprocessing, device, batch_size, workers, description,
                                [len(split)], skip_corrupt, pipeline))  # fmt: skip
    if not len(found.indices) and not allow_empty:
        raise UserError(f"{split.dataset} {split.name}: no readable images")
    return found


def run_over_parts(
    fn: Callable[[nn.Module, torch.Tensor], torch.Tensor],
    model: nn.Module,
    split: Split,
    preprocessing: Preprocessing,
    device: torch.device,
    batch_size: int,
    workers: int,
    description: str,
    ends: Iterable[int],
    skip_corrupt: bool = False,
    pipeline: str = "workers",
) -> Iterator[Outputs]:
    """`fn(model, images)` for every image of the split in one pass (one DataLoader, its workers
    started once), handed out in parts: the outputs of positions [previous end, end) for each of
    `ends`, as soon as every image before `end` has been through the model, so that a caller can
    keep each part (the feature cache's chunks) without a loader per part. Workers decode, resize
    and crop to uint8 (or, with `pipeline="device"`, the device does: device_data.py,
    device_eval.py); the batch is normalised on the device (bit-identical to doing it per image)."""
    ends = [int(e) for e in ends]
    if not len(split):
        nothing = np.empty(0, np.int64)
        yield from (_outputs(np.empty((0, 0), np.float32), nothing, nothing, []) for _ in ends)
        return
    batches: Iterable
    # a split cropped on decoding (ObjectNet's PNGs, which the device decodes on the CPU anyway) stays with the workers
    if not split.border and device_data.choose(pipeline, device, preprocessing) == "device":
        on_device = device_data.decodes_on_device(pipeline)
        batches = device_eval.eval_batches(split, preprocessing, batch_size, device, workers, skip_corrupt, on_device)
    else:
        batches = loader(split, preprocessing.transform(uint8=True), batch_size, workers, device)
    total = math.ceil(len(split) / batch_size)
    model.eval().to(device)
    rows: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []  # (values, labels, indices) not handed out
    bad_rows: list[tuple[int, str]] = []
    through, part = 0, 0  # positions [0, through) have been through the model
    for images, y, idx, bad in track(started(batches), total=total, description=description):
        if bad and not skip_corrupt:
            raise UserError(bad[0][1])
        bad_rows += [(int(i), message) for i, message in bad]
        through = max([through, *(int(i) + 1 for i, _ in bad), int(idx.max()) + 1 if len(idx) else 0])
        if images is not None:
            with torch.inference_mode():  # per batch: a caller's code between parts runs outside it
                images = preprocessing.normalize(images.to(device, non_blocking=True))
                rows.append((_to_host(_full_batch(fn, model, images, batch_size).float()), y, idx))
        while part < len(ends) and through >= ends[part]:
            rows, bad_rows, done = _hand_out(rows, bad_rows, ends[part], device, description)
            part += 1
            yield done
    while part < len(ends):  # what is left (the last part)
        rows, bad_rows, done = _hand_out(rows, bad_rows, ends[part], device, description)
        part += 1
        yield done


def _hand_out(
    rows: list, bad_rows: list, end: int, device: torch.device, description: str
) -> tuple[list, list, Outputs]:
    """The rows and unreadable images before `end` as Outputs, and what is left of each. Each batch
    is written into the part's arrays and let go of in turn (`rows` is emptied as it is read): a
    part is never held twice, as its batches and as their concatenation (the last chunk of a
    200,000-image pass is 50,000 rows; issue 89, item 10)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # the outputs' copies to the host were asynchronous
    kept = [int((indices < end).sum()) for _, _, indices in rows]
    width = next((values.shape[1:] for values, _, _ in rows), ())
    values_out = np.empty((sum(kept), *width), np.float32)
    labels_out, indices_out = np.empty(sum(kept), np.int64), np.empty(sum(kept), np.int64)
    left, at = [], 0
    for i, n in enumerate(kept):
        values, labels, indices = rows[i]
        rows[i] = None  # let go of as soon as it is written
        before = indices < end
        take = before if n < len(indices) else slice(None)  # (a whole batch: no copy)
        values_out[at : at + n], labels_out[at : at + n], indices_out[at : at + n] = (
            values[take].numpy(), labels[take].numpy(), indices[take].numpy()
        )  # fmt: skip
        at += n
        if n < len(indices):
            left.append((values[~before], labels[~before], indices[~before]))
    skipped = [(i, m) for i, m in bad_rows if i < end]
    if skipped:
        log.warning("%s: skipped %d corrupt image(s), first: %s", description, len(skipped), skipped[0][1])
    done = _outputs(values_out, labels_out, indices_out, skipped)
    return left, [(i, m) for i, m in bad_rows if i >= end], done


def _outputs(values: np.ndarray, labels: np.ndarray, indices: np.ndarray, skipped: list[tuple[int, str]]) -> Outputs:
    """A part's Outputs: its rows (none: (0, 0) wide) and the unreadable images among its positions."""
    unreadable = np.asarray([i for i, _ in skipped], np.int64)
    messages = [m for _, m in skipped]
    if not len(indices):
        nothing = np.empty(0, np.int64)
        return Outputs(np.empty((0, 0), np.float32), nothing, nothing, messages, unreadable)
    return Outputs(values, labels, indices, messages, unreadable)

"""The eval side of the device input pipeline (device_data.py): the eval transform (resize, centre
crop) on uint8 images on the device, and a split's batches in split order as `inference.loader`
yields them, each made on a side CUDA stream while the model runs the one before."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

from vitbench.datasets import CorruptImage, Split
from vitbench.engine.device_data import DeviceImages, decode_many, file_loader, pinned, unpack
from vitbench.engine.loader_workers import started
from vitbench.models import pil_resample
from vitbench.models.backend import Preprocessing
from vitbench.models.preprocessing import per_size


def eval_resize(images: torch.Tensor | list[torch.Tensor], pre: Preprocessing) -> torch.Tensor:
    """The eval transform (resize to floor(size / crop_pct), squash or shorter side, then centre
    crop) on uint8 images on the device: one call for a same-sized batch, else one per image.
    TensorFlow's resize for the Google recipes; for timm's, PIL's resize with PIL's arithmetic
    (pil_resample.py): the pixels timm's `create_transform` gives, on any device."""

    def one(x: torch.Tensor) -> torch.Tensor:
        return pre.resize_crop(x) if not pre.antialias else resize_like_pil(x, pre)

    return one(images) if isinstance(images, torch.Tensor) else per_size(images, one)


def resize_like_pil(images: torch.Tensor, pre: Preprocessing) -> torch.Tensor:
    """timm's eval transform of uint8 (..., 3, H, W) images of one size: torchvision's `Resize`
    (both sides to floor(size / crop_pct) for squash, else the shorter one) and `CenterCrop` of a
    PIL image, the crop folded into the resize (only the kept pixels are computed)."""
    scale = int(pre.size / pre.crop_pct)
    height, width = images.shape[-2:]
    resized = (scale, scale) if pre.crop_mode == "squash" else pil_resample.resized_size(height, width, scale)
    box = pil_resample.center_box(*resized, pre.size)
    return pil_resample.resize_crop(images, resized, pre.interpolation, box)


def eval_batches(
    split: Split, pre: Preprocessing, batch_size: int, device: torch.device, workers: int, skip_corrupt: bool,
    on_device: bool = False,
) -> Iterator[tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor, list[tuple[int, str]]]]:  # fmt: skip
    """Batches (uint8 (B, 3, size, size) on the device, labels, indices, bad) in split order, as
    `inference.loader` yields them, each made on a side stream while the model runs the one before
    (`_ahead`). In-memory images go up a batch at a time from page-locked memory (before: the whole
    split from pageable memory inside the pass); image files are decoded by workers with PIL and
    go up a batch at a time, or, `on_device` (device_data.decodes_on_device), a small split is
    decoded onto the device first and a large one streams its bytes, decoded a batch at a time."""
    batches = _eval_batches_here(split, pre, batch_size, device, workers, skip_corrupt, on_device)
    yield from _ahead(batches, device)


def _eval_batches_here(
    split: Split, pre: Preprocessing, batch_size: int, device: torch.device, workers: int, skip_corrupt: bool = False,
    on_device: bool = False,
):  # fmt: skip
    """`eval_batches`, each batch made on the current stream."""
    if isinstance(split.images, np.ndarray | torch.Tensor):  # (N, H, W, 3) uint8, one size (CIFAR)
        for start in range(0, len(split), batch_size):
            index = torch.arange(start, min(start + batch_size, len(split)))
            # to the device as stored, then to (N, 3, H, W) there: the layout copy on the host took
            # longer than the transfer
            host = pinned(torch.as_tensor(split.images[start : start + batch_size]), device)
            batch = host.to(device, non_blocking=True).permute(0, 3, 1, 2).contiguous()
            yield eval_resize(batch, pre), torch.from_numpy(split.labels[index.numpy()]), index, []
        return
    if split.images is not None:  # a list of differently sized (H, W, 3) arrays
        for start in range(0, len(split), batch_size):
            index = torch.arange(start, min(start + batch_size, len(split)))
            images = [torch.from_numpy(np.ascontiguousarray(split.images[i])).permute(2, 0, 1) for i in index]
            batch = eval_resize([pinned(x, device).to(device, non_blocking=True) for x in images], pre)
            yield batch, torch.from_numpy(split.labels[index.numpy()]), index, []
        return
    if on_device and DeviceImages.fits(split):
        # a small file-backed split is decoded onto the device first, in batched nvjpeg calls: on an
        # H200 that ran DeiT-Ti's extraction from JPEGs at 10,400 images/s, decoding a batch at a
        # time from a worker's bytes at 3,000 (docs/performance.md)
        held = DeviceImages(split, device, skip_corrupt, on_device, workers)
        for start in range(0, len(split), batch_size):
            span = range(start, min(start + batch_size, len(split)))
            read = [i for i in span if i not in held.bad]
            bad = [(i, held.bad[i]) for i in span if i in held.bad]
            if not read:
                yield None, None, torch.empty(0, dtype=torch.long), bad
                continue
            batch = eval_resize([held.get(i) for i in read], pre)
            yield batch, torch.from_numpy(split.labels[read]), torch.tensor(read), bad
        return
    for packed, labels, items in started(file_loader(split, batch_size, workers, decoded=not on_device)):
        decoded, kept, bad = [], [], []
        where = [split.location(i) for i in items]
        files = unpack(packed, where, None if on_device else device)
        found = decode_many(files, device, where) if on_device else files
        for position, (image, i) in enumerate(zip(found, items, strict=True)):
            if isinstance(image, CorruptImage):
                bad.append((i, str(image)))
            else:
                decoded.append(image)
                kept.append((position, i))
        if not decoded:
            yield None, None, torch.empty(0, dtype=torch.long), bad
            continue
        keep = torch.tensor([p for p, _ in kept])
        yield eval_resize(decoded, pre), labels[keep], torch.tensor([i for _, i in kept]), bad


def _ahead(batches: Iterator, device: torch.device) -> Iterator:
    """`batches`, each made on a side CUDA stream: the caller's forward pass of one batch (queued on
    the main stream) runs while the host reads, and the device decodes and resizes, the next; the
    main stream waits only for the batch it is about to use. torchvision's nvjpeg decode waits for
    its stream to finish, which on the main stream meant waiting for the previous forward pass too."""
    if device.type != "cuda":
        yield from batches
        return
    side, main = torch.cuda.Stream(device), torch.cuda.current_stream(device)

    def make():
        with torch.cuda.stream(side):
            item = next(batches, None)
        if item is not None and item[0] is not None:
            main.wait_stream(side)
            item[0].record_stream(main)  # made on the side stream: its memory is not reused while main reads it
        return item

    item = make()
    while item is not None:
        yield item
        item = make()

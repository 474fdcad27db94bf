"""The input pipeline on the accelerator: images held as uint8 on the device (image files decoded by
DataLoader workers with PIL, or, when asked, on the device from their bytes), cropped, flipped and
resized there, so that a GPU step is never waiting on CPU workers' resizing.

It reproduces the worker pipeline exactly: each image's crop and flip are drawn on the CPU from the
same (seed, stream position) generator that `train_data.AugmentedSplit` seeds, and the same
tensor ops (train_data.apply_box, TensorFlow-style resizing) run on the device; an antialiased
eval recipe (timm's) resizes with PIL's own fixed-point arithmetic as two matrix products
(pil_resample.py), so its pixels are PIL's to the grey level (tests/test_device_data.py and
tests/test_conformance.py check both, the latter on the 500 shared ImageNet JPEGs). Choosing it
changes speed, not pixels, so it is recorded in a run's notes and not in its key; decoding files on
the device (`--input-pipeline nvjpeg`) changes pixels, and a run records it in its key
(decoder_note). The eval side (the eval transform, batches in split order) is device_eval.py.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch
from torchvision.io import ImageReadMode, decode_image, decode_jpeg

from vitbench.datasets import CorruptImage, Split
from vitbench.datasets.base import decode
from vitbench.engine.loader_workers import started, worker_options
from vitbench.engine.train_data import Box, MicroBatches, Stream, _item_seed, apply_box, draw_box
from vitbench.errors import UserError
from vitbench.models import pil_resample
from vitbench.models.backend import Preprocessing

log = logging.getLogger("vitbench")

# A file-backed split is decoded into device memory first when it is small (VTAB-1k: 800-1,000 train
# images); a large one (ImageNet) streams its JPEG bytes and is decoded per batch instead.
PRELOAD_MAX_IMAGES = 20_000
JPEG_MAGIC = b"\xff\xd8"


# what a frozen-feature run records (and keys on) when its image files go through nvjpeg
NVJPEG_DECODER = "nvjpeg (4:2:0 colour planes repeated, not interpolated as libjpeg does)"


def choose(pipeline: str, device: torch.device, pre: Preprocessing | None = None) -> str:
    """`auto`: on the device for a GPU (it frees the CPU cores), DataLoader workers on a CPU;
    `nvjpeg` is the device pipeline decoding on the device too. A recipe the device cannot resize
    as the workers do stays with the workers: a crop mode other than squash / center, a filter
    that is not one of PIL's resampling filters (nearest), a crop larger than the resize (padded)."""
    if pre is not None and not device_can_resize(pre):
        return "workers"
    if pipeline == "auto":
        return "device" if device.type == "cuda" else "workers"
    return "device" if pipeline == "nvjpeg" else pipeline


def device_can_resize(pre: Preprocessing) -> bool:
    """Whether `device_eval.eval_resize` gives this recipe's pixels (the workers' transform's)."""
    if pre.crop_mode not in ("squash", "center") or int(pre.size / pre.crop_pct) < pre.size:
        return False
    if not pre.antialias:  # TensorFlow's resize: bilinear squash (Preprocessing.resize_crop)
        return pre.crop_mode == "squash" and pre.interpolation == "bilinear"
    return pil_resample.supports(pre.interpolation)


def decodes_on_device(pipeline: str) -> bool:
    """Whether the device pipeline decodes image files on the device (nvjpeg on a GPU): only when
    `--input-pipeline nvjpeg` asks for it. Under `auto` and `device` DataLoader workers decode them
    with PIL's libjpeg and the device does the rest (resize, crop, augmentation). nvjpeg, as torchvision calls
    it, repeats the colour planes of a chroma-subsampled (4:2:0) JPEG where libjpeg (PIL,
    TensorFlow's decode_jpeg, big_vision) interpolates them: on CIFAR-sized 4:2:0 JPEGs that put a
    random-init ViT-B/16's few-shot and k-NN accuracies 3.2 and 3.5 points below the same weights
    through PIL on an H200 (docs/performance.md; sgl-project/sglang#34163 traced the same loss to
    the same flags). Decoded in the workers, the accuracies agree within 0.03 point."""
    return pipeline == "nvjpeg"


def decoder_note(pipeline: str, device: torch.device, pre: Preprocessing | None, splits: list[Split]) -> str | None:
    """NVJPEG_DECODER where image files of `splits` would be decoded by nvjpeg, else None.
    `pre`: the eval recipe (None for training's augmentation, which the device always does)."""
    files = [s for s in splits if s.images is None and not s.border]  # a bordered split stays with the workers
    if device.type == "cuda" and decodes_on_device(pipeline) and files and choose(pipeline, device, pre) == "device":
        return NVJPEG_DECODER
    return None


def decoder_hparams(pipeline: str, device: torch.device, pre: Preprocessing | None, splits: list[Split]) -> dict:
    """What a run records (and is keyed on) about how its image files were decoded: nothing for
    PIL's libjpeg (the references' decoder, whichever pipeline resizes), `decoder` for nvjpeg."""
    note = decoder_note(pipeline, device, pre, splits)
    return {"decoder": note} if note else {}


def _decode_bytes(data: torch.Tensor, device: torch.device, where: str) -> torch.Tensor:
    """(3, H, W) uint8 on `device` from an encoded file: JPEGs with nvjpeg on a GPU, the rest (and
    JPEGs nvjpeg refuses, e.g. CMYK) on the CPU. A corrupt file is a CorruptImage naming it."""
    if device.type == "cuda" and bytes(data[:2].tolist()) == JPEG_MAGIC:
        try:
            return decode_jpeg(data, mode=ImageReadMode.RGB, device=device)
        except RuntimeError:
            pass  # fall through to the CPU decoder, which names the problem if there is one
    try:
        image = decode_image(data, mode=ImageReadMode.RGB)
        if image.dtype == torch.uint16:  # a 16-bit PNG: scaled to 8 bits as the PIL path does
            image = torch.round(image.to(torch.float32) / 257).to(torch.uint8)
        elif image.dtype != torch.uint8:
            raise RuntimeError(f"{image.dtype} pixels")
        return image.to(device)
    except RuntimeError:
        # torchvision cannot read it: PIL's decoder (palette PNGs, odd JPEGs) or its error
        pixels = np.asarray(decode(where, data.numpy().tobytes()))
        return torch.from_numpy(pixels).permute(2, 0, 1).contiguous().to(device)


def decode_many(
    files: list[torch.Tensor | CorruptImage], device: torch.device, where: list[str]
) -> list[torch.Tensor | CorruptImage]:
    """`_decode_bytes` for a list of files' bytes (an unreadable file's CorruptImage passes
    through): each (3, H, W) uint8 on `device`, or the CorruptImage naming it. On a GPU the JPEGs
    go to nvjpeg in one batched call (one call per image left the device pipeline's decode
    CPU-bound on an H100: docs/performance.md); a batch nvjpeg refuses is decoded image by image,
    which names the bad file or takes the CPU decoder's path."""
    out = list(files)
    todo = [i for i, f in enumerate(files) if isinstance(f, torch.Tensor)]
    jpegs = [i for i in todo if bytes(files[i][:2].tolist()) == JPEG_MAGIC]  # type: ignore[index]
    if device.type == "cuda" and len(jpegs) > 1:
        try:
            decoded = decode_jpeg([files[i] for i in jpegs], mode=ImageReadMode.RGB, device=device)
            for i, image in zip(jpegs, decoded, strict=True):
                out[i] = image
            done = set(jpegs)
            todo = [i for i in todo if i not in done]
        except RuntimeError:
            pass  # one of them is not for nvjpeg: each on its own below
    for i in todo:
        try:
            out[i] = _decode_bytes(files[i], device, where[i])  # type: ignore[arg-type]
        except CorruptImage as e:
            out[i] = e
    return out


DECODE_BATCH = 256  # files per batched nvjpeg call when a split is put on the device


class DeviceImages:
    """A split's images as uint8 (3, H, W) tensors on the device: one (N, 3, H, W) tensor when
    they share a size (CIFAR), else one tensor per image (VTAB-1k, decoded once: by `workers` with
    PIL, or on the device with `on_device`, decodes_on_device)."""

    def __init__(
        self, split: Split, device: torch.device, skip_corrupt: bool = False, on_device: bool = False, workers: int = 0
    ):
        self.device = device
        self.bad: dict[int, str] = {}  # split index -> "path: reason" (only with skip_corrupt)
        self.stacked: torch.Tensor | None = None
        self.each: list[torch.Tensor | None] = []
        if isinstance(split.images, np.ndarray | torch.Tensor):  # (N, H, W, 3) uint8
            # to the device as stored, then to (N, 3, H, W) there: the layout copy on the host took
            # longer than the transfer (0.3 s for CIFAR-10's 50,000 training images)
            self.stacked = torch.as_tensor(split.images).to(device).permute(0, 3, 1, 2).contiguous()
        elif split.images is not None:
            self.each = [torch.from_numpy(np.ascontiguousarray(a)).permute(2, 0, 1).to(device) for a in split.images]
        else:
            for packed, _, items in started(file_loader(split, DECODE_BATCH, workers, decoded=not on_device)):
                paths = [split.location(i) for i in items]
                files = unpack(packed, paths, None if on_device else device)
                for index, image in zip(items, decode_many(files, device, paths) if on_device else files, strict=True):
                    if isinstance(image, CorruptImage):
                        if not skip_corrupt:
                            raise image
                        self.bad[index] = str(image)
                        self.each.append(None)
                    else:
                        self.each.append(image)

    @staticmethod
    def fits(split: Split) -> bool:
        """Whether the split is held in memory already or small enough to be decoded into it."""
        return split.images is not None or len(split) <= PRELOAD_MAX_IMAGES

    def size(self, index: int) -> tuple[int, int]:
        image = self.stacked[index] if self.stacked is not None else self.each[index]
        assert image is not None
        return int(image.shape[-2]), int(image.shape[-1])

    def get(self, index: int) -> torch.Tensor:
        image = self.stacked[index] if self.stacked is not None else self.each[index]
        assert image is not None
        return image


# --- training: BiT's augmentation, the same draws as the worker pipeline -----------------------


@dataclass(frozen=True)
class Augmentation:
    res: int
    crop: str  # train_data.CROP_MODES
    flip: bool
    precrop: int | None = None

    def draw(self, height: int, width: int, seed: int, position: int) -> Box:
        """One image's crop and flip: what `train_data.TrainTransform` draws for it from the
        generator `AugmentedSplit` seeds with (seed, position), in the same order."""
        generator = torch.default_generator
        saved = generator.get_state()
        generator.manual_seed(_item_seed(seed, position))
        try:
            return draw_box(height, width, self.res, self.crop, self.flip, self.precrop)
        finally:
            generator.set_state(saved)

    def apply(self, image: torch.Tensor, box: Box) -> torch.Tensor:
        """(3, H, W) uint8 -> (3, res, res) uint8 on the image's device (the workers' exact ops)."""
        return apply_box(image, box, self.res)


def pinned(values: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`values` (host) in page-locked memory when they are bound for a GPU. A copy from pageable
    memory waits for everything queued on the device before it starts (CUDA's rule for pageable
    host-to-device copies), so each micro-batch's labels made the host wait for the previous step,
    and the next batch's crops were launched only then: on an H100 that added ~30 ms to every
    256-image step of ViT-B/16 at both 224 and 384 px (docs/performance.md)."""
    return values.pin_memory() if device.type == "cuda" else values


def train_batches(
    images: DeviceImages, labels: np.ndarray, stream: Stream, start_step: int, total_steps: int, aug: Augmentation
) -> Iterator[tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor, list[tuple[int, str]]]]:
    """Micro-batches (images (B, 3, res, res) uint8 on the device, labels, split indices, bad) in
    the stream's order: the worker loader's contract, without the workers."""
    for items in stream.micro_batches(start_step, total_steps):
        bad = [(i, images.bad[i]) for i, _ in items if i in images.bad]
        good = [(i, p) for i, p in items if i not in images.bad]
        if not good:
            yield None, None, torch.empty(0, dtype=torch.long), bad
            continue
        batch = torch.stack([aug.apply(images.get(i), aug.draw(*images.size(i), stream.seed, p)) for i, p in good])
        index = torch.tensor([i for i, _ in good])
        yield batch, pinned(torch.from_numpy(labels[index.numpy()]), images.device), index, bad


def streamed_train_batches(
    split: Split, stream: Stream, start_step: int, total_steps: int, aug: Augmentation, device: torch.device,
    workers: int, on_device: bool = False,
):  # fmt: skip
    """`train_batches` for a split too large to hold (ImageNet): workers decode the files in stream
    order with PIL (or only read them, decoded on the device `on_device`); each image is cropped
    and flipped on the device."""

    loader = torch.utils.data.DataLoader(
        _Files(split, decoded=not on_device),
        batch_sampler=MicroBatches(stream, start_step, total_steps),
        **worker_options(workers),
        collate_fn=_Files.collate,
        pin_memory=False,
    )
    for packed, labels, items in started(loader):
        out, kept, bad = [], [], []
        paths = [split.location(index) for index, _ in items]
        files = unpack(packed, paths, None if on_device else device)
        images = decode_many(files, device, paths) if on_device else files
        for image, label, (index, position) in zip(images, labels.tolist(), items, strict=True):
            if isinstance(image, CorruptImage):  # reported like the worker loader's: the caller stops or skips
                bad.append((index, str(image)))
                continue
            out.append(aug.apply(image, aug.draw(int(image.shape[-2]), int(image.shape[-1]), stream.seed, position)))
            kept.append((index, label))
        if not out:
            yield None, None, torch.empty(0, dtype=torch.long), bad
            continue
        kept_labels = pinned(torch.tensor([y for _, y in kept]), device)
        yield torch.stack(out), kept_labels, torch.tensor([i for i, _ in kept]), bad


def synthetic_batches(micro: int, res: int, num_classes: int, device: torch.device, steps: int, accum: int):
    """The compute ceiling: one random uint8 batch already on the device, served for every pass
    (what timm's benchmark.py measures)."""
    generator = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (micro, 3, res, res), dtype=torch.uint8, generator=generator).to(device)
    labels = torch.randint(0, num_classes, (micro,), generator=generator)
    index = torch.arange(micro)
    for _ in range(steps * accum):
        yield images, labels, index, []


class _Files(torch.utils.data.Dataset):
    """What workers do for the device pipeline: read each file's bytes (decoded on the device), or,
    with `decoded`, decode it with PIL's libjpeg as the worker pipeline does (the pixels of the
    references) and leave resizing and augmentation to the device. An unreadable file is read as
    the reason why (a string)."""

    def __init__(self, split: Split, decoded: bool = False):
        self.split = split
        self.decoded = decoded

    def __len__(self) -> int:
        return len(self.split)

    def __getitem__(self, item: int | tuple[int, int]):
        """`item`: a split index, or (split index, stream position) from the training stream."""
        index = item[0] if isinstance(item, tuple) else item
        data: np.ndarray | str
        try:
            # a file or a container's record (hf:, wds:, tfds:): decoded as stored, or its bytes
            if self.decoded:
                data = np.asarray(self.split.decoded(index))
            else:
                data = np.frombuffer(self.split.encoded(index), np.uint8)
        except CorruptImage as e:
            data = str(e.reason)
        except UserError:  # decode's other error: the file is gone (as OSError when only read)
            data = "image file is missing"
        except OSError as e:
            data = e.strerror or str(e)
        return data, int(self.split.labels[index]), item

    @staticmethod
    def collate(batch):
        """The batch's bytes (or decoded (H, W, 3) pixels) as ONE flat tensor with each file's
        shape (and the reason for each unreadable one): a worker sends each tensor as a
        shared-memory file descriptor, and one tensor per file (256 a batch, more prefetched) ran
        out of them on an H200 ("Bad file descriptor", a pass that never ended)."""
        arrays = [b[0] if isinstance(b[0], np.ndarray) else np.empty(0, np.uint8) for b in batch]
        problems = [None if isinstance(b[0], np.ndarray) else b[0] for b in batch]
        flat = torch.from_numpy(np.concatenate([a.reshape(-1) for a in arrays]))
        packed = (flat, [a.shape for a in arrays], problems)
        return packed, torch.tensor([b[1] for b in batch]), [b[2] for b in batch]


def unpack(packed, paths: list[str], device: torch.device | None = None) -> list[torch.Tensor | CorruptImage]:
    """`_Files.collate`'s batch as decode_many takes it: each file's bytes (a view on the host), or
    its decoded pixels as (3, H, W) uint8 on `device` (the whole batch sent in one copy), or the
    CorruptImage naming an unreadable one."""
    flat, shapes, problems = packed
    if device is not None:
        flat = pinned(flat, device).to(device, non_blocking=True)
    parts = torch.split(flat, [math.prod(shape) for shape in shapes])
    return [
        CorruptImage(path, why) if why is not None else part.view(shape).permute(2, 0, 1) if len(shape) == 3 else part
        for part, shape, why, path in zip(parts, shapes, problems, paths, strict=True)
    ]


def file_loader(split: Split, batch_size: int, workers: int, decoded: bool):
    """The split's files in order, a batch at a time, read (or decoded, `decoded`) by `workers`."""
    return torch.utils.data.DataLoader(
        _Files(split, decoded),
        batch_size=batch_size,
        shuffle=False,
        **worker_options(workers),
        collate_fn=_Files.collate,
    )

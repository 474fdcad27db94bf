"""The fine-tuning input stream: BiT-style augmentation, and an order that depends only on
(seed, position), so that a resumed run and a data-parallel run see exactly the images, and the
same random crops, that an uninterrupted single-process run sees.

The stream is the concatenation of per-epoch permutations of the train split (epoch e shuffled by
a generator seeded with (seed, e)); optimizer step k consumes positions [k·B, (k+1)·B). Each image's
crop and flip are drawn from a generator seeded with (seed, position), not from a worker's RNG, so
neither the number of DataLoader workers nor the number of processes changes a single pixel.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from vitbench.datasets import Split
from vitbench.datasets.transformed import TransformedSplit
from vitbench.engine.loader_workers import worker_options
from vitbench.models.preprocessing import resize_like_tf

# vit_jax's inception crop (vit_jax/input_pipeline.py): tf.image.sample_distorted_bounding_box with
# area_range=(0.05, 1.0), min_object_covered=0 and the op's defaults, aspect_ratio_range=(0.75, 1.33)
# and max_attempts=100; then a resize to the training resolution (App. B).
CROP_AREA = (0.05, 1.0)
CROP_ASPECT = (0.75, 1.33)
CROP_ATTEMPTS = 100


def _tf_crop(width: int, height: int, aspect: float) -> tuple[int, int, int, int] | None:
    """One attempt of TensorFlow's GenerateRandomCrop (core/kernels/image/
    sample_distorted_bounding_box_op.cc): the crop's *height* is uniform over the integers that
    give an area in CROP_AREA at this aspect ratio, its width round(height · aspect); the offsets
    are uniform in [0, side − crop − 1] (TF's Uniform(n) is [0, n)). (top, left, h, w) or None.
    lrintf rounds half to even, as Python's round does."""
    min_area, max_area = CROP_AREA[0] * width * height, CROP_AREA[1] * width * height
    h = round(math.sqrt(min_area / aspect))
    max_h = round(math.sqrt(max_area / aspect))
    if round(max_h * aspect) > width:  # the tallest crop whose rounded width still fits
        max_h = int((width + 0.5 - 1e-7) / aspect)
        if round(max_h * aspect) > width:
            max_h -= 1
    max_h = min(max_h, height)
    h = min(h, max_h)
    if h < max_h:
        h += int(torch.randint(0, max_h - h + 1, (1,)))
    w = round(h * aspect)
    area = w * h
    if area < min_area:  # rounding: one row more
        h += 1
        w = round(h * aspect)
        area = w * h
    if area > max_area:  # rounding: one row less
        h -= 1
        w = round(h * aspect)
        area = w * h
    if area < min_area or area > max_area or w > width or h > height or w <= 0 or h <= 0:
        return None
    top = int(torch.randint(0, height - h, (1,))) if h < height else 0
    left = int(torch.randint(0, width - w, (1,))) if w < width else 0
    return top, left, h, w


def inception_box(height: int, width: int) -> tuple[int, int, int, int]:
    """vit_jax's inception crop with TensorFlow's sampler, drawn from torch's default generator:
    the aspect ratio uniform in CROP_ASPECT, then the height uniform (not the area, as torchvision's
    RandomResizedCrop samples it, whose crops are larger on average), up to 100 attempts, else the
    whole image. (top, left, h, w); tests/test_inception_crop.py compares it with TF's own op."""
    for _ in range(CROP_ATTEMPTS):
        aspect = float(torch.empty(1).uniform_(CROP_ASPECT[0], CROP_ASPECT[1]))
        box = _tf_crop(width, height, aspect)
        if box is not None and box[2] * box[3] >= 1:  # SatisfiesOverlapConstraints with min_object_covered 0
            return box
    return 0, 0, height, width


# The crop before the resize, per dataset (DatasetSpec.train_crop):
# - "inception": vit_jax's inception crop (above), for CIFAR, Pets, Flowers and ImageNet;
# - "random": BiT's resize to a square, then a random crop of the resolution, for VTAB (the paper,
#   App. B.1.1: "we follow the pre-processing used in Kolesnikov et al. (2020)"; big_transfer's
#   bit_pytorch/train.py::mktrainval: Resize((precrop, precrop)), RandomCrop((crop, crop)),
#   RandomHorizontalFlip), at BiT's 448 -> 384 ratio (BiT paper §3.3), which never cuts away the
#   centre that Camelyon's label is about;
# - "none": a plain resize of the whole image (BiT's no-crop structured VTAB tasks).
CROP_MODES = ("inception", "random", "none")
BIT_PRECROP_RATIO = 448 / 384


def describe_train_aug(crop: str, res: int) -> str:
    """The crop and resize as a run's hparams record them (`train_aug`)."""
    if crop == "inception":
        return f"inception_crop(area=0.05..1)|resize_tf({res})"
    if crop == "random":
        return f"resize_tf({precrop_size(res)})|random_crop({res})"
    return f"resize_tf({res})"


def precrop_size(res: int) -> int:
    """The square BiT resizes to before its random crop of `res` (448 for 384)."""
    return round(res * BIT_PRECROP_RATIO)


@dataclass(frozen=True)
class Box:
    """One image's augmentation: the crop (top, left, height, width) and the flip. With `square`,
    the image is first squashed to square x square and the crop taken from that (BiT's order)."""

    top: int
    left: int
    height: int
    width: int
    flip: bool
    square: int = 0


def draw_box(height: int, width: int, res: int, crop: str, flip: bool, precrop: int | None = None) -> Box:
    """One image's crop and flip, drawn from torch's default generator (the caller seeds it per
    (seed, stream position)): the same draws in the worker and the device pipelines. `precrop`:
    the square of the "random" crop (default: BiT's 448 / 384 ratio; BiT-HyperRule sets its own)."""
    square = 0
    if crop == "inception":
        top, left, h, w = inception_box(height, width)
    elif crop == "random":  # tf.image.random_crop: offsets uniform in [0, square - res]
        square, h, w = precrop or precrop_size(res), res, res
        top = int(torch.randint(0, square - res + 1, (1,)))
        left = int(torch.randint(0, square - res + 1, (1,)))
    elif crop == "none":
        top, left, h, w = 0, 0, height, width
    else:
        raise ValueError(f"crop mode {crop!r}: expected one of {CROP_MODES}")
    flipped = flip and bool(torch.rand(1) < 0.5)
    return Box(top, left, h, w, flipped, square)


def apply_box(image: torch.Tensor, box: Box, res: int) -> torch.Tensor:
    """uint8 (3, H, W) -> uint8 (3, res, res) on the image's device, resized as TensorFlow resizes
    (the references' `tf.image.resize`: bilinear, no antialiasing)."""
    if box.square:
        squashed = resize_like_tf(image, (box.square, box.square))
        out = squashed[:, box.top : box.top + box.height, box.left : box.left + box.width]
    else:
        out = resize_like_tf(image[:, box.top : box.top + box.height, box.left : box.left + box.width], (res, res))
    return out.flip(-1) if box.flip else out


class TrainTransform:
    """The worker pipeline's augmentation: PIL image -> uint8 (3, res, res) tensor."""

    def __init__(self, res: int, crop: str, flip: bool, precrop: int | None = None):
        if crop not in CROP_MODES:
            raise ValueError(f"crop mode {crop!r}: expected one of {CROP_MODES}")
        self.res, self.crop, self.flip, self.precrop = res, crop, flip, precrop

    def __call__(self, image) -> torch.Tensor:
        pixels = torch.from_numpy(np.array(image.convert("RGB"))).permute(2, 0, 1)
        box = draw_box(pixels.shape[-2], pixels.shape[-1], self.res, self.crop, self.flip, self.precrop)
        return apply_box(pixels, box, self.res)


def _item_seed(seed: int, position: int) -> int:
    # a fixed, well-mixed 63-bit seed per (run seed, stream position)
    return int(np.random.SeedSequence([seed, position]).generate_state(2, np.uint64)[0] >> np.uint64(1))


class AugmentedSplit(TransformedSplit):
    """Items are (split index, stream position); the transform runs with torch's CPU generator
    seeded by the position, and the caller's generator state is restored afterwards."""

    def __init__(self, split: Split, transform, seed: int):
        super().__init__(split, transform)
        self.seed = seed

    def __getitem__(self, item: tuple[int, int]):  # type: ignore[override]
        index, position = item
        # torchvision's transforms draw from the CPU default generator: seed it for this image and
        # put the caller's state back after (6 us; torch.manual_seed + fork_rng cost 0.3 ms an image)
        generator = torch.default_generator
        saved = generator.get_state()
        generator.manual_seed(_item_seed(self.seed, position))
        try:
            return super().__getitem__(index)
        finally:
            generator.set_state(saved)


@dataclass(frozen=True)
class Stream:
    """Which split indices the micro-batches of a step hold, for one process of `world`."""

    n: int  # images in the train split
    batch: int  # global batch (all processes, all accumulation steps)
    micro: int  # images per forward/backward pass, per process
    seed: int
    rank: int = 0
    world: int = 1
    # the file (shard, parquet row group, TFRecord file) of each split index, for a shard-ordered
    # stream (--train-order shards); None: each epoch is a permutation of the whole split
    groups: np.ndarray | None = None

    @property
    def accum(self) -> int:
        return self.batch // (self.micro * self.world)

    def _epoch(self, epoch: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, epoch])
        if self.groups is None:
            return rng.permutation(self.n)
        return shard_order(self.groups, rng)

    def positions(self, step: int) -> range:
        """This process's share of step `step`: a contiguous slice of the global batch."""
        per_rank = self.batch // self.world
        start = step * self.batch + self.rank * per_rank
        return range(start, start + per_rank)

    def micro_batches(self, start_step: int, total_steps: int) -> Iterator[list[tuple[int, int]]]:
        """[(split index, position), ...] per micro-batch, from `start_step` on (resume = restart here)."""
        cached_epoch, order = -1, np.empty(0, dtype=np.int64)
        for step in range(start_step, total_steps):
            items = []
            for position in self.positions(step):
                epoch = position // self.n
                if epoch != cached_epoch:
                    cached_epoch, order = epoch, self._epoch(epoch)
                items.append((int(order[position % self.n]), position))
            for m in range(self.accum):
                yield items[m * self.micro : (m + 1) * self.micro]


def shard_order(groups: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """An epoch's order shard by shard (webdataset's shard shuffle, then a shuffle within each shard):
    the files in a random order, each file's images in a random order. Reads then go through one
    file at a time, from its start towards its end, as a stream from an object store wants them;
    the order is a pure function of (seed, epoch), so a resumed run continues it exactly."""
    rank_of_file = rng.permutation(int(groups.max(initial=-1)) + 1)
    within = rng.random(len(groups))
    return np.lexsort((within, rank_of_file[groups]))


class MicroBatches(torch.utils.data.Sampler):
    """The stream as a batch sampler: generated lazily (20k steps x 512 would be 10M tuples)."""

    def __init__(self, stream: Stream, start_step: int, total_steps: int):
        self.stream, self.start, self.total = stream, start_step, total_steps

    def __iter__(self):
        return self.stream.micro_batches(self.start, self.total)

    def __len__(self) -> int:
        return max(0, self.total - self.start) * self.stream.accum


def train_loader(split: Split, stream: Stream, start_step: int, total_steps: int, transform, workers: int, pin: bool):
    """Micro-batches of uint8 images in stream order (collated as TransformedSplit does)."""
    return torch.utils.data.DataLoader(
        AugmentedSplit(split, transform, stream.seed),
        batch_sampler=MicroBatches(stream, start_step, total_steps),
        **worker_options(workers),
        pin_memory=pin,
        collate_fn=TransformedSplit.collate,
        # the workers' base seed comes from here, not from torch's global RNG (dropout's), so
        # starting a loader never shifts the model's random stream; augmentation ignores it anyway
        generator=torch.Generator().manual_seed(stream.seed),
        persistent_workers=False,
    )

"""Preprocessing recipes: the resize, crop and value range an image gets before the model, and
which source each part of a recipe comes from.

One rule (docs/protocols.md, "Preprocessing"): the *protocol* sets the geometry (resize, crop,
interpolation, antialiasing); the *weights' family* sets only the value range (mean / std). The
exception is `eval`, which scores a checkpoint with its own family's published recipe:

- frozen-feature protocols (few-shot, k-NN, linear probe): big_vision's few-shot pipeline,
  `decode|resize(256)|central_crop(224)|value_range(-1,1)`, whose resize is TensorFlow's bilinear
  *without* antialiasing (big_vision/pp/ops_image.py, `get_resize(..., antialias=False)`);
- fine-tuning: vit_jax's plain resize to the resolution (vit_jax/input_pipeline.py, `tf.image.resize`
  with TF's default `antialias=False`);
- eval: Google checkpoints vit_jax's plain resize; timm and DeiT weights timm's data config
  (resize to size / crop_pct, centre crop: what reproduces timm's reported figures).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch and timm load where a model is built: commands that only read results never pay for them
    import torch


def resize_like_tf(images: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """uint8 (..., 3, H, W) -> uint8 (..., 3, *size) as big_vision resizes: `tf.image.resize`
    (bilinear, half-pixel centres, no antialiasing) in float32, clipped to [0, 255] and cast back,
    which truncates (`tf.cast`). torch's bilinear with align_corners=False samples the same points;
    tests/test_resize.py compares it with TensorFlow's op on real images."""
    import torch
    from torch.nn import functional as F

    batched = images.ndim == 4
    x = (images if batched else images[None]).to(torch.float32)
    out = F.interpolate(x, size=size, mode="bilinear", align_corners=False, antialias=False)
    out = out.clamp_(0, 255).trunc_().to(torch.uint8)
    return out if batched else out[0]


@dataclass(frozen=True)
class Preprocessing:
    """Eval-time preprocessing, in the terms timm's `create_transform` understands.

    resize -> centre crop to `size`, where the resize target is floor(size / crop_pct);
    `crop_mode="squash"` resizes both sides (big_vision's `resize(256)|central_crop(224)`),
    `"center"` resizes the shorter side keeping the aspect ratio (timm / DeiT). `antialias=False`
    is TensorFlow's bilinear resize (the Google references'); True is PIL's (timm's).
    """

    size: int = 224
    crop_pct: float = 0.875
    crop_mode: str = "squash"
    interpolation: str = "bilinear"
    mean: tuple[float, float, float] = (0.5, 0.5, 0.5)  # (x - 0.5) / 0.5 is big_vision's value_range(-1, 1)
    std: tuple[float, float, float] = (0.5, 0.5, 0.5)
    antialias: bool = True
    # whose published recipe this is: "vit_jax" (Google checkpoints) or "timm" (timm, DeiT); not
    # part of `describe()`: it chooses eval's recipe, which is then described in full
    family: str = "vit_jax"

    def at(self, size: int) -> Preprocessing:
        """The same recipe producing `size`-pixel inputs."""
        return replace(self, size=size)

    def describe(self) -> str:
        """Canonical one-line form: part of the feature-cache key and of every stored result."""
        resize = math.floor(self.size / self.crop_pct)
        mean = ",".join(f"{v:g}" for v in self.mean)
        std = ",".join(f"{v:g}" for v in self.std)
        aliasing = "" if self.antialias else ",no_antialias"
        return (
            f"resize_{self.crop_mode}({resize},{self.interpolation}{aliasing})|central_crop({self.size})"
            f"|normalize(mean={mean},std={std})"
        )

    def transform(self, uint8: bool = False) -> Callable:
        """PIL image -> normalised float tensor; with `uint8`, stop before ToTensor + Normalize and
        return the uint8 (3, H, W) tensor (timm's prefetcher path), for `normalize` to finish in batch."""
        if not self.antialias:
            return _TFResizeCrop(self, uint8)
        from timm.data import create_transform

        return create_transform(
            input_size=(3, self.size, self.size),
            interpolation=self.interpolation,
            mean=self.mean,
            std=self.std,
            crop_pct=self.crop_pct,
            crop_mode=self.crop_mode,
            use_prefetcher=uint8,
        )

    def resize_crop(self, image: torch.Tensor) -> torch.Tensor:
        """uint8 (3, H, W) -> uint8 (3, size, size) with TensorFlow's resize (squash only: the
        Google references never keep the aspect ratio), then the central crop."""
        if self.crop_mode != "squash" or self.interpolation != "bilinear":
            raise ValueError(f"TensorFlow-style resizing is bilinear squash only, not {self.describe()}")
        scale = math.floor(self.size / self.crop_pct)
        resized = resize_like_tf(image, (scale, scale))
        top = (scale - self.size) // 2  # big_vision's central_crop: (H - h) // 2
        return resized[..., top : top + self.size, top : top + self.size]

    def normalize(self, batch: torch.Tensor) -> torch.Tensor:
        """A uint8 (B, 3, H, W) batch -> what `transform()` gives, bit for bit: the same float32 ops
        in the same order as ToTensor (÷255) then Normalize (−mean, ÷std). Workers then ship uint8
        (a quarter of the bytes) and the arithmetic runs once per batch, on the device."""
        import torch

        mean = torch.tensor(self.mean, dtype=torch.float32, device=batch.device).view(1, 3, 1, 1)
        std = torch.tensor(self.std, dtype=torch.float32, device=batch.device).view(1, 3, 1, 1)
        return batch.to(torch.float32).div_(255).sub_(mean).div_(std)  # one float buffer, updated in place

    # --- where a recipe comes from ---------------------------------------------------------------

    def frozen_features(self) -> Preprocessing:
        """The frozen-feature protocols' recipe at this size: big_vision's few-shot geometry, this
        recipe's value range."""
        return replace(BIG_VISION_FEWSHOT.at(self.size), mean=self.mean, std=self.std, family=self.family)

    def plain_resize(self) -> Preprocessing:
        """vit_jax's fine-tuning and eval recipe at this size: a plain TF-style resize, no crop,
        this recipe's value range."""
        return replace(self.frozen_features(), crop_pct=1.0)

    def published_eval(self) -> Preprocessing:
        """The checkpoint family's own eval recipe: timm's data config as it is, vit_jax's plain resize."""
        return self if self.family == "timm" else self.plain_resize()

    @classmethod
    def from_timm(cls, arch: str, size: int | None = None) -> Preprocessing:
        """The preprocessing timm's pretrained config records for `arch` (no download: it is a table)."""
        import timm

        cfg = timm.models.get_pretrained_cfg(arch)
        if cfg is None:
            return cls(size=size or 224)
        return cls(
            size=size or cfg.input_size[-1],
            crop_pct=cfg.crop_pct,
            crop_mode=cfg.crop_mode,
            interpolation=cfg.interpolation,
            mean=tuple(cfg.mean),  # type: ignore[arg-type]
            std=tuple(cfg.std),  # type: ignore[arg-type]
            family="timm",
        )

    @classmethod
    def from_weights_config(cls, weights: str, fallback: Preprocessing) -> Preprocessing:
        """The recipe a weights file publishes: timm / Hugging Face folders keep a `config.json`
        with `pretrained_cfg` beside the weights (a timm recipe). Absent or unreadable: `fallback`."""
        config = Path(weights).parent / "config.json"
        try:
            cfg = json.loads(config.read_text()).get("pretrained_cfg", {})
        except (OSError, ValueError, AttributeError):
            return fallback
        update: dict = {key: cfg[key] for key in ("crop_pct", "crop_mode", "interpolation") if cfg.get(key)}
        for key in ("mean", "std"):
            if cfg.get(key):
                update[key] = tuple(float(v) for v in cfg[key])
        # timm's recipe is PIL's antialiased resize
        return Preprocessing(**{**asdict(fallback), **update, "antialias": True, "family": "timm"})


class _TFResizeCrop:
    """`Preprocessing.transform()` for a TensorFlow-style recipe (a class, so DataLoader workers
    can pickle it): PIL image -> uint8 (3, size, size), or normalised float without `uint8`. A
    loader may instead take each image's `pixels` and finish a whole batch in one `batch` call."""

    def __init__(self, pre: Preprocessing, uint8: bool):
        self.pre, self.uint8 = pre, uint8

    def __call__(self, image) -> torch.Tensor:
        return self.batch([self.pixels(image)])[0]

    @staticmethod
    def pixels(image) -> torch.Tensor:
        """The decoded image as uint8 (3, H, W)."""
        import numpy as np
        import torch

        return torch.from_numpy(np.array(image if image.mode == "RGB" else image.convert("RGB"))).permute(2, 0, 1)

    def batch(self, images: list[torch.Tensor]) -> torch.Tensor:
        """`pixels` of several images -> (B, 3, size, size): images of one size (CIFAR, a resized
        val set) resized in one call, the same pixels as one call each (tests/test_resize.py) at a
        tenth of the cost for small images, which on 2 cores left the worker less of the cores the
        model shares (issue 46, goal 4)."""
        out = per_size(images, self.pre.resize_crop).contiguous()
        return out if self.uint8 else self.pre.normalize(out)


def per_size(images: list[torch.Tensor], resize: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """`resize` of (3, H, W) images stacked: one call on the whole batch where they share a size
    (the same pixels as one call each), else one call per image."""
    import torch

    if len({tuple(x.shape) for x in images}) == 1:
        return resize(torch.stack(images))
    return torch.stack([resize(x) for x in images])


# big_vision's few-shot preprocessing: decode|resize(256)|central_crop(224)|value_range(-1,1), with
# TensorFlow's resize (bilinear, no antialiasing: big_vision/pp/ops_image.py get_resize)
BIG_VISION_FEWSHOT = Preprocessing(antialias=False)

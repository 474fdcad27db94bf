"""PIL's resize as matrix products (vitbench/models/pil_resample.py) against Pillow's own, every pixel:
every filter timm's configs name, shrinking and enlarging, one axis left alone, crops anywhere, a
batch at once, and both pass orders (the installed Pillow's, read at run time)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from vitbench.models import pil_resample

PILLOW = {
    "box": Image.Resampling.BOX,
    "bilinear": Image.Resampling.BILINEAR,
    "hamming": Image.Resampling.HAMMING,
    "bicubic": Image.Resampling.BICUBIC,
    "lanczos": Image.Resampling.LANCZOS,
}


@pytest.mark.parametrize("interpolation", sorted(PILLOW))
def test_every_pixel_is_pillows(interpolation):
    rng = np.random.default_rng(sorted(PILLOW).index(interpolation))
    for trial in range(40):
        h, w, out_h, out_w = (int(v) for v in rng.integers(4, 300, 4))
        out_h = h if trial % 5 == 0 else out_h  # a pass Pillow skips
        out_w = w if trial % 7 == 0 else out_w
        pixels = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        if trial % 2:  # smooth, as photos are: where rounding between the passes decides a grey level
            ramp = np.linspace(0, 255, w)[None, :, None] + rng.normal(0, 30, (h, w, 3))
            pixels = np.clip(ramp, 0, 255).astype(np.uint8)
        theirs = np.asarray(Image.fromarray(pixels).resize((out_w, out_h), PILLOW[interpolation]))
        top, left = int(rng.integers(0, out_h)), int(rng.integers(0, out_w))
        box = (top, left, int(rng.integers(1, out_h - top + 1)), int(rng.integers(1, out_w - left + 1)))
        batch = torch.from_numpy(pixels).permute(2, 0, 1)[None].expand(2, -1, -1, -1)
        ours = pil_resample.resize_crop(batch, (out_h, out_w), interpolation, box)
        expected = theirs[top : top + box[2], left : left + box[3]]
        for image in ours:
            assert np.array_equal(image.permute(1, 2, 0).numpy(), expected), (h, w, out_h, out_w, box)


def test_the_pass_order_that_matters_is_the_installed_pillows():
    """An image whose height shrinks most: Pillow 13 runs its vertical pass first, earlier releases
    the horizontal one; the two give other pixels, and ours are Pillow's either way."""
    pixels = np.random.default_rng(3).integers(0, 256, (200, 60, 3), dtype=np.uint8)
    theirs = np.asarray(Image.fromarray(pixels).resize((50, 30), Image.Resampling.BICUBIC))
    ours = pil_resample.resize_crop(torch.from_numpy(pixels).permute(2, 0, 1), (30, 50), "bicubic", (0, 0, 30, 50))
    assert np.array_equal(ours.permute(1, 2, 0).numpy(), theirs)
    assert pil_resample.horizontal_first(200, 60, 30, 50) != pil_resample._pillow_picks_order()

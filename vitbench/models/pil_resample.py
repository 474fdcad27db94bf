"""PIL's resize on tensors, to the grey level: the eval transform of timm and DeiT weights
(`Resize` + `CenterCrop` on a PIL image) run as two matrix products on any torch device.

Pillow resamples 8-bit images separably (src/libImaging/Resample.c): one pass along each axis,
the first one's result rounded to uint8 (which pass comes first depends on the Pillow release:
`horizontal_first`). Each output pixel is a weighted sum of a window of
input pixels whose weights (`precompute_coeffs`: the filter at the pixel's centre, its support
widened by the scale when shrinking, normalised to sum to 1) are rounded to fixed point with 22
fractional bits (`normalize_coeffs_8bpc`); the sum starts at half a unit and is shifted back and
clipped (`clip8`). Here the same integer weights fill a dense (out, in) matrix per axis, the sums
run as float64 matrix products (every product and partial sum is an integer below 2^40, so exact
in any summation order, on a CPU or a GPU), and the same shift and clip follow. The weights are
computed in Python floats (C doubles) in Pillow's order of operations, so they are Pillow's bit
for bit; tests/test_pil_resample.py compares whole images with Pillow's own resize, and
tests/test_conformance.py the eval transform with timm's on real photos.

Only the output rows and columns the centre crop keeps are computed, from the input rows and
columns their windows reach: the pixels of the full resize, then the crop, at a fraction of its work.
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # torch loads where an image is resized
    import torch

PRECISION_BITS = 32 - 8 - 2  # Resample.c: 8 bits of result, 2 for the filters' negative lobes and overshoot
_HALF = float(1 << (PRECISION_BITS - 1))
_SCALE = float(1 << PRECISION_BITS)


def _box(x: float) -> float:
    return 1.0 if -0.5 < x <= 0.5 else 0.0


def _bilinear(x: float) -> float:
    x = -x if x < 0.0 else x
    return 1.0 - x if x < 1.0 else 0.0


_F54, _F46 = float(np.float32(0.54)), float(np.float32(0.46))  # Resample.c writes them as C floats (0.54f)


def _hamming(x: float) -> float:
    x = -x if x < 0.0 else x
    if x == 0.0:
        return 1.0
    if x >= 1.0:
        return 0.0
    x = x * math.pi
    return math.sin(x) / x * (_F54 + _F46 * math.cos(x))


def _bicubic(x: float) -> float:
    a = -0.5
    x = -x if x < 0.0 else x
    if x < 1.0:
        return ((a + 2.0) * x - (a + 3.0)) * x * x + 1
    if x < 2.0:
        return (((x - 5) * x + 8) * x - 4) * a
    return 0.0


def _sinc(x: float) -> float:
    if x == 0.0:
        return 1.0
    x = x * math.pi
    return math.sin(x) / x


def _lanczos(x: float) -> float:
    return _sinc(x) * _sinc(x / 3) if -3.0 <= x < 3.0 else 0.0


# torchvision's interpolation names (what timm's configs say) -> Pillow's filter and its support
FILTERS = {
    "box": (_box, 0.5),
    "bilinear": (_bilinear, 1.0),
    "hamming": (_hamming, 1.0),
    "bicubic": (_bicubic, 2.0),
    "lanczos": (_lanczos, 3.0),
}


def supports(interpolation: str) -> bool:
    """Whether PIL resamples with this filter (nearest is a lookup, not a filter: the workers do it)."""
    return interpolation in FILTERS


@functools.lru_cache(maxsize=4096)
def fixed_point_weights(in_size: int, out_size: int, interpolation: str, first: int, count: int):
    """Pillow's integer weights for output positions first..first+count of a resize from
    `in_size` to `out_size`: (start, (count, span) float64 array), the window of input positions
    [start, start + span) that they reach. `precompute_coeffs` and `normalize_coeffs_8bpc`, term for term."""
    filt, support = FILTERS[interpolation]
    scale = in_size / out_size  # (double)(in1 - in0) / outSize
    filterscale = max(scale, 1.0)
    support = support * filterscale
    ss = 1.0 / filterscale
    rows: list[tuple[int, list[float]]] = []
    for xx in range(first, first + count):
        center = (xx + 0.5) * scale  # in0 + (xx + 0.5) * scale, with in0 = 0
        xmin = max(int(center - support + 0.5), 0)  # C's (int) truncates toward zero, as int() does
        xmax = min(int(center + support + 0.5), in_size) - xmin
        weights = [filt((x + xmin - center + 0.5) * ss) for x in range(xmax)]
        total = 0.0
        for w in weights:  # summed in order, as the C loop does (numpy's sum would pair them)
            total += w
        if total != 0.0:
            weights = [w / total for w in weights]
        fixed = [float(int(-0.5 + w * _SCALE) if w < 0 else int(0.5 + w * _SCALE)) for w in weights]
        rows.append((xmin, fixed))
    start = min(xmin for xmin, _ in rows)
    span = max(xmin + len(w) for xmin, w in rows) - start
    matrix = np.zeros((count, span), np.float64)
    for i, (xmin, fixed) in enumerate(rows):
        matrix[i, xmin - start : xmin - start + len(fixed)] = fixed
    return start, matrix


@functools.lru_cache(maxsize=4096)
def _weights_on(in_size: int, out_size: int, interpolation: str, first: int, count: int, device: torch.device):
    """`fixed_point_weights` as a tensor on `device`, copied there once per size: a batch of photos of a
    few sizes (ImageNet's) would otherwise send its matrices to the GPU again for every image."""
    import torch

    start, matrix = fixed_point_weights(in_size, out_size, interpolation, first, count)
    return start, torch.from_numpy(matrix).to(device)


def _clip8(sums: torch.Tensor) -> torch.Tensor:
    """Resample.c's `clip8` of `ss = 2^21 + Σ pixel·weight`: shift out the fraction (a floor, as C's
    arithmetic shift), clip to [0, 255]. Still float64 (integer-valued), ready for the next pass."""
    return sums.add_(_HALF).mul_(1.0 / _SCALE).floor_().clamp_(0, 255)


def resize_crop(images: torch.Tensor, size: tuple[int, int], interpolation: str, box: tuple[int, int, int, int]):
    """uint8 (..., 3, H, W) -> uint8 (..., 3, h, w): Pillow's `resize(size[::-1], filter)` of each
    image, cropped to `box` = (top, left, h, w), where `size` is (height, width). A pass whose
    size does not change is skipped, as Pillow skips it, and the two run in Pillow's order."""
    import torch

    top, left, height, width = box
    in_h, in_w = images.shape[-2:]
    out_h, out_w = size
    device = images.device
    rows = _weights_on(in_h, out_h, interpolation, top, height, device) if out_h != in_h else (top, None)
    cols = _weights_on(in_w, out_w, interpolation, left, width, device) if out_w != in_w else (left, None)
    # the input rows and columns the kept pixels reach: (start, weights), or the crop where a pass is skipped
    row_span = height if rows[1] is None else rows[1].shape[1]
    col_span = width if cols[1] is None else cols[1].shape[1]
    x = images[..., rows[0] : rows[0] + row_span, cols[0] : cols[0] + col_span].to(torch.float64)

    def horizontal(x: torch.Tensor) -> torch.Tensor:
        return x if cols[1] is None else _clip8(x @ cols[1].T)

    def vertical(x: torch.Tensor) -> torch.Tensor:
        return x if rows[1] is None else _clip8(rows[1] @ x)

    if horizontal_first(in_h, in_w, out_h, out_w):
        return vertical(horizontal(x)).to(torch.uint8)
    return horizontal(vertical(x)).to(torch.uint8)


def horizontal_first(in_h: int, in_w: int, out_h: int, out_w: int) -> bool:
    """Which pass this Pillow runs first. Pillow 13 runs the vertical one first when the height
    shrinks by more than twice what the width does (`ImagingResampleInner`: "to make the horizontal
    pass faster"); earlier releases always ran the horizontal one first. The rounding between the
    passes makes the order visible in the pixels, so the reference is the Pillow installed here."""
    shrink = in_h - out_h
    return not (_pillow_picks_order() and shrink > 0 and shrink > (in_w - out_w) * 2)


@functools.cache
def _pillow_picks_order() -> bool:
    """Whether the installed Pillow puts the vertical pass first when the height shrinks most:
    one 64x16 image, which the two orders resize differently, resized by Pillow and compared."""
    import torch
    from PIL import Image

    pixels = np.random.default_rng(0).integers(0, 256, (64, 16, 3), dtype=np.uint8)
    theirs = torch.from_numpy(np.array(Image.fromarray(pixels).resize((12, 8), Image.Resampling.BICUBIC)))
    cpu = torch.device("cpu")
    _, rows = _weights_on(64, 8, "bicubic", 0, 8, cpu)
    _, cols = _weights_on(16, 12, "bicubic", 0, 12, cpu)
    x = torch.from_numpy(pixels).permute(2, 0, 1).to(torch.float64)
    vertical_first = _clip8(_clip8(rows @ x) @ cols.T)
    return torch.equal(vertical_first.to(torch.uint8).permute(1, 2, 0), theirs)


def resized_size(height: int, width: int, size: int | tuple[int, int]) -> tuple[int, int]:
    """torchvision's `Resize(size)` output (height, width): `size` as (h, w), or the shorter side
    resized to `size` and the longer one in proportion, truncated (`_compute_resized_output_size`)."""
    if isinstance(size, tuple):
        return size
    short, long = (width, height) if width <= height else (height, width)
    new_short, new_long = size, int(size * long / short)
    return (new_long, new_short) if width <= height else (new_short, new_long)


def center_box(height: int, width: int, crop: int) -> tuple[int, int, int, int]:
    """torchvision's `CenterCrop(crop)` of a (height, width) image: (top, left, h, w), the offsets
    rounded as it rounds them (Python's round: half to even)."""
    return int(round((height - crop) / 2.0)), int(round((width - crop) / 2.0)), crop, crop

"""How engine/dedup.py compares two 32 x 32 thumbnails: the candidate descriptors (per-channel
normalised 8 x 8 averages, also of shifted and rescaled test thumbnails) and the verification (the
normalised cross-correlation over shifts and scales, on the thumbnails and on their detail band).
Why each: engine/dedup.py's docstring, docs/protocols.md (De-duplication)."""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from vitbench.store.dedup_method import THUMB

CENTRE = 26  # the test thumbnail's centre window, compared at every shift up to (THUMB - CENTRE) / 2
GRID = 8  # the candidate descriptor's resolution
LUMA = torch.tensor([0.299, 0.587, 0.114])  # ITU-R 601, as PIL's convert("L")


def descriptors(pixels: torch.Tensor) -> torch.Tensor:
    """(N, 3, 32, 32) uint8 -> (N, 3 * 8 * 8) unit vectors: each channel's 8 x 8 average, zero mean
    and unit norm per channel, then the whole scaled to unit norm."""
    x = F.avg_pool2d(pixels.float(), THUMB // GRID).flatten(2)
    x = x - x.mean(-1, keepdim=True)
    x = x / x.norm(dim=-1, keepdim=True).clamp_min(1e-3)
    return F.normalize(x.flatten(1), dim=1)


VARIANT_SHIFTS = (-2, 0, 2)  # pixels (of 32): the candidate descriptor's 8 x 8 cells are 4 wide


def variants(pixels: torch.Tensor) -> list[torch.Tensor]:
    """A test block's thumbnails shifted by VARIANT_SHIFTS each way and rescaled by 0.9 and 1.1:
    the candidate search takes each audited image's best cosine over them, so a shifted or
    cropped copy is not outranked by same-class look-alikes (on the planted set a 1-2 px shift
    alone put copies at rank 155-428 of 5,000)."""
    pad = max(abs(d) for d in VARIANT_SHIFTS)
    padded = F.pad(pixels.float(), (pad, pad, pad, pad), mode="replicate")
    out = [
        padded[..., pad + dy : pad + dy + THUMB, pad + dx : pad + dx + THUMB]
        for dy in VARIANT_SHIFTS
        for dx in VARIANT_SHIFTS
    ]
    return out + [_rescaled(pixels.float(), scale) for scale in (0.9, 1.1)]


def _with_luma(x: torch.Tensor) -> torch.Tensor:
    """(N, 3, H, W) float -> (N, 4, H, W): R, G, B and luminance."""
    return torch.cat([x, torch.einsum("nchw,c->nhw", x, LUMA.to(x))[:, None]], 1)


def _rescaled(x: torch.Tensor, scale: float) -> torch.Tensor:
    """(N, C, 32, 32) resized by `scale` about the centre, back on a 32 x 32 canvas (edges replicated)."""
    if scale == 1.0:
        return x
    size = round(THUMB * scale)
    y = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False, antialias=scale < 1)
    if size >= THUMB:
        start = (size - THUMB) // 2
        return y[..., start : start + THUMB, start : start + THUMB]
    pad = THUMB - size
    return F.pad(y, (pad // 2, pad - pad // 2, pad // 2, pad - pad // 2), mode="replicate")


@functools.cache
def _blur_matrix(size: int, sigma: float) -> torch.Tensor:
    """(size, size): a Gaussian blur of `sigma` pixels along one axis, edges replicated, as a matrix
    (two small matrix products blur a batch far faster than a convolution per image on a CPU)."""
    radius = max(1, round(3 * sigma))
    taps = torch.exp(-0.5 * (torch.arange(-radius, radius + 1, dtype=torch.float32) / sigma) ** 2)
    taps = taps / taps.sum()
    matrix = torch.zeros(size, size)
    for i in range(size):
        for offset, weight in zip(range(-radius, radius + 1), taps.tolist(), strict=True):
            matrix[i, min(max(i + offset, 0), size - 1)] += weight
    return matrix


@functools.cache
def _window_matrix(size: int, window: int) -> torch.Tensor:
    """(size - window + 1, size): sums over each `window`-long stretch along one axis."""
    matrix = torch.zeros(size - window + 1, size)
    for i in range(size - window + 1):
        matrix[i, i : i + window] = 1.0
    return matrix


def _gaussian(x: torch.Tensor, sigma: float) -> torch.Tensor:
    """(N, C, H, W) blurred by a Gaussian of `sigma` pixels, edges replicated."""
    rows, cols = _blur_matrix(x.shape[-2], sigma), _blur_matrix(x.shape[-1], sigma)
    return rows @ x @ cols.T


def _band(x: torch.Tensor) -> torch.Tensor:
    """The detail a look-alike does not share: (N, C, 32, 32) less its blur at 2.5 px, lightly
    smoothed (0.7 px) so that JPEG noise and a resize's softening count little."""
    return _gaussian(x, 0.7) - _gaussian(x, 2.5)


def correlation(test: torch.Tensor, candidate: torch.Tensor, max_shift: int, scales: tuple[float, ...]) -> torch.Tensor:
    """The lower of `_correlation` on the thumbnails and on their detail (`_band`): a horizon
    scene's layout correlates with any other horizon scene's, its boats and clouds do not."""
    t, c = _with_luma(test.float()), _with_luma(candidate.float())
    whole = _correlation(t, c, max_shift, scales)
    return torch.minimum(whole, _correlation(_band(t), _band(c), max_shift, scales))


def _correlation(
    test: torch.Tensor, candidate: torch.Tensor, max_shift: int, scales: tuple[float, ...]
) -> torch.Tensor:
    """The best normalised cross-correlation of each pair (`test[i]`, `candidate[i]`), both
    (P, 3, 32, 32) uint8: the test's centre against the candidate's same-sized windows at every
    shift up to `max_shift` pixels and every scale, per channel (R, G, B averaged) and on luminance.
    One grouped convolution per scale (the windows' products), box filters for their norms: no
    window is copied out."""
    margin = (THUMB - CENTRE) // 2
    shift = min(max_shift, margin)
    t = test[..., margin : margin + CENTRE, margin : margin + CENTRE]
    t = t - t.mean((-2, -1), keepdim=True)
    t = t / t.flatten(2).norm(dim=-1)[..., None, None].clamp_min(1e-3)  # (P, 4, 26, 26), zero mean, unit norm
    pairs, channels = t.shape[:2]
    kernel = t.reshape(pairs * channels, 1, CENTRE, CENTRE)
    best = torch.full((pairs,), -1.0)
    lo, hi, area = margin - shift, margin + shift + CENTRE, CENTRE * CENTRE
    for scale in scales:
        c = _rescaled(candidate, scale)[..., lo:hi, lo:hi]
        products = F.conv2d(c.reshape(1, pairs * channels, hi - lo, hi - lo), kernel, groups=pairs * channels)
        box = _window_matrix(hi - lo, CENTRE)
        mean = box @ c @ box.T / area  # each window's mean and mean square
        square = box @ (c * c) @ box.T / area
        norms = (area * (square - mean * mean)).clamp_min(1e-6).sqrt().clamp_min(1e-3)
        corr = products.reshape(pairs, channels, -1) / norms.flatten(2)  # t is zero-mean: no window mean needed
        score = torch.maximum(corr[:, :3].mean(1), corr[:, 3])  # colour channels together, or luminance
        best = torch.maximum(best, score.max(1).values)
    return best

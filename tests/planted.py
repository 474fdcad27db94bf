"""A generated image set with planted near-duplicates, for the de-duplication tests and benchmark.

Images are coloured 1/f noise (the power spectrum of natural images) rendered at 64 px and reduced
to 32 px, as a camera shot is before post-processing. Each class shares a coarse layout (its
frequencies up to 2 cycles per image), so same-class images are look-alikes at low resolution and
differ in their detail: the hard negatives that sink a feature-only or low-resolution search.
Planted duplicates are the same 64-px shot post-processed differently: `KINDS`.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

SOURCE = 64
CHUNK = 1000  # shots generated at a time
KINDS = ("exact", "reencoded", "resized", "cropped", "shifted", "colour")


def _noise(rng: np.random.Generator, n: int, low_only: bool = False) -> np.ndarray:
    """(n, 64, 64, 3) coloured 1/f noise, zero mean; `low_only`: frequencies up to 2 cycles."""
    f = np.fft.fftfreq(SOURCE) * SOURCE
    radius = np.hypot(f[:, None], f[None, :])
    amplitude = 1.0 / np.maximum(radius, 1.0)
    amplitude[0, 0] = 0.0
    if low_only:
        amplitude[radius > 2] = 0.0
    else:
        amplitude[radius <= 2] = 0.0
    parts = []
    for start in range(0, n, CHUNK):  # a chunk at a time: 50,000 complex spectra at once are 10 GB
        m = min(CHUNK, n - start)
        spectrum = rng.normal(size=(m, 3, SOURCE, SOURCE)) + 1j * rng.normal(size=(m, 3, SOURCE, SOURCE))
        x = np.fft.ifft2(spectrum * amplitude).real
        mix = rng.normal(0.5, 0.35, size=(m, 3, 3)) + np.eye(3)  # correlated channels, as in photographs
        x = np.einsum("ncd,ndhw->nhwc", mix, x)
        parts.append((x / x.std(axis=(1, 2, 3), keepdims=True)).astype(np.float32))
    return np.concatenate(parts) if parts else np.empty((0, SOURCE, SOURCE, 3), np.float32)


def shots(rng: np.random.Generator, labels: np.ndarray, layouts: np.ndarray) -> np.ndarray:
    """(n, 64, 64, 3) float shots: the class's coarse layout plus the shot's own detail."""
    detail = _noise(rng, len(labels))
    x = 0.8 * layouts[labels] + detail
    return x


def to_uint8(x: np.ndarray, gain: float = 45.0, offset: float = 128.0) -> np.ndarray:
    return np.clip(x * gain + offset, 0, 255).astype(np.uint8)


def reduce(x: np.ndarray, box: tuple[int, int, int, int] = (0, 0, SOURCE, SOURCE)) -> np.ndarray:
    """A 64-px shot's crop `box` (left, top, right, bottom) as a 32 x 32 uint8 image."""
    return np.asarray(Image.fromarray(to_uint8(x)).crop(box).resize((32, 32), Image.Resampling.BILINEAR))


def post_process(x: np.ndarray, kind: str, rng: np.random.Generator) -> np.ndarray:
    """The shot `x` (64 px, float) as a near-duplicate of kind `kind`, 32 x 32 uint8."""
    if kind == "exact":
        return reduce(x)
    if kind == "reencoded":
        buffer = io.BytesIO()
        Image.fromarray(reduce(x)).save(buffer, "JPEG", quality=int(rng.integers(30, 70)))
        return np.asarray(Image.open(buffer).convert("RGB"))
    if kind == "resized":
        size = int(rng.integers(18, 25))
        small = Image.fromarray(reduce(x)).resize((size, size), Image.Resampling.BILINEAR)
        return np.asarray(small.resize((32, 32), Image.Resampling.BICUBIC))
    if kind == "cropped":
        cut = int(rng.integers(2, 5))  # 3-6 % of each side of the 64-px shot: 7-14 % closer
        return reduce(x, (cut, cut, SOURCE - cut, SOURCE - cut))
    if kind == "shifted":
        dx, dy = (int(v) * int(rng.choice([-1, 1])) for v in rng.integers(2, 5, size=2))  # 1-2 px at 32
        pad = np.pad(x, ((4, 4), (4, 4), (0, 0)), mode="reflect")
        return reduce(pad[4 + dy : 4 + dy + SOURCE, 4 + dx : 4 + dx + SOURCE])
    if kind == "colour":
        gain = rng.uniform(0.7, 1.3, size=3)
        offset = rng.uniform(-25, 25, size=3)
        gamma = rng.uniform(0.8, 1.25)
        base = reduce(x).astype(np.float64) / 255
        return np.clip(255 * base**gamma * gain + offset, 0, 255).astype(np.uint8)
    raise ValueError(kind)


@dataclass
class Planted:
    train: np.ndarray  # (N, 32, 32, 3) uint8
    train_labels: np.ndarray
    test: np.ndarray
    test_labels: np.ndarray
    duplicates: dict[int, tuple[int, str]]  # test index -> (train index, kind)

    def write_folder(self, root: Path) -> Path:
        """The set as an ImageFolder tree (train/<class>/, test/<class>/) of PNG files (lossless:
        the pixels the in-memory arrays hold); returns `root`. File names follow split order."""
        for split, images, labels in (("train", self.train, self.train_labels), ("test", self.test, self.test_labels)):
            for i, (image, label) in enumerate(zip(images, labels, strict=True)):
                folder = root / split / f"c{label}"
                folder.mkdir(parents=True, exist_ok=True)
                Image.fromarray(image).save(folder / f"{i:06d}.png")
        return root


def planted_set(n_train: int, n_test: int, per_kind: int, classes: int = 10, seed: int = 0) -> Planted:
    """`n_train` + `n_test` images of `classes` classes; `per_kind` test images of each kind in KINDS
    have a post-processed copy of their shot in train (at a random place); every other test image
    has same-class look-alikes in train and no copy."""
    rng = np.random.default_rng(seed)
    layouts = _noise(rng, classes, low_only=True)
    train_labels = rng.integers(0, classes, n_train)
    test_labels = rng.integers(0, classes, n_test)
    train = np.concatenate(
        [[reduce(x) for x in shots(rng, train_labels[i : i + CHUNK], layouts)] for i in range(0, n_train, CHUNK)]
    )  # the train shots reduced as they are made: only the test shots are kept at 64 px
    test_shots = shots(rng, test_labels, layouts)
    test = np.stack([reduce(x) for x in test_shots])
    chosen = rng.choice(n_test, size=per_kind * len(KINDS), replace=False)
    places = rng.choice(n_train, size=len(chosen), replace=False)
    duplicates = {}
    for j, (t, place) in enumerate(zip(chosen.tolist(), places.tolist(), strict=True)):
        kind = KINDS[j // per_kind]
        train[place] = post_process(test_shots[t], kind, rng)
        train_labels[place] = test_labels[t]
        duplicates[t] = (place, kind)
    return Planted(train, train_labels, test, test_labels, duplicates)

"""The embedded default: scikit-learn's 1,797 real 8x8 digit scans (no files needed)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from vitbench.datasets.base import Split

DIGITS_TRAIN = 1000  # the first 1000 of sklearn's 1797 digits train, the remaining 797 test


def load_digits(root: Path | None, split: str) -> Split:
    return _digits(split, "digits", range(10))


def digit_classes(name: str, classes: range):
    """A loader of the digits of `classes` only, relabelled 0..len-1: pre-train on 0-4, then
    transfer to the unseen 5-9 (the README's smoke sweep)."""

    def load(root: Path | None, split: str) -> Split:
        return _digits(split, name, classes)

    return load


def _digits(split: str, name: str, classes: range) -> Split:
    import sklearn
    from sklearn.datasets import load_digits as sklearn_digits

    digits = sklearn_digits()
    grey = np.round(digits.images * (255.0 / 16.0)).astype(np.uint8)  # values 0..16 -> 0..255
    rgb = np.repeat(grey[..., None], 3, axis=-1)  # (N, 8, 8, 3)
    labels = digits.target.astype(np.int64)
    train = split == "train"
    part = np.arange(DIGITS_TRAIN) if train else np.arange(DIGITS_TRAIN, len(labels))
    # the full set keeps the fingerprint it has always had, so that stored run keys stay valid
    fingerprint = f"sklearn-{sklearn.__version__}-digits-{'0:1000' if train else '1000:None'}"
    if len(classes) < 10:
        part = part[np.isin(labels[part], classes)]
        fingerprint += f"-classes{classes.start}-{classes.stop - 1}"
    images = np.ascontiguousarray(rgb[part])
    return Split(name, split, labels[part] - classes.start, "sklearn-digits", fingerprint, images=images)

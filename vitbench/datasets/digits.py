"""The embedded default: scikit-learn's 1,797 real 8x8 digit scans (no files needed)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from vitbench.datasets.base import Split

DIGITS_TRAIN = 1000  # the first 1000 of sklearn's 1797 digits train, the remaining 797 test


def load_digits(root: Path | None, split: str) -> Split:
    import sklearn
    from sklearn.datasets import load_digits as sklearn_digits

    digits = sklearn_digits()
    grey = np.round(digits.images * (255.0 / 16.0)).astype(np.uint8)  # values 0..16 -> 0..255
    rgb = np.repeat(grey[..., None], 3, axis=-1)  # (N, 8, 8, 3)
    labels = digits.target.astype(np.int64)
    part = slice(0, DIGITS_TRAIN) if split == "train" else slice(DIGITS_TRAIN, None)
    fingerprint = f"sklearn-{sklearn.__version__}-digits-{part.start}:{part.stop}"
    images = torch.from_numpy(np.ascontiguousarray(rgb[part]))
    return Split("digits", split, labels[part], "sklearn-digits", fingerprint, images=images)

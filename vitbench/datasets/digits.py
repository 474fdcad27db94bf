"""The embedded default: scikit-learn's 1,797 real 8x8 digit scans (no files needed).

Importing scikit-learn to read them costs a process about 1.4 s of a core (it imports SciPy), more
than reading them: every `vitbench run` on the digits (the demo, each Slurm job, each DataLoader-free
test process) paid it. The scans are kept, as scikit-learn gave them, in the user's cache
(`downloads.cache_root()`), under scikit-learn's installed version: a process finds them there without
importing it, an upgrade reads them anew, and a file that is not exactly that (damaged, of another
shape) is only a cache: read from scikit-learn again and rewritten.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import io
import zipfile
from pathlib import Path

import numpy as np

from vitbench.datasets.base import Split
from vitbench.errors import UserError
from vitbench.files.atomic import read_regular, write_atomic
from vitbench.files.downloads import cache_root

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
    scans, labels, version = _scans()
    grey = np.round(scans * (255.0 / 16.0)).astype(np.uint8)  # values 0..16 -> 0..255
    rgb = np.repeat(grey[..., None], 3, axis=-1)  # (N, 8, 8, 3)
    train = split == "train"
    part = np.arange(DIGITS_TRAIN) if train else np.arange(DIGITS_TRAIN, len(labels))
    # the full set keeps the fingerprint it has always had, so that stored run keys stay valid
    fingerprint = f"sklearn-{version}-digits-{'0:1000' if train else '1000:None'}"
    if len(classes) < 10:
        part = part[np.isin(labels[part], classes)]
        fingerprint += f"-classes{classes.start}-{classes.stop - 1}"
    images = np.ascontiguousarray(rgb[part])
    return Split(name, split, labels[part] - classes.start, "sklearn-digits", fingerprint, images=images)


DIGITS = 1797  # scikit-learn's count: 8x8 scans of values 0..16, labels 0..9


def _scans() -> tuple[np.ndarray, np.ndarray, str]:
    """scikit-learn's digits (scans as float64 0..16, labels as int64) and its `__version__`: from the
    user's cache where they are kept for the installed scikit-learn, else from scikit-learn (kept)."""
    try:
        path = cache_root() / f"digits-scikit-learn-{importlib.metadata.version('scikit-learn')}.npz"
    except importlib.metadata.PackageNotFoundError:  # not installed as a distribution: ask it directly
        path = None
    kept = _read(path) if path is not None else None
    if kept is not None:
        return kept
    import sklearn
    from sklearn.datasets import load_digits as sklearn_digits

    digits = sklearn_digits()
    scans, labels = np.asarray(digits.images, dtype=np.float64), np.asarray(digits.target, dtype=np.int64)
    found = (scans, labels, sklearn.__version__)
    if path is not None:
        _keep(path, *found)
    return found


def _read(path: Path) -> tuple[np.ndarray, np.ndarray, str] | None:
    """The kept digits, where the file is exactly what `_keep` writes; else None (read them anew)."""
    try:
        with np.load(io.BytesIO(read_regular(path)), allow_pickle=False) as kept:
            scans, labels, version = kept["scans"], kept["labels"], str(kept["version"])
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):  # absent, a FIFO, damaged
        return None
    ok = (
        scans.shape == (DIGITS, 8, 8) and scans.dtype == np.uint8 and int(scans.max(initial=0)) <= 16
        and labels.shape == (DIGITS,) and labels.dtype == np.uint8 and int(labels.max(initial=0)) <= 9
        and 0 < len(version) < 64
    )  # fmt: skip
    return (scans.astype(np.float64), labels.astype(np.int64), version) if ok else None


def _keep(path: Path, scans: np.ndarray, labels: np.ndarray, version: str) -> None:
    """The digits kept for the next process, where the cache can be written (else read anew next time).
    The scans are whole numbers 0..16 and the labels 0..9: uint8 holds both exactly."""
    if not (np.array_equal(scans, np.round(scans)) and scans.min() >= 0 and scans.max() <= 16):
        return  # not the values this file holds exactly: read from scikit-learn each time instead
    buffer = io.BytesIO()
    np.savez(buffer, scans=scans.astype(np.uint8), labels=labels.astype(np.uint8), version=np.array(version))
    with contextlib.suppress(UserError):  # a read-only or full cache: only read again next time
        write_atomic(path, lambda tmp: tmp.write_bytes(buffer.getvalue()))

"""Oxford Flowers-102 (torchvision's layout): `flowers-102/jpg/image_XXXXX.jpg`, `imagelabels.mat`
(labels 1..102 for all 8,189 images) and `setid.mat` (1-based image ids in trnid / valid / tstid)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from vitbench.datasets.base import Split, fingerprinted, require, require_dir
from vitbench.errors import UserError
from vitbench.provenance import sha256_file

SET_KEYS = {"train": "trnid", "val": "valid", "test": "tstid"}


def _read_mat(path: Path, key: str) -> np.ndarray:
    from scipy.io import loadmat

    try:
        values = loadmat(path)[key]
    except KeyError:
        raise UserError(f"{path}: has no '{key}' array") from None
    except (ValueError, TypeError, OSError) as e:
        raise UserError(f"{path}: not a readable MATLAB file ({e})") from None
    return np.asarray(values).ravel().astype(np.int64)


def load_flowers(root: Path | None, split: str) -> Split:
    assert root is not None
    require_dir(root, "Flowers-102 folder")
    labels_file = require(root / "imagelabels.mat", "Flowers-102 label file")
    setid = require(root / "setid.mat", "Flowers-102 split file")
    all_labels = _read_mat(labels_file, "labels")
    ids = _read_mat(setid, SET_KEYS[split])
    if len(ids) and (ids.min() < 1 or ids.max() > len(all_labels)):
        raise UserError(f"{setid}: {SET_KEYS[split]} has image ids outside 1..{len(all_labels)}")
    paths = [str(root / "jpg" / f"image_{i:05d}.jpg") for i in ids]
    missing = [p for p in paths if not os.path.isfile(p)]
    if missing:
        raise UserError(
            f"{setid}: {SET_KEYS[split]} names a missing image {missing[0]} ({len(missing)} of {len(paths)} missing)"
        )
    fingerprint = fingerprinted(root, paths, sha256_file(setid)[:8] + sha256_file(labels_file)[:8])
    labels = all_labels[ids - 1] - 1  # 1-based labels
    return Split("flowers102", split, labels, "flowers-folder", **fingerprint, paths=paths, label_file=labels_file)

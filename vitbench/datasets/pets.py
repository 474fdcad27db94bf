"""Oxford-IIIT Pets (torchvision's layout): `oxford-iiit-pet/images/<name>.jpg` and
`annotations/{trainval,test}.txt` with `name class_id species breed_id` lines (class ids 1..37)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from vitbench.datasets.base import Split, check_listed, fingerprinted, numbered_lines, require, require_dir
from vitbench.errors import UserError
from vitbench.provenance import sha256_file

ANNOTATIONS = {"train": "trainval.txt", "test": "test.txt"}


def load_pets(root: Path | None, split: str) -> Split:
    assert root is not None
    require_dir(root, "Oxford-IIIT Pets folder")
    listing = require(root / "annotations" / ANNOTATIONS[split], f"Pets {split} annotation file")
    images = require_dir(root / "images", "Pets images folder")
    entries: list[tuple[int, str]] = []
    labels: list[int] = []
    for number, line in numbered_lines(listing, f"Pets {split} annotation file"):
        parts = line.split()
        if len(parts) < 2 or not parts[1].isdigit():
            raise UserError(f"{listing}:{number}: expected 'name class_id species breed_id', got {line!r}")
        entries.append((number, str(images / f"{parts[0]}.jpg")))
        labels.append(int(parts[1]) - 1)  # class ids are 1-based
    if not entries:  # an empty split would fail later, far from its cause
        raise UserError(f"{listing}: lists no image, expected 'name class_id species breed_id' lines")
    check_listed(listing, entries)
    paths = [path for _, path in entries]
    fingerprint = fingerprinted(root, paths, sha256_file(listing)[:16])
    return Split(
        "pets", split, np.asarray(labels, dtype=np.int64), "pets-folder", **fingerprint, paths=paths, label_file=listing
    )

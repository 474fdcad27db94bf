"""`folder:<path>`: any ImageFolder tree (`train/<class>/…`, `test/<class>/…`, optional `val/`) as a
custom dataset. Classes are the sorted folder names of train/, as torchvision's ImageFolder orders them."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from vitbench.datasets.base import DatasetSpec, Split, class_folders, require_dir
from vitbench.errors import UserError
from vitbench.provenance import fingerprint_files

PREFIX = "folder:"
DEV_FRACTION = 0.1  # without a val/ folder, 10 % of train is held out for LR selection (as for Pets)


def _classes(root: Path) -> list[str]:
    return [d.name for d, _ in class_folders(root / "train", "train folder of an ImageFolder tree")]


def folder_spec(name: str) -> DatasetSpec:
    """The spec of `folder:<path>`: classes and splits read from the tree itself."""
    root = Path(name[len(PREFIX) :]).expanduser().resolve()
    require_dir(root, "ImageFolder tree (folder:<path> needs train/ and test/ inside)")
    for split in ("train", "test"):
        require_dir(root / split, f"'{split}' folder of the ImageFolder tree")
    classes = _classes(root)
    if not classes:
        raise UserError(f"{root / 'train'}: no <class>/ folders")
    index = {c: i for i, c in enumerate(classes)}
    has_val = (root / "val").is_dir()

    def load(_root: Path | None, split: str) -> Split:
        paths: list[str] = []
        labels: list[int] = []
        for class_dir, files in class_folders(root / split, f"'{split}' folder of the ImageFolder tree"):
            if class_dir.name not in index:
                raise UserError(f"{class_dir}: class '{class_dir.name}' is not among train/'s classes")
            paths += files
            labels += [index[class_dir.name]] * len(files)
        fingerprint = fingerprint_files(root, paths, content=False)
        return Split(name, split, np.asarray(labels, dtype=np.int64), "imagefolder", fingerprint, paths=paths)

    splits = ("train", "val", "test") if has_val else ("train", "test")
    name = f"{PREFIX}{root.name}"  # the path itself is provenance (data_dir), not part of the run key
    return DatasetSpec(
        name,
        root.name,
        len(classes),
        None,
        dict.fromkeys(splits),  # no official sizes: never reported as a subset
        load,
        sweep_splits=("train", "val") if has_val else ("subtrain", "dev"),
        dev_fraction=None if has_val else DEV_FRACTION,
        source="imagefolder",
    )

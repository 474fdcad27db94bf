"""`folder:<path>`: any ImageFolder tree (`train/<class>/…`, `test/<class>/…`, optional `val/`) as a
custom dataset. Classes are the sorted folder names of train/, as torchvision's ImageFolder orders them."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np

from vitbench.datasets.base import DatasetFormat, DatasetSpec, Split, fingerprinted, require_dir
from vitbench.datasets.image_folders import class_folders
from vitbench.errors import UserError
from vitbench.files.text_safety import non_utf8_byte
from vitbench.provenance import sha256_file, sha256_text

PREFIX = "folder:"
log = logging.getLogger("vitbench")
DEV_FRACTION = 0.1  # without a val/ folder, 10 % of train is held out for LR selection (as for Pets)


def _classes(root: Path) -> list[str]:
    classes = [d.name for d, _ in class_folders(root / "train", "train folder of an ImageFolder tree")]
    for name in classes:
        byte = non_utf8_byte(name)
        if byte is not None:  # a class's name is stored and shown (per-class tables)
            raise UserError(f"{ascii(str(root / 'train' / name))}: byte {byte} of this class folder's name is not "
                            "UTF-8; name it in UTF-8")  # fmt: skip
    return classes


def _listing(folder: Path) -> set[tuple[str, int]]:
    """(name under `folder`, size) of each image: every file of a split, so no per-file relpath
    (0.8 s for a CIFAR-sized folder's 60,000 files)."""
    files = [p for _, found in class_folders(folder, "ImageFolder split") for p in found]
    prefix = os.path.join(os.fspath(folder), "")
    names = (p[len(prefix) :] if p.startswith(prefix) else os.path.relpath(p, folder) for p in files)
    return {(name, os.stat(p).st_size) for name, p in zip(names, files, strict=True)}


def _warn_if_test_is_train(root: Path) -> None:
    """A test split that is (or repeats) the train split scores memory, not generalisation. Files
    alike in class, name and size are compared by content (only those: no full read)."""
    train, test = root / "train", root / "test"
    if train.resolve() == test.resolve():
        log.warning("%s: is the same folder as %s; its accuracy is not a test accuracy", test, train)
        return
    alike = _listing(train) & _listing(test)
    shared = [name for name, _ in alike if sha256_file(train / name) == sha256_file(test / name)]
    if shared:
        log.warning(
            "%s: %d image(s) also in %s (same class, name and bytes); its accuracy is not a test accuracy",
            test, len(shared), train,
        )  # fmt: skip


def folder_spec(path: str) -> DatasetSpec:
    """The spec of `folder:<path>`: classes and splits read from the tree itself."""
    root = Path(path).expanduser().resolve()
    byte = non_utf8_byte(str(root))
    if byte is not None:  # its name is the dataset's, in every run key and table (a UnicodeEncodeError before)
        raise UserError(f"folder:{ascii(path)}: byte {byte} of the folder's path is not UTF-8; name it in UTF-8")
    require_dir(root, "ImageFolder tree (folder:<path> needs train/ and test/ inside)")
    for split in ("train", "test"):
        require_dir(root / split, f"'{split}' folder of the ImageFolder tree")
    classes = _classes(root)
    if len(classes) < 2:
        found = f"only '{classes[0]}'" if classes else "none"
        raise UserError(f"{root / 'train'}: expected two or more <class>/ folders, found {found} (one scores 100 %)")
    _warn_if_test_is_train(root)
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
        labelled = np.asarray(labels, dtype=np.int64)
        return Split(name, split, labelled, "imagefolder", **fingerprinted(root, paths), paths=paths)

    splits = ("train", "val", "test") if has_val else ("train", "test")
    # where it lives is part of its identity (two trees named alike are two datasets); the whole
    # path is recorded as the run's data_dir
    name = f"{PREFIX}{root.name}@{sha256_text(str(root))[:8]}"
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
        location=root,
        class_names=tuple(classes),
    )


# registered as a plugin's format is (vitbench.datasets entry points, `FORMATS`): registry.py reads both alike
FORMATS = [DatasetFormat("folder", folder_spec, "any ImageFolder tree with train/ and test/ (and optional val/)")]

"""ImageNet-1k: `train/<synset>/…` and `val/<synset>/…`, or a flat `val/` labelled by a
`val_caffe_labels.txt`-style file (`file index`); the class index always comes from the canonical
1,000-synset order, never from the folders present. The val split carries the ReaL labels."""

from __future__ import annotations

import json
import logging
import os
import re
from collections import Counter
from pathlib import Path

import numpy as np

from vitbench.datasets.base import Split, fingerprinted, numbered_lines, read_label_file, require_dir
from vitbench.datasets.image_folders import class_folders, image_files, say_left_out
from vitbench.errors import UserError, one_line
from vitbench.provenance import sha256_file

log = logging.getLogger("vitbench")

FLAT_LABEL_FILES = ("val_caffe_labels.txt", "val.txt")  # beside val/ (or inside it)
VAL_NUMBER = re.compile(r"ILSVRC2012_val_(\d{8})")


def timm_info(name: str) -> Path:
    """A class-list file timm ships (`timm/data/_info/`): synsets, ReaL labels, ImageNet-A/-R subsets."""
    import timm.data

    return Path(timm.data.__file__).parent / "_info" / name


def imagenet_synsets(root: Path) -> list[str]:
    """The canonical class order: `synset_words.txt` beside the data wins, else timm's copy."""
    local = root / "synset_words.txt"
    source = local if local.exists() or local.is_symlink() else timm_info("imagenet_synsets.txt")
    synsets = [line.split()[0] for _, line in numbered_lines(source, "ImageNet synset list")]
    if len(synsets) != 1000:
        raise UserError(f"{source}: expected 1000 synsets, found {len(synsets)}")
    return synsets


def real_labels_file(root: Path) -> Path:
    """ReaL labels (Beyer et al. 2020): a `real.json` beside the data wins, else timm's bundled copy."""
    local = root / "real.json"
    return local if local.exists() or local.is_symlink() else timm_info("imagenet_real_labels.json")


def read_real_labels(root: Path, paths: list[str]) -> tuple[list[list[int]] | None, Path]:
    """Per val image, its ReaL label list (index = the val file number − 1); None where the file
    names do not carry the official val numbers."""
    source = real_labels_file(root)
    try:
        table = json.loads(read_label_file(source, "ReaL labels JSON file"))
    except ValueError as e:
        raise UserError(f"{source}: not a ReaL labels JSON file ({one_line(e, 80)})") from None
    if not isinstance(table, list) or len(table) != 50_000:
        raise UserError(f"{source}: expected a list of 50,000 label lists (one per val image)")
    bad = next((i for i, entry in enumerate(table) if not _class_list(entry)), None)
    if bad is not None:
        raise UserError(
            f"{source}: entry {bad} is {str(table[bad])[:40]!r}, expected a list of class indices from 0 to 999"
        )
    labels = []
    for path in paths:
        match = VAL_NUMBER.search(os.path.basename(path))
        if match is None:
            log.warning("%s: not an ILSVRC2012_val_XXXXXXXX file name, so no ReaL labels for this split", path)
            return None, source
        labels.append([int(v) for v in table[int(match.group(1)) - 1]])
    return labels, source


def _class_list(entry: object) -> bool:
    """A ReaL entry: a list (maybe empty: no label agreed) of class indices 0..999."""
    return isinstance(entry, list) and all(type(i) is int and 0 <= i < 1000 for i in entry)


def _flat_labels(root: Path, folder: Path) -> tuple[Path, dict[str, int]]:
    for candidate in [root / n for n in FLAT_LABEL_FILES] + [folder / n for n in FLAT_LABEL_FILES]:
        if candidate.is_file():
            table = {}
            for number, line in numbered_lines(candidate):
                parts = line.split()
                if len(parts) != 2 or not parts[1].lstrip("-").isdigit():
                    raise UserError(f"{candidate}:{number}: expected 'file index', got {line!r}")
                table[Path(parts[0]).name] = int(parts[1])
            return candidate, table
    raise UserError(f"{folder}: a flat folder of images needs a label file ({' or '.join(FLAT_LABEL_FILES)}) beside it")


def synset_folders(folder: Path, index: dict[str, int], what: str, among: str) -> tuple[list[str], list[int]]:
    """(paths, labels) of a tree of `<synset>/` folders, each labelled `index[synset]`; a folder
    whose name is not in `index` is an error naming it and `among` (what the names must be)."""
    paths: list[str] = []
    labels: list[int] = []
    for class_dir, files in class_folders(folder, what):
        if class_dir.name not in index:
            raise UserError(f"{class_dir}: '{class_dir.name}' is not one of {among}")
        paths += files
        labels += [index[class_dir.name]] * len(files)
    return paths, labels


def load_imagenet(root: Path | None, split: str) -> Split:
    assert root is not None
    folder = require_dir(root / split, f"ImageNet '{split}' folder")
    synsets = imagenet_synsets(root)
    index = {s: i for i, s in enumerate(synsets)}
    paths: list[str] = []
    labels: list[int] = []
    label_file: Path | None = None
    left_out = Counter[str]()
    flat = image_files(folder, left_out)
    say_left_out(folder, left_out)
    if flat:  # val/ILSVRC2012_val_XXXXXXXX.JPEG, labels from a list file
        label_file, table = _flat_labels(root, folder)
        for path in flat:
            name = os.path.basename(path)
            if name not in table:
                raise UserError(f"{label_file}: has no label for {path}")
            paths.append(path)
            labels.append(table[name])
    else:
        paths, labels = synset_folders(folder, index, f"ImageNet '{split}' folder", "the 1000 ImageNet synsets")
    if not paths:
        raise UserError(f"{folder}: no images (expected <synset>/ class folders, or images and a label file)")
    extra = sha256_file(label_file)[:8] if label_file is not None else ""
    real_labels = None
    if split == "val":
        real_labels, real_source = read_real_labels(root, paths)
        if real_labels is not None:
            extra += sha256_file(real_source)[:8]
    return Split(
        "imagenet",
        split,
        np.asarray(labels, dtype=np.int64),
        "imagenet-folder",
        **fingerprinted(root, paths, extra),
        paths=paths,
        label_file=label_file,
        real_labels=real_labels,
    )

"""What the container formats (`hf:`, `wds:`, `tfds:`) share: split names as users name them, the
spec of a dataset whose splits are records inside containers, and the label checks that name
the file and member a bad label came from."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vitbench.datasets.base import DatasetSpec, Split
from vitbench.datasets.records import Records, file_size, is_remote, open_binary
from vitbench.errors import UserError
from vitbench.provenance import fingerprint_files, sha256_file, sha256_text

# how the formats' writers name splits -> vitbench's names (`validation` is the Hub's and TFDS's)
SPLIT_NAMES = {"train": "train", "validation": "val", "valid": "val", "val": "val", "test": "test"}
DEV_FRACTION = 0.1  # without a validation split, 10 % of train is held out for LR selection (as folder: does)


def split_of(name: str) -> str | None:
    """vitbench's split for a file or folder name as writers name them: `train-00000-of-00004`,
    `cifar10-validation-000012`, `test`; None when no part of it names a split."""
    stem = name.split(".")[0]
    for part in reversed(re.split(r"[-_./]", stem)):
        if part.lower() in SPLIT_NAMES:
            return SPLIT_NAMES[part.lower()]
    return None


def by_split(files: list[str], relative_to: str = "") -> dict[str, list[str]]:
    """The files of each split, in the given order: a file's split is named by its own name
    (`train-00000.parquet`) or else by the nearest folder above it that names one (`test/0000.tar`),
    below `relative_to` (the dataset's folder or prefix, whose own name never counts)."""
    grouped: dict[str, list[str]] = {}
    for f in files:
        parts = (f[len(relative_to) :] if relative_to and f.startswith(relative_to) else f).strip("/").split("/")
        split = split_of(parts[-1]) or next((s for p in reversed(parts[:-1]) if (s := split_of(p))), None)
        if split is not None:
            grouped.setdefault(split, []).append(f)
    return grouped


@dataclass
class ContainerSplit:
    """One split found in a container format: its records and labels, read when first asked for."""

    files: list[str]  # the container files, in row order
    # (records, labels): the index, built or read once; read(fresh=True) builds it from the bytes (--verify-data)
    read: Callable[..., tuple[Records, np.ndarray]]
    official_size: int | None = None  # what the container's metadata says (parquet footers, _info.json)
    # image files the records name by path outside the containers (a parquet cell {bytes: null, path}):
    # known once `read` has run, and fingerprinted with the containers
    referenced: Callable[[], list[str]] = lambda: []


def read_once(read: Callable[[bool], tuple[Records, np.ndarray]]) -> Callable[..., tuple[Records, np.ndarray]]:
    """`read(fresh)`, run the first time only: a split's index is built (or read from the cache) once
    a process, and once more the first time --verify-data asks for it built from the bytes."""
    cached: dict[bool, tuple[Records, np.ndarray]] = {}

    def once(fresh: bool = False) -> tuple[Records, np.ndarray]:
        if fresh not in cached:
            cached[fresh] = cached[False] = read(fresh)
        return cached[fresh]

    return once


def files_fingerprint(files: list[str], content: bool) -> str:
    """The fingerprint of a split's container files: names and sizes (and times, locally) from the
    file system — no image read — or, `content`, every byte (--verify-data)."""
    if not any(is_remote(f) for f in files):
        root = Path(files[0]).parent if files else Path(".")
        return fingerprint_files(root, files, content)
    if content:
        digest = sha256_text("|".join(files))
        for f in files:
            with open_binary(f) as handle:
                digest = sha256_text(digest + sha256_stream(handle))
        return digest[:16]
    return sha256_text("|".join(f"{f}|{file_size(f)}" for f in files))[:16]


def sha256_stream(handle) -> str:
    import hashlib

    digest = hashlib.sha256()
    for block in iter(lambda: handle.read(1 << 20), b""):
        digest.update(block)
    return digest.hexdigest()


def container_spec(
    name: str,
    title: str,
    source: str,
    splits: dict[str, ContainerSplit],
    class_names: list[str] | None,
    num_classes: Callable[[], int] | int,
    where: str,
    location: Path | None = None,
    extra_fingerprint: str = "",
) -> DatasetSpec:
    """The spec of a dataset whose splits are container records. `splits` must hold train and test
    (or train and val, scored on val as ImageNet is); without val, `DEV_FRACTION` of train is the
    dev split. `where` names the argument in errors."""
    if "train" not in splits:
        found = ", ".join(sorted(splits)) or "none"
        raise UserError(f"{where}: no train split found (found: {found}); expected files named like train-00000.*")
    if "test" not in splits and "val" not in splits:
        raise UserError(f"{where}: no test or validation split found beside train")
    count = num_classes() if callable(num_classes) else num_classes
    if count < 2:
        raise UserError(f"{where}: {count} class(es) found, expected two or more (one scores 100 %)")
    if class_names is not None and len(class_names) != count:
        class_names = None
    has_val = "val" in splits
    test = "test" if "test" in splits else "val"

    def load(_root: Path | None, split: str, fresh: bool = False) -> Split:
        found = splits[split]
        records, labels = found.read(fresh)
        check_labels(labels, count, records, "train" if split == "train" else split, class_names, where)
        files = found.files + found.referenced()
        fingerprint = files_fingerprint(files, content=False) + extra_fingerprint
        return Split(
            name, split, labels, source, fingerprint, records=records,
            content_fingerprint=lambda: files_fingerprint(files, content=True) + extra_fingerprint,
            reread=None if fresh else lambda: load(_root, split, fresh=True),
        )  # fmt: skip

    # the sizes the container's metadata gives (parquet footers, _info.json, TFDS's split info): what
    # `doctor` counts and a dry run plans from without reading an image
    on_disk: dict[str, int | None] = {s: splits[s].official_size for s in ("train", "val", "test") if s in splits}
    return DatasetSpec(
        name,
        title,
        count,
        None,
        on_disk,
        load,
        transfer_splits=("train", test),
        sweep_splits=("train", "val") if has_val and test == "test" else ("subtrain", "dev"),
        dev_fraction=None if has_val and test == "test" else DEV_FRACTION,
        source=source,
        location=location,
        class_names=tuple(class_names) if class_names else None,
    )


def check_labels(
    labels: np.ndarray, count: int, records: Records, split: str, names: list[str] | None, where: str
) -> None:
    """Every label is one of the dataset's `count` classes (train's, where the format does not name
    them): the first that is not is named with the file and member it came from."""
    bad = np.flatnonzero((labels < 0) | (labels >= count))
    if len(bad):
        first = int(bad[0])
        what = f"one of the {count} classes named by the data" if names else f"one of train's classes 0..{count - 1}"
        raise UserError(
            f"{records.where(first)}: label {int(labels[first])} of the {split} split is not {what} "
            f"({len(bad)} such image(s) in {where})"
        )


def identity(argument: str, resolved: str) -> str:
    """What tells two datasets of a format apart: the name the user gave and a hash of where it resolved."""
    return f"{argument.rstrip('/').rsplit('/', 1)[-1] or argument}@{sha256_text(resolved)[:8]}"


def info_digest(path: Path) -> str:
    return "|" + sha256_file(path)[:16] if path.is_file() else ""

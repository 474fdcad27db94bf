"""VTAB-1k: task_adaptation's 19 tasks (names, groups, classes, test sizes, BiT's flip/crop
exceptions; docs/protocols.md, "VTAB-1k"), read from the folder layout PyTorch fine-tuning papers use:
`vtab-1k/<folder>/{train800,val200,train800val200,test}.txt`, lines `relative/path label`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vitbench.datasets.base import Split, check_listed, fingerprinted, numbered_lines, require, require_dir
from vitbench.errors import UserError
from vitbench.provenance import sha256_file

ROOT_FOLDER = "vtab-1k"
GROUPS = ("natural", "specialized", "structured")


@dataclass(frozen=True)
class VtabTask:
    key: str  # vitbench's name is vtab/<key>; the paper's Table 9 columns use the same keys
    title: str  # Table 9's column name
    group: str
    folder: str  # the task's folder under vtab-1k/ (the names the PyTorch VTAB-1k releases use)
    num_classes: int
    test_size: int
    flip: bool = True  # BiT Suppl. F: no random flip for dSpr-Loc, dSpr-Ori, sNORB-Azim
    crop: bool = True  # ... no random crop for Clevr-Count/Dist, DMLab, KITTI-Dist, dSpr-Loc


TASKS: tuple[VtabTask, ...] = (
    VtabTask("caltech101", "Caltech101", "natural", "caltech101", 102, 6_084),
    VtabTask("cifar100", "CIFAR-100", "natural", "cifar", 100, 10_000),
    VtabTask("dtd", "DTD", "natural", "dtd", 47, 1_880),
    VtabTask("flowers102", "Flowers102", "natural", "oxford_flowers102", 102, 6_149),
    VtabTask("pets", "Pets", "natural", "oxford_iiit_pet", 37, 3_669),
    VtabTask("sun397", "Sun397", "natural", "sun397", 397, 21_750),
    VtabTask("svhn", "SVHN", "natural", "svhn", 10, 26_032),
    VtabTask("camelyon", "Camelyon", "specialized", "patch_camelyon", 2, 32_768),
    VtabTask("eurosat", "EuroSAT", "specialized", "eurosat", 10, 5_400),
    VtabTask("resisc45", "Resisc45", "specialized", "resisc45", 45, 6_300),
    VtabTask("retinopathy", "Retinopathy", "specialized", "diabetic_retinopathy", 5, 42_670),
    VtabTask("clevr_count", "Clevr-Count", "structured", "clevr_count", 8, 15_000, crop=False),
    VtabTask("clevr_dist", "Clevr-Dist", "structured", "clevr_dist", 6, 15_000, crop=False),
    VtabTask("dmlab", "DMLab", "structured", "dmlab", 6, 22_735, crop=False),
    VtabTask("dsprites_loc", "dSpr-Loc", "structured", "dsprites_loc", 16, 73_728, flip=False, crop=False),
    VtabTask("dsprites_ori", "dSpr-Ori", "structured", "dsprites_ori", 16, 73_728, flip=False),
    VtabTask("kitti_dist", "KITTI-Dist", "structured", "kitti", 4, 711, crop=False),
    VtabTask("smallnorb_azim", "sNORB-Azim", "structured", "smallnorb_azi", 18, 12_150, flip=False),
    VtabTask("smallnorb_elev", "sNORB-Elev", "structured", "smallnorb_ele", 9, 12_150),
)
TASKS_BY_KEY = {t.key: t for t in TASKS}


def dataset_name(task: VtabTask) -> str:
    return f"vtab/{task.key}"


def official_sizes(task: VtabTask) -> dict[str, int | None]:
    return {"train800": 800, "val200": 200, "train800val200": 1000, "test": task.test_size}


def folder_loader(task: VtabTask):
    def load(root: Path | None, split: str) -> Split:
        assert root is not None
        require_dir(root, f"VTAB-1k {task.title} folder")
        listing = require(root / f"{split}.txt", f"VTAB-1k {task.title} '{split}' list")
        entries: list[tuple[int, str]] = []
        labels: list[int] = []
        for number, line in numbered_lines(listing):
            parts = line.rsplit(maxsplit=1)
            if len(parts) != 2 or not parts[1].lstrip("-").isdigit():
                raise UserError(f"{listing}:{number}: expected 'relative/path label', got {line!r}")
            label = int(parts[1])
            if not 0 <= label < task.num_classes:
                raise UserError(f"{listing}:{number}: label {label} is outside 0..{task.num_classes - 1}")
            entries.append((number, str(root / parts[0])))
            labels.append(label)
        check_listed(listing, entries)
        paths = [path for _, path in entries]
        fingerprint = fingerprinted(root, paths, sha256_file(listing)[:16])
        labelled = np.asarray(labels, dtype=np.int64)
        name = dataset_name(task)
        return Split(name, split, labelled, "vtab-folder", **fingerprint, paths=paths, label_file=listing)

    return load


def group_tasks() -> dict[str, list[str]]:
    """Each roll-up and its tasks: natural, specialized, structured, then "vtab" (all 19)."""
    found = {group: [t.key for t in TASKS if t.group == group] for group in GROUPS}
    return {**found, "vtab": [t.key for t in TASKS]}


def group_means(task_accuracy: dict[str, float]) -> dict[str, float]:
    """Natural / specialized / structured means and the VTAB mean over the 19 tasks, unweighted as
    in the paper; a group (and the overall mean) only when all of its tasks are present."""
    return {
        name: float(np.mean([task_accuracy[k] for k in keys]))
        for name, keys in group_tasks().items()
        if all(k in task_accuracy for k in keys)
    }

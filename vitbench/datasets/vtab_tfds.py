"""VTAB-1k from the official TFDS builders (optional extra `vitbench[tfds]`), built exactly as
google-research/task_adaptation builds it: the same TFDS versions, the same split arithmetic for
train800 / val200 / train800val200 / test, and the same label rules (docs/protocols.md, "VTAB-1k").

The rules and the arithmetic are plain functions on plain records, so they are tested without
TensorFlow; only `load_tfds` imports tensorflow_datasets. The folder layout and TFDS give
different numbers (different images), so the source is part of every result."""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vitbench.datasets.base import Split
from vitbench.datasets.native_stderr import held_back
from vitbench.datasets.vtab import TASKS_BY_KEY, VtabTask, dataset_name
from vitbench.errors import UserError, one_line
from vitbench.files import downloads
from vitbench.provenance import sha256_file

Record = dict  # one TFDS example as numpy values (nested dicts for `objects`)


# --- label rules (task_adaptation/data/*.py) ---------------------------------------------------------


def clevr_count(r: Record) -> int:
    return int(len(r["objects"]["size"])) - 3  # 3..10 objects -> 8 classes


CLEVR_DIST_THRESHOLDS = np.array([0.0, 8.0, 8.5, 9.0, 9.5, 10.0, 100.0])


def clevr_dist(r: Record) -> int:
    distance = float(np.min(np.asarray(r["objects"]["pixel_coords"])[:, 2]))
    return int(np.max(np.flatnonzero(distance > CLEVR_DIST_THRESHOLDS)))


KITTI_THRESHOLDS = np.array([-100.0, 8.0, 20.0, 999.0])
KITTI_VEHICLE_TYPES = 3  # TFDS types 0, 1, 2: Car, Van, Truck


def kitti_dist(r: Record) -> int:
    objects = r["objects"]
    vehicles = np.asarray(objects["type"]) < KITTI_VEHICLE_TYPES
    depths = np.asarray(objects["location"]).reshape(-1, 3)[:, 2][vehicles]
    distance = float(np.min(depths)) if depths.size else 1000.0  # no vehicle: the "far" bin
    return int(np.max(np.flatnonzero(distance > KITTI_THRESHOLDS)))


def binned(key: str, original_classes: int, classes: int) -> Callable[[Record], int]:
    """dSprites: an attribute with `original_classes` values in `classes` equal bins (floor division)."""
    width = original_classes / classes

    def rule(r: Record) -> int:
        return int(np.floor(float(r[key]) / width))

    return rule


def field(key: str) -> Callable[[Record], int]:
    def rule(r: Record) -> int:
        return int(r[key])

    return rule


def rgb(r: Record) -> np.ndarray:
    return np.asarray(r["image"], dtype=np.uint8)


def tiled_binary(r: Record) -> np.ndarray:
    """dSprites: 0/1 single-channel images -> 0/255 RGB."""
    return np.repeat(np.asarray(r["image"], dtype=np.uint8) * 255, 3, axis=-1)


def tiled(r: Record) -> np.ndarray:
    """smallNORB: greyscale -> 3 identical channels."""
    return np.repeat(np.asarray(r["image"], dtype=np.uint8), 3, axis=-1)


# --- split arithmetic -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class TfdsTask:
    builder: str  # TFDS name (with config) and the version task_adaptation pins
    val_from: str  # the TFDS split the 200 validation images come from
    val_start_pct: int  # ... starting at floor(pct × its size / 100): 0 = its first images
    test_from: str  # the TFDS split used as the VTAB test split
    # ... from the sum of floor(pct × its size / 100) over these percentages (the train and val
    # blocks before it, each rounded down as task_adaptation rounds them) to its end
    test_after_pcts: tuple[int, ...]
    label: Callable[[Record], int]
    image: Callable[[Record], np.ndarray] = rgb


def split_strings(task: TfdsTask, counts: dict[str, int]) -> dict[str, str]:
    """TFDS split strings for the four VTAB-1k splits, given the TFDS split sizes.

    train800 is always the first 800 of TFDS train; val200 the 200 images at the start of the
    validation block; train800val200 the two together, in that order."""

    def start(split: str, pct: int) -> int:
        if split not in counts:
            raise UserError(f"TFDS {task.builder}: has no '{split}' split (it has: {', '.join(counts)})")
        return pct * counts[split] // 100

    v = start(task.val_from, task.val_start_pct)
    t = sum(start(task.test_from, pct) for pct in task.test_after_pcts)
    train800, val200 = "train[:800]", f"{task.val_from}[{v}:{v + 200}]"
    return {
        "train800": train800,
        "val200": val200,
        "train800val200": f"{train800}+{val200}",
        "test": f"{task.test_from}[{t}:]" if t else task.test_from,
    }


TFDS_TASKS: dict[str, TfdsTask] = {
    "caltech101": TfdsTask("caltech101:3.*.*", "train", 90, "test", (), field("label")),
    "cifar100": TfdsTask("cifar100:3.*.*", "train", 90, "test", (), field("label")),
    "dtd": TfdsTask("dtd:3.*.*", "validation", 0, "test", (), field("label")),
    "flowers102": TfdsTask("oxford_flowers102:2.*.*", "validation", 0, "test", (), field("label")),
    "pets": TfdsTask("oxford_iiit_pet:3.*.*", "train", 80, "test", (), field("label")),
    "sun397": TfdsTask("sun397/tfds:4.*.*", "validation", 0, "test", (), field("label")),
    "svhn": TfdsTask("svhn_cropped:3.*.*", "train", 90, "test", (), field("label")),
    "camelyon": TfdsTask("patch_camelyon:2.*.*", "validation", 0, "test", (), field("label")),
    "eurosat": TfdsTask("eurosat/rgb:2.*.*", "train", 60, "train", (60, 20), field("label")),
    "resisc45": TfdsTask("resisc45:3.*.*", "train", 60, "train", (60, 20), field("label")),
    "retinopathy": TfdsTask(
        "diabetic_retinopathy_detection/btgraham-300:3.*.*", "validation", 0, "test", (), field("label")
    ),
    "clevr_count": TfdsTask("clevr:3.*.*", "train", 90, "validation", (), clevr_count),
    "clevr_dist": TfdsTask("clevr:3.*.*", "train", 90, "validation", (), clevr_dist),
    "dmlab": TfdsTask("dmlab:2.0.1", "validation", 0, "test", (), field("label")),
    "dsprites_loc": TfdsTask(
        "dsprites:2.*.*", "train", 80, "train", (80, 10), binned("label_x_position", 32, 16), tiled_binary
    ),
    "dsprites_ori": TfdsTask(
        "dsprites:2.*.*", "train", 80, "train", (80, 10), binned("label_orientation", 40, 16), tiled_binary
    ),
    "kitti_dist": TfdsTask("kitti:3.1.0", "validation", 0, "test", (), kitti_dist),
    "smallnorb_azim": TfdsTask("smallnorb:2.*.*", "test", 0, "test", (50,), field("label_azimuth"), tiled),
    "smallnorb_elev": TfdsTask("smallnorb:2.*.*", "test", 0, "test", (50,), field("label_elevation"), tiled),
}


@contextmanager
def _root_logging_kept():
    """TensorFlow and absl add a handler to the root logger when imported, which would print every
    vitbench log line a second time: remove whatever handler appears while TFDS is in use."""
    root = logging.getLogger()
    before = list(root.handlers)
    try:
        yield
    finally:
        for handler in [h for h in root.handlers if h not in before]:
            root.removeHandler(handler)


def _builder(rule: TfdsTask, data_dir: Path | None):
    """(tfds, the task's TFDS builder under `data_dir`, its split sizes: empty where not prepared)."""
    # TensorFlow's start-up chatter is held back in the `vitbench` command's own process only
    # (vitbench/datasets/native_stderr.py): a program that reads TFDS through vitbench keeps its stderr as it is
    try:
        with held_back():
            import tensorflow_datasets as tfds
    except ImportError:
        raise UserError("--data-source tfds needs TensorFlow Datasets: pip install 'vitbench[tfds]'") from None
    if data_dir is None:
        raise UserError("--data-source tfds needs --data-dir: the TFDS data_dir holding the prepared builders")
    try:
        builder = tfds.builder(rule.builder, data_dir=str(data_dir), try_gcs=False)
        counts = {name: info.num_examples for name, info in builder.info.splits.items()}
    except Exception as e:  # tfds raises several types for "not prepared here"
        raise UserError(f"TFDS {rule.builder} is not prepared under {data_dir} ({type(e).__name__}: {e})") from None
    return tfds, builder, counts


def tfds_fetcher(task: VtabTask):
    """What --download does before the task is read from TFDS: a builder not prepared under
    --data-dir is built by TFDS's own download_and_prepare (TFDS fetches the sources, checks them
    against its registered checksums and shows its progress; what it fetched stays in
    <data-dir>/downloads, so a failed build does not fetch them again)."""
    rule = TFDS_TASKS[task.key]

    def fetch(data_dir: Path | None) -> None:
        with _root_logging_kept():
            _, builder, counts = _builder(rule, data_dir)
            if not counts:
                assert data_dir is not None  # (_builder refuses None)
                _download_and_prepare(builder, rule.builder, data_dir)

    return fetch


def tfds_loader(task: VtabTask):
    """Read one VTAB-1k split from a prepared TFDS data dir (`--data-dir`); never fetches
    (`tfds_fetcher` does, with --download)."""
    rule = TFDS_TASKS[task.key]

    def load(data_dir: Path | None, split: str) -> Split:
        with _root_logging_kept():
            return read(data_dir, split)

    def read(data_dir: Path | None, split: str) -> Split:
        tfds, builder, counts = _builder(rule, data_dir)
        if not counts:
            raise UserError(
                f"TFDS {rule.builder} is not prepared under {data_dir}; add --download (or set {downloads.ENV}=1) "
                f"to build it there, or build it on a connected machine (tfds build) and copy it"
            )
        ds = builder.as_dataset(split=split_strings(rule, counts)[split], shuffle_files=False)
        images, labels = [], []
        for record in tfds.as_numpy(ds):
            images.append(rule.image(record))
            labels.append(rule.label(record))
        # the builder's name/version, the slice, and its dataset_info.json (split sizes, shard lengths)
        fingerprint = f"{builder.info.full_name}|{split_strings(rule, counts)[split]}"
        info = Path(str(builder.data_dir)) / "dataset_info.json"
        if info.is_file():
            fingerprint += "|" + sha256_file(info)[:16]
        return Split(dataset_name(task), split, np.asarray(labels, dtype=np.int64), "tfds", fingerprint, images=images)

    return load


def _download_and_prepare(builder, name: str, data_dir: Path) -> None:
    """TFDS's own download and build, into `data_dir` (the builder's info then lists its splits);
    any failure is one line naming the builder."""
    try:
        builder.download_and_prepare(download_dir=str(data_dir / "downloads"))
    except Exception as e:  # network errors, checksum mismatches, a dataset TFDS cannot fetch itself
        raise UserError(
            f"TFDS {name}: download_and_prepare into {data_dir} failed ({type(e).__name__}: {one_line(e, 200)}); "
            f"run the same command again to retry (finished downloads are kept), or build it on a connected "
            f"machine (tfds build) and copy {data_dir}"
        ) from None


assert set(TFDS_TASKS) == set(TASKS_BY_KEY)  # one TFDS recipe per task

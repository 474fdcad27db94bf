"""Dataset specs and loaders for the on-disk formats researchers already have.

Layouts follow torchvision's `root` conventions under `--data-dir` (env VITBENCH_DATA); nothing
is ever downloaded. A loader returns a `Split`: labels plus a way to get each image as RGB PIL.
Decoding happens in `Split.image`, i.e. inside DataLoader workers.
"""

from __future__ import annotations

import logging
import pickle
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from vitbench.errors import UserError
from vitbench.provenance import fingerprint_files

log = logging.getLogger("vitbench")

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".webp"}


@dataclass
class Split:
    """One split of a dataset: integer labels and the images, in memory or as files."""

    dataset: str
    name: str
    labels: np.ndarray  # (N,) int64
    source: str  # the on-disk format: recorded with every result
    fingerprint: str
    images: np.ndarray | None = None  # (N, H, W, 3) uint8 when held in memory
    paths: list[Path] | None = None
    official_size: int | None = None

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def is_subset(self) -> bool:
        return self.official_size is not None and len(self) != self.official_size

    def image(self, index: int) -> Image.Image:
        if self.images is not None:
            return Image.fromarray(self.images[index])
        assert self.paths is not None
        with Image.open(self.paths[index]) as img:
            return img.convert("RGB")  # greyscale, CMYK and palette images become RGB


class TransformedSplit(torch.utils.data.Dataset):
    """A Split with a preprocessing transform applied per item (in the DataLoader worker)."""

    def __init__(self, split: Split, transform: Callable):
        self.split, self.transform = split, transform

    def __len__(self) -> int:
        return len(self.split)

    def __getitem__(self, index: int):
        return self.transform(self.split.image(index)), int(self.split.labels[index])


@dataclass(frozen=True)
class DatasetSpec:
    name: str
    title: str  # as the paper's tables name it
    num_classes: int
    folder: str | None  # directory under --data-dir; None for an embedded dataset
    official_sizes: dict[str, int]
    load: Callable[[Path | None, str], Split]
    # which splits the few-shot protocol draws its shots from and scores on
    fewshot_splits: tuple[str, str] = ("train", "test")
    key_files: tuple[str, ...] = field(default=())  # files (under folder) whose presence means "found"

    def root(self, data_dir: Path | None) -> Path | None:
        if self.folder is None:
            return None
        if data_dir is None:
            raise UserError(f"dataset {self.name} needs --data-dir (or VITBENCH_DATA) pointing at its parent folder")
        return data_dir / self.folder

    def load_split(self, data_dir: Path | None, split: str) -> Split:
        if split not in self.official_sizes:
            raise UserError(f"dataset {self.name} has no split '{split}' (it has: {', '.join(self.official_sizes)})")
        result = self.load(self.root(data_dir), split)
        result.official_size = self.official_sizes[split]
        if result.is_subset:
            log.warning(
                "%s %s: %d images, the official split has %d: a subset, so numbers are not comparable with the paper's",
                self.name,
                split,
                len(result),
                result.official_size,
            )
        if len(result.labels) and (result.labels.min() < 0 or result.labels.max() >= self.num_classes):
            raise UserError(f"{self.name} {split}: labels outside 0..{self.num_classes - 1}")
        return result


def require(path: Path, what: str) -> Path:
    if not path.exists():
        raise UserError(f"missing {what}: {path}")
    return path


# --- CIFAR: the original python pickles, read with a restricted unpickler ----------------------------


class _CifarUnpickler(pickle.Unpickler):
    """Admit only what CIFAR batches contain (dicts, lists, bytes, numpy arrays): a pickle can
    run arbitrary code on load, and a data directory is not a trusted place."""

    ALLOWED = {
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy.core.multiarray", "scalar"),
        ("numpy._core.multiarray", "scalar"),
        ("_codecs", "encode"),
    }

    def __init__(self, file, path: Path):
        super().__init__(file, encoding="latin1")
        self.path = path

    def find_class(self, module: str, name: str):
        if (module, name) not in self.ALLOWED:
            raise UserError(
                f"{self.path}: refusing to unpickle {module}.{name}; a CIFAR batch holds only dicts, "
                "lists, bytes and numpy arrays (is this file really a CIFAR batch?)"
            )
        if module.startswith("numpy.core") and int(np.__version__.split(".")[0]) >= 2:
            module = module.replace("numpy.core", "numpy._core", 1)  # avoid numpy 2's deprecation shim
        return super().find_class(module, name)


def read_cifar_batch(path: Path, label_key: str) -> tuple[np.ndarray, np.ndarray]:
    """(N, 32, 32, 3) uint8 images and (N,) labels from one original CIFAR pickle."""
    try:
        with open(path, "rb") as f:
            batch = _CifarUnpickler(f, path).load()
        data = np.asarray(batch["data"], dtype=np.uint8)
        labels = np.asarray(batch[label_key], dtype=np.int64)
    except UserError:
        raise
    except (pickle.UnpicklingError, EOFError, KeyError, TypeError, ValueError) as e:
        raise UserError(f"{path}: not a readable CIFAR batch ({type(e).__name__}: {e})") from None
    if data.ndim != 2 or data.shape[1] != 3072 or len(data) != len(labels):
        raise UserError(f"{path}: expected 'data' of shape (N, 3072) matching '{label_key}', got {data.shape}")
    return data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1), labels  # CHW rows -> NHWC


def _cifar_loader(name: str, train_files: list[str], test_file: str, label_key: str):
    def load(root: Path | None, split: str) -> Split:
        assert root is not None
        if not root.is_dir():
            raise UserError(f"missing {name} folder: {root} (expected under --data-dir, torchvision's layout)")
        if split == "train":
            # the shared subsets (and quick experiments) ship only the first batches: load what is there
            files = [root / f for f in train_files if (root / f).exists()]
            if not files:
                raise UserError(f"missing {name} train batch: {root / train_files[0]}")
        else:
            files = [require(root / test_file, f"{name} test batch")]
        parts = [read_cifar_batch(f, label_key) for f in files]
        images = np.concatenate([p[0] for p in parts])
        labels = np.concatenate([p[1] for p in parts])
        return Split(name, split, labels, "cifar-pickle", fingerprint_files(root, files, content=True), images=images)

    return load


# --- ImageNet: <split>/<synset>/*.JPEG, class index from the canonical 1,000-synset order -------------


def imagenet_synsets(root: Path) -> list[str]:
    """The canonical class order: `synset_words.txt` beside the data wins, else timm's copy."""
    local = root / "synset_words.txt"
    if local.exists():
        synsets = [line.split()[0] for line in local.read_text().splitlines() if line.strip()]
    else:
        import timm.data

        bundled = Path(timm.data.__file__).parent / "_info" / "imagenet_synsets.txt"
        synsets = bundled.read_text().split()
    if len(synsets) != 1000:
        raise UserError(f"{local}: expected 1000 synsets, found {len(synsets)}")
    return synsets


def _imagenet_load(root: Path | None, split: str) -> Split:
    assert root is not None
    folder = require(root / split, f"ImageNet '{split}' folder")
    if not folder.is_dir():
        raise UserError(f"{folder}: expected a folder of <synset>/ class folders, found a file")
    index = {s: i for i, s in enumerate(imagenet_synsets(root))}
    paths: list[Path] = []
    labels: list[int] = []
    for class_dir in sorted(p for p in folder.iterdir() if p.is_dir()):
        if class_dir.name not in index:
            raise UserError(f"{class_dir}: '{class_dir.name}' is not one of the 1000 ImageNet synsets")
        files = sorted(p for p in class_dir.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
        if not files:
            raise UserError(f"{class_dir}: empty class folder (no images)")
        paths += files
        labels += [index[class_dir.name]] * len(files)
    if not paths:
        raise UserError(f"{folder}: no <synset>/ class folders with images")
    fingerprint = fingerprint_files(root, paths, content=False)
    return Split("imagenet", split, np.asarray(labels, dtype=np.int64), "imagefolder", fingerprint, paths=paths)


# --- digits: the embedded default, real 8x8 scans shipped with scikit-learn ---------------------------

DIGITS_TRAIN = 1000  # the first 1000 of sklearn's 1797 digits train, the remaining 797 test


def _digits_load(root: Path | None, split: str) -> Split:
    from sklearn.datasets import load_digits

    digits = load_digits()
    grey = np.round(digits.images * (255.0 / 16.0)).astype(np.uint8)  # values 0..16 -> 0..255
    rgb = np.repeat(grey[..., None], 3, axis=-1)  # (N, 8, 8, 3)
    labels = digits.target.astype(np.int64)
    part = slice(0, DIGITS_TRAIN) if split == "train" else slice(DIGITS_TRAIN, None)
    import sklearn

    fingerprint = f"sklearn-{sklearn.__version__}-digits-{part.start}:{part.stop}"
    return Split("digits", split, labels[part], "sklearn-digits", fingerprint, images=rgb[part])


DATASETS: dict[str, DatasetSpec] = {
    spec.name: spec
    for spec in [
        DatasetSpec("digits", "Digits (8x8, scikit-learn)", 10, None, {"train": 1000, "test": 797}, _digits_load),
        DatasetSpec(
            "cifar10",
            "CIFAR-10",
            10,
            "cifar-10-batches-py",
            {"train": 50_000, "test": 10_000},
            _cifar_loader("cifar10", [f"data_batch_{i}" for i in range(1, 6)], "test_batch", "labels"),
            key_files=("data_batch_1", "test_batch"),
        ),
        DatasetSpec(
            "cifar100",
            "CIFAR-100",
            100,
            "cifar-100-python",
            {"train": 50_000, "test": 10_000},
            _cifar_loader("cifar100", ["train"], "test", "fine_labels"),
            key_files=("train", "test"),
        ),
        DatasetSpec(
            "imagenet",
            "ImageNet",
            1000,
            "imagenet",
            {"train": 1_281_167, "val": 50_000},
            _imagenet_load,
            fewshot_splits=("train", "val"),
            key_files=("val",),
        ),
    ]
}


def find_status(spec: DatasetSpec, data_dir: Path | None) -> str:
    """found / incomplete (naming what is missing) / absent, without loading anything."""
    if spec.folder is None:
        return "embedded"
    if data_dir is None:
        return "absent (no --data-dir)"
    root = data_dir / spec.folder
    if not root.is_dir():
        return "absent"
    missing = [f for f in spec.key_files if not (root / f).exists()]
    if missing:
        return f"incomplete: missing {root / missing[0]}" + (
            f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        )
    return "found"

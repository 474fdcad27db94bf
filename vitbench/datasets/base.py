"""What every loader returns (a Split), what every dataset is described by (a DatasetSpec), and the
shared rules: decoding to RGB, the deterministic dev hold-out, and one-line errors naming files."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from vitbench.datasets.decoding import CorruptImage, decode
from vitbench.datasets.records import Records
from vitbench.errors import UserError
from vitbench.files.atomic import read_regular
from vitbench.provenance import fingerprint_files, sha256_text

log = logging.getLogger("vitbench")

DEV_SEED = 0  # the dev hold-out is a fixed permutation of train: the same for every run and user


@dataclass
class Split:
    """One split of a dataset: integer labels and the images, in memory, as files, or as records
    inside containers (parquet, Arrow, tar shards, TFRecord: records.py)."""

    dataset: str
    name: str
    labels: np.ndarray  # (N,) int64
    source: str  # the on-disk format ("cifar-pickle", "vtab-folder", "tfds", ...): recorded with every result
    fingerprint: str
    # in memory: one (N, H, W, 3) uint8 array (CIFAR, digits), or one (H, W, 3) uint8 array per image (TFDS);
    # numpy, not torch: listing datasets and counting their images (`vitbench doctor`) never loads torch
    images: np.ndarray | Sequence[np.ndarray] | None = None
    paths: list[str] | None = None  # strings, not Paths: ImageNet train has 1.28M of them
    official_size: int | None = None
    label_file: Path | None = None  # where the labels came from: named when one is out of range
    # ImageNet ReaL: per image, the list of correct labels (empty: the image is not scored)
    real_labels: list[list[int]] | None = None
    # a set scored with another label space's classifier (the robustness sets, with an ImageNet-1k
    # head): per class of this split, the head's classes whose logits are pooled (max) into it
    class_map: list[list[int]] | None = None
    border: int = 0  # pixels cropped from every side when decoding (ObjectNet's 1-pixel red frame)
    # the fingerprint from the files' contents, for --verify-data (None: `fingerprint` already is
    # one, or the split is in memory); computed only when asked: it reads every byte
    content_fingerprint: Callable[[], str] | None = None
    reread: Callable[[], Split] | None = None  # read again, its index built from the bytes (--verify-data)
    # images inside containers, read by row (hf:, wds:, tfds:): neither `images` nor `paths`
    records: Records | None = None

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def is_subset(self) -> bool:
        return self.official_size is not None and len(self) != self.official_size

    def image(self, index: int) -> Image.Image:
        """Image `index` as the protocols see it (a set's frame cropped: `border`)."""
        if self.images is not None:
            pixels = self.images[index]
            return Image.fromarray(np.asarray(pixels))
        image = self.decoded(index)
        if self.border:
            image = image.crop((self.border, self.border, image.width - self.border, image.height - self.border))
        return image

    def decoded(self, index: int) -> Image.Image:
        """Image `index` of a file or a container's record, decoded as stored (no border crop)."""
        if self.records is not None:
            try:
                return decode("", self.records.read(index))
            except CorruptImage as e:  # named only when it is: where() formats a member's name
                raise CorruptImage(self.records.where(index), e.reason) from None
            except OSError as e:  # a record its container cannot give (a torn parquet page): the image is lost
                where = self.records.where(index)
                raise CorruptImage(where, " ".join(str(e).removeprefix(f"{where}: ").split())[:200]) from None
        assert self.paths is not None
        return decode(self.paths[index])

    def location(self, index: int) -> str:
        """Where image `index` is read from: its file, or its container's file and member."""
        if self.records is not None:
            return self.records.where(index)
        assert self.paths is not None
        return str(self.paths[index])

    def encoded(self, index: int) -> bytes:
        """Image `index` as stored (a file's bytes, a record's): an OSError when it cannot be read."""
        if self.records is not None:
            return self.records.read(index)
        assert self.paths is not None
        with open(self.paths[index], "rb") as f:
            return f.read()

    def file_groups(self) -> np.ndarray:
        """The container file (shard, row group, TFRecord file) of each image, numbered 0..: what a
        shard-ordered training stream groups by. Only container splits have them."""
        if self.records is None:
            raise UserError(
                f"--train-order shards: {self.dataset} {self.name} is not in shards (it reads hf:, wds: and tfds: data)"
            )
        return self.records.container.groups(self.records.rows)

    def subset(self, name: str, indices: np.ndarray) -> Split:
        """The images at `indices` (kept in order) as a split of their own."""
        indices = np.sort(indices)
        images = self.images
        if isinstance(images, np.ndarray):
            images = images[indices]
        elif images is not None:
            images = [images[i] for i in indices]
        return replace(
            self,
            name=name,
            labels=self.labels[indices],
            images=images,
            paths=[self.paths[i] for i in indices] if self.paths is not None else None,
            records=self.records.take(indices) if self.records is not None else None,
            real_labels=[self.real_labels[i] for i in indices] if self.real_labels is not None else None,
            fingerprint=sha256_text(f"{self.fingerprint}|{name}|{indices.tobytes().hex()}")[:16],
            content_fingerprint=None,  # a subset is made of a verified split (DatasetSpec.load_split)
            official_size=None,
        )


def fingerprinted(root: Path, paths: list[str], extra: str = "") -> dict[str, Any]:
    """A split of files' fingerprint arguments: from the files' names, sizes and times (what
    planning reads), and how to make it from their contents instead (--verify-data); `extra` covers
    the listing files the loader read."""
    return {
        "fingerprint": fingerprint_files(root, paths, content=False) + extra,
        "content_fingerprint": lambda: fingerprint_files(root, paths, content=True) + extra,
    }


# (the dataset's folder, or --data-dir for another source; the split's name) -> the split
Loader = Callable[[Path | None, str], Split]


@dataclass(frozen=True)
class DatasetSpec:
    """Everything a protocol needs to know about a dataset, so that none of them special-cases one.

    `splits` are the ones on disk; `subtrain` and `dev` are derived: the paper's dev split for LR
    selection, `dev_fraction` of train held out deterministically (VTAB has its own: val200)."""

    name: str
    title: str  # as the paper's tables name it
    num_classes: int
    folder: str | None  # directory under --data-dir; None for an embedded dataset
    official_sizes: dict[str, int | None]  # split on disk -> official image count (None: no official size)
    load: Loader
    # what a transfer learns from, then is scored on: fine-tuning's final runs, few-shot's shots
    # and test images, k-NN's memory bank and queries, the linear probe's fit and test
    transfer_splits: tuple[str, str] = ("train", "test")
    # choosing a setting (fine-tuning's LR, pre-training's kept step): learn on the first, score on the second
    sweep_splits: tuple[str, str] = ("subtrain", "dev")
    dev_fraction: float | None = None  # held out of "train" as "dev" (None: the dataset has its own)
    group: str | None = None  # VTAB group: natural, specialized or structured
    train_flip: bool = True  # BiT's random horizontal flip at train time (off for some structured tasks)
    # the crop before the train-time resize (engine/train_data.CROP_MODES): vit_jax's "inception"
    # crop, BiT's "random" crop of a resized square (VTAB), or "none" (some structured tasks)
    train_crop: str = "inception"
    key_files: tuple[str, ...] = field(default=())  # files under `folder` whose presence means "found"
    # the files each split needs (default: all key files); what decides "missing" for a protocol
    split_files: dict[str, tuple[str, ...]] = field(default_factory=dict)
    source: str = ""  # the data source `load` reads (recorded with every result)
    # other sources by name (e.g. VTAB's "tfds"); their loaders get --data-dir itself
    other_sources: dict[str, Loader] = field(default_factory=dict)
    # what --download runs for a source before it is read (TFDS: build what is not prepared), given --data-dir
    fetchers: dict[str, Callable[[Path | None], None]] = field(default_factory=dict)
    # a test set scored with another dataset's classifier: the robustness sets are scored with the
    # checkpoint's ImageNet-1k head (1000), through each split's `class_map` (None: num_classes)
    head_classes: int | None = None
    # what the set is for, in `vitbench ls datasets` (e.g. "eval only: ImageNet-1k head, 200 classes")
    note: str = ""
    location: Path | None = None  # where a dataset outside --data-dir lives (folder:<path>): its data_dir
    # settings one protocol reads for this dataset, by the protocol's name, passed through untouched:
    # ImageNet's {"fewshot": {"train_limit": 65_000}} (big_vision draws its shots from train[:65000])
    per_protocol: dict[str, dict[str, Any]] = field(default_factory=dict)
    # the classes' names in label order where the data names them (folder:<path>: its class folders);
    # kept with each run's predictions, so per-class tables name classes without reading the data
    class_names: tuple[str, ...] | None = None
    # where the data is published and how it becomes `folder` under --data-dir (a dry run says it
    # for what is missing)
    how_to_get: str = ""

    @property
    def head_size(self) -> int:
        """The number of outputs the checkpoint's own classifier must have to score this dataset."""
        return self.head_classes or self.num_classes

    def root(self, data_dir: Path | None) -> Path | None:
        if self.folder is None:
            return None
        if data_dir is None:
            raise UserError(f"dataset {self.name} needs --data-dir (or VITBENCH_DATA) pointing at its parent folder")
        root = data_dir / self.folder
        if root.exists() and not root.is_dir():
            raise UserError(f"{root}: is a file, expected the {self.title} folder")
        return root

    @property
    def test_split(self) -> str:
        """The split its transfer results are scored on (the final runs' test split)."""
        return self.transfer_splits[1]

    @property
    def split_names(self) -> tuple[str, ...]:
        derived = ("subtrain", "dev") if self.dev_fraction else ()
        return (*self.official_sizes, *derived)

    def _derived(self, split: str) -> bool:
        """Whether `split` is held out of train here (subtrain, dev), not a split on disk."""
        return split in ("subtrain", "dev") and split not in self.official_sizes

    def _held_out(self, train: Split, split: str) -> Split:
        """subtrain or dev of `train`: the dev split is `dev_fraction` of a fixed permutation."""
        subtrain, dev = dev_holdout(len(train), self.dev_fraction or 0.0)
        return train.subset(split, subtrain if split == "subtrain" else dev)

    @property
    def official_sizes_known(self) -> bool:
        """Whether every split on disk has an official size: what a dry run plans it from without its files."""
        return bool(self.official_sizes) and None not in self.official_sizes.values()

    def official_split(self, split: str) -> Split:
        """A split of its official size and no files (a dry run's plan of data not fetched yet):
        labels spread evenly over the classes, so that what a protocol plans from them (shots per
        class, a per-class limit, a dev hold-out) is what the real split gives, near enough."""
        if self._derived(split):
            return self._held_out(self.official_split("train"), split)
        size = self.official_sizes[split] or 0
        labels = np.arange(size, dtype=np.int64) % self.num_classes
        return Split(self.name, split, labels, self.source, "absent", official_size=size)

    @property
    def sources(self) -> tuple[str, ...]:
        return (self.source, *self.other_sources)

    def needed_files(self, splits: tuple[str, ...] | None = None) -> list[str]:
        """The files (under `folder`) that `splits` read; every key file when no splits are given."""
        if splits is None:
            return list(self.key_files)
        names: list[str] = []
        for split in splits:
            on_disk = "train" if self._derived(split) else split
            names += [n for n in self.split_files.get(on_disk, self.key_files) if n not in names]
        return names

    def missing_for(self, data_dir: Path | None, splits: tuple[str, ...]) -> Path | None:
        """The first file or folder that `splits` need and `data_dir` lacks; None when all are there."""
        if self.folder is None:
            return None
        if data_dir is None:
            return Path(self.folder)
        root = data_dir / self.folder
        if not root.is_dir():
            return root
        missing = [root / name for name in self.needed_files(splits) if not (root / name).exists()]
        return missing[0] if missing else None

    def fetch(self, data_dir: Path | None, source: str | None) -> None:
        """Fetch what `source` needs that is not here yet (--download); nothing for a source without a fetcher."""
        fetcher = self.fetchers.get(source or self.source)
        if fetcher is not None:
            fetcher(data_dir)

    def load_split(self, data_dir: Path | None, split: str, source: str | None = None, verify: bool = False) -> Split:
        """The split from `source` (None: the dataset's own), fingerprinted by its files' contents
        where `verify` (--verify-data)."""
        if split not in self.split_names:
            raise UserError(f"dataset {self.name} has no split '{split}' (it has: {', '.join(self.split_names)})")
        if source not in (None, self.source) and source not in self.other_sources:
            raise UserError(f"--data-source {source}: dataset {self.name} reads {' or '.join(self.sources)}")
        if self._derived(split):
            return self._held_out(self.load_split(data_dir, "train", source, verify), split)
        other = self.other_sources.get(source) if source is not None else None
        result = other(data_dir, split) if other is not None else self.load(self.root(data_dir), split)
        if verify and result.reread is not None:  # --verify-data re-reads what it verifies: no kept index trusted
            result = result.reread()
        result.official_size = self.official_sizes.get(split)
        if verify and result.content_fingerprint is not None:
            result.fingerprint, result.content_fingerprint = result.content_fingerprint(), None
        elif verify and result.paths is not None:  # a plugin's loader that does not say how
            log.warning("%s %s: its loader gives no fingerprint by contents; --verify-data cannot apply", self.name,
                        split)  # fmt: skip
        if result.is_subset:
            log.warning(
                "%s %s: %d images, the official split has %d: a subset, so numbers are not comparable with the paper's",
                self.name,
                split,
                len(result),
                result.official_size,
            )
        check_label_range(result.labels, self.num_classes, result.label_file or f"{self.name} {split}")
        if result.class_map is not None:
            check_class_map(result.class_map, self.num_classes, self.head_size, f"{self.name} {split}")
        return result


@dataclass(frozen=True)
class DatasetFormat:
    """A parametric dataset: `PREFIX:<argument>` (`folder:<path>`, a plugin's `csv:<file>`), read
    into a DatasetSpec when a run names it. `build` gets the argument and returns a spec whose name
    starts with `PREFIX:` and tells two datasets apart (folder: the tree's name and a hash of its
    path); a bad argument is a UserError naming it."""

    prefix: str
    build: Callable[[str], DatasetSpec]
    summary: str  # a line for `vitbench ls datasets`: what the argument is
    # what --download does for an argument before it is built (hf:<repo id>: the Hub's snapshot into
    # its cache); None: the format reads what is there
    fetch: Callable[[str], None] | None = None


def dev_holdout(n: int, fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """(subtrain, dev) indices: the last `fraction` of a fixed permutation of train is the dev split.

    TFDS slices `train[:98%]` / `train[98%:]` of its own shuffled order, with the boundary rounded
    as TFDS rounds it; on-disk orders are often sorted by class, so the permutation comes first."""
    boundary = int(round(n * round(100 * (1 - fraction)) / 100))
    order = np.random.default_rng(DEV_SEED).permutation(n)
    return np.sort(order[:boundary]), np.sort(order[boundary:])


def check_label_range(labels: np.ndarray, num_classes: int, where: object) -> None:
    if len(labels) and (labels.min() < 0 or labels.max() >= num_classes):
        bad = int(labels.min() if labels.min() < 0 else labels.max())
        raise UserError(f"{where}: label {bad} is outside 0..{num_classes - 1}")


def check_class_map(class_map: list[list[int]], num_classes: int, head_size: int, where: object) -> None:
    """A class map names, for each of the dataset's classes, at least one of the head's classes."""
    if len(class_map) != num_classes:
        raise UserError(f"{where}: its class map covers {len(class_map)} classes, the dataset has {num_classes}")
    for label, classes in enumerate(class_map):
        if not classes or not all(0 <= c < head_size for c in classes):
            raise UserError(f"{where}: class {label} maps to {classes}, expected head classes 0..{head_size - 1}")


def require(path: Path, what: str) -> Path:
    if not path.exists():
        raise UserError(f"missing {what}: {path}")
    return path


def require_dir(path: Path, what: str) -> Path:
    require(path, what)
    if not path.is_dir():
        raise UserError(f"{path}: is a file, expected the {what}")
    return path


MAX_LABEL_FILE_BYTES = 256 * 2**20  # ImageNet train's file list is some 40 MB; ReaL's JSON 1.6 MB


def read_label_file(path: Path, what: str = "list file") -> str:
    """The text of a dataset's list or label file (Pets' annotations, ImageNet's synset_words.txt and
    real.json, flat val labels), checked before it is read: a regular file (a FIFO hung `run
    --dry-run` and `doctor`; a folder was a traceback), of a bounded size, UTF-8 text."""
    require(path, what)
    if path.is_dir():
        raise UserError(f"{path}: is a folder, expected the {what}")
    try:
        size = path.stat().st_size
        if size > MAX_LABEL_FILE_BYTES:
            raise UserError(f"{path}: {size:,} bytes, expected the {what} (at most {MAX_LABEL_FILE_BYTES:,})")
        raw = read_regular(path)
    except OSError as e:
        raise UserError(f"{path}: {e.strerror or e}, expected the {what} (a regular file)") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise UserError(f"{path}: not a text file, expected the {what}") from None


def numbered_lines(path: Path, what: str = "list file") -> Iterator[tuple[int, str]]:
    """(line number, text) of the non-blank, non-comment lines of a list file."""
    text = read_label_file(path, what)
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip() and not line.lstrip().startswith("#"):
            yield number, line.strip()


def check_listed(listing: Path, entries: list[tuple[int, str]]) -> None:
    """Every (line number, image) a list file names must exist: name the first missing one and the count."""
    missing = [(number, path) for number, path in entries if not os.path.isfile(path)]
    if missing:
        number, path = missing[0]
        raise UserError(
            f"{listing}:{number}: names a missing image {path} ({len(missing)} of {len(entries)} listed images missing)"
        )

"""What `vitbench doctor` reports per dataset: found / incomplete / absent, and each split's image
count against the official count (a subset is flagged, not an error)."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vitbench.datasets.base import DatasetSpec
from vitbench.datasets.paper_sources import metadata_counts, present_sources
from vitbench.errors import UserError

log = logging.getLogger("vitbench")


@dataclass
class SplitCount:
    split: str
    count: int | None  # None: could not be read (see error)
    official: int | None
    error: str | None = None
    classes: tuple[int, int] | None = None  # (present in the split, the dataset's): said where fewer than all

    @property
    def is_subset(self) -> bool:
        return self.count is not None and self.official is not None and self.count != self.official

    def describe(self) -> str:
        if self.count is None:
            return f"{self.split} — ({self.error})" if self.error else f"{self.split} —"
        official = f" / {self.official:,}" if self.official is not None else ""
        fewer = self.classes is not None and self.classes[0] < self.classes[1]
        covers = f": {self.classes[0]:,} of {self.classes[1]:,} classes" if fewer else ""  # type: ignore[index]
        return f"{self.split} {self.count:,}{official}" + (f" (subset{covers})" if self.is_subset or fewer else "")


def empty_files(paths: list[str]) -> list[str]:
    """The files of a split that hold no byte (os.stat each: doctor's cost, not a run's)."""
    found = []
    for path in paths:
        try:
            if os.stat(path).st_size == 0:
                found.append(path)
        except OSError:
            continue  # vanished since listed: the run names it when it reads it
    return found


def find_status(spec: DatasetSpec, data_dir: Path | None) -> str:
    """found / incomplete (naming the first missing file, relative to data_dir, and how many are
    missing) / absent, from the presence of the key files alone (nothing is loaded). Relative,
    because doctor's title already names data_dir and a deep absolute path wraps the table cell."""
    if spec.folder is None:
        return "embedded"
    if data_dir is None:
        return "absent (no --data-dir)"
    root = data_dir / spec.folder
    if not root.exists():
        return "absent"
    if not root.is_dir():
        return f"incomplete: {spec.folder} is a file, expected a folder"
    missing = [f for f in spec.needed_files() if not (root / f).exists()]
    if missing:
        more = f" ({len(missing)} of {len(spec.key_files)} key files missing)" if len(missing) > 1 else ""
        return f"incomplete: missing {Path(spec.folder) / missing[0]}{more}"
    return "found"


def dataset_status(spec: DatasetSpec, data_dir: Path | None) -> tuple[str, list[SplitCount]]:
    """The status line and, where anything is there, the count of every split on disk."""
    status = find_status(spec, data_dir)
    if status.startswith("absent"):
        return status, []
    counts = []
    quiet = log.level
    log.setLevel(logging.ERROR)  # the subset warnings are what the counts show
    try:
        for split, official in spec.official_sizes.items():
            try:
                loaded = spec.load_split(data_dir, split)
                empty = empty_files(loaded.paths or [])
                if empty:  # 200,000 empty files were "found (subset)": no image in them
                    raise UserError(
                        f"{len(empty):,} of {len(loaded):,} image files are empty (0 bytes), e.g. {empty[0]}"
                    )
                present = int(np.unique(loaded.labels).size)  # chance is 100 / these, in a subset too
                counts.append(SplitCount(split, len(loaded), official, classes=(present, int(spec.num_classes))))
            except UserError as e:  # named relative to data_dir, as the status is
                where = f"{data_dir}{os.sep}" if data_dir is not None else ""
                counts.append(SplitCount(split, None, official, str(e).replace(where, "")))
    finally:
        log.setLevel(quiet)
    errors = [c.error for c in counts if c.error]
    if status == "found" and errors:
        status = f"incomplete: {errors[0]}"
    elif status == "found" and any(c.is_subset for c in counts):
        status = "found (subset)"
    elif status.startswith("incomplete: missing") and counts and not errors:
        # every split loads without some key files (the shared CIFAR-10 holds data_batch_1 alone): a
        # subset, as the other subsets read, naming what is absent (issue 89: it read "incomplete")
        root = Path(data_dir or ".") / (spec.folder or "")  # both set: "incomplete" found a folder
        missing = [f for f in spec.needed_files() if not (root / f).exists()]
        status = f"found (subset: {len(missing)} of {len(spec.key_files)} key files absent, e.g. {missing[0]})"
    return status, counts


def source_counts(spec: DatasetSpec, data_dir: Path | None) -> list[tuple[str, list[SplitCount]]]:
    """(source, counts) for each container source of a paper dataset found under data_dir (`--data-source
    hf|wds|tfds`): the counts the container's metadata gives, against the official ones, no image read."""
    found = []
    for source in present_sources(spec, data_dir):
        try:
            counts = metadata_counts(spec, data_dir, source)
            found.append(
                (source, [SplitCount(s, counts.get(s), official) for s, official in spec.official_sizes.items()])
            )
        except UserError as e:
            found.append(
                (source, [SplitCount(s, None, official, str(e)) for s, official in spec.official_sizes.items()][:1])
            )
    return found

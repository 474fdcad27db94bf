"""The image files of a folder, as every ImageFolder-style loader lists them (folder: trees, ImageNet,
ObjectNet): the suffixes read as images, the other files counted in one warning per folder."""

from __future__ import annotations

import logging
import os
from collections import Counter
from pathlib import Path

from vitbench.datasets.base import require_dir
from vitbench.errors import UserError

log = logging.getLogger("vitbench")

# the files read as images: torchvision's ImageFolder's (datasets.folder.IMG_EXTENSIONS); any other
# file in an image folder is left out, and counted in a warning (a GIF copy was left out unseen)
IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp"}


def image_files(folder: Path, left_out: Counter | None = None) -> list[str]:
    """The images of a folder, sorted; `left_out` counts the other files by suffix. scandir's entry
    types need no stat per file (ImageNet train lists 1.28M files)."""
    with os.scandir(folder) as entries:
        found = [(e, os.path.splitext(e.name)[1].lower()) for e in entries]
    if left_out is not None:
        left_out.update(suffix or "(no suffix)" for e, suffix in found if suffix not in IMAGE_SUFFIXES and _is_file(e))
    return sorted(e.path for e, suffix in found if suffix in IMAGE_SUFFIXES and _is_file(e))


_TOLD_LEFT_OUT: set[Path] = set()


def say_left_out(folder: Path, left_out: Counter) -> None:
    """One warning per folder and process for the files an image listing left out."""
    if left_out and folder not in _TOLD_LEFT_OUT:
        _TOLD_LEFT_OUT.add(folder)
        kinds = ", ".join(f"{suffix} ×{n}" for suffix, n in sorted(left_out.items()))
        log.warning("%s: left out %d file(s) that are not images vitbench reads (%s; it reads %s)",
                    folder, left_out.total(), kinds, " ".join(sorted(IMAGE_SUFFIXES)))  # fmt: skip


def _is_file(entry: os.DirEntry) -> bool:
    try:
        return entry.is_file()
    except OSError as e:  # a symlink loop
        raise UserError(f"{entry.path}: cannot be read ({e.strerror or e})") from None


def images_under(folder: Path, left_out: Counter | None = None) -> list[str]:
    """The images of a class folder and of every folder under it, in torchvision's ImageFolder order
    (`sorted(os.walk(class_dir, followlinks=True))`, each folder's files sorted): 2 of 6 images were
    read where a class folder held subfolders. A folder reached twice (a link back up) is walked once."""
    found: list[str] = []
    seen: set[tuple[int, int]] = set()
    for root, _, _ in sorted(os.walk(folder, followlinks=True)):
        try:
            stat = os.stat(root)
        except OSError as e:
            raise UserError(f"{root}: cannot be read ({e.strerror or e})") from None
        if (stat.st_dev, stat.st_ino) in seen:
            continue
        seen.add((stat.st_dev, stat.st_ino))
        found += image_files(Path(root), left_out)
    return found


def class_folders(folder: Path, what: str) -> list[tuple[Path, list[str]]]:
    """(class folder, its images) for each <class>/ folder of an ImageFolder split, the images of its
    subfolders included (torchvision's ImageFolder reads them); an empty one is an error."""
    require_dir(folder, what)
    found, left_out = [], Counter[str]()
    for class_dir in sorted(p for p in folder.iterdir() if p.is_dir()):
        files = images_under(class_dir, left_out)
        if not files:
            raise UserError(f"{class_dir}: empty class folder (no images)")
        found.append((class_dir, files))
    say_left_out(folder, left_out)
    return found


def holds_images(root: Path, look: int = 2000) -> bool:
    """Whether an image file is among the first `look` entries under `root` (hf: given a class-folder
    tree points to folder:), without walking a large tree whole."""
    seen = 0
    for _, _, files in os.walk(root):
        for name in files:
            if Path(name).suffix.lower() in IMAGE_SUFFIXES:
                return True
        seen += len(files) + 1
        if seen > look:
            return False
    return False

"""The ImageNet robustness test sets, each read from the layout its archive extracts to, and scored
with the checkpoint's own ImageNet-1k classifier (`--protocol eval`):

| dataset | folder under --data-dir | layout | scored over |
|---|---|---|---|
| imagenet-v2 (-threshold, -top) | imagenetv2-<variant>-format-val | `<class index 0..999>/*.jpeg` | 1000 classes |
| imagenet-r, imagenet-a | imagenet-r, imagenet-a | `<synset>/*.jpg`, 200 synsets each | their 200 classes |
| imagenet-sketch | sketch | `<synset>/*.JPEG`, 1000 synsets | 1000 classes |
| objectnet | objectnet-1.0 | `images/<folder>/*.png` + `mappings/` | the 113 classes that overlap ImageNet |

ImageNet-R and -A hold 200 of the 1000 classes: scored over all 1000, a model loses points for
predicting a class the set cannot contain, so the logits are restricted to the 200 (Hendrycks et
al.'s own evaluation; timm ships the synsets and their ImageNet indices). ObjectNet's classes map to
one or more ImageNet classes each (its `mappings/` files): a class's logit is the max over its
ImageNet classes (wise-ft's `project_logits`, the common practice), and the 1-pixel red border
every image carries is cropped first (ObjectNet's README)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np

from vitbench.datasets.base import DatasetSpec, Split, fingerprinted, read_label_file, require_dir
from vitbench.datasets.image_folders import image_files, say_left_out
from vitbench.datasets.imagenet import imagenet_synsets, synset_folders, timm_info
from vitbench.errors import UserError, one_line
from vitbench.provenance import sha256_file

IMAGENET_CLASSES = 1000
OBJECTNET_CLASSES = 113  # ObjectNet's classes that overlap ImageNet-1k
OBJECTNET_BORDER = 1  # pixels: "a 1 pixel red border around each image which must be removed" (its README)
OBJECTNET_MAPPINGS = (
    "folder_to_objectnet_label.json",  # {image folder: ObjectNet label}
    "objectnet_to_imagenet_1k.json",  # {ObjectNet label: "ImageNet name; ImageNet name"} (the 113 overlapping)
    "pytorch_to_imagenet_2012_id.json",  # {PyTorch/timm class index: line of imagenet_to_label_2012_v2}
    "imagenet_to_label_2012_v2",  # one ImageNet class name per line
)
V2_VARIANTS = {  # dataset -> (title, the folder its tarball extracts to)
    "imagenet-v2": ("ImageNet-V2", "imagenetv2-matched-frequency-format-val"),
    "imagenet-v2-threshold": ("ImageNet-V2 threshold-0.7", "imagenetv2-threshold0.7-format-val"),
    "imagenet-v2-top": ("ImageNet-V2 top-images", "imagenetv2-top-images-format-val"),
}


LAYOUTS = {  # what each source expects, for the error when a folder holds no images
    "imagenetv2-folder": "class folders named 0..999 holding the images",
    "synset-folder": "<synset>/ class folders holding the images",
    "objectnet-folder": "<class>/ folders named in mappings/folder_to_objectnet_label.json, holding .png images",
}


def _split(name: str, source: str, root: Path, paths: list[str], labels: list[int], extra: list[Path]) -> Split:
    """The test split; its fingerprint covers the image listing and the class-list files used."""
    if not paths:
        raise UserError(f"{root}: no images (expected {LAYOUTS[source]})")
    fingerprint = fingerprinted(root, paths, "".join(sha256_file(p)[:8] for p in extra))
    return Split(name, "test", np.asarray(labels, dtype=np.int64), source, **fingerprint, paths=paths)


def _v2_loader(name: str, title: str) -> Callable[[Path | None, str], Split]:
    index = {str(i): i for i in range(IMAGENET_CLASSES)}

    def load(root: Path | None, _split_name: str) -> Split:
        assert root is not None
        folder = require_dir(root, f"{title} folder")
        among = "the class indices 0..999 (ImageNet-V2 names each class folder by its ImageNet index)"
        paths, labels = synset_folders(folder, index, f"{title} folder", among)
        return _split(name, "imagenetv2-folder", folder, paths, labels, [])

    return load


def _subset_loader(name: str, title: str, prefix: str) -> Callable[[Path | None, str], Split]:
    """ImageNet-R / -A: 200 synset folders, labelled 0..199 in timm's synset order, each mapped
    to its ImageNet-1k index from timm's `<prefix>_indices.txt`."""

    def load(root: Path | None, _split_name: str) -> Split:
        assert root is not None
        folder = require_dir(root, f"{title} folder")
        synsets_file, indices_file = timm_info(f"{prefix}_synsets.txt"), timm_info(f"{prefix}_indices.txt")
        synsets = synsets_file.read_text().split()
        indices = [int(i) for i in indices_file.read_text().split()]
        position = {s: i for i, s in enumerate(synsets)}
        among = f"the {len(synsets)} {title} synsets (timm's {synsets_file.name})"
        paths, labels = synset_folders(folder, position, f"{title} folder", among)
        split = _split(name, "synset-folder", folder, paths, labels, [synsets_file, indices_file])
        split.class_map = [[i] for i in indices]
        return split

    return load


def _load_sketch(root: Path | None, _split_name: str) -> Split:
    assert root is not None
    folder = require_dir(root, "ImageNet-Sketch folder")
    index = {s: i for i, s in enumerate(imagenet_synsets(folder))}
    paths, labels = synset_folders(folder, index, "ImageNet-Sketch folder", "the 1000 ImageNet synsets")
    return _split("imagenet-sketch", "synset-folder", folder, paths, labels, [])


def _json_object(path: Path) -> dict:
    try:
        found = json.loads(read_label_file(path, "ObjectNet mapping file"))
    except ValueError as e:
        raise UserError(f"{path}: not a JSON file ({one_line(e, 80)})") from None
    if not isinstance(found, dict):
        raise UserError(f"{path}: expected a JSON object (as ObjectNet's mappings/ ship it)")
    return found


def objectnet_classes(root: Path) -> dict[str, list[int]]:
    """ObjectNet's overlap with ImageNet from the archive's own `mappings/` files: image folder ->
    the ImageNet-1k class indices (PyTorch's order, which is timm's) of its ObjectNet label."""
    maps = root / "mappings"
    folder_of = {str(label): str(folder) for folder, label in _json_object(maps / OBJECTNET_MAPPINGS[0]).items()}
    to_imagenet = _json_object(maps / OBJECTNET_MAPPINGS[1])
    index_of_line: dict[int, int] = {}
    for index, line in _json_object(maps / OBJECTNET_MAPPINGS[2]).items():
        try:
            index_of_line[int(line)] = int(index)
        except (TypeError, ValueError):
            where = maps / OBJECTNET_MAPPINGS[2]
            raise UserError(f"{where}: expected class index -> line number pairs, got {index!r}: {line!r}") from None
    names_file = maps / OBJECTNET_MAPPINGS[3]
    names = read_label_file(names_file, "ObjectNet mapping file").splitlines()
    line_of = {name.strip(): number for number, name in enumerate(names)}
    classes: dict[str, list[int]] = {}
    for label, names in to_imagenet.items():
        if label not in folder_of:
            where = maps / OBJECTNET_MAPPINGS[1]
            raise UserError(f"{where}: label {label!r} has no folder in {OBJECTNET_MAPPINGS[0]}")
        indices = []
        for imagenet_name in str(names).split("; "):
            line = line_of.get(imagenet_name.strip())
            if line is None or line not in index_of_line:
                raise UserError(
                    f"{maps / OBJECTNET_MAPPINGS[1]}: '{imagenet_name}' (for {label!r}) is not in {names_file.name}"
                )
            indices.append(index_of_line[line])
        classes[folder_of[label]] = indices
    return classes


def _load_objectnet(root: Path | None, _split_name: str) -> Split:
    """The images of the overlapping classes (the others are not ImageNet classes), labelled by
    their folders' sorted order; the other 200 folders of the archive are not read."""
    assert root is not None
    images = require_dir(root / "images", "ObjectNet images folder")
    classes = objectnet_classes(root)
    if len(classes) != OBJECTNET_CLASSES:
        where = root / "mappings" / OBJECTNET_MAPPINGS[1]
        raise UserError(f"{where}: maps {len(classes)} ObjectNet classes to ImageNet, expected {OBJECTNET_CLASSES}")
    folders = sorted(classes)
    paths: list[str] = []
    labels: list[int] = []
    left_out = Counter[str]()
    for label, folder in enumerate(folders):
        if (images / folder).is_dir():  # a class folder that is not there: a subset, reported by count
            files = image_files(images / folder, left_out)
            paths += files
            labels += [label] * len(files)
    say_left_out(images, left_out)
    mappings = [root / "mappings" / m for m in OBJECTNET_MAPPINGS]
    split = _split("objectnet", "objectnet-folder", images, paths, labels, mappings)
    split.class_map = [classes[f] for f in folders]
    split.border = OBJECTNET_BORDER
    return split


def _spec(name: str, title: str, classes: int, folder: str, size: int, load, source: str, **kw) -> DatasetSpec:
    scored = "all 1000 classes" if classes == IMAGENET_CLASSES else f"restricted to its {classes} classes"
    return DatasetSpec(
        name,
        title,
        classes,
        folder,
        {"test": size},
        load,
        source=source,
        head_classes=IMAGENET_CLASSES,
        note=f"test set only (--protocol eval): an ImageNet-1k head, {scored}",
        how_to_get=PUBLISHED.get(name, PUBLISHED.get(source, "")),
        **kw,
    )


# where each set is published (a dry run says it for what is missing)
PUBLISHED = {
    "imagenetv2-folder": "https://github.com/modestyachts/ImageNetV2 (its Hugging Face tarballs), extracted "
    "under --data-dir",
    "imagenet-r": "https://github.com/hendrycks/imagenet-r (imagenet-r.tar), extracted under --data-dir",
    "imagenet-a": "https://github.com/hendrycks/natural-adv-examples (imagenet-a.tar), extracted under --data-dir",
    "imagenet-sketch": "https://github.com/HaohanWang/ImageNet-Sketch (ImageNet-Sketch.zip: its sketch/ folder) "
    "under --data-dir",
    "objectnet": "https://objectnet.dev/download.html (objectnet-1.0.zip, with its mappings/) under --data-dir",
}
R_LOADER = _subset_loader("imagenet-r", "ImageNet-R", "imagenet_r")
A_LOADER = _subset_loader("imagenet-a", "ImageNet-A", "imagenet_a")
ROBUSTNESS = [
    *(_spec(n, t, 1000, f, 10_000, _v2_loader(n, t), "imagenetv2-folder") for n, (t, f) in V2_VARIANTS.items()),
    _spec("imagenet-r", "ImageNet-R", 200, "imagenet-r", 30_000, R_LOADER, "synset-folder"),
    _spec("imagenet-a", "ImageNet-A", 200, "imagenet-a", 7_500, A_LOADER, "synset-folder"),
    _spec("imagenet-sketch", "ImageNet-Sketch", 1000, "sketch", 50_889, _load_sketch, "synset-folder"),
    # 18,574 images in the 113 overlapping classes (Taori et al. 2020), of ObjectNet's 50,000
    _spec(
        "objectnet",
        "ObjectNet",
        OBJECTNET_CLASSES,
        "objectnet-1.0",
        18_574,
        _load_objectnet,
        "objectnet-folder",
        key_files=("images", *(f"mappings/{m}" for m in OBJECTNET_MAPPINGS)),
    ),
]
ROBUSTNESS_NAMES = tuple(s.name for s in ROBUSTNESS)

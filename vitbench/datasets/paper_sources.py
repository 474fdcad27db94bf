"""The paper's datasets from the containers researchers keep them in: `--data-source hf|wds|tfds`
gives ImageNet, CIFAR-10/100, Pets and Flowers-102 from a Hugging Face dataset, WebDataset shards
or a prepared TFDS build, under the dataset's own name, splits and official sizes (a count that
differs is flagged as a subset, as for the folders). Where each is looked for, under --data-dir:

- hf:   `<data-dir>/hf/<name>/` (parquet or save_to_disk), else the Hub repo in the local Hub cache
        (fetched with --download)
- wds:  `<data-dir>/wds/<name>/` (`<split>-*.tar`, as timm's `imagenet-1k-wds` is laid out)
- tfds: the TFDS build `<builder>` in the TFDS data_dir `<data-dir>` (what big_vision reads)

The source is each result's `data_source` (part of its key), as `tfds` and `vtab-folder` are."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path

from vitbench.datasets.base import DatasetSpec, Loader, Split
from vitbench.datasets.hf_format import hf_spec
from vitbench.datasets.tfds_format import tfds_spec
from vitbench.datasets.wds_format import wds_spec
from vitbench.errors import UserError

SOURCES = ("hf", "wds", "tfds")


@dataclass(frozen=True)
class Published:
    """Where a paper dataset is published in each container format."""

    hub_repo: str  # the Hub dataset repo (parquet)
    label: str  # its label column (CIFAR-100: the fine labels)
    wds_name: str  # its folder of shards under <data-dir>/wds/
    tfds_builder: str  # the TFDS builder big_vision names
    splits: dict[str, str]  # vitbench's split -> the container's (validation is `val` in both)


PUBLISHED = {
    "cifar10": Published("uoft-cs/cifar10", "label", "cifar10", "cifar10", {"train": "train", "test": "test"}),
    "cifar100": Published("uoft-cs/cifar100", "fine_label", "cifar100", "cifar100", {"train": "train", "test": "test"}),
    "pets": Published(
        "timm/oxford-iiit-pet", "label", "oxford-iiit-pet", "oxford_iiit_pet", {"train": "train", "test": "test"}
    ),  # fmt: skip
    "flowers102": Published(
        "nelorth/oxford-flowers",
        "label",
        "oxford-flowers102",
        "oxford_flowers102",
        {"train": "train", "val": "val", "test": "test"},
    ),  # fmt: skip
    "imagenet": Published(
        "ILSVRC/imagenet-1k", "label", "imagenet-1k-wds", "imagenet2012", {"train": "train", "val": "val"}
    ),
}


def location(name: str, source: str, data_dir: Path | None) -> str:
    """The `PREFIX:<argument>` that reads dataset `name` from `source`."""
    published = PUBLISHED[name]
    if source == "hf":
        folder = data_dir / "hf" / published.hub_repo.rsplit("/", 1)[-1] if data_dir is not None else None
        return f"hf:{folder if folder is not None and folder.is_dir() else published.hub_repo}#{published.label}"
    if data_dir is None:
        raise UserError(f"--data-source {source} needs --data-dir (the folder holding {source}/ or the TFDS data_dir)")
    if source == "wds":
        folder = data_dir / "wds" / published.wds_name
        if not folder.is_dir():
            raise UserError(f"{folder}: missing; --data-source wds reads {name}'s shards (<split>-*.tar) there")
        return f"wds:{folder}"
    builder = data_dir / published.tfds_builder
    versions = sorted((p for p in builder.glob("*") if (p / "dataset_info.json").is_file()), key=_version_key)
    if not versions:
        raise UserError(f"{builder}: no prepared TFDS {published.tfds_builder} build there (tfds build, or --download)")
    return f"tfds:{versions[-1]}"


def _version_key(path: Path) -> tuple[int, ...]:
    try:
        return tuple(int(p) for p in path.name.split("."))
    except ValueError:
        return (-1,)


@cache
def _container(argument: str, num_classes: int) -> DatasetSpec:
    """The container's spec; where it does not name its classes, the dataset's count is theirs
    (a subset's train split may hold fewer of them: the shared Pets holds 6 of 37 breeds)."""
    prefix, _, rest = argument.partition(":")
    if prefix == "tfds":
        return tfds_spec(rest)
    return {"hf": hf_spec, "wds": wds_spec}[prefix](rest, known_classes=num_classes)


def container_loader(spec_name: str, num_classes: int, source: str) -> Loader:
    """Read a paper dataset's split from `source`: its container, checked to hold the dataset's classes."""

    def load(data_dir: Path | None, split: str) -> Split:
        container = _container(location(spec_name, source, data_dir), num_classes)
        if container.num_classes != num_classes:
            raise UserError(
                f"{container.name}: {container.num_classes} classes, {spec_name} has {num_classes}: "
                f"not {spec_name} (--data-source {source})"
            )
        check_class_order(container, spec_name, source)
        theirs = PUBLISHED[spec_name].splits[split]
        if theirs not in container.split_names:
            raise UserError(f"{container.name}: has no {theirs} split for {spec_name} {split}")
        found = container.load_split(None, theirs)
        named = replace(found, dataset=spec_name, name=split)
        if found.reread is not None:  # --verify-data's re-read, named as this dataset too
            reread = found.reread
            named.reread = lambda: replace(reread(), dataset=spec_name, name=split)
        return named

    return load


# CIFAR-10's classes in the order of its `batches.meta` (the labels every CIFAR-10 classifier was trained on)
CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")


def canonical_classes(spec_name: str) -> list[tuple[str, ...]]:
    """The names each class of a paper dataset goes by, in its canonical order (ImageNet: the synset
    and its words, as timm lists them); empty where vitbench knows no names to check against."""
    if spec_name == "imagenet":
        from timm.data import ImageNetInfo

        info = ImageNetInfo()
        return [(synset, info.index_to_description(i)) for i, synset in enumerate(info.label_names())]
    if spec_name == "cifar10":
        return [(name,) for name in CIFAR10_CLASSES]
    return []


def _normal(name: str) -> str:
    return " ".join(name.lower().replace("_", " ").split())


def check_class_order(container: DatasetSpec, spec_name: str, source: str) -> None:
    """A container whose class names are the dataset's in another order is refused: its label 0 is
    not the class a classifier's output 0 scores (a permuted ImageNet scored 0 % where the canonical
    order gives 72 %). Names vitbench does not know are not judged."""
    canonical = canonical_classes(spec_name)
    if not container.class_names or not canonical:
        return
    seen = Counter(_normal(name) for names in canonical for name in set(names))
    # a name two classes share (ImageNet's bird and machine are both 'crane') tells nothing
    index = {_normal(name): i for i, names in enumerate(canonical) for name in names if seen[_normal(name)] == 1}
    for i, name in enumerate(container.class_names):
        j = index.get(_normal(name))
        if j is not None and j != i:
            raise UserError(
                f"{container.name}: its class {i} is '{name}', {spec_name}'s class {i} is '{canonical[i][-1]}' "
                f"(--data-source {source}): the classes are in another order than {spec_name}'s, so scores "
                f"would go to the wrong classes; write the labels in {spec_name}'s order"
            )


def with_container_sources(spec: DatasetSpec) -> DatasetSpec:
    """`spec` able to read its splits from the container sources too (`--data-source hf|wds|tfds`)."""
    if spec.name not in PUBLISHED:
        return spec
    loaders = {s: container_loader(spec.name, spec.num_classes, s) for s in SOURCES}
    return replace(spec, other_sources={**spec.other_sources, **loaders})


def present_sources(spec: DatasetSpec, data_dir: Path | None) -> list[str]:
    """The container sources of a paper dataset that are there: a folder under --data-dir (hf/,
    wds/) or a prepared TFDS build in it; a Hub repo only in the Hub cache is not looked up here."""
    if spec.name not in PUBLISHED or data_dir is None:
        return []
    published = PUBLISHED[spec.name]
    there = {
        "hf": (data_dir / "hf" / published.hub_repo.rsplit("/", 1)[-1]).is_dir(),
        "wds": (data_dir / "wds" / published.wds_name).is_dir(),
        "tfds": any((data_dir / published.tfds_builder).glob("*/dataset_info.json")),
    }
    return [s for s in SOURCES if there[s]]


def metadata_counts(spec: DatasetSpec, data_dir: Path | None, source: str) -> dict[str, int | None]:
    """Each split's image count as the container's metadata gives it (parquet footers, _info.json,
    TFDS's split info), or, for shards without an _info.json, from their index (tar headers only)."""
    container = _container(location(spec.name, source, data_dir), spec.num_classes)
    counts: dict[str, int | None] = {}
    for ours, theirs in PUBLISHED[spec.name].splits.items():
        if theirs not in container.split_names:
            counts[ours] = None
            continue
        known = container.official_sizes.get(theirs)
        counts[ours] = known if known is not None else len(container.load_split(None, theirs))
    return counts

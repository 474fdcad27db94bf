"""`hf:<folder or Hub repo id>[#<label column>]`: a Hugging Face dataset, as the Hub keeps it
(parquet files, `data/train-00000-of-00004.parquet`: an `image` column of {bytes, path} and a
ClassLabel column) or as `save_to_disk` writes it (a DatasetDict folder of Arrow files).

Nothing is converted or copied: parquet is read a row group at a time with pyarrow (footers give
the row counts, so a split is indexed without reading an image), Arrow files are memory-mapped.
The image and label columns come from the dataset's own features (the `huggingface` metadata the
datasets library writes into every file: Image, ClassLabel with its names); without them, the one
integer column is the label, or the one named after `#`. A repo id is looked up in the local Hub
cache only, unless downloads are allowed (--download): then huggingface_hub fetches it."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vitbench.datasets.base import DatasetFormat, DatasetSpec
from vitbench.datasets.container_spec import ContainerSplit, by_split, container_spec, identity, read_once, split_of
from vitbench.datasets.image_folders import holds_images
from vitbench.datasets.records import Records, open_binary, remote_fs, store_errors
from vitbench.datasets.table_images import TableImages, image_paths, parquet_image_paths
from vitbench.datasets.table_images import pyarrow_module as _pyarrow
from vitbench.errors import UserError, one_line
from vitbench.files import downloads

PREFIX = "hf"
IMAGE_NAMES = ("image", "img", "jpg", "png", "webp")
LABEL_NAMES = ("label", "labels", "fine_label", "cls", "class")


@dataclass
class Columns:
    """Which column holds the image and which the label, and the classes' names where the
    features name them."""

    image: str
    label: str
    names: list[str] | None


def hf_features(schema) -> dict[str, Any]:
    """The datasets library's features, kept in a parquet or Arrow schema's `huggingface` metadata."""
    meta = (schema.metadata or {}).get(b"huggingface")
    if not meta:
        return {}
    try:
        info = json.loads(meta)
    except ValueError:
        return {}
    return dict((info.get("info") or {}).get("features") or {})


def choose_columns(schema, label_key: str | None, where: str) -> Columns:
    """The image and label columns of `schema` (a pyarrow schema), from the features or the types."""
    pa = _pyarrow()
    features = hf_features(schema)
    kind = {name: (value or {}).get("_type") for name, value in features.items() if isinstance(value, dict)}
    images = [n for n, t in kind.items() if t == "Image"] or [
        f.name for f in schema if _is_image_type(pa, f.type) and f.name.lower() in IMAGE_NAMES
    ] or [f.name for f in schema if _is_image_type(pa, f.type)]  # fmt: skip
    if not images:
        raise UserError(f"{where}: no image column (expected an Image feature, or {{bytes, path}} or binary data)")
    if label_key is not None:
        if label_key not in schema.names:
            raise UserError(f"{where}: no label column '{label_key}' (columns: {', '.join(schema.names)})")
        label = label_key
    else:
        labelled = [n for n, t in kind.items() if t == "ClassLabel"]
        integers = [f.name for f in schema if pa.types.is_integer(f.type)]
        candidates = labelled or integers
        named = [n for n in candidates if n.lower() in LABEL_NAMES]
        if len(candidates) == 1 or len(named) == 1:
            label = candidates[0] if len(candidates) == 1 else named[0]
        elif not candidates:
            raise UserError(
                f"{where}: no label column (an integer or ClassLabel column; columns: {', '.join(schema.names)})"
            )
        else:
            raise UserError(
                f"{where}: {len(candidates)} label columns ({', '.join(candidates)}); name one: "
                f"hf:<folder>#{candidates[0]}"
            )
    if not pa.types.is_integer(schema.field(label).type):
        raise UserError(f"{where}: label column '{label}' holds {schema.field(label).type}, expected integers")
    names = (features.get(label) or {}).get("names") if isinstance(features.get(label), dict) else None
    return Columns(images[0], label, list(names) if names else None)


def _is_image_type(pa, kind) -> bool:
    if pa.types.is_struct(kind):
        return any(kind.field(i).name == "bytes" for i in range(kind.num_fields))
    return pa.types.is_binary(kind) or pa.types.is_large_binary(kind)


def _parquet_split(files: list[str], label_key: str | None, where: str) -> tuple[ContainerSplit, Columns]:
    pa = _pyarrow()
    blocks, start, columns = [], 0, None
    for i, f in enumerate(files):
        try:
            with open_binary(f) as handle:
                meta = pa.parquet.ParquetFile(handle)
                if columns is None:
                    columns = choose_columns(meta.schema_arrow, label_key, f)
                else:
                    _same_columns(meta.schema_arrow, columns, f, files[0])
                for g in range(meta.metadata.num_row_groups):
                    blocks.append((i, g, start))
                    start += meta.metadata.row_group(g).num_rows
        except (OSError, pa.ArrowInvalid) as e:
            raise UserError(f"{f}: not a readable parquet file ({one_line(e, 200)})") from None
    assert columns is not None
    container = TableImages(files, columns.image, blocks, start, arrow=False)
    chosen = columns

    referenced: list[str] = []

    def read(_fresh: bool) -> tuple[Records, np.ndarray]:  # labels and paths are read from the files each time
        labels = []
        referenced.clear()
        for f in files:
            with open_binary(f) as handle:  # one footer parse a file for its labels and its image paths
                parquet = pa.parquet.ParquetFile(handle)
                labels.append(_labels(parquet.read(columns=[chosen.label]).column(0), f))
                referenced.extend(parquet_image_paths(parquet, chosen.image))
        return Records(container, np.arange(start, dtype=np.int64)), np.concatenate(labels).astype(np.int64)

    return ContainerSplit(files, read_once(read), official_size=start, referenced=lambda: referenced), columns


def _same_columns(schema, first: Columns, where: str, first_file: str) -> None:
    """A later file of a split holds the first file's image and label columns, the label as integers
    and with the same class names: one that lacks one was an Arrow traceback; float labels were
    truncated to classes in silence."""
    pa = _pyarrow()
    for role, name in (("image", first.image), ("label", first.label)):
        if name not in schema.names:
            raise UserError(
                f"{where}: no {role} column '{name}', which {first_file} has; every file of a split needs the same "
                f"columns (columns: {', '.join(schema.names)})"
            )
    if not pa.types.is_integer(schema.field(first.label).type):
        raise UserError(
            f"{where}: label column '{first.label}' holds {schema.field(first.label).type}, expected integers as in "
            f"{first_file}"
        )
    feature = hf_features(schema).get(first.label)
    names = feature.get("names") if isinstance(feature, dict) else None
    if names and first.names and list(names) != list(first.names):
        raise UserError(
            f"{where}: label column '{first.label}' names its classes otherwise than {first_file} does "
            f"({names[0]!r}, … against {first.names[0]!r}, …); every file of a split needs the same classes"
        )


def _labels(column, where: str) -> np.ndarray:
    if column.null_count:
        row = int(np.flatnonzero(column.is_null().to_numpy(zero_copy_only=False))[0])
        raise UserError(f"{where}:row {row}: has no label ({column.null_count} unlabelled row(s))")
    return column.to_numpy()


def _arrow_split(folder: Path, label_key: str | None, where: str) -> tuple[ContainerSplit, Columns]:
    """A split folder of `save_to_disk` (state.json, dataset_info.json, data-*.arrow), read as
    `datasets.load_from_disk` opens it."""
    try:
        import datasets
    except ImportError:
        raise UserError(
            f"{where}: a save_to_disk folder needs the datasets library: pip install 'vitbench[hf]'"
        ) from None
    try:
        ds = datasets.load_from_disk(str(folder))
    except Exception as e:  # FileNotFoundError, JSON errors, Arrow errors: the folder is not one
        raise UserError(f"{folder}: not a save_to_disk dataset ({type(e).__name__}: {one_line(e, 200)})") from None
    table = ds.data.table if hasattr(ds.data, "table") else ds.data
    columns = choose_columns(table.schema, label_key, str(folder))
    files = [c["filename"] for c in ds.cache_files]
    pa = _pyarrow()
    blocks, start = [], 0
    for i, f in enumerate(files):
        blocks.append((i, 0, start))
        start += pa.ipc.open_stream(pa.memory_map(f)).read_all().num_rows
    container = TableImages(files, columns.image, blocks, start, arrow=True)
    labels_column = table.column(columns.label)
    image_column = table.column(columns.image)  # memory-mapped: only cells without bytes are looked at
    referenced = [p for chunk in image_column.chunks for p in image_paths(chunk)]

    def read(_fresh: bool) -> tuple[Records, np.ndarray]:
        return Records(container, np.arange(start, dtype=np.int64)), _labels(labels_column, files[0]).astype(np.int64)

    return ContainerSplit(files, read_once(read), official_size=start, referenced=lambda: referenced), columns


def _hub_folder(repo_id: str, download: bool = False) -> Path:
    """The local snapshot of a Hub dataset repo: the cache only, unless downloads are allowed
    (`download`: --download, handed down by the planner; or VITBENCH_DOWNLOAD=1) and the user's own
    HF_HUB_OFFLINE does not forbid them."""
    try:
        from huggingface_hub import constants, snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError
    except ImportError:
        raise UserError(
            f"hf:{repo_id}: reading the Hub cache needs huggingface_hub: pip install 'vitbench[hf]'"
        ) from None
    online = downloads.allowed(download) and not constants.HF_HUB_OFFLINE
    try:
        folder = snapshot_download(
            repo_id, repo_type="dataset", local_files_only=not online, cache_dir=downloads.hub_cache(),
            endpoint=downloads.hub_endpoint(), allow_patterns=["*.parquet", "*.json", "*.md"],
        )  # fmt: skip
        return Path(folder)
    except LocalEntryNotFoundError:
        raise UserError(
            f"hf:{repo_id}: not in the local Hub cache; add --download (or set {downloads.ENV}=1) to fetch it, "
            f"or give the folder: hf:<path>"
        ) from None
    except Exception as e:  # the Hub's own errors: no such repo, gated, offline
        raise UserError(f"hf:{repo_id}: {type(e).__name__}: {one_line(e, 200)}") from None


@dataclass
class Found:
    splits: dict[str, ContainerSplit] = field(default_factory=dict)
    columns: Columns | None = None


def _find_splits(root: Path, label_key: str | None, where: str) -> Found:
    found = Found()
    if (root / "dataset_dict.json").is_file():  # DatasetDict.save_to_disk
        try:
            names = json.loads((root / "dataset_dict.json").read_text())["splits"]
        except (ValueError, KeyError, TypeError):
            raise UserError(f"{root / 'dataset_dict.json'}: not a DatasetDict's split list") from None
        for name in names:
            split = split_of(name)
            if split is not None:
                found.splits[split], found.columns = _arrow_split(root / name, label_key, where)
        return found
    if (root / "state.json").is_file():
        raise UserError(f"{root}: one saved split; save the DatasetDict (train and test) with save_to_disk")
    grouped = by_split([str(f) for f in sorted(root.rglob("*.parquet"))], str(root))
    if not grouped:
        hint = f"; it holds image files: an ImageFolder tree reads as folder:{root}" if holds_images(root) else ""
        raise UserError(f"{where}: no parquet files named by split (train-*.parquet, data/test-*.parquet) "
                        f"and no save_to_disk folder (dataset_dict.json){hint}")  # fmt: skip
    for split, files in grouped.items():
        found.splits[split], found.columns = _parquet_split(files, label_key, where)
    return found


def _remote_splits(url: str, label_key: str | None) -> Found:
    """Parquet files under an object-store prefix (`s3://bucket/cifar10`), by their names."""
    fs, path = remote_fs(url)
    protocol = url.split("://", 1)[0]
    found = Found()
    with store_errors(url):
        listed = sorted(p for p in fs.find(path) if p.endswith(".parquet"))
    grouped = by_split([f"{protocol}://{p}" for p in listed], f"{protocol}://{path}")
    if not grouped:
        raise UserError(f"{url}: no parquet files named by split (train-*.parquet)")
    for split, files in grouped.items():
        found.splits[split], found.columns = _parquet_split(files, label_key, url)
    return found


def hf_spec(argument: str, known_classes: int | None = None) -> DatasetSpec:
    """The spec of `hf:<folder, URL or repo id>[#<label column>]`. `known_classes`: the class count
    where the data names none (a plain integer column) and the dataset is known (`--data-source`)."""
    target, _, label_key = argument.partition("#")
    where = f"hf:{target}"
    if "://" in target:
        found, resolved, location = _remote_splits(target, label_key or None), target, None
    else:
        path = Path(target).expanduser()
        if path.exists():
            if not path.is_dir():
                raise UserError(f"{path}: is a file, expected a Hugging Face dataset folder (parquet or save_to_disk)")
            path = path.resolve()
        elif is_repo_id(target):
            path = _hub_folder(target)
        else:
            raise UserError(f"hf:{target}: no such folder (a Hub repo id reads owner/name)")
        found, resolved, location = _find_splits(path, label_key or None, where), str(path), path
    assert found.columns is not None
    names = found.columns.names

    def classes() -> int:
        if names:
            return len(names)
        if known_classes is not None:
            return known_classes
        _, labels = found.splits["train"].read()
        return int(labels.max(initial=-1)) + 1

    label_note = f"#{label_key}" if label_key else ""
    return container_spec(
        f"{PREFIX}:{identity(target, resolved)}{label_note}", target.rstrip("/").rsplit("/", 1)[-1], "hf",
        found.splits, names, classes, where, location=location, extra_fingerprint=label_note,
    )  # fmt: skip


def is_repo_id(target: str) -> bool:
    """`owner/name`, not a folder here or a URL."""
    return target.count("/") == 1 and not target.startswith((".", "/", "~")) and "://" not in target


def hf_fetch(argument: str) -> None:
    """--download for `hf:<owner>/<name>`: the repo's parquet files into the Hub cache (a folder or
    an object store is read where it is)."""
    target = argument.partition("#")[0]
    if is_repo_id(target) and not Path(target).expanduser().exists():
        _hub_folder(target, download=True)


FORMATS = [
    DatasetFormat(
        PREFIX,
        hf_spec,
        "a Hugging Face dataset: parquet folder, save_to_disk folder, Hub repo id or s3:// prefix",
        fetch=hf_fetch,
    )
]

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

import contextlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vitbench import downloads
from vitbench.datasets.base import DatasetFormat, DatasetSpec
from vitbench.datasets.container_spec import ContainerSplit, by_split, container_spec, identity, read_once, split_of
from vitbench.datasets.image_folders import holds_images
from vitbench.datasets.records import Container, Records, is_remote, open_binary, remote_fs, store_errors
from vitbench.errors import UserError, one_line

PREFIX = "hf"
IMAGE_NAMES = ("image", "img", "jpg", "png", "webp")
LABEL_NAMES = ("label", "labels", "fine_label", "cls", "class")


def _pyarrow():
    try:
        import pyarrow
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        raise UserError("hf: datasets need pyarrow: pip install 'vitbench[hf]'") from None
    return pyarrow


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


def image_bytes(value: Any, where: Callable[[], str]) -> bytes:
    """The encoded image of one cell: a {bytes, path} struct's bytes (or, as the datasets library
    reads a local dataset that refers to its files, the file at its absolute path), or the binary value."""
    data = value.get("bytes") if isinstance(value, dict) else value
    if not data and isinstance(value, dict) and value.get("path") and Path(value["path"]).is_absolute():
        try:
            return Path(value["path"]).read_bytes()
        except OSError as e:
            raise OSError(f"{where()}: its image file {value['path']}: {e.strerror or e}") from None
    if not data:
        raise UserError(f"{where()}: the row has no image bytes")
    return bytes(data)


# a parquet row group up to this (uncompressed, from its footer) is read whole and kept while its rows
# are read; a larger one a few rows at a time, so memory follows the rows read, not the row group
# (one 480 MB row group peaked at 2.9 GB). The datasets library writes row groups of ~100 images.
WHOLE_GROUP_BYTES = 64 << 20
STREAMED_ROWS = 16  # the rows a large row group is read by (restarted for a row behind the last read)


class TableImages(Container):
    """Images in a column of parquet files (read a row group at a time, or a few rows at a time from
    a large one) or Arrow files (memory-mapped)."""

    def __init__(self, files: list[str], column: str, blocks: list[tuple[int, int, int]], total: int, arrow: bool):
        """`blocks`: (file, row group, first row) of each row group (an Arrow file is one block)."""
        self.files = tuple(files)
        self.column = column
        self.arrow = arrow
        self.blocks = blocks
        self.starts = np.asarray([b[2] for b in blocks], dtype=np.int64)
        self.total = total

    def __len__(self) -> int:
        return self.total

    def _block(self, k: int):
        cached = getattr(self, "_open_block", None)
        if cached is not None and cached[0] == k:
            return cached[1]
        pa = _pyarrow()
        file, group, _ = self.blocks[k]
        if self.arrow:
            tables = getattr(self, "_open_tables", None) or {}
            if file not in tables:  # memory-mapped: the pages are read as rows are
                tables[file] = pa.ipc.open_stream(pa.memory_map(self.files[file])).read_all()
                self._open_tables = tables
            column = tables[file].column(self.column)
        else:
            # one row group, one array: its `bytes` child read directly (a struct scalar's as_py() built
            # a dict per image, and parquet then decoded 5 % slower than the same JPEGs as files)
            column = self._parquet(file).read_row_group(group, columns=[self.column]).column(0).combine_chunks()
            if pa.types.is_struct(column.type) and column.null_count == 0 and column.field("bytes").null_count == 0:
                column = column.field("bytes")
        self._open_block = (k, column)
        return column

    def _parquet(self, file: int, streamed: bool = False):
        """The file opened once a process (its footer parsed once), a few kept open. `streamed`: for
        reading a large row group a few rows at a time, its column chunks through a 1 MiB buffer and
        not fetched whole first (pyarrow's pre-buffering held the whole chunk: 3x the rows read)."""
        opened: dict[tuple[int, bool], Any] = self.__dict__.setdefault("_open_files", {})
        if (file, streamed) not in opened:
            if len(opened) >= 8:
                opened.pop(next(iter(opened))).close()
            options = {"pre_buffer": False, "buffer_size": 1 << 20} if streamed else {}
            opened[file, streamed] = _pyarrow().parquet.ParquetFile(open_binary(self.files[file]), **options)
        return opened[file, streamed]

    def _large(self, k: int) -> bool:
        if self.arrow:
            return False
        file, group, _ = self.blocks[k]
        return self._parquet(file).metadata.row_group(group).total_byte_size > WHOLE_GROUP_BYTES

    def _streamed(self, k: int, offset: int):
        """Row `offset` of large row group `k`: from the rows read last, read on to it, or read again
        from the group's start for a row behind them."""
        state = getattr(self, "_open_stream", None)
        if state is None or state[0] != k or offset < state[2]:
            file, group, _ = self.blocks[k]
            batches = self._parquet(file, streamed=True).iter_batches(
                batch_size=STREAMED_ROWS, row_groups=[group], columns=[self.column], use_threads=False
            )
            state = [k, batches, 0, next(batches).column(0)]
        while offset >= state[2] + len(state[3]):
            state[2] += len(state[3])
            state[3] = next(state[1]).column(0)
        self._open_stream = state
        return state[3][offset - state[2]]

    def groups(self, rows: np.ndarray) -> np.ndarray:
        """A parquet row group (read whole), or an Arrow file."""
        return np.searchsorted(self.starts, rows, side="right").astype(np.int64) - 1

    def _locate(self, row: int) -> tuple[int, int]:
        k = int(np.searchsorted(self.starts, row, side="right")) - 1
        return k, row - int(self.starts[k])

    def read(self, row: int) -> bytes:
        k, offset = self._locate(row)
        file = self.files[self.blocks[k][0]]
        try:
            with store_errors(file) if is_remote(file) else contextlib.nullcontext():
                value = (self._streamed(k, offset) if self._large(k) else self._block(k)[offset]).as_py()
        except OSError as e:
            raise OSError(f"{self.where(row)}: {one_line(e, 200)}") from None
        return image_bytes(value, lambda: self.where(row))

    def where(self, row: int) -> str:
        k, offset = self._locate(row)
        file, group, _ = self.blocks[k]
        within = offset if self.arrow else int(self.starts[k] - self._file_start(file)) + offset
        return f"{self.files[file]}:row {within}"

    def _file_start(self, file: int) -> int:
        return int(next(b[2] for b in self.blocks if b[0] == file))


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

    def read() -> tuple[Records, np.ndarray]:
        labels = []
        referenced.clear()
        for f in files:
            with open_binary(f) as handle:
                labels.append(_labels(pa.parquet.read_table(handle, columns=[chosen.label]).column(0), f))
                referenced.extend(_parquet_image_paths(pa.parquet.ParquetFile(handle), chosen.image))
        return Records(container, np.arange(start, dtype=np.int64)), np.concatenate(labels).astype(np.int64)

    return ContainerSplit(files, read_once(read), official_size=start, referenced=lambda: referenced), columns


def _parquet_image_paths(parquet, image: str) -> list[str]:
    """The image files a parquet file's cells name by path instead of holding their bytes: read
    only from row groups whose footer counts null `bytes` (the datasets library's own files hold
    bytes: nothing is read), so a replaced file changes the split's fingerprint."""
    schema = parquet.metadata.schema
    leaf = next((i for i in range(len(schema)) if schema.column(i).path == f"{image}.bytes"), None)
    if leaf is None:  # binary cells: bytes only
        return []
    paths: list[str] = []
    for g in range(parquet.metadata.num_row_groups):
        stats = parquet.metadata.row_group(g).column(leaf).statistics
        if stats is not None and stats.has_null_count and stats.null_count == 0:
            continue
        column = parquet.read_row_group(g, columns=[image]).column(0).combine_chunks()
        paths += image_paths(column)
    return paths


def image_paths(column) -> list[str]:
    """The absolute paths of a {bytes, path} column's cells without bytes (what `image_bytes` reads)."""
    if not _pyarrow().types.is_struct(column.type) or column.field("bytes").null_count == 0:
        return []
    no_bytes = column.field("bytes").is_null().to_numpy(zero_copy_only=False)
    named = column.field("path").to_pylist()
    return [p for p, empty in zip(named, no_bytes, strict=True) if empty and p and Path(p).is_absolute()]


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

    def read() -> tuple[Records, np.ndarray]:
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

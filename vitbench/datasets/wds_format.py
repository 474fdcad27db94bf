"""`wds:<folder or shard pattern>[#<label key>]`: WebDataset tar shards (`train-{000000..000143}.tar`,
members `KEY.jpg` + `KEY.cls` or `KEY.json`), as ImageNet-21k and timm's `imagenet-1k-wds` keep them.

A folder holds `<split>-*.tar` (or `<split>/*.tar`) and, where timm's writers put one, an
`_info.json` of split sizes; a pattern is expanded as WebDataset expands it (braceexpand), each
shard's split read from its name. Samples are grouped as webdataset groups members (its
`base_plus_ext`: the key is the name up to the first dot of its last part). Each shard is indexed
once — every member's offset and size, read from the tar headers without reading an image — and
the index is kept in vitbench's cache (as `wids` keeps one), keyed by the shard's path, size and
time, so the shard itself is never written to. An image is then one seek and one read: random
access for few-shot sampling, extraction and fine-tuning's shuffled stream alike."""

from __future__ import annotations

import json
import re
import tarfile
from pathlib import Path

import numpy as np

from vitbench.datasets.base import DatasetFormat, DatasetSpec
from vitbench.datasets.container_spec import ContainerSplit, by_split, container_spec, identity, read_once, split_of
from vitbench.datasets.image_folders import IMAGE_SUFFIXES
from vitbench.datasets.records import (
    OffsetContainer,
    Records,
    concatenated,
    file_size,
    is_remote,
    kept_index,
    open_binary,
    remote_fs,
    store_errors,
)
from vitbench.errors import UserError, one_line

PREFIX = "wds"
IMAGE_EXTENSIONS = {s.lstrip(".") for s in IMAGE_SUFFIXES}
LABEL_EXTENSIONS = ("cls", "cls2", "label", "target")  # a member holding the class index as text
CLASS_INDEX = re.compile(r"-?[0-9]+")  # as a label member writes one (ASCII digits: int() takes any script's)
INDEX_VERSION = 2  # bump when the index's arrays or the labels it accepts change: old cache entries are then rebuilt
# (2: labels read as written, one per sample; a lenient index kept by 1 is not trusted)
MAX_LABEL_MEMBER = 1 << 20  # a .cls/.json member is read whole: a larger one is not a label


# webdataset's grouping rule (webdataset/tariterators.py, base_plus_ext): the key is the member's
# name up to the first dot of its last part, the rest its extension. Written out, not imported:
# importing webdataset imports torch (seconds), and `doctor` and dry runs index shards without it.
KEY_AND_EXTENSION = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")


def _base_plus_ext(name: str) -> tuple[str | None, str | None]:
    match = KEY_AND_EXTENSION.match(name)
    return (match.group(1), match.group(2)) if match else (None, None)


def _label_of(member_ext: str, data: bytes, label_key: str | None, where: str) -> int | None:
    """The class index a label member holds: `.cls` text, or a `.json` object's label field."""
    if member_ext == "json" or member_ext.endswith(".json"):
        try:
            value = json.loads(data)
        except ValueError:
            raise UserError(f"{where}: not JSON (expected an object with the label)") from None
        keys = (label_key,) if label_key else ("label", "cls", "class", "target")
        found = [value[k] for k in keys if isinstance(value, dict) and k in value]
        if not found:
            return None
        raw: object = found[0]
    else:
        raw = data.decode("utf-8", "replace").strip()
    # a whole number as written, never coerced: Python's int() reads `1_0` as 10 and JSON's 1.7 and
    # true as 1 (issue 89), each a wrong class in silence
    if isinstance(raw, int) and not isinstance(raw, bool):
        return raw
    if isinstance(raw, str) and CLASS_INDEX.fullmatch(raw):
        return int(raw)
    shown = json.dumps(raw) if not isinstance(raw, str) else repr(raw[:40])
    raise UserError(f"{where}: label {shown[:40]} is not a class index")


def index_shard(shard: str, label_key: str | None) -> dict[str, np.ndarray]:
    """One shard's samples: offset and size of each image member, its label, and its member name;
    every problem is one line naming the shard and member. Read from the tar headers (a seek past
    each member locally; one sequential pass for a remote shard), label members read whole."""
    size = file_size(shard)
    offsets, sizes, labels, names = [], [], [], []
    pending: dict[str, dict] = {}
    order: list[str] = []
    try:
        with open_binary(shard) as handle, tarfile.open(fileobj=handle, mode="r|" if is_remote(shard) else "r:") as tar:
            for member in tar:
                name = member.name
                if name.startswith("/") or ".." in Path(name).parts:
                    raise UserError(
                        f"{shard}: member '{name}' names a path outside the shard; refused (never extracted)"
                    )
                if not member.isfile():
                    continue
                if member.offset_data + member.size > size:
                    raise UserError(f"{shard}: truncated inside member '{name}' (the shard ends at byte {size:,})")
                key, ext = _base_plus_ext(name)
                if key is None or ext is None or Path(name).name.startswith("_"):
                    continue  # webdataset's own rule: no extension, or a metadata member (_info.json)
                if key not in pending:
                    pending[key] = {}
                    order.append(key)
                sample = pending[key]
                ext = ext.lower()
                if ext.rsplit(".", 1)[-1] in IMAGE_EXTENSIONS:
                    if "image" in sample:
                        raise UserError(f"{shard}: sample {key} has two images ('{sample['image'][2]}', '{name}')")
                    sample["image"] = (member.offset_data, member.size, name)
                elif ext in LABEL_EXTENSIONS or ext == "json" or (label_key and ext == label_key):
                    if member.size > MAX_LABEL_MEMBER:
                        raise UserError(
                            f"{shard}: label member '{name}' is {member.size:,} bytes, expected a class index"
                        )
                    extracted = tar.extractfile(member)
                    assert extracted is not None
                    found = _label_of(ext, extracted.read(), label_key, f"{shard}:{name}")
                    if found is not None and (label_key is None or ext in (label_key, "json")):
                        if "label" in sample and sample["label"][0] != found:  # never the first one, unsaid
                            raise UserError(
                                f"{shard}: sample {key} has two labels ({sample['label'][0]} in "
                                f"'{sample['label'][1]}', {found} in '{name}')"
                            )
                        sample.setdefault("label", (found, name))
    except tarfile.TarError as e:
        raise UserError(f"{shard}: not a readable tar shard ({one_line(e, 160)})") from None
    except EOFError:
        raise UserError(f"{shard}: truncated (the tar ends inside a member)") from None
    except OSError as e:
        raise UserError(f"{shard}: cannot be read ({e.strerror or e})") from None
    for key in order:
        sample = pending[key]
        if "image" not in sample:
            continue  # a sample without an image (captions, metadata) is not an image sample
        if "label" not in sample:
            wanted = f"'{label_key}'" if label_key else ".cls or .json"
            raise UserError(f"{shard}: member '{sample['image'][2]}' has no label ({wanted} member with its key {key})")
        offset, length, name = sample["image"]
        offsets.append(offset)
        sizes.append(length)
        labels.append(sample["label"][0])
        names.append(name)
    return {
        "offset": np.asarray(offsets, dtype=np.int64),
        "size": np.asarray(sizes, dtype=np.int64),
        "label": np.asarray(labels, dtype=np.int64),
        "name": np.asarray(names, dtype=str),
    }


def shard_index(
    shard: str, label_key: str | None, keys: tuple[str, ...] = (), fresh: bool = False
) -> dict[str, np.ndarray]:
    """`index_shard`'s arrays (`keys` of them), from the cache when this shard (unchanged) was indexed
    before, unless `fresh` (--verify-data)."""
    settings = f"{INDEX_VERSION}|{label_key}"
    return kept_index("wds-index", shard, settings, lambda: index_shard(shard, label_key), keys, fresh)


class ShardImages(OffsetContainer):
    """Image members of tar shards, read by offset."""

    def __init__(self, shards: list[str], parts: list[dict[str, np.ndarray]], label_key: str | None):
        which, offset, size, self.labels = concatenated(parts)
        super().__init__(shards, which, offset, size)
        self.label_key = label_key

    def where(self, row: int) -> str:
        k = int(self.which[row])
        names = self.__dict__.setdefault("_open_names", {})
        if k not in names:  # member names are read back from the index only when one is named
            names[k] = shard_index(self.files[k], self.label_key)["name"]
        return f"{self.files[k]}:{names[k][self.within(row)]}"


def _split_reader(shards: list[str], label_key: str | None):
    def read(fresh: bool) -> tuple[Records, np.ndarray]:
        parts = [shard_index(s, label_key, ("offset", "size", "label"), fresh) for s in shards]
        container = ShardImages(shards, parts, label_key)
        return Records(container, np.arange(len(container), dtype=np.int64)), container.labels

    return read_once(read)


def _expand(pattern: str) -> list[str]:
    try:
        from braceexpand import UnbalancedBracesError, braceexpand
    except ImportError:
        raise UserError("wds: shard patterns need webdataset: pip install 'vitbench[wds]'") from None
    try:
        return list(braceexpand(pattern))
    except UnbalancedBracesError:
        raise UserError(
            f"wds:{pattern}: its braces do not pair up; expected a pattern such as train-{{000000..000143}}.tar"
        ) from None


COMPRESSED = (".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".tar.zst")  # shards read only once unpacked


def _uncompressed(target: str, names: list[str]) -> None:
    """A compressed shard among `names` is refused, never skipped: its images would be left out of
    the split in silence (an image is one seek into an uncompressed tar)."""
    packed = [n for n in names if n.lower().endswith(COMPRESSED)]
    if packed:
        raise UserError(
            f"wds:{target}: shard {packed[0]} is compressed ({len(packed)} such); vitbench reads uncompressed "
            ".tar shards by seeking to each image: decompress them (e.g. gunzip) and name the .tar files"
        )


def _shards(target: str) -> tuple[list[str], Path | None]:
    """The shards `target` names (a folder's, or a pattern's that exist), and the folder (for _info.json)."""
    if is_remote(target):
        fs, path = remote_fs(target)
        protocol = target.split("://", 1)[0]
        if "{" in target:
            shards = _expand(target)
            _uncompressed(target, shards)
            return shards, None
        with store_errors(f"wds:{target}"):
            found = [f"{protocol}://{p}" for p in sorted(fs.find(path))]
        _uncompressed(target, found)
        return [p for p in found if p.endswith(".tar")], None
    path = Path(target).expanduser()
    if path.is_dir():
        files = sorted(str(p) for p in path.resolve().rglob("*"))
        _uncompressed(target, files)
        return [f for f in files if f.endswith(".tar")], path.resolve()
    expanded = _expand(target) if "{" in target else [target]
    _uncompressed(target, expanded)
    present = [str(Path(s).expanduser().resolve()) for s in expanded if Path(s).expanduser().is_file()]
    if present and len(present) < len(expanded):
        missing = next(s for s in expanded if not Path(s).expanduser().is_file())
        raise UserError(f"wds:{target}: shard {missing} is missing ({len(expanded) - len(present)} of {len(expanded)})")
    return present, Path(present[0]).parent if present else None


def _info(folder: Path | None) -> dict:
    """timm's `_info.json` (split sizes, shard lengths) where the writer left one."""
    if folder is None or not (folder / "_info.json").is_file():
        return {}
    try:
        info = json.loads((folder / "_info.json").read_text())
    except (OSError, ValueError):
        raise UserError(f"{folder / '_info.json'}: not a JSON file of split sizes") from None
    return info if isinstance(info, dict) else {}


def wds_spec(argument: str, known_classes: int | None = None) -> DatasetSpec:
    """The spec of `wds:<folder, pattern or URL>[#<label key>]`. `known_classes`: the class count of
    a dataset read from shards that do not name their classes (a paper dataset's: `--data-source`)."""
    target, _, label_key = argument.partition("#")
    where = f"wds:{target}"
    shards, folder = _shards(target)
    if not shards:
        raise UserError(f"{where}: matches no .tar shard")
    grouped = by_split(shards, str(folder) if folder is not None else "")
    info = _info(folder)
    sizes = {split_of(k): v.get("num_samples") for k, v in (info.get("splits") or {}).items() if isinstance(v, dict)}
    splits = {
        split: ContainerSplit(files, _split_reader(files, label_key or None), official_size=sizes.get(split))
        for split, files in grouped.items()
    }
    names = info.get("classes") or info.get("class_names")

    def classes() -> int:
        if isinstance(names, list) and names:
            return len(names)
        if isinstance(info.get("num_classes"), int):
            return int(info["num_classes"])
        if known_classes is not None:
            return known_classes
        _, labels = splits["train"].read()
        return int(labels.max(initial=-1)) + 1

    resolved = str(folder) if folder is not None and Path(target).expanduser().is_dir() else "|".join(shards)
    label_note = f"#{label_key}" if label_key else ""
    title = (folder.name if folder is not None else target.rstrip("/").rsplit("/", 1)[-1]) or target
    return container_spec(
        f"{PREFIX}:{identity(title, resolved)}{label_note}", title, "wds", splits,
        names if isinstance(names, list) else None, classes, where, location=folder, extra_fingerprint=label_note,
    )  # fmt: skip


FORMATS = [
    DatasetFormat(
        PREFIX, wds_spec, "WebDataset tar shards: a folder of <split>-*.tar, a brace pattern, or an s3:// prefix"
    )
]

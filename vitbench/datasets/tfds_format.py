"""`tfds:<builder>[:<version>]` or `tfds:<prepared builder folder>`: any prepared TFDS image
classification build (`cifar10`, `oxford_iiit_pet`, `imagenet2012`, ...), what big_vision reads.

A name is looked up as `tfds.load` looks it up (TFDS_DATA_DIR, else ~/tensorflow_datasets); a
folder (`.../cifar10/3.0.2`) is opened with `tfds.builder_from_directory`. The image and label
features come from the build's own FeaturesDict (its Image and ClassLabel, with the class names).
Nothing is decoded into memory: each TFRecord file is indexed once (every record's offset, from
the record framing, and its label), the index kept in vitbench's cache; an image is one seek, one
read and the Example's bytes as TFDS stored them."""

from __future__ import annotations

import functools
import os
import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np

from vitbench.datasets.base import DatasetFormat, DatasetSpec
from vitbench.datasets.container_spec import ContainerSplit, container_spec, identity, info_digest, read_once, split_of
from vitbench.datasets.native_stderr import held_back
from vitbench.datasets.records import OffsetContainer, Records, concatenated, kept_index
from vitbench.errors import UserError, one_line

PREFIX = "tfds"
INDEX_VERSION = 2  # 2: records checked against their CRCs as they are indexed
HEADER = 12  # a TFRecord: length (uint64), its CRC (uint32), the data, the data's CRC (uint32)
CRC = 4


def _masked_crc(data: bytes) -> int:
    """TFRecord's checksum: CRC-32C, masked as TensorFlow's `crc32c::Mask` masks it (a CRC of data
    holding CRCs is not itself a weak check)."""
    import google_crc32c  # TensorFlow's own dependency chain brings it; the tfds extra names it

    crc = google_crc32c.value(data)
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def _checked(data: bytes, stored_crc: bytes, where: Callable[[], str]) -> bytes:
    """`data` when its CRC is the one stored after it, as TensorFlow's reader checks it (it raises
    DataLossError): a damaged record is refused, never decoded into a number."""
    if len(stored_crc) != CRC or struct.unpack("<I", stored_crc)[0] != _masked_crc(data):
        raise UserError(f"{where()}: the record fails its CRC check (corrupted, or rewritten without its checksum); "
                        "prepare the build again")  # fmt: skip
    return data


def _tfds():
    torchvision_before_tensorflow()
    try:
        with held_back():  # TensorFlow's start-up chatter (vitbench/datasets/native_stderr.py)
            import tensorflow_datasets as tfds
    except ImportError:
        raise UserError("tfds: datasets need TensorFlow Datasets: pip install 'vitbench[tfds]'") from None
    return tfds


def torchvision_before_tensorflow() -> None:
    """Import torchvision, if it is not yet, before anything imports TensorFlow: the other way round
    (TensorFlow 2.21, torchvision 0.29) the process ends in a segmentation fault when torchvision
    loads its operators."""
    import torchvision  # noqa: F401


def _example_class():
    torchvision_before_tensorflow()
    with held_back():  # TensorFlow's start-up chatter, where this is its first import
        from tensorflow.core.example.example_pb2 import Example  # TFDS's records are tf.train.Examples

    return Example


def _parse(data: bytes, image_key: str, label_key: str, where: Callable[[], str]) -> tuple[bytes, int]:
    example = _example_class().FromString(data)
    features = example.features.feature
    if image_key not in features or not features[image_key].bytes_list.value:
        raise UserError(f"{where()}: the record has no '{image_key}' image")
    labels = features[label_key].int64_list.value if label_key in features else []
    if not labels:
        raise UserError(f"{where()}: the record has no '{label_key}' label")
    return bytes(features[image_key].bytes_list.value[0]), int(labels[0])


def index_file(path: str, image_key: str, label_key: str) -> dict[str, np.ndarray]:
    """Every record's data offset and length and its label, read once from the file."""
    offsets: list[int] = []
    lengths: list[int] = []
    labels: list[int] = []
    size = os.stat(path).st_size
    with open(path, "rb") as f:
        position = 0
        while position < size:
            header = f.read(HEADER)
            if len(header) < HEADER:
                raise UserError(f"{path}: truncated after record {len(offsets)} (a partial record header)")
            where = functools.partial("{}:record {}".format, path, len(offsets))
            (length,) = struct.unpack("<Q", _checked(header[:8], header[8:], where))
            if position + HEADER + length + CRC > size:
                raise UserError(f"{path}: truncated inside record {len(offsets)}")
            data = _checked(f.read(length), f.read(CRC), where)
            _, label = _parse(data, image_key, label_key, where)
            offsets.append(position + HEADER)
            lengths.append(length)
            labels.append(label)
            position += HEADER + length + CRC
    return {
        "offset": np.asarray(offsets, dtype=np.int64),
        "size": np.asarray(lengths, dtype=np.int64),
        "label": np.asarray(labels, dtype=np.int64),
    }


def file_index(path: str, image_key: str, label_key: str, fresh: bool = False) -> dict[str, np.ndarray]:
    settings = f"{INDEX_VERSION}|{image_key}|{label_key}"
    return kept_index("tfds-index", path, settings, lambda: index_file(path, image_key, label_key), fresh=fresh)


class RecordImages(OffsetContainer):
    """The image of each tf.train.Example in TFRecord files, read by offset."""

    def __init__(self, files: list[str], parts: list[dict[str, np.ndarray]], image_key: str, label_key: str):
        which, offset, size, self.labels = concatenated(parts)
        super().__init__(files, which, offset, size + CRC)  # each read takes the record's CRC with it
        self.image_key, self.label_key = image_key, label_key

    def read(self, row: int) -> bytes:
        raw = self.raw(row)
        data = _checked(raw[:-CRC], raw[-CRC:], lambda: self.where(row))
        return _parse(data, self.image_key, self.label_key, lambda: self.where(row))[0]

    def where(self, row: int) -> str:
        return f"{self.files[int(self.which[row])]}:record {self.within(row)}"


def _builder(target: str):
    tfds = _tfds()
    path = Path(target).expanduser()
    try:
        if path.is_dir():
            return tfds.builder_from_directory(str(path.resolve()))
        return tfds.builder(target, try_gcs=False)
    except Exception as e:  # tfds raises several types for "no such builder" and "not prepared"
        raise UserError(f"tfds:{target}: {type(e).__name__}: {one_line(e, 200)}") from None


def _keys(features, where: str) -> tuple[str, str, list[str]]:
    """(image key, label key, class names) of a build's top-level FeaturesDict."""
    tfds = _tfds()
    images = [k for k, f in features.items() if isinstance(f, tfds.features.Image)]
    labels = [(k, f) for k, f in features.items() if isinstance(f, tfds.features.ClassLabel)]
    if not images or not labels:
        raise UserError(f"{where}: not an image classification build (features: {', '.join(features.keys())})")
    chosen = next((lf for lf in labels if lf[0] == "label"), labels[0])
    return images[0], chosen[0], list(chosen[1].names)


def tfds_spec(argument: str) -> DatasetSpec:
    where = f"tfds:{argument}"
    builder = _builder(argument)
    info = builder.info
    if not info.splits:
        raise UserError(f"{where}: not prepared under {builder.data_dir}; prepare it with `tfds build` (or --download)")
    if str(getattr(info.file_format, "value", info.file_format)) != "tfrecord":
        raise UserError(f"{where}: its records are {info.file_format}; vitbench reads TFRecord builds")
    image_key, label_key, names = _keys(info.features, where)
    splits: dict[str, ContainerSplit] = {}
    for name, split_info in info.splits.items():
        split = split_of(name)
        if split is None:
            continue
        files = [os.fspath(p) for p in split_info.filepaths]

        def read(fresh: bool, files=files) -> tuple[Records, np.ndarray]:
            parts = [file_index(f, image_key, label_key, fresh) for f in files]
            container = RecordImages(files, parts, image_key, label_key)
            return Records(container, np.arange(len(container), dtype=np.int64)), container.labels

        splits[split] = ContainerSplit(files, read_once(read), official_size=int(split_info.num_examples))
    data_dir = Path(os.fspath(builder.data_dir))
    return container_spec(
        f"{PREFIX}:{identity(f'{info.name}:{info.version}', str(data_dir))}", info.name, "tfds", splits, names,
        len(names), where, location=data_dir, extra_fingerprint=info_digest(data_dir / "dataset_info.json"),
    )  # fmt: skip


FORMATS = [DatasetFormat(PREFIX, tfds_spec, "a prepared TFDS image classification build: name[:version] or its folder")]

"""One set of JPEG files written in every container format vitbench reads, each by the library that
writes it: an ImageFolder tree, a Hub-style parquet folder and a `save_to_disk` folder (the
`datasets` library), WebDataset shards (`webdataset`'s ShardWriter), and a TFDS build (TFDS's
`store_as_tfds_dataset`). Every format holds the same bytes in the same order."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from PIL import Image

from vitbench.datasets.tfds_format import torchvision_before_tensorflow

CLASSES = ("ant", "bee", "cat")


def jpeg(rng: np.random.Generator, label: int, size: int) -> bytes:
    """A noisy 32-px JPEG whose mean colour leans towards its class (hard enough that a random-init
    backbone makes mistakes, so predictions differ between images)."""
    base = np.array([[90, 60, 60], [60, 90, 60], [60, 60, 90]][label], dtype=np.float64)
    pixels = np.clip(rng.normal(base, 45, (size, size, 3)), 0, 255).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG", quality=90)
    return out.getvalue()


def samples(per_class: dict[str, int], size: int = 32, seed: int = 0) -> dict[str, list[tuple[str, int, bytes]]]:
    """split -> [(name, label, JPEG bytes)] in ImageFolder's order (class folders, then file names)."""
    rng = np.random.default_rng(seed)
    out: dict[str, list[tuple[str, int, bytes]]] = {}
    for split, n in per_class.items():
        out[split] = [
            (f"{cls}/{split}_{i:03d}", label, jpeg(rng, label, size))
            for label, cls in enumerate(CLASSES)
            for i in range(n)
        ]
    return out


def write_folder(data, root: Path) -> Path:
    for split, items in data.items():
        for name, _, raw in items:
            path = root / split / f"{name}.jpg"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(raw)
    return root


def hf_dataset_dict(data, classes=CLASSES):
    import datasets

    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=list(classes))})
    return datasets.DatasetDict(
        {
            "validation" if split == "val" else split: datasets.Dataset.from_dict(
                {
                    "image": [{"bytes": raw, "path": f"{name}.jpg"} for name, _, raw in items],
                    "label": [label for _, label, _ in items],
                },
                features=features,
            )  # fmt: skip
            for split, items in data.items()
        }
    )


def write_parquet(data, root: Path, rows_per_group: int = 16, classes=CLASSES) -> Path:
    """The Hub's layout: data/<split>-00000-of-00001.parquet, bytes embedded, small row groups."""
    for split, ds in hf_dataset_dict(data, classes).items():
        (root / "data").mkdir(parents=True, exist_ok=True)
        ds.to_parquet(str(root / "data" / f"{split}-00000-of-00001.parquet"), batch_size=rows_per_group)
    return root


def write_saved(data, root: Path) -> Path:
    hf_dataset_dict(data).save_to_disk(str(root))
    return root


def write_shards(data, root: Path, per_shard: int = 20) -> Path:
    import webdataset as wds

    root.mkdir(parents=True, exist_ok=True)
    for split, items in data.items():
        with wds.ShardWriter(str(root / f"{split}-%06d.tar"), maxcount=per_shard, verbose=0) as sink:
            for name, label, raw in items:
                sink.write({"__key__": name, "jpg": raw, "cls": label})
    return root


def write_tfds(data, root: Path, name: str = "vitbench_same_bytes", version: str = "1.0.0", classes=CLASSES) -> Path:
    """A TFDS build of the same bytes (TFDS keeps JPEG bytes given as bytes), in the same order."""
    torchvision_before_tensorflow()
    import tensorflow as tf
    import tensorflow_datasets as tfds

    features = tfds.features.FeaturesDict(
        {"image": tfds.features.Image(), "label": tfds.features.ClassLabel(names=list(classes))}
    )
    splits = {
        "validation" if split == "val" else split: tf.data.Dataset.from_tensor_slices(
            {"image": [raw for _, _, raw in items], "label": np.array([label for _, label, _ in items], np.int64)}
        )
        for split, items in data.items()
    }
    tfds.dataset_builders.store_as_tfds_dataset(
        name=name, version=version, features=features, split_datasets=splits, data_dir=str(root), disable_shuffling=True
    )
    return root / name / version

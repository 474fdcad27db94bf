"""Datasets in the on-disk formats researchers already have: torchvision's layouts under
`--data-dir` (env VITBENCH_DATA), ImageFolder trees, the VTAB-1k folder layout, and TFDS. Nothing
is ever downloaded. `DATASETS` is the table of specs; `find_dataset` also resolves `folder:<path>`.

May import: vitbench.provenance, vitbench.files and vitbench.errors; never the models, the engine
or anything above (a Split holds numpy arrays or paths, never torch tensors)."""

from __future__ import annotations

from vitbench.datasets.base import CorruptImage, DatasetSpec, Split, dev_holdout
from vitbench.datasets.cifar import read_cifar_batch
from vitbench.datasets.image_folders import IMAGE_SUFFIXES
from vitbench.datasets.imagenet import imagenet_synsets
from vitbench.datasets.specs import DATASETS
from vitbench.datasets.status import SplitCount, dataset_status, find_status

__all__ = [
    "DATASETS",
    "IMAGE_SUFFIXES",
    "CorruptImage",
    "DatasetSpec",
    "Split",
    "SplitCount",
    "dataset_status",
    "dev_holdout",
    "find_status",
    "imagenet_synsets",
    "read_cifar_batch",
]

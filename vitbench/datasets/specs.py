"""The dataset table: one DatasetSpec per dataset, so protocols ask the spec (classes, splits, dev
hold-out, VTAB group, BiT's flip/crop exceptions) instead of special-casing names."""

from __future__ import annotations

from vitbench.datasets.base import DatasetSpec
from vitbench.datasets.cifar import cifar_loader
from vitbench.datasets.digits import digit_classes, load_digits
from vitbench.datasets.flowers import load_flowers
from vitbench.datasets.imagenet import load_imagenet
from vitbench.datasets.paper_sources import with_container_sources
from vitbench.datasets.pets import load_pets
from vitbench.datasets.robustness import ROBUSTNESS
from vitbench.datasets.vtab import ROOT_FOLDER, TASKS, dataset_name, folder_loader, official_sizes
from vitbench.datasets.vtab_tfds import tfds_fetcher, tfds_loader

# The paper's dev splits for LR selection (App. B.1.1): 2 % CIFAR, 10 % Pets and Flowers, 1 % ImageNet.
CLASSIC = [
    DatasetSpec(
        "digits",
        "Digits (8x8, scikit-learn)",
        10,
        None,
        {"train": 1000, "test": 797},
        load_digits,
        dev_fraction=0.1,
        # like BiT's structured-task exceptions: a crop of 5 % of an 8x8 glyph, or its mirror
        # image, is no longer the same digit (fine-tuning with them barely learns in a smoke run)
        train_flip=False,
        train_crop="none",
        source="sklearn-digits",
    ),
    *(
        DatasetSpec(
            f"digits{lo}-{hi}",
            f"Digits {lo}–{hi} (8x8, scikit-learn)",
            5,
            None,
            {"train": None, "test": None},
            digit_classes(f"digits{lo}-{hi}", range(lo, hi + 1)),
            dev_fraction=0.1,
            train_flip=False,
            train_crop="none",
            source="sklearn-digits",
            note="the demo's halves: pre-train on 0–4, few-shot on the unseen 5–9",
        )
        for lo, hi in ((0, 4), (5, 9))
    ),
    DatasetSpec(
        "cifar10",
        "CIFAR-10",
        10,
        "cifar-10-batches-py",
        {"train": 50_000, "test": 10_000},
        cifar_loader("cifar10", [f"data_batch_{i}" for i in range(1, 6)], "test_batch", "labels"),
        dev_fraction=0.02,
        key_files=("data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4", "data_batch_5", "test_batch"),
        split_files={"train": ("data_batch_1",), "test": ("test_batch",)},  # train reads the batches there
        source="cifar-pickle",
        how_to_get=(
            "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz, unpacked under --data-dir (torchvision's "
            "CIFAR10(root, download=True) writes the same folder)"
        ),
    ),
    DatasetSpec(
        "cifar100",
        "CIFAR-100",
        100,
        "cifar-100-python",
        {"train": 50_000, "test": 10_000},
        cifar_loader("cifar100", ["train"], "test", "fine_labels"),
        dev_fraction=0.02,
        key_files=("train", "test"),
        split_files={"train": ("train",), "test": ("test",)},
        source="cifar-pickle",
        how_to_get=(
            "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz, unpacked under --data-dir (torchvision's "
            "CIFAR100(root, download=True) writes the same folder)"
        ),
    ),
    DatasetSpec(
        "pets",
        "Oxford-IIIT Pets",
        37,
        "oxford-iiit-pet",
        {"train": 3_680, "test": 3_669},
        load_pets,
        dev_fraction=0.1,
        key_files=("images", "annotations/trainval.txt", "annotations/test.txt"),
        split_files={"train": ("images", "annotations/trainval.txt"), "test": ("images", "annotations/test.txt")},
        source="pets-folder",
        how_to_get=(
            "https://www.robots.ox.ac.uk/~vgg/data/pets/: images.tar.gz and annotations.tar.gz, unpacked into "
            "oxford-iiit-pet/ (torchvision's OxfordIIITPet(root, download=True) writes the same folder)"
        ),
    ),
    DatasetSpec(
        "flowers102",
        "Oxford Flowers-102",
        102,
        "flowers-102",
        {"train": 1_020, "val": 1_020, "test": 6_149},
        load_flowers,
        dev_fraction=0.1,
        key_files=("jpg", "imagelabels.mat", "setid.mat"),
        source="flowers-folder",
        how_to_get=(
            "https://www.robots.ox.ac.uk/~vgg/data/flowers/102/: 102flowers.tgz (its jpg/), imagelabels.mat and "
            "setid.mat, into flowers-102/ (torchvision's Flowers102(root, download=True) writes the same folder)"
        ),
    ),
    DatasetSpec(
        "imagenet",
        "ImageNet",
        1000,
        "imagenet",
        {"train": 1_281_167, "val": 50_000},
        load_imagenet,
        transfer_splits=("train", "val"),
        dev_fraction=0.01,
        # big_vision's configs/common_fewshot.py: ('imagenet2012', 'train[:65000]', 'validation'),
        # "the first 65000 ImageNet samples have at least 30 shots per any class"
        per_protocol={"fewshot": {"train_limit": 65_000}},
        key_files=("train", "val"),
        split_files={"train": ("train",), "val": ("val",)},
        source="imagenet-folder",
        how_to_get=(
            "https://image-net.org/download (ILSVRC2012, after registering): train/<synset>/ and val/<synset>/ "
            "under imagenet/, as torchvision's ImageFolder reads them; ReaL labels: real.json from "
            "https://github.com/google-research/reassessed-imagenet in imagenet/"
        ),
    ),
]

VTAB_HOW_TO_GET = (
    "`--data-source tfds --download` builds each task from TFDS with task_adaptation's splits (a network "
    "and tensorflow-datasets needed; the --data-dir is TFDS's data_dir); or the VTAB-1k folders PyTorch "
    "fine-tuning papers share (e.g. NOAH's, https://github.com/ZhangYuanhan-AI/NOAH#data-preparation) as "
    "vtab-1k/<task>/ with train800.txt, val200.txt, train800val200.txt, test.txt (lines `path label`)"
)
VTAB = [
    DatasetSpec(
        dataset_name(task),
        f"VTAB {task.title}",
        task.num_classes,
        f"{ROOT_FOLDER}/{task.folder}",
        official_sizes(task),
        folder_loader(task),
        transfer_splits=("train800val200", "test"),
        sweep_splits=("train800", "val200"),
        group=task.group,
        train_flip=task.flip,
        train_crop="random" if task.crop else "none",
        key_files=("train800.txt", "val200.txt", "train800val200.txt", "test.txt"),
        split_files={s: (f"{s}.txt",) for s in ("train800", "val200", "train800val200", "test")},
        other_sources={"tfds": tfds_loader(task)},
        fetchers={"tfds": tfds_fetcher(task)},
        source="vtab-folder",
        how_to_get=VTAB_HOW_TO_GET,
    )
    for task in TASKS
]

# the paper's five transfer datasets also from Hub parquet, WebDataset shards and TFDS builds (paper_sources.py)
CLASSIC = [with_container_sources(spec) for spec in CLASSIC]
DATASETS: dict[str, DatasetSpec] = {spec.name: spec for spec in CLASSIC + ROBUSTNESS + VTAB}

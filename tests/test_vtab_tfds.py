"""task_adaptation's VTAB-1k label rules and split arithmetic, on synthetic TFDS-shaped records
(no TensorFlow needed)."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

from vitbench.datasets import vtab_tfds as t
from vitbench.datasets.vtab import TASKS_BY_KEY
from vitbench.errors import UserError


def clevr(n_objects: int, depths=None) -> dict:
    depths = depths if depths is not None else [12.0] * n_objects
    return {"objects": {"size": np.zeros(n_objects), "pixel_coords": np.array([[10.0, 20.0, d] for d in depths])}}


def test_clevr_count_is_objects_minus_three():
    assert [t.clevr_count(clevr(n)) for n in (3, 4, 10)] == [0, 1, 7]


@pytest.mark.parametrize(
    "depths, label", [([7.9, 20.0], 0), ([8.0], 0), ([8.2, 9.9], 1), ([8.5001], 2), ([9.7], 4), ([10.5, 11], 5)]
)
def test_clevr_distance_bins_the_closest_object(depths, label):
    # thresholds [0, 8, 8.5, 9, 9.5, 10, 100]: label = the largest i with threshold_i < distance
    assert t.clevr_dist(clevr(len(depths), depths)) == label


def kitti(types, depths) -> dict:
    return {"objects": {"type": np.array(types), "location": np.array([[0.0, 1.0, d] for d in depths]).reshape(-1, 3)}}


@pytest.mark.parametrize(
    "types, depths, label",
    [
        ([0], [5.0], 0),  # a car under 8 m
        ([1, 2], [30.0, 12.0], 1),  # van and truck: the closest counts, 8-20 m
        ([0], [25.0], 2),  # 20-999 m
        ([3, 4], [2.0, 3.0], 3),  # pedestrians and cyclists are not vehicles: "no vehicle"
        ([], [], 3),
    ],
)
def test_kitti_distance_bins_the_closest_vehicle(types, depths, label):
    assert t.kitti_dist(kitti(types, depths)) == label


def test_dsprites_binning_and_tiling():
    loc = t.binned("label_x_position", 32, 16)
    ori = t.binned("label_orientation", 40, 16)
    assert [loc({"label_x_position": x}) for x in (0, 1, 2, 31)] == [0, 0, 1, 15]
    assert [ori({"label_orientation": o}) for o in (0, 2, 3, 5, 39)] == [0, 0, 1, 2, 15]  # bins of 2.5
    image = t.tiled_binary({"image": np.array([[[0], [1]]], dtype=np.uint8)})
    assert image.shape == (1, 2, 3) and image[0, 1].tolist() == [255, 255, 255]


def test_smallnorb_attributes_and_grey_tiling():
    record = {"label_azimuth": 17, "label_elevation": 8, "image": np.full((2, 2, 1), 7, np.uint8)}
    assert t.TFDS_TASKS["smallnorb_azim"].label(record) == 17 and t.TFDS_TASKS["smallnorb_elev"].label(record) == 8
    assert t.tiled(record).shape == (2, 2, 3)


# the TFDS split sizes of the pinned builder versions
COUNTS = {
    "caltech101": {"train": 3060, "test": 6084},
    "cifar100": {"train": 50_000, "test": 10_000},
    "dtd": {"train": 1880, "validation": 1880, "test": 1880},
    "eurosat": {"train": 27_000},
    "resisc45": {"train": 31_500},
    "dsprites_loc": {"train": 737_280},
    "smallnorb_azim": {"train": 24_300, "test": 24_300},
    "clevr_count": {"train": 70_000, "validation": 15_000, "test": 15_000},
    "pets": {"train": 3680, "test": 3669},
}


@pytest.mark.parametrize(
    "task, expected",
    [
        ("caltech101", ("train[2754:2954]", "test")),  # val200 starts at 90 % of train
        ("cifar100", ("train[45000:45200]", "test")),
        ("dtd", ("validation[0:200]", "test")),
        ("eurosat", ("train[16200:16400]", "train[21600:]")),  # 60 / 20 / 20 of TFDS train
        ("resisc45", ("train[18900:19100]", "train[25200:]")),
        ("dsprites_loc", ("train[589824:590024]", "train[663552:]")),  # 80 / 10 / 10
        ("smallnorb_azim", ("test[0:200]", "test[12150:]")),  # val from the first half of test
        ("clevr_count", ("train[63000:63200]", "validation")),  # TFDS validation is the VTAB test
        ("pets", ("train[2944:3144]", "test")),  # 80 %
    ],
)
def test_split_arithmetic(task, expected):
    splits = t.split_strings(t.TFDS_TASKS[task], COUNTS[task])
    assert (splits["val200"], splits["test"]) == expected
    assert splits["train800"] == "train[:800]" and splits["train800val200"] == f"train[:800]+{expected[0]}"


@pytest.mark.parametrize("task", ["eurosat", "resisc45", "dsprites_loc", "smallnorb_azim"])
def test_test_slices_have_the_official_test_size(task):
    test = t.split_strings(t.TFDS_TASKS[task], COUNTS[task])["test"]
    split, start = test.split("[")[0], int(test.split("[")[1].split(":")[0])
    assert COUNTS[task][split] - start == TASKS_BY_KEY[task].test_size


def test_a_missing_tfds_split_is_named():
    with pytest.raises(Exception, match="has no 'validation' split"):
        t.split_strings(t.TFDS_TASKS["dtd"], {"train": 10})


def test_tfds_source_without_tensorflow_datasets_says_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)  # as if the extra were not installed
    from vitbench.datasets import DATASETS

    with pytest.raises(
        UserError, match=r"--data-source tfds needs TensorFlow Datasets: pip install 'vitbench\[tfds\]'"
    ):
        DATASETS["vtab/dtd"].load_split(tmp_path, "test", "tfds")
    with pytest.raises(UserError, match=r"--data-source tfds: dataset digits reads sklearn-digits"):
        DATASETS["digits"].load_split(tmp_path, "test", "tfds")
    (tmp_path / "cifar10" / "3.0.2").mkdir(parents=True)  # a build's folder, read without the extra
    (tmp_path / "cifar10" / "3.0.2" / "dataset_info.json").write_text("{}")
    with pytest.raises(UserError, match=r"tfds: datasets need TensorFlow Datasets: pip install 'vitbench\[tfds\]'"):
        DATASETS["cifar10"].load_split(tmp_path, "test", "tfds")


def test_tfds_reader_end_to_end_on_a_prepared_builder(tmp_path, monkeypatch):
    """The real TFDS path (needs the `tfds` extra; skipped without it): a prepared `dtd` with the real
    builder's features and version and synthetic images, read through vitbench and checked against
    TFDS's own reading of the same slice. Read as a library, vitbench leaves the environment as it was
    (it had set TF_CPP_MIN_LOG_LEVEL; only the `vitbench` command's entry quiets TensorFlow now)."""
    monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL", raising=False)
    tfds = pytest.importorskip("tensorflow_datasets")
    tf = pytest.importorskip("tensorflow")
    from vitbench.datasets import DATASETS

    empty = tfds.builder("dtd", data_dir=str(tmp_path / "empty"))
    rng = np.random.default_rng(0)

    def split(n, offset):
        return tf.data.Dataset.from_tensor_slices(
            {
                "image": rng.integers(0, 255, (n, 12, 10, 3), dtype=np.uint8),
                "label": ((np.arange(n) + offset) % 47).astype(np.int64),
                "file_name": np.array([f"{offset}_{i}.jpg".encode() for i in range(n)]),
            }
        )

    tfds.dataset_builders.store_as_tfds_dataset(
        name="dtd",
        version=str(empty.info.version),
        features=empty.info.features,
        split_datasets={"train": split(900, 0), "validation": split(210, 1), "test": split(30, 2)},
        data_dir=str(tmp_path / "tfds"),
    )
    environment = dict(os.environ)  # as TensorFlow left it (importing it sets some of its own)
    spec = DATASETS["vtab/dtd"]
    sizes = {
        s: len(spec.load_split(tmp_path / "tfds", s, "tfds")) for s in ("train800", "val200", "train800val200", "test")
    }
    assert sizes == {"train800": 800, "val200": 200, "train800val200": 1000, "test": 30}
    val = spec.load_split(tmp_path / "tfds", "val200", "tfds")
    direct = list(tfds.as_numpy(tfds.load("dtd", split="validation[:200]", data_dir=str(tmp_path / "tfds"))))
    assert val.source == "tfds" and val.labels.tolist() == [int(r["label"]) for r in direct]
    assert dict(os.environ) == environment
    assert all(np.array_equal(r["image"], img) for r, img in zip(direct, val.images, strict=True))
    (tmp_path / "nothing").mkdir()
    with pytest.raises(UserError, match=r"TFDS dtd:3.\*.\* is not prepared under .*nothing"):
        spec.load_split(tmp_path / "nothing", "test", "tfds")

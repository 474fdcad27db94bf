"""Every on-disk format, read from real image and label files written here in that format."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import write_image
from scipy.io import savemat

from vitbench.catalog.registry import get_dataset
from vitbench.datasets import DATASETS, dataset_status, dev_holdout
from vitbench.datasets.vtab import TASKS, TASKS_BY_KEY
from vitbench.errors import UserError

# --- Oxford-IIIT Pets --------------------------------------------------------------------------------


@pytest.fixture
def pets_dir(tmp_path: Path) -> Path:
    root = tmp_path / "oxford-iiit-pet"
    for split, rows in {"trainval": [("Abyssinian_1", 1), ("beagle_2", 2)], "test": [("yorkie_3", 37)]}.items():
        lines = ["#Image CLASS-ID SPECIES BREED ID", "#ID: 1:37 Class ids"]  # the official header comments
        for i, (name, cls) in enumerate(rows):
            write_image(root / "images" / f"{name}.jpg", mode=("L", "CMYK", "RGB")[i % 3], seed=cls)
            lines.append(f"{name} {cls} 1 {cls}")
        (root / "annotations").mkdir(parents=True, exist_ok=True)
        (root / "annotations" / f"{split}.txt").write_text("\n".join(lines) + "\n")
    return tmp_path


def test_pets_labels_are_class_id_minus_one_and_images_rgb(pets_dir):
    train = DATASETS["pets"].load_split(pets_dir, "train")
    assert train.labels.tolist() == [0, 1] and train.source == "pets-folder"
    assert [train.image(i).mode for i in range(2)] == ["RGB", "RGB"]  # from greyscale and CMYK files
    assert DATASETS["pets"].load_split(pets_dir, "test").labels.tolist() == [36]


def test_pets_bad_annotations_name_file_and_line(pets_dir):
    listing = pets_dir / "oxford-iiit-pet" / "annotations" / "test.txt"
    listing.write_text("yorkie_3 38 1 38\n")
    with pytest.raises(UserError, match=r"test.txt: label 37 is outside 0..36"):
        DATASETS["pets"].load_split(pets_dir, "test")
    listing.write_text("yorkie_3 1 1 1\nghost_9 1 1 1\nghost_10 1 1 1\n")
    with pytest.raises(UserError, match=r"test.txt:2: names a missing image .*ghost_9.jpg \(2 of 3 listed"):
        DATASETS["pets"].load_split(pets_dir, "test")
    listing.write_text("yorkie_3\n")
    with pytest.raises(UserError, match=r"test.txt:1: expected 'name class_id species breed_id'"):
        DATASETS["pets"].load_split(pets_dir, "test")
    listing.unlink()
    with pytest.raises(UserError, match=r"missing Pets test annotation file: .*annotations/test.txt"):
        DATASETS["pets"].load_split(pets_dir, "test")


def test_a_dataset_path_that_is_a_file_is_named(tmp_path):
    (tmp_path / "oxford-iiit-pet").write_text("not a folder")
    with pytest.raises(UserError, match=r"oxford-iiit-pet: is a file, expected the Oxford-IIIT Pets folder"):
        DATASETS["pets"].load_split(tmp_path, "train")


# --- Oxford Flowers-102 -----------------------------------------------------------------------------


@pytest.fixture
def flowers_dir(tmp_path: Path) -> Path:
    root = tmp_path / "flowers-102"
    labels = np.array([[5, 102, 1, 7, 5, 9]])  # 1-based, for images 1..6
    root.mkdir()
    savemat(root / "imagelabels.mat", {"labels": labels})
    savemat(root / "setid.mat", {"trnid": np.array([[1, 2]]), "valid": np.array([[3, 4]]), "tstid": np.array([[5, 6]])})
    for i in range(1, 7):
        write_image(root / "jpg" / f"image_{i:05d}.jpg", mode="P" if i == 2 else "RGB", seed=i)
    return tmp_path


def test_flowers_splits_from_setid_and_labels_minus_one(flowers_dir):
    spec = DATASETS["flowers102"]
    train, val, test = (spec.load_split(flowers_dir, s) for s in ("train", "val", "test"))
    assert train.labels.tolist() == [4, 101] and val.labels.tolist() == [0, 6] and test.labels.tolist() == [4, 8]
    assert [Path(p).name for p in test.paths] == ["image_00005.jpg", "image_00006.jpg"]
    assert train.image(1).mode == "RGB"  # a palette file


def test_flowers_setid_naming_a_missing_image(flowers_dir):
    (flowers_dir / "flowers-102" / "jpg" / "image_00006.jpg").unlink()
    with pytest.raises(UserError, match=r"setid.mat: tstid names a missing image .*image_00006.jpg \(1 of 2"):
        DATASETS["flowers102"].load_split(flowers_dir, "test")


# --- ImageNet: flat val/ with a label file, and ReaL ------------------------------------------------------


@pytest.fixture
def flat_imagenet(tmp_path: Path) -> Path:
    root = tmp_path / "imagenet"
    for i in (1, 2, 3):
        write_image(root / "val" / f"ILSVRC2012_val_{i:08d}.JPEG", seed=i)
    (root / "val_caffe_labels.txt").write_text(
        "ILSVRC2012_val_00000001.JPEG 65\nILSVRC2012_val_00000002.JPEG 970\nILSVRC2012_val_00000003.JPEG 230\n"
    )
    real = [[] for _ in range(50_000)]
    real[0], real[2] = [65], [230, 231]  # image 2 has no ReaL labels
    (root / "real.json").write_text(json.dumps(real))
    return tmp_path


def test_flat_imagenet_val_with_label_file_and_real_labels_beside(flat_imagenet):
    val = DATASETS["imagenet"].load_split(flat_imagenet, "val")
    assert val.labels.tolist() == [65, 970, 230]
    assert val.real_labels == [[65], [], [230, 231]]  # real.json beside the data wins over timm's copy


def test_timm_real_labels_are_the_fallback(flat_imagenet):
    (flat_imagenet / "imagenet" / "real.json").unlink()
    val = DATASETS["imagenet"].load_split(flat_imagenet, "val")
    assert val.real_labels == [[], [970, 795], [230, 231]]  # timm's imagenet_real_labels.json, images 1..3


def test_flat_imagenet_image_without_a_label_is_named(flat_imagenet):
    write_image(flat_imagenet / "imagenet" / "val" / "ILSVRC2012_val_00000009.JPEG")
    with pytest.raises(UserError, match=r"val_caffe_labels.txt: has no label for .*ILSVRC2012_val_00000009.JPEG"):
        DATASETS["imagenet"].load_split(flat_imagenet, "val")


# --- VTAB-1k folder layout -------------------------------------------------------------------------------


@pytest.fixture
def vtab_dir(tmp_path: Path) -> Path:
    """vtab-1k/dtd with 4 + 2 train/val images and 3 test images, lists as the PyTorch releases write them."""
    root = tmp_path / "vtab-1k" / "dtd"
    lists = {"train800": [0, 1, 46, 3], "val200": [5, 6], "test": [0, 1, 2]}
    for split, labels in lists.items():
        lines = []
        for i, label in enumerate(labels):
            rel = f"images/{split}/{i}.jpg"
            write_image(root / rel, seed=label)
            lines.append(f"{rel} {label}")
        (root / f"{split}.txt").write_text("\n".join(lines) + "\n")
    (root / "train800val200.txt").write_text((root / "train800.txt").read_text() + (root / "val200.txt").read_text())
    return tmp_path


def test_vtab_folder_layout_reads_every_split(vtab_dir):
    spec = DATASETS["vtab/dtd"]
    sizes = {s: len(spec.load_split(vtab_dir, s)) for s in ("train800", "val200", "train800val200", "test")}
    assert sizes == {"train800": 4, "val200": 2, "train800val200": 6, "test": 3}
    split = spec.load_split(vtab_dir, "train800")
    assert split.labels.tolist() == [0, 1, 46, 3] and split.source == "vtab-folder"
    assert spec.sweep_splits == ("train800", "val200") and spec.transfer_splits == ("train800val200", "test")


@pytest.mark.parametrize(
    "line, message",
    [
        ("images/test/0.jpg", r"test.txt:2: expected 'relative/path label', got 'images/test/0.jpg'"),
        ("images/test/0.jpg seven", r"test.txt:2: expected 'relative/path label'"),
        ("images/test/0.jpg 47", r"test.txt:2: label 47 is outside 0..46"),
        ("images/test/nope.jpg 3", r"test.txt:2: names a missing image .*nope.jpg \(1 of 2 listed"),
    ],
)
def test_vtab_bad_list_lines_name_file_and_line(vtab_dir, line, message):
    (vtab_dir / "vtab-1k" / "dtd" / "test.txt").write_text(f"images/test/1.jpg 1\n{line}\n")
    with pytest.raises(UserError, match=message):
        DATASETS["vtab/dtd"].load_split(vtab_dir, "test")


def test_vtab_missing_split_file_is_named(vtab_dir):
    (vtab_dir / "vtab-1k" / "dtd" / "val200.txt").unlink()
    with pytest.raises(UserError, match=r"missing VTAB-1k DTD 'val200' list: .*vtab-1k/dtd/val200.txt"):
        DATASETS["vtab/dtd"].load_split(vtab_dir, "val200")


def test_vtab_task_table_matches_the_paper():
    groups = [t.group for t in TASKS]
    assert len(TASKS) == 19 and groups.count("natural") == 7 and groups.count("specialized") == 4
    assert groups.count("structured") == 8
    # BiT Suppl. F: no flip for dSpr-Loc/Ori and sNORB-Azim; no crop for Clevr-*, DMLab, KITTI, dSpr-Loc
    no_flip = {t.key for t in TASKS if not DATASETS[f"vtab/{t.key}"].train_flip}
    no_crop = {t.key for t in TASKS if DATASETS[f"vtab/{t.key}"].train_crop == "none"}
    assert no_flip == {"dsprites_loc", "dsprites_ori", "smallnorb_azim"}
    assert no_crop == {"clevr_count", "clevr_dist", "dmlab", "kitti_dist", "dsprites_loc"}
    assert all(
        DATASETS[n].train_flip and DATASETS[n].train_crop == "inception" for n in ("cifar10", "pets", "imagenet")
    )
    paper_keys = {row.split(",")[1] for row in (Path(__file__).parents[1] / "results/paper/table9.csv").open()}
    assert {f"vtab/{t.key}" for t in TASKS} <= paper_keys  # the same names as the paper's Table 9 rows
    assert TASKS_BY_KEY["smallnorb_azim"].num_classes == 18 and TASKS_BY_KEY["clevr_count"].num_classes == 8


# --- folder:<path> --------------------------------------------------------------------------------------


def test_imagefolder_dataset_with_and_without_val(tmp_path):
    for split, n in (("train", 3), ("test", 2)):
        for cls in ("cat", "dog"):
            for i in range(n):
                write_image(tmp_path / "pics" / split / cls / f"{i}.png", seed=i)
    spec = get_dataset(f"folder:{tmp_path / 'pics'}")
    assert spec.name.startswith("folder:pics@") and spec.num_classes == 2 and spec.location == tmp_path / "pics"
    assert spec.sweep_splits == ("subtrain", "dev")  # no val/: 10 % of train held out
    test = spec.load_split(None, "test")
    assert test.labels.tolist() == [0, 0, 1, 1] and not test.is_subset
    for cls in ("cat", "dog"):
        write_image(tmp_path / "pics" / "val" / cls / "0.png")
    assert get_dataset(f"folder:{tmp_path / 'pics'}").sweep_splits == ("train", "val")
    (tmp_path / "pics" / "test" / "bird").mkdir()
    with pytest.raises(UserError, match=r"test/bird: empty class folder"):
        spec.load_split(None, "test")


def test_imagefolder_reads_the_images_of_subfolders_as_torchvision_does(tmp_path):
    """Issue 71, item 13. Before: a class folder's subfolders were skipped, silently (2 of 6 images
    read). Now every image under a class folder is read, in the order torchvision's ImageFolder
    (whose conventions the README promises) lists them, and a link back up is walked once."""
    from torchvision.datasets import ImageFolder

    root = tmp_path / "pics"
    for rel in ("cat/0.png", "cat/a/1.png", "cat/a/deeper/2.png", "cat/b-x/3.png", "dog/4.png", "dog/z/5.png"):
        for split in ("train", "test"):
            write_image(root / split / rel, seed=len(rel))
    test = get_dataset(f"folder:{root}").load_split(None, "test")
    expected = ImageFolder(str(root / "test")).samples
    assert (
        len(test) == 6 and test.paths == [p for p, _ in expected] and test.labels.tolist() == [c for _, c in expected]
    )
    (root / "test" / "cat" / "a" / "up").symlink_to(root / "test" / "cat")  # a loop: walked once, not forever
    assert len(get_dataset(f"folder:{root}").load_split(None, "test")) == 6


def test_imagefolder_needs_train_and_test(tmp_path):
    (tmp_path / "pics" / "train").mkdir(parents=True)
    with pytest.raises(UserError, match=r"missing 'test' folder of the ImageFolder tree: .*pics/test"):
        get_dataset(f"folder:{tmp_path / 'pics'}")


def test_a_prefix_no_format_has_is_one_line_naming_the_known_ones():
    """`folder:` is one format among those plugins add (`csv:` in docs/architecture.md): an unknown
    prefix or a missing argument is one line, not a lookup of a dataset named `csv:x`."""
    known = r"\(known: folder:, hf:, wds:, tfds:;"
    with pytest.raises(UserError, match=rf"dataset 'csv:x.csv': no dataset format 'csv:' {known}"):
        get_dataset("csv:x.csv")
    with pytest.raises(UserError, match=r"dataset 'folder:': folder: needs its argument \(any ImageFolder tree"):
        get_dataset("folder:")


# --- dev split ----------------------------------------------------------------------------------------------


def test_dev_holdout_is_deterministic_disjoint_and_the_papers_size():
    subtrain, dev = dev_holdout(50_000, 0.02)
    assert len(dev) == 1000 and len(subtrain) == 49_000  # CIFAR: train[:98%] / train[98%:]
    assert len(np.intersect1d(subtrain, dev)) == 0 and len(np.union1d(subtrain, dev)) == 50_000
    again = dev_holdout(50_000, 0.02)
    assert np.array_equal(again[1], dev)
    assert len(dev_holdout(3680, 0.1)[1]) == 368 and len(dev_holdout(1_281_167, 0.01)[1]) == 12_812


def test_dev_split_of_a_loaded_dataset(cifar10_dir):
    spec = DATASETS["cifar10"]
    sub, dev = spec.load_split(cifar10_dir, "subtrain"), spec.load_split(cifar10_dir, "dev")
    assert len(sub) + len(dev) == 60 and len(dev) == 1  # round(60 × 2 %) = 1
    assert sub.fingerprint != dev.fingerprint and sub.images.shape[1:] == (32, 32, 3)
    assert spec.sweep_splits == ("subtrain", "dev") and spec.transfer_splits == ("train", "test")


# --- doctor's counts ---------------------------------------------------------------------------------------


def test_dataset_status_counts_splits_against_official(pets_dir):
    status, counts = dataset_status(DATASETS["pets"], pets_dir)
    assert status == "found (subset)"
    # and how many of Pets' 37 classes each split holds: chance there is 100 / those (issue 80)
    assert [c.describe() for c in counts] == [
        "train 2 / 3,680 (subset: 2 of 37 classes)",
        "test 1 / 3,669 (subset: 1 of 37 classes)",
    ]
    (pets_dir / "oxford-iiit-pet" / "images" / "yorkie_3.jpg").unlink()
    status, counts = dataset_status(DATASETS["pets"], pets_dir)
    assert status.startswith("incomplete: ") and "names a missing image" in status and "(1 of 1 listed" in status
    assert dataset_status(DATASETS["flowers102"], pets_dir) == ("absent", [])

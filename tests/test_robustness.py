"""The ImageNet robustness test sets: each read from its distributed layout (trees built here), the
class masking and pooling of an ImageNet-1k head, the suite, doctor and the robustness view; and the
shared ImageNet subset rearranged into ImageNet-V2's layout scores exactly as in val's."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import DEIT_WEIGHTS, SHARED_DATA, needs_shared_data, write_image
from PIL import Image

from vitbench import store
from vitbench.catalog.registry import get_model
from vitbench.datasets import DATASETS, imagenet_synsets
from vitbench.datasets.imagenet import timm_info
from vitbench.datasets.robustness import OBJECTNET_MAPPINGS
from vitbench.engine.scoring import pool_classes
from vitbench.errors import UserError
from vitbench.weights import build_model

SYNSETS = imagenet_synsets(Path("/nonexistent"))  # timm's canonical order
R_SYNSETS = timm_info("imagenet_r_synsets.txt").read_text().split()
A_SYNSETS = timm_info("imagenet_a_synsets.txt").read_text().split()


def head_weights(path: Path, bias: dict[int, float]) -> Path:
    """A ViT-Ti/16 with an ImageNet-1k head whose output ignores the image: zero weights and
    `bias` (class -> logit, 0 elsewhere). Every image gets the same logits, so which class is
    predicted, and so the accuracy, follows from the bias and the label mapping alone."""
    from safetensors.torch import save_file

    model = build_model(get_model("vit-ti/16"), 1000, 224, "random")
    state = {k: v.clone().contiguous() for k, v in model.state_dict().items()}
    state["head.weight"].zero_()
    state["head.bias"].zero_()
    for index, value in bias.items():
        state["head.bias"][index] = value
    save_file(state, str(path))
    return path


def write_tree(root: Path, counts: dict[str, int], suffix: str = ".jpg") -> None:
    for i, (folder, n) in enumerate(counts.items()):
        for j in range(n):
            write_image(root / folder / f"img{j}{suffix}", seed=10 * i + j)


def eval_metrics(cli, results: Path, weights: Path, data: Path, dataset: str, *more: str) -> dict[str, float]:
    code, _, err = cli(
        "run", "--results", results, "--protocol", "eval", "--model", "vit-ti/16", "--weights", weights,
        "--dataset", dataset, "--data-dir", data, "--workers", "0", *more,
    )  # fmt: skip
    assert code == 0, err
    rows = store.read_results(results)
    return rows[rows["dataset"] == dataset].set_index("metric")["value"].to_dict()


def test_pool_classes_takes_the_max_over_each_class_map():
    logits = np.array([[5.0, 1.0, 2.0, 9.0], [0.0, 3.0, -1.0, 9.0]])
    assert pool_classes(logits, None) is logits
    np.testing.assert_array_equal(pool_classes(logits, [[1], [0, 2]]), [[1.0, 5.0], [3.0, 0.0]])


@pytest.mark.parametrize("name, synsets", [("imagenet-r", R_SYNSETS), ("imagenet-a", A_SYNSETS)])
def test_200_class_sets_label_by_timms_synsets_and_map_to_imagenet(tmp_path, name, synsets):
    assert len(synsets) == 200
    root = tmp_path / name
    write_tree(root, {synsets[7]: 2, synsets[150]: 1})
    split = DATASETS[name].load_split(tmp_path, "test")
    assert split.labels.tolist() == [7, 7, 150] and len(split.class_map) == 200
    # timm's indices file agrees with the canonical ImageNet order, class by class
    assert split.class_map == [[SYNSETS.index(s)] for s in synsets]
    (root / "n99999999").mkdir()
    write_image(root / "n99999999" / "x.jpg")
    with pytest.raises(UserError, match=f"n99999999' is not one of the 200 {DATASETS[name].title} synsets"):
        DATASETS[name].load_split(tmp_path, "test")


@pytest.mark.parametrize("name", ["imagenet-r", "imagenet-a"])
def test_a_head_favouring_a_class_outside_the_subset_is_scored_within_it(cli, results, tmp_path, name):
    """Class 0 (tench) is in neither set and gets the highest logit: scored over 1000 classes no
    image would be right; restricted to the 200, every image is predicted as the favoured subset
    class `b`, so the accuracy is the share of b's images (3 of 5)."""
    synsets = R_SYNSETS if name == "imagenet-r" else A_SYNSETS
    assert SYNSETS[0] not in synsets
    a, b = synsets[3], synsets[120]
    write_tree(tmp_path / "data" / name, {a: 2, b: 3})
    weights = head_weights(tmp_path / "w.safetensors", {0: 50.0, SYNSETS.index(b): 20.0, SYNSETS.index(a): 10.0})
    metrics = eval_metrics(cli, results, weights, tmp_path / "data", name)
    assert (metrics["n_correct"], metrics["n_scored"]) == (3, 5)
    assert metrics["accuracy_top5"] == 1.0  # a is second among the 200


def test_imagenet_v2_folders_are_class_indices(tmp_path):
    root = tmp_path / "imagenetv2-matched-frequency-format-val"
    write_tree(root, {"7": 2, "999": 1}, suffix=".jpeg")
    split = DATASETS["imagenet-v2"].load_split(tmp_path, "test")
    assert split.labels.tolist() == [7, 7, 999] and split.class_map is None and split.source == "imagenetv2-folder"
    write_image(root / "n01440764" / "x.jpeg")  # an ImageNet synset folder is not V2's layout
    with pytest.raises(UserError, match="'n01440764' is not one of the class indices 0..999"):
        DATASETS["imagenet-v2"].load_split(tmp_path, "test")


def test_imagenet_sketch_reads_synset_folders(tmp_path):
    write_tree(tmp_path / "sketch", {SYNSETS[0]: 1, SYNSETS[999]: 2}, suffix=".JPEG")
    split = DATASETS["imagenet-sketch"].load_split(tmp_path, "test")
    assert split.labels.tolist() == [0, 999, 999] and split.class_map is None


def write_objectnet(root: Path, images: dict[int, int]) -> None:
    """ObjectNet 1.0's layout: images/<folder>/*.png with a 1-pixel red border, and the four
    mappings/ files. ImageNet names sit in a permuted 2012-id order (line = 7 * index mod 1000),
    ObjectNet label i < 113 maps to ImageNet classes 2i and 2i + 1, labels 113..119 to none."""
    maps = root / "mappings"
    maps.mkdir(parents=True)
    line_of = {index: (7 * index) % 1000 for index in range(1000)}
    names = [""] * 1000
    for index, line in line_of.items():
        names[line] = f"imagenet class {index}"
    (maps / OBJECTNET_MAPPINGS[3]).write_text("\n".join(names) + "\n")
    (maps / OBJECTNET_MAPPINGS[2]).write_text(json.dumps({str(i): line for i, line in line_of.items()}))
    (maps / OBJECTNET_MAPPINGS[0]).write_text(json.dumps({f"folder_{i:03d}": f"Label {i}" for i in range(120)}))
    overlap = {f"Label {i}": f"imagenet class {2 * i}; imagenet class {2 * i + 1}" for i in range(113)}
    (maps / OBJECTNET_MAPPINGS[1]).write_text(json.dumps(overlap))
    for label, n in images.items():
        for j in range(n):
            pixels = np.full((12, 10, 3), 40 * j + 10 * (label % 5), dtype=np.uint8)
            red = (255, 0, 0)
            pixels[0, :], pixels[-1, :], pixels[:, 0], pixels[:, -1] = red, red, red, red
            (root / "images" / f"folder_{label:03d}").mkdir(parents=True, exist_ok=True)
            Image.fromarray(pixels).save(root / "images" / f"folder_{label:03d}" / f"{j}.png")


def test_objectnet_reads_its_mappings_and_crops_the_red_border(tmp_path):
    write_objectnet(tmp_path / "objectnet-1.0", {5: 2, 50: 1, 115: 1})  # folder 115 is not an ImageNet class
    split = DATASETS["objectnet"].load_split(tmp_path, "test")
    assert split.labels.tolist() == [5, 5, 50] and split.class_map[5] == [10, 11] and len(split.class_map) == 113
    image = np.asarray(split.image(0))
    assert image.shape == (10, 8, 3) and not (image == (255, 0, 0)).all(axis=-1).any()
    (tmp_path / "objectnet-1.0" / "mappings" / OBJECTNET_MAPPINGS[1]).write_text('{"Label 1": "no such class"}')
    with pytest.raises(UserError, match="'no such class' .*is not in imagenet_to_label_2012_v2"):
        DATASETS["objectnet"].load_split(tmp_path, "test")


def test_objectnet_pools_the_imagenet_logits_of_each_class(cli, results, tmp_path):
    """Class 5 maps to ImageNet 10 and 11: only 11 (its second) is favoured, and ImageNet class 999,
    which no ObjectNet class maps to, more so: every image is predicted as class 5 (2 of 3 right)."""
    write_objectnet(tmp_path / "data" / "objectnet-1.0", {5: 2, 50: 1, 115: 1})
    weights = head_weights(tmp_path / "w.safetensors", {999: 50.0, 11: 20.0})
    metrics = eval_metrics(cli, results, weights, tmp_path / "data", "objectnet")
    assert (metrics["n_correct"], metrics["n_scored"]) == (2, 3)
    hparams = json.loads(store.read_results(results)["hparams"].iloc[0])
    assert hparams["class_pooling"] == "max" and hparams["head_classes"] == 1000
    assert hparams["objectnet_scoring"] == "restricted"
    # ObjectNet's own code: the top-k over all 1,000; ImageNet 999 belongs to no ObjectNet class, so
    # every top-1 is a miss; the top 5 are ImageNet 999, 11, 0, 1, 2 (ties in index order) = ObjectNet
    # -, 5, 0, 0, 1: the two class-5 images are hits at top-5, the class-50 one is not
    theirs = eval_metrics(cli, results / "all", weights, tmp_path / "data", "objectnet", "--objectnet-scoring", "all")
    assert (theirs["n_correct"], theirs["accuracy_top5"]) == (0, pytest.approx(2 / 3))
    assert metrics["accuracy"] > theirs["accuracy"] and metrics["accuracy_top5"] >= theirs["accuracy_top5"]
    stored = store.read_results(results / "all")
    assert json.loads(stored["hparams"].iloc[0])["objectnet_scoring"] == "all"
    from vitbench.store.predictions import read_predictions

    (key,) = set(stored["run_key"])
    recorded = json.loads(stored["notes"].iloc[0])["predictions"]
    top1 = read_predictions(results / "all", key, recorded)["top1"]
    assert set(top1) == {113}  # the stored top-1 is that of all 1,000: "other", outside ObjectNet's classes


def test_suite_doctor_view_and_a_protocol_that_needs_train(cli, results, tmp_path):
    data = tmp_path / "data"
    write_tree(data / "imagenet-r", {R_SYNSETS[0]: 2, R_SYNSETS[1]: 2})
    write_tree(data / "imagenetv2-matched-frequency-format-val", {"1": 1, "2": 3}, suffix=".jpeg")
    val = data / "imagenet" / "val"
    for j, synset in enumerate([R_SYNSETS[1], R_SYNSETS[1], SYNSETS[5], SYNSETS[6]]):
        write_image(val / synset / f"ILSVRC2012_val_{j + 1:08d}.JPEG", seed=j)
    code, out, _ = cli("doctor", "--data-dir", data)
    flat = " ".join(out.split())
    assert code == 0 and "imagenet-r │ found (subset) │ test 4 / 30,000 (subset: 2 of 200 classes)" in flat
    assert "objectnet │ absent" in flat
    assert SYNSETS.index(R_SYNSETS[1]) == 2  # ImageNet class 2: V2's folder "2"
    weights = head_weights(tmp_path / "w.safetensors", {2: 5.0})
    common = ("--model", "vit-ti/16", "--weights", weights, "--data-dir", data, "--workers", "0")
    code, _, err = cli("run", "--results", results, "--suite", "robustness", *common)
    assert code == 2 and "5 of 8 datasets not found" in err and "--skip-missing" in err
    code, out, err = cli("run", "--results", results, "--suite", "robustness", "--skip-missing", *common)
    assert code == 0, err
    assert set(store.read_results(results)["dataset"]) == {"imagenet", "imagenet-r", "imagenet-v2"}
    code, out, _ = cli("table", "--results", results, "--view", "robustness", "--format", "csv")
    assert code == 0
    cells = {tuple(line.split(",")[:2]): line.split(",")[2] for line in out.splitlines()[1:]}
    ours = next(c for _, c in cells if "(paper)" not in c)  # the one measured column: vit-ti/16
    assert cells[("ImageNet-R", ours)] == "50" and cells[("ImageNet-V2", ours)] == "75"  # R_SYNSETS[1]; class 2
    assert cells[("ImageNet", ours)] == "50"  # two of the four val images are R_SYNSETS[1]
    assert cells[("Average drop from ImageNet (points)", ours)] == "-12.5"  # 50 - (75 + 50) / 2
    paper_col = "vit-h/14-jft (paper)"
    assert cells[("ObjectNet", paper_col)] == "61.7" and cells[("ObjectNet (top-5)", paper_col)] == "82.1"
    assert cells[("ImageNet", paper_col)] == "88.55"
    code, out, _ = cli("table", "--results", results, "--view", "robustness")
    print(out)
    assert code == 0 and "-12.50 (2 sets)‡" in out and "logits restricted to their 200 classes" in out
    code, _, err = cli("run", "--results", results, "--dataset", "imagenet-r", "--shots", "1", *common)
    assert code == 2 and "does not have (it has: test); test set only (--protocol eval)" in err
    assert len(err.strip().splitlines()) == 1


@needs_shared_data
def test_imagenet_v2_layout_scores_the_same_images_exactly_as_val(cli, results, tmp_path, deit_imagenet_eval):
    """The shared ImageNet val subset, linked into ImageNet-V2's layout (folders named by class
    index, any file names): the same 500 images give the same top-1 and top-5."""
    synsets = (SHARED_DATA / "imagenet" / "synset_words.txt").read_text().split("\n")
    index = {line.split()[0]: i for i, line in enumerate(synsets) if line.strip()}
    v2 = tmp_path / "data" / "imagenetv2-matched-frequency-format-val"
    for folder in sorted((SHARED_DATA / "imagenet" / "val").iterdir()):
        target = v2 / str(index[folder.name])
        target.mkdir(parents=True)
        for j, image in enumerate(sorted(folder.iterdir())):
            (target / f"{j:04x}.jpeg").symlink_to(image)
    run = ("--protocol", "eval", "--model", "deit-ti/16", "--weights", DEIT_WEIGHTS, "--workers", "2")
    shutil.copytree(deit_imagenet_eval, results)  # val was scored there once (the fixture)
    code, _, err = cli("run", "--results", results, "--dataset", "imagenet", "--data-dir", SHARED_DATA, *run)
    assert code == 0, err
    code, _, err = cli("run", "--results", results, "--dataset", "imagenet-v2", "--data-dir", tmp_path / "data", *run)
    assert code == 0, err
    rows = store.read_results(results)
    by = {d: part.set_index("metric")["value"] for d, part in rows.groupby("dataset")}
    assert (by["imagenet"]["n_correct"], by["imagenet"]["n_scored"]) == (353, 500)  # the README's reference
    assert (by["imagenet-v2"]["n_correct"], by["imagenet-v2"]["n_scored"]) == (353, 500)
    assert by["imagenet-v2"]["accuracy_top5"] == by["imagenet"]["accuracy_top5"]

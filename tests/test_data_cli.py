"""The datasets issue end to end: suites with missing data, corrupt images, the eval protocol
(ReaL included), doctor, and the VTAB roll-up in the table."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import DEIT_WEIGHTS, SHARED_DATA, needs_shared_data, write_image

from vitbench import store
from vitbench.datasets.vtab import group_means
from vitbench.engine import scoring

FAST = ("--res", "32", "--workers", "0", "--extraction-batch", "256", "--model", "vit-ti/16", "--weights", "random")


@pytest.fixture
def pictures(tmp_path: Path) -> Path:
    """An ImageFolder tree of real JPEGs, 2 classes, 4 train and 2 test images each."""
    root = tmp_path / "pics"
    for split, n in (("train", 4), ("test", 2)):
        for c, cls in enumerate(("cat", "dog")):
            for i in range(n):
                write_image(root / split / cls / f"{i}.jpg", seed=10 * c + i)
    return root


def test_corrupt_jpeg_is_named_or_skipped_and_counted(cli, results, pictures):
    bad = pictures / "test" / "dog" / "1.jpg"
    bad.write_bytes(bad.read_bytes()[:200])  # truncated
    args = ("run", "--results", results, "--dataset", f"folder:{pictures}", "--shots", "1", "--seeds", "0", *FAST)
    code, _, err = cli(*args)
    assert code == 2 and f"error: {bad}: corrupt or truncated image" in err and "--skip-corrupt" in err
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith(f"error: {bad}")  # one line
    code, _, err = cli(*args, "--skip-corrupt")
    assert code == 0, err
    row = store.read_results(results).iloc[0]
    assert row["skipped_images"] == 1 and row["n_test"] == 3 and row["data_subset"]  # marked ‡ in the table
    assert str(bad) in row["notes"]


def test_suite_with_missing_datasets_stops_or_skips(cli, results, cifar10_dir, caplog):
    args = ("run", "--results", results, "--suite", "table2", "--data-dir", cifar10_dir, *FAST)
    code, _, err = cli(*args)
    assert code == 2 and "23 of 24 datasets not found under" in err
    assert f"imagenet (no {cifar10_dir / 'imagenet'})" in err and "vtab/dtd (no " in err and "--skip-missing" in err
    code, out, _ = cli(*args, "--dry-run", "--assume-mfu", "0.4@H100")  # a dry run plans them all the same
    assert code == 0 and out.count("(planned from the official split sizes)") == 23
    code, out, _ = cli(*args, "--dry-run", "--skip-missing")
    assert code == 0 and "skipping 23 of 24 datasets" in caplog.text
    assert "cifar10" in out and "imagenet" not in out


def test_vtab_folder_runs_through_the_cli(cli, results, tmp_path):
    root = tmp_path / "vtab-data"
    for split, labels in {"train800val200": [0, 1, 0, 1], "test": [0, 1]}.items():
        lines = []
        for i, label in enumerate(labels):
            write_image(root / "vtab-1k" / "dtd" / "images" / f"{split}{i}.jpg", seed=label)
            lines.append(f"images/{split}{i}.jpg {label}")
        (root / "vtab-1k" / "dtd" / f"{split}.txt").write_text("\n".join(lines) + "\n")
    code, _, err = cli(
        "run", "--results", results, "--dataset", "vtab/dtd", "--data-dir", root, "--shots", "1", "--seeds", "0", *FAST
    )
    assert code == 0, err
    row = store.read_results(results).iloc[0]
    assert row["dataset"] == "vtab/dtd" and row["data_source"] == "vtab-folder" and row["n_test"] == 2


def test_eval_scores_top1_top5_and_real():
    logits = np.array([[0.9, 0.1, 0.0], [0.1, 0.2, 0.7], [0.5, 0.4, 0.1], [0.0, 0.0, 1.0]])
    labels = np.array([0, 1, 1, 2])
    real = [[0], [2, 1], [], [1]]  # image 3 has no ReaL labels: not scored
    s = scoring.scores(logits, labels, real)
    assert s["accuracy"] == 0.5 and s["n_correct"] == 2 and s["accuracy_top3"] == 1.0
    assert s["n_scored_real"] == 3 and s["n_correct_real"] == 2 and s["accuracy_real"] == pytest.approx(2 / 3)
    assert "accuracy_real" not in scoring.scores(logits, labels, None)


@needs_shared_data
def test_eval_reproduces_the_deit_tiny_reference_figures(cli, results, deit_imagenet_eval):
    """../shared/data/README.md: top-1 70.6 % (353 of 500), ReaL 76.6 % (364 of the 475 with labels)."""
    shutil.copytree(deit_imagenet_eval, results)  # the eval ran there once (the fixture); the command finds it
    code, out, err = cli(
        "run", "--results", results, "--protocol", "eval", "--model", "deit-ti/16", "--weights", DEIT_WEIGHTS,
        "--dataset", "imagenet", "--data-dir", SHARED_DATA, "--workers", "2",
    )  # fmt: skip
    assert code == 0, err
    metrics = store.read_results(results).set_index("metric")["value"]
    assert (metrics["n_correct"], metrics["n_scored"]) == (353, 500)
    assert (metrics["n_correct_real"], metrics["n_scored_real"]) == (364, 475)
    assert "ImageNet ReaL" in out and "76.63‡" in out and "70.60‡" in out


@needs_shared_data
def test_eval_needs_a_classifier_with_the_datasets_classes(cli, results, cifar10_dir):
    code, _, err = cli(
        "run", "--results", results, "--protocol", "eval", "--model", "deit-ti/16", "--weights", DEIT_WEIGHTS,
        "--dataset", "cifar10", "--data-dir", cifar10_dir, "--workers", "0",
    )  # fmt: skip
    assert code == 2 and "its classifier has 1000 classes, scoring the dataset needs 10" in err


@needs_shared_data
def test_doctor_reports_the_shared_subsets(cli):
    code, out, _ = cli("doctor", "--data-dir", SHARED_DATA)
    assert code == 0
    flat = " ".join(out.split())
    for expected in (
        "train 1,102 / 50,000 (subset)",  # cifar10: only data_batch_1
        # a subset, as the others read (issue 89: "incomplete: missing data_batch_2 (4 of 6 key files missing)")
        "cifar10 │ found (subset: 4 of 6 key files absent, e.g. data_batch_2)",
        "train 486 / 50,000 (subset: 99 of 100 classes), test 916 / 10,000 (subset)",
        "train 300 / 3,680 (subset: 3 of 37 classes), test 298 / 3,669 (subset: 3 of 37 classes)",
        "train 1,020 / 1,020, val 204 / 1,020 (subset), test 306 / 6,149 (subset)",
        "train — (missing ImageNet 'train' folder: imagenet/train), val 500 / 50,000 (subset: 10 of 1,000 classes)",
        "vtab/* (19 tasks) │ absent",
    ):
        assert expected in flat, expected


def test_vtab_group_means_from_table9_match_table2():
    paper = pd.read_csv(Path(__file__).parents[1] / "results/paper/table9.csv")
    expected = {"vit-h/14-jft": 77.63, "vit-l/16-jft": 76.28, "vit-l/16-i21k": 72.72}  # Table 2's VTAB row
    for column, vtab in expected.items():
        tasks = paper[(paper["column"] == column) & (paper["task"] != "vtab")]
        means = group_means({k[len("vtab/") :]: v for k, v in zip(tasks["task"], tasks["value"], strict=True)})
        assert abs(means["vtab"] - vtab) < 0.02, column  # Table 9 rounds each task to 0.1


def test_a_dataset_lacking_the_split_a_protocol_needs_counts_as_missing(cli, results, imagenet_dir):
    """ImageNet with val/ only: few-shot needs train/ (missing), eval needs val/ only (there)."""
    common = ("--dataset", "imagenet", "--data-dir", imagenet_dir, *FAST)
    code, _, err = cli("run", "--results", results, *common)
    assert code == 2 and f"imagenet (no {imagenet_dir / 'imagenet' / 'train'})" in err
    code, out, err = cli("run", "--results", results, "--protocol", "eval", *common, "--dry-run")
    assert code == 0 and "imagenet" in out and " eval seed=0" in out

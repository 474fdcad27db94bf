"""Marks that answer the researcher's question (issue 45): with DeiT-Ti and random init side by side on
an image folder, `table --ci --baseline weights=random` tests each DeiT-Ti cell against random init's
cell of the same protocol, shots and k, and nothing else; `compare A B --all` prints every shared
setting in one call. Before, each `*` compared a cell with its row's first column: "pretrained
10-shot vs pretrained 1-shot", "random k-NN vs pretrained 1-shot"."""

from __future__ import annotations

import pickle
import re
from pathlib import Path

import numpy as np
import pytest
from conftest import DEIT_WEIGHTS, SHARED_DATA, needs_shared_data
from PIL import Image

from vitbench import store
from vitbench.store.predictions import read_predictions
from vitbench.store.query import json_field
from vitbench.views.measured.axes import with_axes
from vitbench.views.statistics import methods as stats
from vitbench.views.statistics.significance import ALPHA, SIGNIFICANT_MARK

CLASSES = (0, 1, 2)  # airplane, automobile, bird


def _cifar_folder(root: Path, train_per_class: int, test_per_class: int) -> Path:
    """Real CIFAR-10 images (the shared subset) as an ImageFolder tree of three classes."""
    source = SHARED_DATA / "cifar-10-batches-py"
    for split, batch, per_class in (("train", "data_batch_1", train_per_class), ("test", "test_batch", test_per_class)):
        with open(source / batch, "rb") as f:
            data = pickle.load(f, encoding="latin1")
        images = data["data"].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
        for label in CLASSES:
            folder = root / split / f"class{label}"
            folder.mkdir(parents=True)
            for i in np.flatnonzero(np.array(data["labels"]) == label)[:per_class]:
                Image.fromarray(images[i]).save(folder / f"{i}.png")
    return root


@pytest.fixture(scope="module")
def deit_and_random(tmp_path_factory) -> Path:
    """DeiT-Ti and random init, few-shot (1 and 5 shots) and k-NN (k = 3, 10), on 3 × 60 test images, at
    112 px (a quarter of 224 px's cost; the position embeddings interpolated)."""
    if not DEIT_WEIGHTS.exists():
        pytest.skip("../shared/data is not present")
    import vitbench

    folder = tmp_path_factory.mktemp("baseline")
    data = _cifar_folder(folder / "photos", 10, 60)
    vitbench.run(model="deit-ti/16", weights=[DEIT_WEIGHTS, "random"], datasets=[f"folder:{data}"],
                 protocol=["fewshot", "knn"], shots=[1, 5], seeds=[0], knn_k=[3, 10], res=112, workers=0,
                 results=folder / "results")  # fmt: skip
    return folder / "results"


def _expected_marks(results: Path) -> dict[str, bool]:
    """Worked out here from the stored predictions, apart from the views: each DeiT-Ti run against the
    random-init run of the same protocol, shots and k, Holm over those pairs. Key: its setting."""
    runs = with_axes(store.read_results(results))
    runs = runs[runs["metric"] == "accuracy"]
    setting = [f"{r.protocol} {r.shots if r.protocol == 'fewshot' else k}" for r in runs.itertuples()
               for k in [json_field(r.hparams).get("knn_k")]]  # fmt: skip
    outcomes = {}
    for run, name in zip(runs.itertuples(), setting, strict=True):
        kept = read_predictions(results, run.run_key, json_field(run.notes)["predictions"])
        outcomes[(name, bool(run.random_init))] = kept.sort_values("id")["correct"].to_numpy()
    names = sorted({name for name, _ in outcomes})
    p = [stats.compare(outcomes[(n, True)][None], outcomes[(n, False)][None]).p for n in names]
    return dict(zip(names, (q < ALPHA for q in stats.holm(p)), strict=True))


def _setting_named(text: str) -> str:
    """The key of `_expected_marks` for a column label or a `compare --all` row."""
    shots, k = re.search(r"(\d+)-shot", text), re.search(r"k=(\d+)", text)
    return f"fewshot {shots[1]}" if shots else f"knn {k[1]}"


def _row_cells(out: str, row: str) -> tuple[list[str], list[str]]:
    lines = out.splitlines()
    header = next(line for line in lines if line.startswith("| |"))
    cells = next(line for line in lines if line.startswith(f"| {row} |"))
    return [c.strip() for c in header.strip("|").split("|")][1:], [c.strip() for c in cells.strip("|").split("|")][1:]


@needs_shared_data
def test_marks_compare_each_cell_with_its_baseline_at_the_same_setting(cli, deit_and_random, tmp_path):
    results = deit_and_random
    row = "folder:" + next(iter(store.read_results(results)["dataset"].unique())).split(":", 1)[1]
    code, out, err = cli("table", "--ci", "--baseline", "weights=random", "--format", "md", "--results", results)
    assert code == 0, err
    columns, cells = _row_cells(out, row)
    assert len(columns) == 8  # (1-shot, 5-shot, k=3, k=10) × (DeiT-Ti, random init)
    expected = _expected_marks(results)
    assert any(expected.values())  # the test can fail: some pair does differ
    for column, cell in zip(columns, cells, strict=True):
        starred = f" {SIGNIFICANT_MARK}" in cell
        assert starred == (expected[_setting_named(column)] and "†" not in column), (column, cell)
    legend = next(line for line in out.splitlines() if line.startswith(f"- {SIGNIFICANT_MARK} differs"))
    assert "baseline (weights=random) at the same dataset, protocol, version and shots or k" in legend
    assert "over the table's 4 comparison(s)" in legend and legend.count(" vs ") == 4

    # by default the baseline is the table's first model and weights: the marks move to random init's cells
    code, out, err = cli("table", "--ci", "--format", "md", "--results", results)
    columns, cells = _row_cells(out, row)
    assert code == 0 and "the first model: deit-ti/16 (deit_tiny_patch16_224 [b2e17235])" in out
    assert all((f" {SIGNIFICANT_MARK}" not in c) for col, c in zip(columns, cells, strict=True) if "†" not in col)
    starred = sum(f" {SIGNIFICANT_MARK}" in c for c in cells)
    assert starred == sum(expected.values())

    code, _, err = cli("table", "--baseline", "weights=random", "--results", results)
    assert code == 2 and "--baseline weights=random: names what --ci's marks compare against; add --ci" in err
    code, _, err = cli("table", "--ci", "--baseline", "wieghts=random", "--results", results)  # a typo: named
    assert code == 2 and err.startswith("error: --baseline wieghts: not a stored field") and len(err.splitlines()) == 1

    # the same marks in the report, each protocol's section against the baseline it names
    code, _, err = cli("report", "--baseline", "weights=random", "--out", tmp_path / "r.html", "--results", results)
    page = (tmp_path / "r.html").read_text()
    assert code == 0 and page.count("differs from the baseline (weights=random)") == 2, err  # few-shot, k-NN

    # A vs B at every shared setting, in one call: Δ, interval and Holm-adjusted p per setting
    code, out, err = cli("compare", "weights=random", "weights=deit*", "--all", "--format", "md", "--results", results)
    assert code == 0, err
    rows = [line for line in out.splitlines() if line.startswith(f"| {row} · ")]
    assert len(rows) == 4 and any("· fewshot · 5-shot ·" in r for r in rows) and any("· k=10 " in r for r in rows)
    for line in rows:
        holm = line.strip("|").split("|")[6].strip()
        assert (holm == "< 0.0005" or float(holm) < ALPHA) == expected[_setting_named(line)], line

"""Per-image predictions kept with every run that scores a test split, and calibration for `eval`."""

from __future__ import annotations

import json
import re

import duckdb
import numpy as np
import pytest

from vitbench import store
from vitbench.engine.scoring import calibration
from vitbench.store.predictions import predictions_path, top_classes

FAST = ("--model", "vit-ti/16", "--weights", "random", "--dataset", "digits", "--res", "32", "--workers", "0")


def test_calibration_equals_a_hand_computation():
    # confidences 0.9, 0.6, 0.55, 0.8: bins (13/15, 14/15], (8/15, 9/15] twice, (11/15, 12/15]
    probs = np.array([[0.9, 0.1], [0.4, 0.6], [0.55, 0.45], [0.2, 0.8]])
    labels = np.array([0, 0, 0, 1])  # right, wrong, right, right
    ece = (1 / 4) * abs(1 - 0.9) + (2 / 4) * abs(0.5 - (0.6 + 0.55) / 2) + (1 / 4) * abs(1 - 0.8)
    nll = -np.mean(np.log([0.9, 0.4, 0.55, 0.8]))
    found = calibration(np.log(probs), labels)
    assert found["ece"] == pytest.approx(ece, abs=1e-12) and found["nll"] == pytest.approx(nll, abs=1e-12)
    assert calibration(np.log(np.array([[0.97, 0.03]] * 10)), np.zeros(10, int))["ece"] == pytest.approx(0.03)


def runs(results):
    return store.read_results(results).drop_duplicates("run_key").set_index("run_key")


@pytest.mark.parametrize("protocol", ["fewshot", "eval", "knn"])
def test_each_protocol_keeps_its_test_predictions(cli, tmp_path, protocol):
    results = tmp_path / "results"
    code, _, err = cli("run", *FAST, "--protocol", protocol, "--shots", "5", "--seeds", "0", "--knn-k", "5",
                       "--results", results)  # fmt: skip
    assert code == 0, err
    df = store.read_results(results)
    (key,) = set(df["run_key"])
    notes = json.loads(df["notes"].iloc[0])
    kept = notes["predictions"]
    path = predictions_path(results, key)
    assert kept["file"] == path.name and kept["rows"] == 797  # digits' test split
    table = duckdb.connect().execute(f"SELECT * FROM read_parquet('{path}')").df()
    accuracy = df.set_index("metric")["value"]["accuracy"]
    assert (
        table["correct"].mean() == pytest.approx(accuracy)
        and (table["top1"] == table["topk"].map(lambda t: t[0])).all()
    )
    assert set(table["id"]) == {str(i) for i in range(797)}  # in-memory images: their index in the split
    if protocol == "eval":
        metrics = df.set_index("metric")["value"]
        assert 0 <= metrics["ece"] <= 1 and metrics["nll"] > 0


def test_export_predictions_and_a_changed_file_is_named(cli, tmp_path):
    results = tmp_path / "results"
    assert cli("run", *FAST, "--shots", "1,5", "--seeds", "0", "--results", results)[0] == 0
    out = tmp_path / "predictions.csv"
    code, text, err = cli("export", "--predictions", "--format", "csv", "--out", out, "--results", results)
    assert code == 0, err
    assert "wrote 1594 rows (run × image) of 2 run(s)" in text
    exported = duckdb.connect().execute(f"SELECT * FROM read_csv_auto('{out}')").df()
    assert {json.loads(h)["shots"] for h in exported["hparams"]} == {1, 5} and len(exported) == 1594
    key = next(iter(runs(results).index))
    path = predictions_path(results, key)
    path.write_bytes(path.read_bytes()[:-10])
    # issue 71, item 11: one changed file costs its own run, named, not the export (as in the report)
    code, text, err = cli("export", "--predictions", "--out", tmp_path / "again.parquet", "--results", results)
    assert code == 0 and f"{path}: changed since run {key[:12]} wrote it" in err and "Traceback" not in err
    assert "of 1 run(s)" in text


def test_a_store_from_before_predictions_were_kept_exports_none(cli, tmp_path):
    results = tmp_path / "results"
    assert cli("run", *FAST, "--shots", "1", "--seeds", "0", "--fewshot-l2", "sweep", "--results", results)[0] == 0
    code, _, err = cli("export", "--predictions", "--out", tmp_path / "p.parquet", "--results", results)
    assert code != 0 and "kept per-image predictions" in err  # a λ sweep keeps none, as old stores


def test_per_class_calibration_and_confusion_views(cli, tmp_path):
    results = tmp_path / "results"
    assert cli("run", *FAST, "--shots", "5", "--seeds", "0,1", "--results", results)[0] == 0
    assert cli("run", *FAST, "--protocol", "eval", "--results", results)[0] == 0
    code, md, err = cli(
        "table", "--per-class", "digits", "--protocol", "fewshot", "--format", "md", "--results", results
    )
    assert code == 0, err
    rows = [line for line in md.splitlines() if line.startswith("| class ")]
    assert len(rows) == 10 and "(n=2)" in rows[0]
    mean_row = next(line for line in md.splitlines() if line.startswith("| mean per-class accuracy |"))
    df = store.read_results(results).query("protocol == 'fewshot' and metric == 'accuracy'")
    assert abs(float(mean_row.split("|")[2].split()[0]) - df["value"].mean() * 100) < 3  # digits is balanced
    code, md, err = cli("table", "--view", "calibration", "--format", "md", "--results", results)
    assert code == 0 and "| digits · ECE (15 bins, %) |" in md and "| digits · NLL |" in md, err
    key = store.read_results(results).query("protocol == 'eval'")["run_key"].iloc[0]
    code, out, err = cli("plot", "confusion", "--run", key[:10], "--out", tmp_path / "plots", "--formats", "png",
                         "--results", results)  # fmt: skip
    assert code == 0, err
    assert (tmp_path / "plots" / "confusion_matrix.png").stat().st_size > 1000 and "797 test images" in out
    code, _, err = cli("table", "--per-class", "cifar10", "--results", results)
    assert code != 0 and "--per-class cifar10: no stored run on that dataset" in err


def _few_shot_on_class_folders(cli, tmp_path, names: list[str], train: int, test: int, spread: int):
    """A `folder:` dataset of one class folder per name (16 px images, each class `spread` grey levels
    from the next), and a 2-shot run on it: (results folder, the `folder:` argument, the stored name)."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, n in (("train", train), ("test", test)):
        for c, name in enumerate(names):
            folder = tmp_path / "pics" / split / name
            folder.mkdir(parents=True)
            for i in range(n):
                pixels = np.clip(rng.normal(spread * c + 40, 25, (16, 16, 3)), 0, 255).astype(np.uint8)
                Image.fromarray(pixels).save(folder / f"{i}.png")
    results = tmp_path / "results"
    folder = f"folder:{tmp_path / 'pics'}"
    code, _, err = cli("run", "--model", "vit-ti/16", "--weights", "random", "--dataset", folder, "--res", "32",
                       "--workers", "0", "--shots", "2", "--seeds", "0", "--results", results)  # fmt: skip
    assert code == 0, err
    (dataset,) = set(store.read_results(results)["dataset"])
    return results, folder, dataset


def test_per_class_rows_name_folder_classes_and_markdown_keeps_names_inert(cli, tmp_path):
    """A folder's classes are its folder names: the per-class table names them (before: "class 0…n").
    A name holding HTML or "|" stays text in Markdown (before: `<img …>` went in raw for a renderer to
    draw, and "|" split the row), while a value written "< 0.0005" stays as it is."""
    names = ["<img src=x onerror=alert(1)>", "cat", "dog|wolf"]  # sorted as ImageFolder sorts them
    results, folder, dataset = _few_shot_on_class_folders(cli, tmp_path, names, train=6, test=4, spread=70)
    code, md, err = cli("table", "--per-class", dataset, "--format", "md", "--results", results)
    assert code == 0, err
    rows = [line.split(" | ")[0] for line in md.splitlines() if line.startswith("| class ")]
    assert rows == ["| class 0: &lt;img src=x onerror=alert(1)>", "| class 1: cat", "| class 2: dog\\|wolf"]
    assert "<img" not in md
    code, text, err = cli("table", "--per-class", dataset, "--results", results)
    assert code == 0 and "class 0: <img src=x onerror=alert(1)>" in text and "class 2: dog|wolf" in text, err
    # issue 97, item 12: the name `run` was given, and the folder's name alone, mean the stored folder:pics@…
    # (before: "no stored run on that dataset"); a name that matches none says the stored names
    for given in (folder, "folder:pics"):
        assert cli("table", "--per-class", given, "--results", results)[1] == text, given
    code, _, err = cli("table", "--per-class", "folder:pets", "--results", results)
    assert code == 2 and f"no stored run on that dataset; stored: {dataset}" in err


def test_predictions_with_labels_out_of_range_are_named_not_used(cli, tmp_path):
    """Issue 71, item 11. Before: a predictions file whose labels were 2e9 or -5 (its shard's record
    made to match) was a `table --per-class` traceback, and `plot confusion` asked for 26.8 GiB; one
    such file made `export --predictions`, `compare` and `--per-class` fail outright. Now it is one
    line naming the file; the commands that read many runs read around it."""
    import pandas as pd

    from vitbench.provenance import sha256_file
    from vitbench.store.shards import shard_dir

    results = tmp_path / "results"
    assert cli("run", *FAST, "--shots", "5", "--seeds", "0,1", "--results", results)[0] == 0
    key = sorted(runs(results).index)[0]
    path = predictions_path(results, key)
    con = duckdb.connect()
    table = con.execute(f"SELECT * FROM read_parquet('{path}')").df()
    for bad in (2_000_000_000, -5):
        table.loc[0, ["label", "top1"]] = bad
        con.register("t", pd.DataFrame(table))
        con.execute(f"COPY t TO '{path}' (FORMAT parquet)")
        con.unregister("t")
        shard = shard_dir(results) / f"{key}.json"
        record = json.loads(shard.read_text())
        record["run"]["notes"]["predictions"]["sha256"] = sha256_file(path)  # as if vitbench had written it
        shard.write_text(json.dumps(record))
        store.ingest(store.connect(results), [shard])
        code, md, err = cli("table", "--per-class", "digits", "--format", "md", "--results", results)
        assert code == 0 and f"{path}: not the predictions of run {key[:12]} (label values outside" in err, err
        assert "(n=1)" in md and "Traceback" not in err
        code, _, err = cli("plot", "confusion", "--run", key[:12], "--out", tmp_path / "p", "--results", results)
        assert code == 2 and "label values outside the classes" in err and len(err.strip().splitlines()) == 1, err
        code, text, err = cli("export", "--predictions", "--out", tmp_path / "p.csv", "-f", "csv", "--results", results)
        assert code == 0 and "of 1 run(s)" in text, err
        code, out, err = cli("compare", "seed=0", "seed=1", "--results", results)
        assert code != 0 and "Traceback" not in err and "label values outside" in out + err, err


@pytest.mark.parametrize("classes", [3, 5, 40])
def test_top_classes_rank_as_a_stable_sort_of_every_score_does(classes):
    """Issue 89: a run's top-5 without N x K ranks (21,843 classes): ties, NaN and ±inf as before."""
    rng = np.random.default_rng(classes)
    scores = rng.integers(0, 6, size=(300, classes)).astype(np.float32)  # many ties, some at the bound
    scores[::7] = rng.normal(size=(len(scores[::7]), classes))
    scores[5, 1], scores[6, 0], scores[8, :] = np.nan, np.inf, -np.inf
    expected = np.argsort(-scores, axis=1, kind="stable")[:, :5]
    np.testing.assert_array_equal(top_classes(scores), expected)
    assert top_classes(scores[:0]).shape == (0, min(5, classes))


def test_class_names_that_read_alike_are_told_apart_and_bidi_controls_are_shown(cli, tmp_path):
    """Issue 97, item 11. Before: class folders named "café" composed (NFC) and decomposed (NFD, as macOS
    writes names), or "cat" and "cat ", printed as identical rows; a name holding U+202E (RIGHT-TO-LEFT
    OVERRIDE) reached the terminal raw and drew the rest of its line backwards."""
    import unicodedata

    names = [unicodedata.normalize("NFC", "café"), unicodedata.normalize("NFD", "café"), "cat", "cat ", "x\u202eyz"]
    results, _, dataset = _few_shot_on_class_folders(cli, tmp_path, names, train=4, test=2, spread=40)
    for fmt in ("rich", "md"):
        code, shown, err = cli("table", "--per-class", dataset, "--format", fmt, "--results", results)
        assert code == 0, err
        labels = re.findall(r"class \d+: (?:'[^']*'|\S+)", shown)
        assert len(labels) == len(set(labels)) == len(names), labels
        assert "\u202e" not in shown and "x\\u202eyz" in shown and "cafe\\u0301" in shown and "'cat '" in shown, shown

"""The comparison views, their formats, export and plots, on a small store built here from shards
with fixed numbers and provenance (so the rendered text is stable: golden files)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import duckdb
import pytest
from PIL import Image

from vitbench import store
from vitbench.datasets.vtab import TASKS
from vitbench.views.cells import SUBSET_MARK
from vitbench.views.measured.paper_match import SETTING_MARK
from vitbench.views.tables import render, table

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("VITBENCH_UPDATE_GOLDEN") == "1"  # regenerate after a deliberate change, then review the diff
SHA_B16 = "ab12cd34" * 8
FIXED = dict(
    weights_sha256=SHA_B16,
    random_init=False,
    data_dir="/data",
    data_subset=False,
    protocol="finetune",
    protocol_version="finetune/1",
    status="done",
    device="cuda",
    device_name="NVIDIA H100 80GB HBM3",
    device_count=1,
    git_sha="0123abcd",
    vitbench_version="0.1.0",
    torch_version="2.14.1",
    timm_version="1.0.31",
    python_version="3.11.7",
    hostname="node1",
    command="vitbench run",
    notes={},
    started_at="2026-11-20T10:00:00+00:00",
    finished_at="2026-11-20T11:00:00+00:00",
)
FINETUNE = {"res": 384, "steps": 10000, "batch": 512, "smoke": False}


def write_run(results: Path, key: str, metrics: dict, curves: dict | None = None, **fields) -> None:
    run = {c: None for c in store.RUN_COLUMNS}
    run.update(FIXED)
    run.update(
        run_key=key, model="vit-b/16", weights="/w/ViT-B_16.npz", dataset="cifar10", data_source="cifar-pickle",
        data_fingerprint="f" * 16, seed=0, device_seconds=3600.0, flops=2e18,
        hparams={**FINETUNE, "stage": "final", "lr": "best-on-dev"},
    )  # fmt: skip
    run.update(fields)
    path = results / "runs" / f"{key}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"run": run, "metrics": metrics, "curves": curves or {}}))


def build_store(results: Path) -> Path:
    """vit-b/16 fine-tuned: CIFAR-10 × 3 seeds (+ its LR sweep), Pets × 2 seeds, ImageNet eval × 1
    (top-1 and ReaL: one seed, no std); a smoke fine-tune on a Flowers subset; a random-init
    few-shot column (shown beside the fine-tuned ones, never given a Δ). CIFAR-100 and VTAB: none."""
    for seed, acc in enumerate([0.9900, 0.9910, 0.9896]):
        curves = {"train_loss": [2.0, 1.0, 0.5], "lr": [0.001, 0.01, 0.005]} if seed == 0 else None
        write_run(results, f"c10-{seed}", {"accuracy": acc, "lr": 0.01}, seed=seed, curves=curves)
    for i, lr in enumerate([0.001, 0.003, 0.01, 0.03]):
        write_run(results, f"c10-sweep-{i}", {"dev_accuracy": 0.95 + i / 100}, device_seconds=1800.0,
                  hparams={**FINETUNE, "stage": "sweep", "lr": lr})  # fmt: skip
    for seed, acc in enumerate([0.9480, 0.9410]):
        write_run(results, f"pets-{seed}", {"accuracy": acc}, seed=seed, dataset="pets", data_source="pets-folder")
    write_run(results, "inet", {"accuracy": 0.8453, "accuracy_real": 0.8891}, dataset="imagenet",
              data_source="imagenet-folder", protocol="eval", protocol_version="eval/1",
              hparams={"res": 384}, device_seconds=600.0)  # fmt: skip
    for seed in (0, 1):
        write_run(results, f"smoke-{seed}", {"accuracy": 0.05 + seed / 100}, seed=seed, dataset="flowers102",
                  data_source="flowers-folder", data_subset=True,
                  hparams={"res": 64, "steps": 20, "batch": 32, "smoke": True, "stage": "final", "lr": 0.03},
                  device_seconds=60.0)  # fmt: skip
    for seed in (0, 1):
        write_run(results, f"fs-{seed}", {"accuracy": 0.30 + seed / 10}, seed=seed, model="vit-ti/16",
                  weights="random", weights_sha256="random", random_init=True, protocol="fewshot",
                  protocol_version="fewshot-lsr/2", hparams={"fewshot_l2": "1024", "res": 224, "shots": 10},
                  device_seconds=10.0)  # fmt: skip
    con = store.connect(results)
    store.ingest_pending(con, results)
    con.close()
    return results


@pytest.fixture
def stored(tmp_path: Path) -> Path:
    return build_store(tmp_path / "results")


def column_of(data, sha: str) -> str:
    """The measured column whose provenance footnote names weights with this sha256 start (labels
    carry no weights; the footnote does, and lists the columns it covers)."""
    note = next(n for n in data.footnotes if n.startswith("[") and f"sha256 {sha}" in n)
    return note[1 : note.index("] ")].split(", ")[0]


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if UPDATE:
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"{path} missing: run with VITBENCH_UPDATE_GOLDEN=1 once and review it"
    assert text == path.read_text()


@pytest.mark.parametrize("fmt, suffix", [("md", "md"), ("latex", "tex"), ("csv", "csv")])
def test_table2_golden(stored, fmt, suffix):
    data = table.accuracy_view(store.read_results(stored), compare=["bit-l", "vit-l/16-i21k"])
    check_golden(f"table2.{suffix}", render.render_text(data, fmt))


def test_table2_cells_deltas_markers_and_empty_cells(stored):
    data = table.accuracy_view(store.read_results(stored), compare=["bit-l", "vit-l/16-i21k"])
    # every transfer protocol is shown (few-shot beside fine-tuned), in a stable order: model, weights
    # (random init last), protocol in the registry's order, then the setting; the resolutions differ, so
    # every column names its own (fine-tuning at 384 px beside eval at 384 and few-shot at 224)
    ev, ft, smoke = "vit-b/16 · eval · res=384", "vit-b/16 · finetune · res=384", "vit-b/16 · finetune · res=64§"
    few = "vit-ti/16† · 10-shot · res=224"
    assert data.columns[:4] == [smoke, ft, ev, few]
    assert data.title == "Table 2 layout: top-1 accuracy (%)"  # two models: each column names its own
    assert ("CIFAR-10", few) in data.cells and data.cells[("CIFAR-10", few)].delta is None
    c10 = data.cells[("CIFAR-10", ft)]
    assert (round(c10.mean, 2), round(c10.std, 2), c10.n) == (99.02, 0.07, 3)
    assert round(c10.delta, 2) == round(99.02 - 99.37, 2)  # against the first --compare column
    assert data.cells[("ImageNet", ev)].std is None and data.cells[("ImageNet", ev)].value() == "84.53 (n=1)"
    assert ("CIFAR-100", ft) not in data.cells and ("VTAB (19 tasks)", ft) not in data.cells  # empty, never 0
    flowers = data.cells[("Oxford Flowers-102", smoke)]
    assert flowers.marks == SUBSET_MARK and flowers.delta is None and not flowers.rankable
    cost = data.cells[(table.COST_ROW, ft)]
    assert cost.n == 9 and abs(cost.mean - (5 * 3600 + 4 * 1800) / 86400) < 1e-9  # the LR sweep counts
    assert data.cells[(table.PAPER_COST_ROW, "bit-l (paper)")].value() == "9.9k"
    assert ("ImageNet", "bit-l (paper)") in data.best() and ("CIFAR-10", "bit-l (paper)") in data.best()
    assert not any("not shown" in n for n in data.footnotes)  # nothing hidden
    assert "paper columns are fine-tuned results; few-shot cells get no Δ" in data.footnotes
    provenance = [n for n in data.footnotes if n.startswith(f"[{ft}]")]
    assert provenance and "sha256 ab12cd34ab12" in provenance[0] and "cifar10: cifar-pickle@ffffffff" in provenance[0]
    assert "vitbench 0.1.0 (git 0123abcd)" in provenance[0] and "NVIDIA H100" in provenance[0]

    marked = table.accuracy_view(store.read_results(stored), compare=["bit-l"], include_marked=True)
    assert round(marked.cells[("Oxford Flowers-102", smoke)].delta, 2) == round(5.5 - 99.63, 2)
    other = table.accuracy_view(
        store.read_results(stored), compare=["bit-l", "vit-l/16-i21k"], delta_to="vit-l/16-i21k"
    )
    assert round(other.cells[("CIFAR-10", ft)].delta, 2) == round(99.02 - 99.15, 2)


def test_the_paper_cell_is_the_one_measured_in_the_same_setting(tmp_path):
    """ViT-L/16-I21k's ImageNet is 85.30 in Table 2 (512 px + Polyak) and 85.15 in Table 5 (384 px,
    none): a 384 px run without Polyak is compared with 85.15, a 512 px Polyak run with 85.30, and a
    224 px run, which neither table measured, gets its Δ flagged (≠) and footnoted, never hidden."""
    results = tmp_path / "results"
    settings = {"r384": (384, None, 0.8500), "r512": (512, 0.9999, 0.8520), "r224": (224, None, 0.8000)}
    for key, (res, polyak, acc) in settings.items():
        write_run(
            results,
            key,
            {"accuracy": acc},
            model="vit-l/16",
            weights="/w/ViT-L_16.npz",
            weights_sha256=key * 16,
            dataset="imagenet",
            data_source="imagenet-folder",
            hparams={**FINETUNE, "res": res, "polyak": polyak, "stage": "final", "lr": "best-on-dev"},
        )
    con = store.connect(results)
    store.ingest_pending(con, results)
    con.close()
    df = store.read_results(results)
    data = table.accuracy_view(df, compare=["vit-l/16-i21k"])
    column = {key: column_of(data, key * 3) for key in settings}
    deltas = {key: round(data.cells[("ImageNet", col)].delta, 2) for key, col in column.items()}
    assert deltas == {"r384": round(85.00 - 85.15, 2), "r512": round(85.20 - 85.30, 2), "r224": round(80.0 - 85.30, 2)}
    assert SETTING_MARK in data.cells[("ImageNet", column["r224"])].marks
    assert (
        SETTING_MARK
        not in data.cells[("ImageNet", column["r384"])].marks + data.cells[("ImageNet", column["r512"])].marks
    )
    flagged = [n for n in data.footnotes if n.startswith(SETTING_MARK)]
    assert (
        len(flagged) == 1 and "measured 224 px, no Polyak; paper Table 2's 85.30 (512 px, Polyak 0.9999)" in flagged[0]
    )
    # the columns disagree: the paper column shows its usual (Table 2) cell
    assert data.cells[("ImageNet", "vit-l/16-i21k (paper)")].mean == 85.30
    only_384 = table.accuracy_view(df[df["run_key"] == "r384"], compare=["vit-l/16-i21k"])
    assert only_384.cells[("ImageNet", "vit-l/16-i21k (paper)")].mean == 85.15  # every column agrees: Table 5's
    assert any("ImageNet: Table 5's 85.15 (384 px, no Polyak); also Table 2's 85.30" in n for n in only_384.footnotes)
    assert not any(SETTING_MARK in c.marks for c in only_384.cells.values())


# docs/protocols.md's Table 2, verbatim: every paper cell the default view shows must read back as printed here
TABLE2_MD = """\
| ImageNet | 88.55 ± 0.04 | 87.76 ± 0.03 | 85.30 ± 0.02 | 87.54 ± 0.02 | 88.4 / 88.5* |
| ImageNet ReaL | 90.72 ± 0.05 | 90.54 ± 0.03 | 88.62 ± 0.05 | 90.54 | 90.55 |
| CIFAR-10 | 99.50 ± 0.06 | 99.42 ± 0.03 | 99.15 ± 0.03 | 99.37 ± 0.06 | − |
| CIFAR-100 | 94.55 ± 0.04 | 93.90 ± 0.05 | 93.25 ± 0.05 | 93.51 ± 0.08 | − |
| Oxford-IIIT Pets | 97.56 ± 0.03 | 97.32 ± 0.11 | 94.67 ± 0.15 | 96.62 ± 0.23 | − |
| Oxford Flowers-102 | 99.68 ± 0.02 | 99.74 ± 0.00 | 99.61 ± 0.02 | 99.63 ± 0.03 | − |
| VTAB (19 tasks) | 77.63 ± 0.23 | 76.28 ± 0.46 | 72.72 ± 0.21 | 76.29 ± 1.70 | − |
| TPUv3-core-days | 2.5k | 0.68k | 0.23k | 9.9k | 12.3k |"""
TABLE2_COLUMNS = ["vit-h/14-jft", "vit-l/16-jft", "vit-l/16-i21k", "bit-l", "noisy-student"]
PROTOCOLS_MD = Path(__file__).resolve().parents[1] / "docs" / "protocols.md"


def _numbers(text: str) -> list[float]:
    return [float(x) for x in re.findall(r"\d+\.\d+|\d+", text.split("/")[0])]


def test_paper_columns_reproduce_protocols_table2_exactly(tmp_path):
    assert TABLE2_MD in PROTOCOLS_MD.read_text()  # the copy above is the document's own text
    data = table.accuracy_view(store.read_results(tmp_path), compare=TABLE2_COLUMNS)
    for line in TABLE2_MD.splitlines():
        title, *cells = [c.strip() for c in line.strip("|").split("|")]
        row = table.PAPER_COST_ROW if title == "TPUv3-core-days" else title
        for name, expected in zip(TABLE2_COLUMNS, cells, strict=True):
            cell = data.cells.get((row, f"{name} (paper)"))
            if expected == "−":
                assert cell is None, (row, name)
            elif title == "TPUv3-core-days":
                assert cell.value() == expected
            else:
                assert [cell.mean] + ([cell.std] if cell.std is not None else []) == _numbers(expected), (row, name)


def test_table9_group_means_match_table2_vtab_row(tmp_path):
    data = table.table9_view(store.read_results(tmp_path))
    mean_row = data.cells
    expected = {"vit-h/14-jft": 77.63, "vit-l/16-jft": 76.28, "vit-l/16-i21k": 72.72}  # Table 2 (76.29 / 72.71 from 9)
    for name, vtab in expected.items():
        assert abs(mean_row[("Mean (19 tasks)", f"{name} (paper)")].mean - vtab) <= 0.015, name
    assert round(mean_row[("Natural mean (7 tasks)", "vit-h/14-jft (paper)")].mean, 2) == 86.69
    assert round(mean_row[("Structured mean (8 tasks)", "vit-l/16-i21k (paper)")].mean, 2) == 57.50
    assert len(data.rows) == len(TASKS) + 4


def test_table9_measured_tasks_roll_up_and_partial_is_said(tmp_path):
    results = tmp_path / "results"
    for seed in (0, 1):
        for i, task in enumerate(TASKS):
            write_run(results, f"{seed}-{task.key}", {"accuracy": 0.5 + 0.01 * i + 0.1 * seed}, seed=seed,
                      dataset=f"vtab/{task.key}", data_source="vtab-folder")  # fmt: skip
    build_store(results)
    df = store.read_results(results)
    t9 = table.table9_view(df, compare=["vit-h/14-jft"])
    col = next(c for c in t9.columns if c.startswith("vit-b/16") and "(paper)" not in c)
    assert t9.cells[("Mean (19 tasks)", col)].value() == "64.00 ± 7.07 (n=2)"
    assert t9.cells[("Natural mean (7 tasks)", col)].value().startswith("58.00 ± 7.07")
    assert t9.cells[("Caltech101 (natural)", col)].delta is not None
    t2 = table.accuracy_view(df)
    finetuned = "vit-b/16 · finetune · res=384"  # T2 also holds the eval column and the smoke fine-tune
    assert t2.cells[("VTAB (19 tasks)", finetuned)].n == 2
    partial = table.accuracy_view(df[df["dataset"] != "vtab/dtd"])
    assert ("VTAB (19 tasks)", finetuned) not in partial.cells
    assert any("18 of 19 tasks stored" in n for n in partial.footnotes)


def test_table5_and_table6_views(stored):
    df = store.read_results(stored)
    t5 = table.table5_view(df)
    assert t5.cells[("ImageNet-21k · CIFAR-10", "vit-l/16")].mean == 99.16
    assert t5.cells[("JFT-300M · Oxford-IIIT Pets", "vit-h/14")].mean == 97.56
    assert ("ImageNet · CIFAR-10", "vit-h/14") not in t5.cells  # "−" in the paper
    measured = [r for r in t5.rows if r.startswith("measured: ViT-B_16 [ab12cd34]") and r.endswith("CIFAR-10")]
    assert measured and t5.cells[(measured[0], "vit-b/16")].n == 3
    t6 = table.table6_view(df)
    assert t6.cells[("ViT-H/14 · 14 ep (paper)", "ImageNet")].mean == 88.08
    assert t6.cells[("ViT-H/14 · 14 ep (paper)", "paper pre-training exaFLOPs")].value() == "4262"
    ours = next(r for r in t6.rows if r.startswith("vit-b/16") and r.endswith("· finetune · res=384"))
    assert t6.cells[(ours, "vitbench exaFLOPs (this evaluation)")].value() == "18"  # 9 runs × 2 exaFLOPs


def test_fewshot_view_group_by_and_where(stored):
    df = store.read_results(stored)
    fs = table.accuracy_view(df, protocol="fewshot", shots=10)
    assert fs.columns == ["10-shot"] and fs.title.endswith(" · vit-ti/16 (random init)†")
    assert fs.cells[("CIFAR-10", fs.columns[0])].value() == "35.00 ± 7.07 (n=2)"
    grouped = table.accuracy_view(df, group_by=["device_name", "hparams.res"])
    # what the fields leave together but a setting or the protocol tells apart stays apart (issue 61:
    # fine-tuned and eval accuracies at 384 px were one column, a mean of both)
    assert grouped.columns[:3] == ["device_name=NVIDIA H100 80GB HBM3, hparams.res=64§",
                                   "device_name=NVIDIA H100 80GB HBM3, hparams.res=384 · finetune",
                                   "device_name=NVIDIA H100 80GB HBM3, hparams.res=384 · eval"]  # fmt: skip
    from vitbench.store.query import apply_where

    assert set(apply_where(df, ["dataset=pets"])["run_key"]) == {"pets-0", "pets-1"}
    assert set(apply_where(df, ["weights=ViT-B_*", "seed>=1", "protocol!=eval"])["dataset"]) == {
        "cifar10", "pets", "flowers102"}  # fmt: skip
    assert apply_where(df, ["date>=2026-11-21"]).empty and len(apply_where(df, ["date=2026-11-20"])) == len(df)
    assert set(apply_where(df, ["random_init=true"])["model"]) == {"vit-ti/16"}
    assert set(apply_where(df, ["data_source~FOLDER"])["dataset"]) == {"pets", "imagenet", "flowers102"}


@pytest.mark.parametrize(
    "args, message",
    [
        (["--where", "colour=red"], "--where colour: not a stored field; expected one of date, run_key"),
        (["--where", "model"], "--where 'model': expected FIELD OP VALUE"),
        (["--group-by", "nope"], "--group-by nope: not a stored field"),
        (["--table", "7"], "--table 7: expected 2, 5, 6 or 9"),
        (["--format", "pdf"], "--format pdf: expected rich, md, latex, csv, html"),
        (["--compare", "bit-l", "--delta-to", "vit-h/14-jft"], "--delta-to vit-h/14-jft: not one of the --compare"),
        (["--table", "9", "--compare", "bit-l"], "--compare bit-l: Table 9 has vit-h/14-jft"),
        (["bit-l"], "unexpected argument 'bit-l': paper columns follow --compare"),
        (["--protocol", "probe"], "--protocol probe: expected fewshot, finetune, eval, knn, linear or pretrain"),
    ],
)
def test_table_mistakes_are_one_line(cli, stored, args, message):
    code, out, err = cli("table", "--results", stored, *args)
    assert code == 2 and message in err and "Traceback" not in err + out


def test_cli_compare_with_several_names_and_html_page(cli, stored, tmp_path):
    code, out, _ = cli("table", "--results", stored, "--compare", "bit-l", "vit-l/16-i21k", "--format", "md")
    assert code == 0 and "| bit-l (paper) | vit-l/16-i21k (paper) |" in out and "(Δ −0.35)" in out
    page = tmp_path / "table.html"
    code, _, err = cli("table", "--results", stored, "--compare", "bit-l", "--format", "html", "--out", page)
    assert code == 0 and f"wrote {page}" in err
    root = ET.fromstring(page.read_text().split("\n", 1)[1])  # well-formed: parses as XML after the doctype
    cells = ["".join(td.itertext()) for td in root.iter("td")]  # a cell's value, n and marks: spans of it
    assert any(c.startswith("99.02 ± 0.07 (n=3)") for c in cells)
    assert root.find(".//ol") is not None and "‡ measured on a subset" in page.read_text()
    code, out, _ = cli("table", "--results", stored, "--compare", "bit-l")  # the terminal: rich, coloured Δ
    assert code == 0 and "Δ −0.35" in out and "9.9k" in out


def test_empty_store(cli, tmp_path):
    import pandas as pd

    empty = tmp_path / "none"
    code, _, err = cli("table", "--results", empty)
    assert code == 0 and "no results in" in err
    code, out, _ = cli("table", "--results", empty, "--compare", "bit-l", "--format", "csv")
    assert code == 0 and "ImageNet,bit-l (paper),87.54,0.02,,,,False,paper" in out
    # issue 97, item 14: as `table` says it, exit 0 (before: rc 2 "no stored runs"); the file is written
    # with its columns only, so an earlier export of that name is never read as this one
    (tmp_path / "x.parquet").write_text("an earlier export")
    code, out, err = cli("export", "--results", empty, "--out", tmp_path / "x.parquet")
    assert code == 0 and f"no results yet in {empty}: wrote {tmp_path / 'x.parquet'} with its columns only" in out
    written = pd.read_parquet(tmp_path / "x.parquet")
    assert written.empty and "run_key" in written


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_export_round_trips_with_provenance(cli, stored, tmp_path, fmt):
    path = tmp_path / "out" / f"runs.{fmt}"
    path.parent.mkdir()  # vitbench makes no folder it was not asked to (tests/test_out_files.py)
    code, out, _ = cli("export", "--results", stored, "--format", fmt, "--out", path, "--where", "dataset=cifar10")
    assert code == 0 and "wrote 12 rows" in out  # 3 finals × (accuracy, lr), 4 sweeps' dev_accuracy, 2 few-shot
    reader = {"parquet": "read_parquet", "csv": "read_csv"}[fmt]
    got = duckdb.connect().execute(f"SELECT * FROM {reader}('{path}')").df()
    assert len(got) == 12 and set(got["metric"]) == {"accuracy", "lr", "dev_accuracy"}
    row = got[got["run_key"] == "c10-0"].iloc[0]
    assert row["weights_sha256"] == SHA_B16 and row["git_sha"] == "0123abcd" and row["data_source"] == "cifar-pickle"
    assert json.loads(row["hparams"])["res"] == 384


def test_json_export_is_one_document_per_run_that_its_schema_describes(cli, stored, one_run, tmp_path):
    """Other tools read a run as an object: hparams and notes nested (not JSON text inside JSON),
    metrics by name, and docs/results-schema.json (versioned) says what each field is."""
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((Path(__file__).parents[1] / "docs" / "results-schema.json").read_text())
    real = tmp_path / "real.json"
    code, _, err = cli("export", "--results", one_run, "--format", "json", "--out", real)
    assert code == 0, err
    jsonschema.validate(json.loads(real.read_text()), schema, format_checker=jsonschema.FormatChecker())
    path = tmp_path / "runs.json"  # the hand-made store: known values in every field
    code, out, err = cli("export", "--results", stored, "--format", "json", "--out", path)
    assert code == 0, err
    assert f"wrote 14 run(s) (one document each, schema vitbench.run/2) to {path}" in " ".join(out.split())
    documents = json.loads(path.read_text())
    by_key = {d["run_key"]: d for d in documents}
    assert len(by_key) == 14 and by_key["c10-0"]["metrics"] == {"accuracy": 0.99, "lr": 0.01}
    assert by_key["c10-0"]["hparams"]["res"] == 384 and by_key["inet"]["metrics"]["accuracy_real"] == 0.8891
    assert by_key["c10-0"]["started_at"] == "2026-11-20T10:00:00+00:00" and by_key["fs-0"]["hparams"]["shots"] == 10
    assert "shots" not in {*by_key["inet"], *by_key["inet"]["hparams"]} and by_key["fs-0"]["random_init"] is True
    (document,) = json.loads(real.read_text())
    broken = [{**document, "hparams": json.dumps(document["hparams"])}]  # the old form: JSON text inside JSON
    with pytest.raises(jsonschema.ValidationError, match="is not of type 'object'"):
        jsonschema.validate(broken, schema)


PRETRAINED_SHA = "9e" * 32


def add_pretraining(results: Path) -> Path:
    """A pre-training run (2 exaFLOPs counted, one accelerator-hour) whose weights then ran few-shot
    on CIFAR-10 (5 and 10 shots, two seeds each)."""
    write_run(results, "pre", {"val_accuracy": 0.9, "best_step": 300}, model="vit-ti/16", dataset="digits",
              data_source="sklearn-digits", data_fingerprint="sklearn-1.9.1-digits-0:1000", weights="random",
              weights_sha256="random", random_init=True, protocol="pretrain", protocol_version="pretrain/3",
              hparams={"subset": 900, "objective": "supervised", "steps": 300, "res": 32, "batch": 64},
              notes={"weights_file": {"sha256": PRETRAINED_SHA}}, flops=2e18, device_seconds=3600.0,
              curves={"train_loss": [2.3, 1.2, 0.4], "lr": [0.001, 0.001, 0.0]})  # fmt: skip
    for shots in (5, 10):
        for seed in (0, 1):
            write_run(results, f"pre-fs{shots}-{seed}", {"accuracy": 0.5 + shots / 100 + seed / 100}, seed=seed,
                      model="vit-ti/16", weights=str(results / "weights" / "vit-ti16-digits.safetensors"),
                      weights_sha256=PRETRAINED_SHA, protocol="fewshot", protocol_version="fewshot-lsr/3",
                      hparams={"fewshot_l2": "1024", "res": 32, "shots": shots}, device_seconds=5.0)  # fmt: skip
    con = store.connect(results)
    store.ingest_pending(con, results)
    con.close()
    return results


def test_plots_write_png_and_svg_of_the_expected_size(cli, stored, tmp_path):
    out_dir = tmp_path / "plots"
    code, out, err = cli("plot", "--results", stored, "--out", out_dir)
    assert code == 0, err
    with Image.open(out_dir / "finetune_curves.png") as img:
        assert img.size == (900, 600)
    ET.parse(out_dir / "finetune_curves.svg")  # a well-formed SVG
    # no figure without measured data: no VTAB run; no weights whose pre-training cost is known; one
    # shot count (10): no line against shots; no k-NN run
    assert "fewshot: skipped, every stored few-shot run has 10-shot: a line against shots per class needs" in err
    assert "knn: skipped, no k-NN runs are stored; run `vitbench run --protocol knn`" in err
    assert "vtab: skipped, no complete VTAB-1k group is stored" in err
    assert "cost: skipped, no transfer run of weights pre-trained here" in err
    assert not (out_dir / "vtab_groups.png").exists() and not (out_dir / "accuracy_vs_cost.png").exists()
    assert "run c10-0" in out and "finetune: per-step" in out  # the curves figure: the only run with curves
    code, _, err = cli("plot", "curves", "--results", stored, "--out", out_dir, "--run", "zzz")
    assert code == 2 and "--run zzz: no stored run with training curves" in err


def test_the_cost_figure_draws_pre_training_cost_never_the_evaluations(cli, stored, tmp_path):
    add_pretraining(stored)
    code, out, err = cli("plot", "cost", "curves", "--results", stored, "--out", tmp_path / "p", "--formats", "svg")
    assert code == 0, err
    out = " ".join(out.split())  # as printed, wrapped at the terminal's width
    assert "Measured: 4 run(s): pre-fs10, pre-fs10, pre-fs5-, pre-fs5-." in out  # the pre-trained weights' few-shot
    assert "vit-b/16 · finetune · res=384 (pre-trained elsewhere: its cost is not known here)" in out
    assert "vit-ti/16† · 10-shot · res=224 (random init)" in out
    assert "run c10-0" in out  # curves: the fine-tuning run, not the newer pre-training one
    code, out, err = cli("plot", "curves", "--run", "pre", "--results", stored, "--out", tmp_path / "p")
    assert code == 0 and "pretrain: per-step training loss and learning rate of run pre " in out, err


def test_plot_on_an_empty_store_skips_what_has_no_data(cli, tmp_path):
    code, out, err = cli("plot", "--results", tmp_path / "none", "--out", tmp_path / "p", "--formats", "png")
    assert code == 0 and "fewshot: skipped, no few-shot runs are stored" in err and "curves: skipped" in err
    assert "vtab: skipped" in err and not list((tmp_path / "p").glob("*.png"))  # nothing measured, nothing drawn
    code, _, err = cli("plot", "fewshot", "--results", tmp_path / "none", "--out", tmp_path / "p")
    assert code == 2 and "no few-shot runs are stored" in err


def test_readers_see_the_shards_while_a_run_holds_the_store(stored):
    write_run(stored, "late", {"accuracy": 0.5})  # a shard the database has not ingested: only the snapshot has it
    holder = subprocess.Popen(
        [sys.executable, "-c", f"import duckdb, time; c = duckdb.connect({str(stored / store.DB_NAME)!r}); "
         "print('held', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        time.sleep(0.2)
        df = store.read_results(stored)
        assert df["run_key"].nunique() == 15 and len(store.read_curves(stored)) == 6  # 14 ingested + "late"
    finally:
        holder.kill()
        holder.wait()


def test_two_protocol_versions_are_two_columns_never_averaged(stored):
    """A protocol bump (finetune/1 -> finetune/2: the inception crop) changes the numbers: the
    runs of each version stand in a column of their own, labelled with the version."""
    write_run(stored, "c10-v2", {"accuracy": 0.5}, protocol_version="finetune/2")
    store.sync(stored)
    data = table.accuracy_view(store.read_results(stored))
    old, new = "vit-b/16 · finetune · finetune/1 · res=384", "vit-b/16 · finetune · finetune/2 · res=384"
    assert data.cells[("CIFAR-10", new)].mean == 50.0 and data.cells[("CIFAR-10", new)].n == 1
    assert data.cells[("CIFAR-10", old)].n == 3  # the three finetune/1 seeds, not four


def test_a_where_that_matches_nothing_says_so_not_that_the_store_is_empty(cli, stored):
    """Before: a --where that matched nothing said "no results yet; try vitbench run"."""
    code, _, err = cli("table", "--results", stored, "--where", "model=vit-h/14")
    assert code == 0 and "no results in" not in err
    assert f"none of the 14 runs in {stored} fits what was asked for (--where" in " ".join(err.split())


def test_a_where_that_misses_the_only_run_says_it_in_the_singular(cli, one_run):
    code, _, err = cli("table", "--results", one_run, "--where", "shots=99")
    assert code == 0
    assert f"the one run in {one_run} does not fit what was asked for" in " ".join(err.split())


@pytest.mark.parametrize(
    "args, message",
    [
        (("--view", "calibration", "--compare", "bit-l"), "--view calibration: has its own layout; --compare does not"),
        (
            ("--view", "robustness", "--table", "9", "--shots", "5"),
            "--view robustness: has its own layout; --table, --shots do not apply",
        ),  # fmt: skip
        (("--bench", "--ci"), "--bench: has its own layout; --ci does not apply"),
        (("--view", "nope"), "--view nope: expected accuracy, robustness, calibration, attention or pretrain"),
    ],
)
def test_a_view_refuses_the_options_it_does_not_take(cli, tmp_path, args, message):
    """Issue 30: `table` had five modes checked against each other by hand (--bench and --view
    attention ignored every other option without a word); each view now says which it takes."""
    code, _, err = cli("table", *args, "--results", tmp_path)
    assert code == 2 and message in err and "Traceback" not in err


def test_plot_names_every_figure_it_can_draw(cli, tmp_path):
    code, _, err = cli("plot", "nope", "--results", tmp_path, "--out", tmp_path)
    expected = "vitbench plot nope: expected one of vtab, cost, fewshot, knn, curves, confusion, checkpoints"
    assert code == 2 and expected in err


def test_a_row_of_a_lower_is_better_metric_bolds_its_lowest_cell():
    """Issue 48: a metric says which way is better. ECE and NLL (eval's) are lower-is-better, so the
    calibration view's bold is the better-calibrated model, not the worse one."""
    from vitbench.protocols.registry import declared_metric
    from vitbench.views.cells import Cell, TableData

    assert declared_metric("ece").higher_is_better is False and declared_metric("accuracy").higher_is_better
    data = TableData(columns=["a", "b"], rows=["digits · ECE (15 bins, %)", "digits · accuracy"])
    for row, (a, b) in zip(data.rows, [(3.0, 7.0), (60.0, 80.0)], strict=True):
        data.cells[(row, "a")], data.cells[(row, "b")] = Cell(a, n=1, rankable=True), Cell(b, n=1, rankable=True)
    data.lower_is_better.add("digits · ECE (15 bins, %)")
    assert data.best() == {("digits · ECE (15 bins, %)", "a"), ("digits · accuracy", "b")}

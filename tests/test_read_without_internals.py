"""Issue 68, read a number without knowing vitbench: every setting explicit, one pairing, nothing
dropped. A store of mixed settings in miniature: a ViT-Ti at 32 and 48 px and, at 32 px, in fp32 and
bf16 (a real bf16 run on this CPU), a random-init timm ResNet-18 and a backbone of one's own (the
docs' nn.Module, registered here) at 32 px only, k-NN and the linear probe beside few-shot; the
few-shot table is wider than the report's page, so the report splits it. Every reader is checked:
`vitbench.results`, `--where`, the exports, the table (terminal, CSV), `--ci`, `compare`, the
report in Chromium at 1,400 px, and every figure's CSV."""

from __future__ import annotations

import html
import io
import json
import re
from pathlib import Path

import pandas as pd
import pytest
from loopback import Server
from test_report import browser, headless, probed

import vitbench
from vitbench import store
from vitbench.catalog import registry
from vitbench.cli.output import print_summary_table
from vitbench.provenance import run_key_of
from vitbench.store.shards import read_shards
from vitbench.views.report import summary

RUN = dict(datasets=["digits"], workers=0, seeds=(0, 1), shots=(1, 100))  # 100 shots: more than a digit has
BASELINE = "model=vit-ti/16"
SPEC_FIELDS = ("model", "weights_sha256", "dataset", "data_source", "data_fingerprint", "protocol",
               "protocol_version", "hparams", "seed")  # fmt: skip


def acme_cnn():
    """The docs' backbone of one's own (docs/architecture.md, "Add a backend"), as written."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "architecture.md").read_text()
    source = re.search(r"```python\n# acme-cnn/acme_cnn.py\n(.*?)```", text, flags=re.S).group(1)
    namespace: dict = {}
    exec(compile(source, "acme_cnn.py", "exec"), namespace)
    return namespace["MODELS"][0]


@pytest.fixture(scope="module")
def mixed(tmp_path_factory) -> Path:
    results = tmp_path_factory.mktemp("mixed") / "results"
    registry.MODELS.register(acme_cnn())
    vitbench.run(model="vit-ti/16", weights="random", res=32, protocol="fewshot,knn,linear", knn_k=(5, 20),
                 results=results, **RUN)  # fmt: skip
    vitbench.run(model="vit-ti/16", weights="random", res=48, protocol="fewshot", results=results, **RUN)
    vitbench.run(model="vit-ti/16", weights="random", res=32, precision="bf16", protocol="fewshot", results=results,
                 **RUN)  # fmt: skip
    vitbench.run(model="timm:resnet18", weights="random", res=32, protocol="fewshot,knn", knn_k=(5, 20),
                 results=results, **RUN)  # fmt: skip
    vitbench.run(model="acme-cnn", weights="random", res=32, protocol="fewshot", results=results, **RUN)
    yield results
    registry.MODELS.unregister("acme-cnn")


def csv_of(cli, *args) -> pd.DataFrame:
    code, out, err = cli(*args, "--format", "csv")
    assert code == 0, err
    return pd.read_csv(io.StringIO(out))


def measured(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[(frame["source"] == "vitbench") & ~frame["row"].str.contains("accelerator-days")]


def test_every_setting_is_a_value_for_every_run(cli, mixed):
    """Goal 1: no setting column of `results()` holds None for a default, a groupby keeps every run,
    `--where precision=fp32` selects the fp32 runs, the exports carry the defaults, keys unchanged."""
    frame = vitbench.results(mixed)
    assert frame[["precision", "decoder", "res", "gelu"]].notna().all().all()
    assert set(frame["precision"]) == {"fp32", "bf16"} and set(frame["decoder"].str.split().str[0]) == {"libjpeg"}
    fewshot = frame[frame["protocol"] == "fewshot"]
    assert fewshot.groupby(["precision", "res", "shots"]).size().sum() == len(fewshot) == 2 * 2 * 5
    chosen = measured(csv_of(cli, "table", "--where", "precision=fp32", "--results", mixed))
    assert len(chosen) and not chosen["column"].str.contains("bf16").any()
    code, md, _ = cli("table", "--where", "precision=fp32", "--format", "md", "--results", mixed)
    assert code == 0 and "- every column: precision=fp32, decoder=libjpeg, gelu=exact" in md  # said once, not left out
    code, _, err = cli("export", "--format", "csv", "--out", mixed.parent / "runs.csv", "--results", mixed)
    assert code == 0, err
    rows = pd.read_csv(mixed.parent / "runs.csv")
    assert all({"precision", "decoder", "res"} <= set(json.loads(h)) for h in rows["hparams"])
    for path, record in read_shards(sorted((mixed / "runs").glob("*.json"))).records:  # keys as first made
        assert run_key_of({name: record["run"][name] for name in SPEC_FIELDS}) == path.stem


def test_one_pairing_in_the_table_the_report_the_export_and_compare(cli, mixed, tmp_path):
    """Goal 2: the table's marks and intervals, the report's (which splits the table), `export
    --cells` and `compare` pair the same cells and give the same p-values."""
    table = measured(csv_of(cli, "table", "--protocol", "fewshot", "--ci", "--baseline", BASELINE, "--results",
                            mixed))  # fmt: skip
    cells = pd.read_csv(export_cells(cli, mixed, tmp_path, "--protocol", "fewshot"))
    assert len(cells) == len(table)  # a row per cell the table shows
    tested = cells[cells["p"].notna()]
    # every other backbone at 32 px fp32 is tested against the ViT-Ti at 32 px fp32: the plugin too
    assert set(tested["model"]) == {"timm:resnet18", "acme-cnn"} and len(tested) == 4
    assert set(tested["baseline"]) == {"vit-ti/16† · 1-shot · precision=fp32, res=32",
                                       "vit-ti/16† · 100-shot · precision=fp32, res=32"}  # fmt: skip
    for model in ("timm:resnet18", "acme-cnn"):
        compared = csv_of(cli, "compare", f"{BASELINE},res=32,precision=fp32", f"model={model}", "--all",
                          "--results", mixed)  # fmt: skip
        p = compared[compared["column"] == "p"].set_index("row")["mean"]
        for row in tested[tested["model"] == model].itertuples():
            unit = next(u for u in p.index if f" {int(row.shots)}-shot " in u)
            assert p[unit] == pytest.approx(row.p, rel=1e-6), (unit, row.p)
    # the report: the same marks and intervals in its parts as the table shows
    code, _, err = cli("report", "--out", tmp_path / "r.html", "--baseline", BASELINE, "--results", mixed)
    assert code == 0, err
    page = (tmp_path / "r.html").read_text()
    shown = report_cells(page, "fewshot-table")
    assert len(re.findall(r'id="fewshot-table(?:-\d+)?"', page)) >= 2  # split into parts
    for row in table.itertuples():
        text = shown[(row.row, row.column)]
        assert ("*" in text) == ("*" in str(row.marks)), (row.row, row.column)
        if not pd.isna(row.ci_low):
            assert f"[{row.ci_low:.2f}, {row.ci_high:.2f}]" in text


def export_cells(cli, results: Path, tmp_path: Path, *args) -> Path:
    out = tmp_path / "cells.csv"
    code, _, err = cli("export", "--cells", "--baseline", BASELINE, *args, "-f", "csv", "-o", out, "--results", results)
    assert code == 0, err
    return out


def report_cells(page: str, anchor: str) -> dict[tuple[str, str], str]:
    """(row, column label) -> the cell's text, over every part of a section's table."""
    found = {}
    for table in re.findall(rf'<table class="view" id="{anchor}(?:-\d+)?">(.*?)</table>', page, flags=re.S):
        header = re.search(r"<thead><tr><th></th>(.*?)</tr></thead>", table, flags=re.S).group(1)
        columns = [" ".join(html.unescape(re.sub(r"<[^>]+>", " ", c)).split()) for c in
                   re.findall(r"<th[^>]*>(.*?)</th>", header, flags=re.S)]  # fmt: skip
        rows = table[table.index("<tbody>") :]
        for row, body in re.findall(r"<tr><th>(.*?)</th>(.*?)</tr>", rows, flags=re.S):
            for column, cell in zip(columns, re.findall(r"<td[^>]*>(.*?)</td>", body, flags=re.S), strict=True):
                found[(html.unescape(row), column)] = html.unescape(re.sub(r"<[^>]+>", "", cell))
    return found


def test_labels_name_every_setting_that_differs_anywhere(cli, mixed, capsys):
    """Goal 3: every column names res and precision (they differ somewhere in the view), the plugin's
    and the k-NN columns too; the end-of-run table of the bf16 runs says bf16; the headline picks
    the default setting first."""
    table = measured(csv_of(cli, "table", "--results", mixed))
    assert table["column"].str.contains("res=").all() and table["column"].str.contains("precision=").all()
    assert {"acme-cnn† · 1-shot · precision=fp32, res=32", "timm:resnet18† · knn · k=5, precision=fp32, res=32",
            "vit-ti/16† · linear · precision=fp32, res=32"} <= set(table["column"])  # fmt: skip
    runs = vitbench.results(mixed)
    print_summary_table(mixed, set(runs.loc[runs["precision"] == "bf16", "run_key"]))
    ended = capsys.readouterr().out
    assert "precision=bf16" in ended and "res=32" in ended and "precision=fp32" not in ended
    at_32 = runs[(runs["res"] == 32) & (runs["model"] == "vit-ti/16") & (runs["protocol"] == "fewshot")]
    stored = store.read_results(mixed)
    chosen = summary.headline_setting(summary.measured_columns(stored[stored["run_key"].isin(at_32["run_key"])],
                                                               "fewshot").acc)  # fmt: skip
    assert "precision=fp32" in chosen  # fp32 and bf16 at the same resolution: the default first


def test_nothing_is_dropped_and_every_line_is_distinct(cli, mixed, tmp_path, monkeypatch):
    """Goal 4: every figure draws every cell, each line in a style of its own; the terminal table fits
    120 columns whole; the report fits 1,400 px with no overlap and draws every figure line."""
    table = measured(csv_of(cli, "table", "--results", mixed))
    for protocol, name in (("fewshot", "fewshot_shots"), ("knn", "knn_knn_k")):
        code, _, err = cli("plot", protocol, "--results", mixed, "--out", tmp_path, "--formats", "png")
        assert code == 0, err
        points = pd.read_csv(tmp_path / f"{name}.csv")
        drawn = points[points["kind"] == "point"]
        cells = table[table["column"].str.contains(" · 100-shot| · 1-shot" if protocol == "fewshot" else " · knn")]
        assert len(drawn) == len(cells)  # every cell a point: nothing left out
        styles = drawn.drop_duplicates(["model", "weights_sha256", "setting"])[["colour", "marker", "dash"]]
        assert not styles.duplicated().any()  # no two lines look alike
    hundred = pd.read_csv(tmp_path / "fewshot_shots.csv")
    assert hundred.loc[hundred["x"] == 100, "effective_shots"].notna().all()  # the 100-shot points say they had fewer
    monkeypatch.setenv("COLUMNS", "120")
    code, out, _ = cli("table", "--results", mixed)
    assert code == 0 and max(len(line) for line in out.splitlines()) <= 120
    assert all(f"{value:.2f}" in out for value in table["mean"])  # every cell is there, none cut
    monkeypatch.delenv("COLUMNS")
    code, _, err = cli("report", "--out", tmp_path / "r.html", "--baseline", BASELINE, "--results", mixed)
    assert code == 0, err
    with Server() as server:
        server.state.files["/r.html"] = probed((tmp_path / "r.html").read_text()).encode()
        loaded = headless(browser(), "--window-size=1400,1000", "--virtual-time-budget=3000", "--dump-dom",
                          f"{server.url}/r.html")  # fmt: skip
    probe = json.loads(html.unescape(re.search(r'data-probe="([^"]*)"', loaded.stdout).group(1)))
    assert probe["pageWidth"] <= 1400 and probe["outside"] == [] and probe["scrolls"] == [], probe
    assert probe["overflowing"] == [], probe  # no label or cell wider than its cell
    for figure, csv in (("figure-fewshot", "fewshot_shots"), ("figure-knn", "knn_knn_k")):
        points = pd.read_csv(tmp_path / f"{csv}.csv")
        lines = points[points["kind"] == "point"].drop_duplicates(["line"])
        assert sum(line.startswith(f"{figure}/") for line in probe["lines"]) == len(lines), probe["lines"]


def test_footnotes_never_contradict_a_cell(cli, mixed):
    """Goal 4: `compare`'s [k-shot] note no longer claims a Δ of 0 between two backbones."""
    code, out, err = cli("compare", f"{BASELINE},res=32,precision=fp32", "model=timm:resnet18", "--all",
                         "--results", mixed)  # fmt: skip
    assert code == 0, err
    assert "[100-shot]" not in out and "by construction" not in out
    assert re.search(r"\[\d+-shot\]", out) and "fewer than the shots the row names" in " ".join(out.split())


def test_the_knn_figure_says_what_it_measures(cli, mixed, tmp_path):
    """Goal 6: the linear probe of the same features beside k-NN, the rule and chance level said."""
    code, out, err = cli("plot", "knn", "--results", mixed, "--out", tmp_path, "--formats", "png")
    assert code == 0, err
    points = pd.read_csv(tmp_path / "knn_knn_k.csv")
    probe = points[points["kind"] == "reference: linear"]
    linear = vitbench.results(mixed, where="protocol=linear")
    assert len(probe) == 1 and probe["mean"].iloc[0] == pytest.approx(linear["accuracy"].iloc[0] * 100)
    assert points.loc[points["kind"] == "chance", "mean"].iloc[0] == pytest.approx(10.0)  # ten digits
    said = " ".join(out.split())
    assert "DINO's rule" in said and "T = 0.07" in said and "chance, 100 / the classes in the scored split" in said

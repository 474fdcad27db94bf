"""One number, one meaning (docs/tables.md): every view reads one grouping of runs into cells, so no
view shows a mean over runs of different settings, every value shown is a table cell at the setting
its label names, and no label is cut. The store: DeiT-Ti few-shot and k-NN on the digits at two
resolutions beside ResNet-18 at random init, then the same runs recorded again at a second precision
and with a second decoder (what a GPU run records), which must stay apart too."""

from __future__ import annotations

import html
import json
import re
import shutil
import time
from pathlib import Path

import pandas as pd
import pytest
from conftest import DEIT_WEIGHTS, needs_shared_data

import vitbench
from vitbench import store as store_module
from vitbench.engine.device_data import NVJPEG_DECODER
from vitbench.provenance import run_key_of
from vitbench.views.measured.columns import measured_columns
from vitbench.views.measured.settings import run_setting

pytestmark = needs_shared_data

RUNS = dict(datasets="digits", protocol="fewshot,knn", shots=(1, 5), seeds=(0, 1), knn_k=(5, 20), workers=0)
SPEC_FIELDS = ("model", "weights_sha256", "dataset", "data_source", "data_fingerprint", "protocol",
               "protocol_version", "hparams", "seed")  # fmt: skip


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    results = tmp_path_factory.mktemp("one-number") / "results"
    for res in (32, 48):
        vitbench.run(model="deit-ti/16", weights=str(DEIT_WEIGHTS), res=res, results=results, **RUNS)
    vitbench.run(model="timm:resnet18", weights="random", res=32, results=results, **RUNS)
    return results


def recorded_again(results: Path, setting: dict, shift: float, name: str | None = None) -> Path:
    """A copy of the store in which every DeiT-Ti run at 48 px is also stored with `setting` among its
    hparams (its own run key, its accuracies moved by `shift`): what a second precision or decoder
    records."""
    copy = results.parent / f"{results.name}-{name or next(iter(setting))}"
    shutil.copytree(results, copy)
    for path in sorted((copy / "runs").glob("*.json")):
        shard = json.loads(path.read_text())
        run = shard["run"]
        if run["model"] != "deit-ti/16" or run["hparams"].get("res") != 48:
            continue
        run["hparams"] = {**run["hparams"], **setting}
        key = run_key_of({name: run[name] for name in SPEC_FIELDS})
        kept = run["notes"].get("predictions")
        if kept:  # the same predictions file, under the new run's name
            shutil.copy(path.with_name(kept["file"]), path.with_name(f"{key}.predictions.parquet"))
            run["notes"]["predictions"] = {**kept, "file": f"{key}.predictions.parquet"}
        run["run_key"] = key
        shard["metrics"] = {k: (v + shift if k.startswith("accuracy") else v) for k, v in shard["metrics"].items()}
        path.with_name(f"{key}.json").write_text(json.dumps(shard))
    return copy


def table_cells(cli, results: Path, protocol: str) -> dict[str, float]:
    code, csv, err = cli("table", "--protocol", protocol, "--format", "csv", "--results", results)
    assert code == 0, err
    frame = pd.read_csv(pd.io.common.StringIO(csv))
    measured = frame[(frame["source"] == "vitbench") & (frame["row"] != "vitbench accelerator-days")]
    return dict(zip(measured["column"], measured["mean"], strict=True))


def cells_by_runs(results: Path, protocol: str) -> dict[frozenset, str]:
    """The runs behind each table column (one dataset here): {run keys: column label}."""
    acc = measured_columns(store_module.read_results(results), protocol).acc
    return {frozenset(part["run_key"]): str(col) for col, part in acc.groupby("column")}


def one_setting(results: Path, keys) -> bool:
    """Whether runs `keys` share every setting but the seed (a mean over them is over seeds only)."""
    frame = vitbench.results(results, long=True)
    runs = frame[frame["run_key"].isin(set(keys))].drop_duplicates("run_key")
    settings = {json.dumps(run_setting(h), sort_keys=True, default=str) for h in runs["hparams"]}
    identities = set(zip(runs["model"], runs["weights_sha256"], runs["protocol_version"], strict=True))
    return len(settings) == 1 and len(identities) == 1


@pytest.mark.parametrize("variant", ["resolutions", "precisions", "decoders"])
def test_every_view_shows_cells_of_one_setting(cli, store, tmp_path, variant):
    results = {
        "resolutions": store,
        "precisions": recorded_again(store, {"precision": "bf16"}, 0.01) if variant == "precisions" else None,
        "decoders": recorded_again(store, {"decoder": NVJPEG_DECODER}, -0.01) if variant == "decoders" else None,
    }[variant]
    apart = {"resolutions": "res=", "precisions": "precision=", "decoders": "decoder="}[variant]
    for protocol, figure in (("fewshot", "fewshot_shots"), ("knn", "knn_knn_k")):
        cells = table_cells(cli, results, protocol)
        columns = cells_by_runs(results, protocol)
        assert all("…" not in label for label in cells), cells  # never cut
        assert all(one_setting(results, keys) for keys in columns), protocol  # a cell: seeds of one setting
        assert sum(apart in label for label in cells) >= 4, cells  # the setting that differs is named
        # every figure point is a table cell: the same runs, the same mean, its setting named in its line
        code, _, err = cli("plot", protocol, "--results", results, "--out", tmp_path / variant, "--formats", "png")
        assert code == 0, err
        points = pd.read_csv(tmp_path / variant / f"{figure}.csv")
        points = points[points["kind"] == "point"]  # (the reference lines and chance are rows of their own)
        assert len(points) == len(cells)
        for point in points.itertuples():
            column = columns[frozenset(point.run_keys.split())]
            assert point.mean == pytest.approx(cells[column], abs=1e-3)
            named = [part for part in column.split(" · ")[-1].split(", ") if apart in part]
            assert all(part in point.line for part in named), (point.line, column)
        assert "…" not in " ".join(points["line"])
        # grouped by a stored field, a column still never mixes settings (nor protocols)
        grouped = measured_columns(store_module.read_results(results), group_by=["model"]).acc
        assert all(one_setting(results, part["run_key"]) for _, part in grouped.groupby("column"))
    # the API: a row per run, a column per metric and per setting; its group means are the table's
    frame = vitbench.results(results, where=["protocol=fewshot", "model=deit-ti/16"])
    assert frame["run_key"].is_unique and {"accuracy", "res"} <= set(frame.columns) and "value" not in frame
    keys = ["res", "shots"] + [c for c in ("precision", "decoder") if c in frame]
    means = frame.assign(**{c: frame[c].fillna("-") for c in keys}).groupby(keys)["accuracy"].mean() * 100
    cells = table_cells(cli, results, "fewshot")
    assert sorted(round(v, 3) for v in means) == sorted(round(v, 3) for k, v in cells.items() if "deit" in k)


def test_the_report_headline_shows_one_setting_and_names_it(cli, store, tmp_path):
    page = tmp_path / "report.html"
    code, _, err = cli("report", "--out", page, "--results", store)
    assert code == 0, err
    text = page.read_text()
    headline = text[text.index("Headline numbers") : text.index("</table>", text.index("Headline numbers"))]
    values = [html.unescape(re.sub(r"<[^>]+>", "", c)) for c in re.findall(r"<td[^>]*>.*?</td>", headline, re.S)]
    deit = [v for v in values if "(res=" in v]
    assert len(deit) == 2 and all("(res=48)" in v for v in deit), values  # nearest the native 224 px
    fewshot, knn = table_cells(cli, store, "fewshot"), table_cells(cli, store, "knn")
    shown = float(deit[0].split()[0])
    assert shown == pytest.approx(fewshot["deit-ti/16 · 5-shot · res=48"], abs=0.006)  # 5 shots: the most it has
    assert float(deit[1].split()[0]) == pytest.approx(knn["deit-ti/16 · k=20, res=48"], abs=0.006)
    assert "the weights' native resolution where it ran there, else the resolution nearest it" in html.unescape(text)


def test_compare_gives_a_row_per_shared_setting_and_names_what_it_cannot_pair(cli, store):
    code, csv, err = cli("compare", "model=timm:resnet18", "model=deit-ti/16", "--all", "--format", "csv",
                         "--results", store)  # fmt: skip
    assert code == 0, err
    rows = sorted(set(pd.read_csv(pd.io.common.StringIO(csv))["row"]))
    assert rows == [
        "digits · fewshot · 1-shot · fewshot-lsr/3 · res=32", "digits · fewshot · 5-shot · fewshot-lsr/3 · res=32",
        "digits · knn · knn/3 · k=20 · res=32", "digits · knn · knn/3 · k=5 · res=32",
    ]  # fmt: skip
    code, out, _ = cli("compare", "model=timm:resnet18", "model=deit-ti/16", "--all", "--format", "md",
                       "--results", store)  # fmt: skip
    assert (
        "B alone (no A run at the same setting, so no row): digits · fewshot · 1-shot · fewshot-lsr/3 · res=48" in out
    )
    code, _, err = cli("compare", "model=timm:resnet18,protocol=knn,knn_k=20", "model=deit-ti/16,protocol=knn,knn_k=20",
                       "--results", store)  # fmt: skip
    assert code == 2 and "they differ in res (32, 48): narrow it, e.g." in err and "knn_k=20,res=32 (" in err


def test_a_six_column_table_fits_the_page_in_a_browser(cli, store, tmp_path):
    from test_report import browser, headless, probed

    binary = browser()
    page = tmp_path / "report.html"
    code, _, err = cli("report", "--out", page, "--results", store, "--where", "protocol=fewshot")
    assert code == 0, err
    page.write_text(probed(page.read_text()))
    done = headless(binary, "--window-size=1400,1200", "--virtual-time-budget=3000", "--dump-dom", page.as_uri())
    probe = json.loads(html.unescape(re.search(r'data-probe="([^"]*)"', done.stdout).group(1)))
    # every column of the 6-column few-shot table in view: no table scrolls sideways, nothing sticks out
    assert probe["width"] == 1400 and probe["scrolls"] == [] and not probe["outside"], probe
    assert page.read_text().count("</th>") > 6
    shot = tmp_path / "report.png"
    headless(binary, "--window-size=1400,1200", f"--screenshot={shot}", page.as_uri())
    for _ in range(20):  # the file appears when the browser has written it
        if shot.exists() and shot.stat().st_size:
            break
        time.sleep(0.1)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_runs_decoded_by_nvjpeg_say_so_where_nothing_else_differs(cli, store):
    """Not the reference's pixels: a column of nvjpeg-decoded runs is marked even alone."""
    results = recorded_again(store, {"decoder": NVJPEG_DECODER}, 0.0, name="nvjpeg-alone")
    for path in (results / "runs").glob("*.json"):  # only the nvjpeg copies and the other models stay
        run = json.loads(path.read_text())["run"]
        if run["model"] == "deit-ti/16" and run["hparams"].get("decoder") != NVJPEG_DECODER:
            path.unlink()
    (results / "vitbench.duckdb").unlink()
    cells = table_cells(cli, results, "knn")
    assert {label for label in cells if "deit" in label} == {
        "deit-ti/16 · decoder=nvjpeg, k=5, res=48", "deit-ti/16 · decoder=nvjpeg, k=20, res=48"}  # fmt: skip

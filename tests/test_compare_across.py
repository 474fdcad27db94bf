"""Issue 80, goal 1: pair what a researcher compares. Table 2 compares backbones each at its own
resolution; a baseline named with `--baseline` (or `compare`'s A side) is paired with every cell on
the same test images, protocol and shots or k, whatever its backbone, weights or resolution. The
store in miniature: the docs' own ConvNet at its own 24 px, a ViT-Ti at 32 and at 48 px; few-shot,
k-NN and the linear probe on the digits."""

from __future__ import annotations

import io
from pathlib import Path

import pandas as pd
import pytest
from test_read_without_internals import acme_cnn

import vitbench
from vitbench.catalog import registry

RUN = dict(datasets=["digits"], workers=0, seeds=(0,), shots=(1, 5), knn_k=(5,), protocol="fewshot,knn,linear")
BASELINE = "model=vit-ti/16,res=48"


@pytest.fixture(scope="module")
def across(tmp_path_factory) -> Path:
    results = tmp_path_factory.mktemp("across") / "results"
    registry.MODELS.register(acme_cnn())
    for res in (32, 48):
        vitbench.run(model="vit-ti/16", weights="random", res=res, results=results, **RUN)
    vitbench.run(model="acme-cnn", weights="random", res=24, results=results, **RUN)
    yield results
    registry.MODELS.unregister("acme-cnn")


def _csv(cli, *args) -> pd.DataFrame:
    code, out, err = cli(*args, "--format", "csv")
    assert code == 0, err
    return pd.read_csv(io.StringIO(out))


def test_a_named_baseline_pairs_every_backbone_at_its_own_resolution(cli, across, tmp_path):
    """Before: "no cell has a baseline cell … at the same dataset, protocol, shots and setting", and
    `export --cells` had p, baseline and delta empty in every row."""
    out = tmp_path / "cells.csv"
    code, _, err = cli("export", "--cells", "--baseline", BASELINE, "-f", "csv", "-o", out, "--results", across)
    assert code == 0, err
    cells = pd.read_csv(out)
    others = cells[~((cells["model"] == "vit-ti/16") & cells["column"].str.contains("res=48"))]
    assert len(others) == 8  # (ConvNet at 24, ViT-Ti at 32) x (1-shot, 5-shot, k-NN k=5, linear)
    assert others["p"].notna().all() and others["baseline"].str.contains("res=48").all(), others
    for row in others.itertuples():  # the baseline cell of its own protocol and shots or k
        if "shot" in row.column:
            assert f"{int(row.shots)}-shot" in row.baseline
        assert ("k=5" in row.column) == ("k=5" in row.baseline) and row.protocol in ("fewshot", "knn", "linear")
    code, text, err = cli("table", "--ci", "--baseline", BASELINE, "--results", across)
    assert code == 0, err
    legend = next(line for line in text.splitlines() if line.startswith("* differs from the baseline"))
    assert "protocol, version and shots or k" in legend and "resolution may differ" in legend
    assert "[acme-cnn† · 1-shot · res=24] vs [vit-ti/16† · 1-shot · res=48]" in legend
    # without --baseline, the default column and today's pairing (within one condition) hold
    code, text, err = cli("table", "--ci", "--results", across)
    assert code == 0 and "at the same dataset, protocol, shots and setting" in text, err
    # the report's tables mark the same pairs
    code, _, err = cli("report", "--baseline", BASELINE, "--out", tmp_path / "r.html", "--results", across)
    assert code == 0, err
    assert "[acme-cnn† · 1-shot · res=24] vs [vit-ti/16† · 1-shot · res=48]" in (tmp_path / "r.html").read_text()


def test_compare_all_gives_a_row_per_dataset_protocol_and_shots_across_resolutions(cli, across):
    """Before: `compare res=32 res=48 --all` refused ("A and B share no dataset and setting"), the
    very setting that was varied."""
    frame = _csv(cli, "compare", "model=vit-ti/16,res=32", "model=vit-ti/16,res=48", "--all", "--results", across)
    rows = sorted(set(frame["row"]))
    assert len(rows) == 4, rows
    assert any("1-shot" in r for r in rows) and any("5-shot" in r for r in rows)
    assert any(r.startswith("digits · knn") and "k=5" in r for r in rows) and any("linear" in r for r in rows)
    code, text, err = cli("compare", "model=vit-ti/16,res=32", "model=vit-ti/16,res=48", "--all", "--results", across)
    assert code == 0, err
    assert "1-shot: A and B paired across settings (A at res=32, B at res=48)" in text


def test_a_pair_that_differs_in_more_than_the_backbone_says_so():
    from vitbench.views.measured.settings import also_differ, pairing

    assert pairing("knn", None, "knn/2", {"knn_k": 20, "res": 224}) == "knn · knn/2 · k=20"
    assert (
        pairing("fewshot", 10, "fewshot-lsr/3", {"res": 224, "precision": "bf16"})
        == "fewshot · fewshot-lsr/3 · 10-shot"
    )
    cell = [{"res": 112, "precision": "bf16", "decoder": "libjpeg (x)", "preprocessing": "a", "fewshot_l2": "1024"}]
    base = [{"res": 224, "precision": "fp32", "decoder": "libjpeg (x)", "preprocessing": "b", "fewshot_l2": "sweep"}]
    assert also_differ("fewshot", cell, base, same_backbone=True) == [
        "fewshot_l2=1024 vs sweep",
        "precision=bf16 vs fp32",
    ]  # preprocessing follows from the resolution here
    same_res = [{**base[0], "res": 112}]
    assert "preprocessing=a vs b" in also_differ("fewshot", cell, same_res, same_backbone=True)
    assert also_differ("fewshot", cell, same_res, same_backbone=False) == [
        "fewshot_l2=1024 vs sweep",
        "precision=bf16 vs fp32",
    ]  # another backbone's preprocessing is its own


def test_the_report_says_each_footnote_once_and_draws_the_standalone_figures(cli, across, tmp_path):
    """Goal 3. Before: a split table's footnote block under each of its parts, the interval's and the
    marks' footnotes where no interval or mark was shown, and the report's few-shot figure without the
    linear-probe references the standalone figure draws."""
    import html
    import re

    import pandas as pd

    from vitbench.views.cells import Cell, TableData
    from vitbench.views.report.report import Page

    data = TableData(title="wide")
    data.add_row("Digits")
    for i in range(24):
        column = f"model-{i} · a setting long enough to need its own width · res={i}"
        data.add_column(column)
        data.cells[("Digits", column)] = Cell(mean=50.0 + i, text=f"{50 + i:.2f}")
    data.footnotes += ["[lo, hi]: 95 % percentile bootstrap interval …", "*: no cell has a baseline cell …",
                       "measured cells: top-1 accuracy (%), one run each"]  # fmt: skip
    page = Page(df=pd.DataFrame(), results=tmp_path, compare=(), figures=tmp_path)
    shown = page.table("wide", data)
    assert shown.count("<h3>") > 2  # split into parts that fit
    assert shown.count("measured cells: top-1 accuracy") == 1 and shown.rindex("measured cells") > shown.rindex("<h3>")
    assert "[lo, hi]" not in shown and "no cell has a baseline" not in shown  # no interval, no mark shown

    code, printed, err = cli("plot", "fewshot", "--out", tmp_path / "plots", "--formats", "svg", "--results", across)
    assert code == 0, err
    code, _, err = cli("report", "--out", tmp_path / "r.html", "--results", across)
    assert code == 0, err
    captions = [
        html.unescape(c) for c in re.findall(r"<figcaption>(.*?)</figcaption>", (tmp_path / "r.html").read_text(), re.S)
    ]
    fewshot = next(c for c in captions if c.startswith("few-shot"))
    assert "the linear probe of the same features" in fewshot
    assert " ".join(fewshot.split()) in " ".join(printed.split())  # the standalone figure's own caption


def test_a_ringed_points_label_stays_inside_its_panel():
    """Goal 3. Before: the `[10-shot]` label of a point at a panel's last x ran into the next panel."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    from vitbench.protocols.registry import protocols
    from vitbench.views.figures.axis_plot import _draw_panel, line_style

    points = pd.DataFrame({"key": ["a"] * 3, "x": [1.0, 5.0, 100.0], "mean": [30.0, 50.0, 60.0],
                           "std": [None] * 3, "n": [2] * 3, "legend": ["a"] * 3,
                           "effective_shots": [None, None, 10.0]})  # fmt: skip
    fig, ax = plt.subplots(figsize=(3, 2))
    axis = protocols()["fewshot"].axis
    _draw_panel(ax, points, points.iloc[0:0].assign(kind=[], mean=[]), {"a": line_style(0)}, axis, "t")
    ax.set_xscale("log")
    fig.canvas.draw()
    (label,) = [t for t in ax.texts if t.get_text() == "[10-shot]"]
    box, panel = label.get_window_extent(), ax.get_window_extent()
    assert panel.x0 <= box.x0 and box.x1 <= panel.x1, (box, panel)
    plt.close(fig)

"""`vitbench table --view robustness`: a checkpoint's ImageNet head on ImageNet val and its
distribution shifts (V2, R, A, Sketch, ObjectNet), with the average drop from ImageNet, beside the
paper's cells (App. D.9: ViT-H/14 on ObjectNet; ImageNet and ReaL from Table 2)."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from vitbench.datasets.robustness import ROBUSTNESS
from vitbench.reference import paper
from vitbench.views.cells import SUBSET_MARK, Cell, TableData
from vitbench.views.measured.columns import measured_columns, meta_by_column, seed_cell
from vitbench.views.measured.footnotes import marker_footnotes, provenance_footnotes
from vitbench.views.tables.table import add_deltas, paper_columns, resolve_delta_to

# row key -> (dataset, stored metric, row label); the ImageNet rows first, the shifts below them
ROWS: dict[str, tuple[str, str, str]] = {
    "imagenet": ("imagenet", "accuracy", "ImageNet"),
    "imagenet_real": ("imagenet", "accuracy_real", "ImageNet ReaL"),
    **{s.name: (s.name, "accuracy", s.title) for s in ROBUSTNESS},
    "objectnet_top5": ("objectnet", "accuracy_top5", "ObjectNet (top-5)"),
}
SHIFTS = [s.name for s in ROBUSTNESS]  # the rows the average drop is taken over (top-1)
DROP_ROW = "Average drop from ImageNet (points)"


def scored_under_shift(df: pd.DataFrame) -> set[str]:
    """The protocols with runs on a shifted set: only a checkpoint's own classifier can be scored on
    their label spaces (`eval`), so their ImageNet runs are the rows the drop is taken from."""
    return set(df.loc[df["dataset"].isin(SHIFTS), "protocol"]) if not df.empty else set()


def _paper_values(names: Sequence[str]) -> dict[str, pd.DataFrame]:
    """Per paper column, its cells keyed like ROWS: the robustness table, then Table 2's ImageNet rows."""
    robust = paper.table("robustness")
    keys = {(d, metric): key for key, (d, metric, _) in ROWS.items()}
    values = {}
    for name in names:
        part = robust[robust["column"] == name]
        rows = [(keys[(d, m)], v) for d, m, v in zip(part["dataset"], part["metric"], part["value"], strict=True)]
        table2 = paper.column(name)
        rows += [(d, v) for d, v in zip(table2["dataset"], table2["value"], strict=True) if d in ROWS]
        values[name] = pd.DataFrame(rows, columns=["dataset", "value"]).assign(std=float("nan"))
    return values


def _drop_cells(data: TableData, row_of: dict[str, str], columns: list[str]) -> None:
    """Per column, ImageNet top-1 minus each shift's top-1, averaged over the shifts it has."""
    for col in columns:
        base = data.cells.get((row_of["imagenet"], col))
        shifted = [data.cells.get((row_of[k], col)) for k in SHIFTS]
        found = [c for c in shifted if c is not None and c.mean is not None]
        if base is None or base.mean is None or not found:
            continue
        drop = base.mean - sum(c.mean for c in found if c.mean is not None) / len(found)
        marks = SUBSET_MARK if base.marks or any(c.marks for c in found) else ""
        sets = f"{len(found)} set" + ("s" if len(found) != 1 else "")
        data.cells[(DROP_ROW, col)] = Cell(mean=drop, text=f"{drop:.2f} ({sets})", marks=marks)


def robustness_view(
    df: pd.DataFrame,
    compare: Sequence[str] = (),
    protocol: str | None = None,
    include_marked: bool = False,
    delta_to: str | None = None,
) -> TableData:
    """Rows ImageNet, ReaL, each robustness set (ObjectNet also top-5) and the average drop; one
    measured column per (model, weights) evaluated with its own head; paper columns where the
    paper has robustness numbers (all of them when `compare` is empty)."""
    robust = paper.table("robustness")
    names = list(compare) or list(dict.fromkeys(robust["column"]))
    delta_to = resolve_delta_to(names, delta_to)
    datasets = {d for d, _, _ in ROWS.values()}
    own = {protocol} if protocol else scored_under_shift(df)
    m = measured_columns(df[df["dataset"].isin(datasets) & df["protocol"].isin(own)] if not df.empty else df)
    data = TableData(title="Robustness: the ImageNet head under distribution shift, top-1 accuracy (%)")
    row_of = {key: label for key, (_, _, label) in ROWS.items()}
    for label in row_of.values():
        data.add_row(label)
    meta = meta_by_column(m.runs)
    columns = [str(c) for c in dict.fromkeys(m.runs["column"])] if not m.runs.empty else []
    for col in columns:
        data.add_column(col)
    if columns:
        column_of = dict(zip(m.runs["run_key"], m.runs["column"], strict=True))
        scored = df[df["run_key"].isin(column_of)].assign(column=lambda f: f["run_key"].map(column_of))
        for dataset, metric, label in ROWS.values():
            part = scored[(scored["dataset"] == dataset) & (scored["metric"] == metric)]
            for col, cells in part.groupby("column", sort=False):
                data.cells[(label, str(col))] = seed_cell(cells, meta[str(col)], include_marked)
        _drop_cells(data, row_of, columns)
        data.add_row(DROP_ROW)
    paper_columns(data, names, row_of, _paper_values(names), cost=False)
    shown = add_deltas(data, meta, delta_to, row_of, include_marked)
    if columns:
        data.footnotes.append("measured cells: accuracy (%) of the checkpoint's own ImageNet-1k classifier")
    data.footnotes.append(
        "ImageNet-R and -A: logits restricted to their 200 classes; ObjectNet: its 113 ImageNet classes, each the "
        "max over the ImageNet logits it maps to, 1-pixel border cropped; V2 and Sketch: all 1000 classes"
    )
    if columns:
        data.footnotes.append("average drop: ImageNet top-1 − the mean top-1 of the shifted sets a column has")
    if shown and delta_to:
        data.footnotes.append(f"Δ: measured − {delta_to} (paper), in percentage points")
    robust_sources = dict(zip(robust["column"], robust["source"], strict=True))
    for name in names:
        where = robust_sources.get(name, "no robustness numbers in the paper")
        data.footnotes.append(f"{name} (paper): {where}; ImageNet and ReaL from Table 2 (512 px + Polyak)")
    marker_footnotes(data, include_marked, bool(names))
    provenance_footnotes(data, m)
    return data

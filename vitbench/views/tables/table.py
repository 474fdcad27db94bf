"""The comparison views: stored runs (mean ± std over seeds, n) beside the paper's own numbers.

Every view builds a `TableData` (rows × columns of `Cell`s plus footnotes); `vitbench.views.tables.render`
turns it into rich, Markdown, LaTeX, CSV or HTML. Views:

- `accuracy_view`: Table 2's layout — rows ImageNet, ReaL, CIFAR-10/100, Pets, Flowers, VTAB,
  then the cost rows; one column per measured (model, weights, protocol, setting), or per
  `--group-by` fields; `--compare` paper columns with Δ against one of them.
- `table9_view`: VTAB-1k per task with the natural / specialized / structured means.
- `table5_view`: Table 5's blocks by pre-training dataset, measured weights as blocks of their own.
- `table6_view`: Table 6's models with pre-training exaFLOPs, measured columns as rows.

(The attention-distance view is views/tables/attention.py; the throughput table views/tables/bench_table.py.)

Honesty: random-init (†), subset-data (‡) and smoke (§) results carry their symbol and a
footnote in every view, get no Δ and are never the row's best unless `include_marked`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from vitbench.datasets.vtab import GROUPS, TASKS, group_means
from vitbench.errors import UserError, listed
from vitbench.protocols.registry import protocols
from vitbench.reference import paper
from vitbench.views.cells import RANDOM_MARK, SMOKE_MARK, Cell, TableData
from vitbench.views.measured.columns import (
    Measured,
    accelerator_days,
    delta_allowed,
    measured_cells,
    measured_columns,
    meta_by_column,
    paper_comparable,
    seed_cell,
    vtab_rollups,
    weights_label,
)
from vitbench.views.measured.dataset_titles import TITLES, title
from vitbench.views.measured.footnotes import marker_footnotes, provenance_footnotes
from vitbench.views.measured.paper_match import SETTING_MARK, WITHIN_MARK, Matches, as_values, flag, match
from vitbench.views.statistics.significance import add_significance
from vitbench.views.tables.labels import PER_CELL_N, say_once

TABLE2_ROWS = ["imagenet", "imagenet_real", "cifar10", "cifar100", "pets", "flowers102", "vtab"]
TABLE5_ROWS = ["cifar10", "cifar100", "imagenet", "imagenet_real", "flowers102", "pets"]
TABLE6_ROWS = ["imagenet", "imagenet_real", "cifar10", "cifar100", "pets", "flowers102"]
COST_ROW = "vitbench accelerator-days"
PAPER_COST_ROW = "paper TPUv3-core-days"
COST_NOTE = (
    "vitbench accelerator-days: this evaluation's devices × days, every run behind the column (a fine-tuning "
    "LR sweep included; a frozen-feature run counts the extraction of every image it read, whichever run "
    "extracted it); paper TPUv3-core-days: the paper's pre-training, cores × days (not the same quantity)"
)


def _cost_row(data: TableData, m: Measured, datasets: set[str]) -> None:
    """Accelerator-days of every run behind each column (the fine-tuning LR sweep's included) on the
    datasets shown; empty where a run recorded no device time."""
    runs = m.runs
    in_rows = runs["dataset"].isin(datasets) | (
        runs["dataset"].str.startswith("vtab/") & bool(datasets & {"vtab", *(f"vtab_{g}" for g in GROUPS)})
    )
    any_cost = False
    for col, part in runs[in_rows].groupby("column", sort=False):
        days = accelerator_days(part)
        if days is not None:
            data.cells[(COST_ROW, str(col))] = Cell(mean=days, n=len(part), text=f"{days:.2g}")
            any_cost = True
    if any_cost or data.columns:
        data.add_row(COST_ROW)


def paper_columns(
    data: TableData,
    compare: Sequence[str],
    row_of: dict[str, str],
    values: dict[str, pd.DataFrame],
    cost: bool = True,
) -> None:
    for name in compare:
        col = f"{name} (paper)"
        data.add_column(col, is_paper=True)
        by_dataset = {r.dataset: r for r in values[name].itertuples()}
        for dataset, row in row_of.items():
            if dataset in by_dataset:
                r = by_dataset[dataset]
                std = float(r.std) if isinstance(r.std, int | float) and not math.isnan(r.std) else None
                data.cells[(row, col)] = Cell(mean=float(r.value), std=std, is_paper=True, rankable=True)
        if cost and "tpuv3_core_days" in by_dataset:
            data.add_row(PAPER_COST_ROW)
            value = float(by_dataset["tpuv3_core_days"].value)
            data.cells[(PAPER_COST_ROW, col)] = Cell(mean=value, text=f"{value / 1000:g}k", is_paper=True)


def add_deltas(
    data: TableData,
    meta: dict[str, dict],
    delta_to: str | None,
    row_of: dict[str, str],
    include_marked: bool,
    matches: Matches | None = None,
) -> int:
    """Δ = measured − the `delta_to` paper cell, in percentage points; with `matches`, the cell of
    the measured setting (views/measured/paper_match.py), flagged where none is. Returns how many were shown."""
    if delta_to is None:
        return 0
    ref_col, shown = f"{delta_to} (paper)", 0
    for dataset, row in row_of.items():
        ref = data.cells.get((row, ref_col))
        if ref is None or ref.mean is None:
            continue
        for col, column_meta in meta.items():
            cell = data.cells.get((row, col))
            if cell is None or cell.mean is None or not delta_allowed(column_meta, cell, include_marked):
                continue
            target, agrees = matches.against.get((delta_to, dataset, col), (None, True)) if matches else (None, True)
            cell.delta = cell.mean - (target.value if target is not None else ref.mean)
            spread = target.std if target is not None else ref.std
            if spread and abs(cell.delta) <= 2 * spread:  # within the paper's own runs' spread
                cell.marks += f" {WITHIN_MARK}"
            if matches and target is not None and not agrees:
                how = flag(cell, target, matches.settings[(dataset, col)])
                data.footnotes.append(f"{SETTING_MARK} [{col}] · {row}: Δ against a cell of another setting ({how})")
            shown += 1
    return shown


def _common_footnotes(data: TableData, m: Measured, compare: Sequence[str], delta_to: str | None, deltas: int) -> None:
    if any(not c.endswith("(paper)") for c in data.columns):
        data.footnotes.append(f"measured cells: top-1 accuracy (%), {PER_CELL_N}")
    if COST_ROW in data.rows or PAPER_COST_ROW in data.rows:
        data.footnotes.append(COST_NOTE)
    if compare:
        known = protocols()
        others = sorted(set(m.runs["protocol"]) - paper_comparable()) if not m.runs.empty else []
        labels = listed((known[p].label if p in known else p for p in others), "and")
        data.footnotes.append("paper columns are fine-tuned results" + (f"; {labels} cells get no Δ" if others else ""))
    if deltas and delta_to:
        data.footnotes.append(f"Δ: measured − {delta_to} (paper), in percentage points")
    for k, l2 in sorted(m.chosen_l2.items()):
        data.footnotes.append(f"{k}-shot: λ = {l2:g} chosen by mean rank across datasets (--fewshot-l2 sweep)")
    if m.superseded:
        data.footnotes.append(
            f"{m.superseded} earlier run(s) of a shown setting on data whose files have changed since "
            "(another fingerprint) not shown: the latest run stands for each"
        )


def resolve_delta_to(compare: Sequence[str], delta_to: str | None) -> str | None:
    if delta_to is not None and delta_to not in compare:
        raise UserError(f"--delta-to {delta_to}: not one of the --compare columns ({', '.join(compare) or 'none'})")
    return delta_to if delta_to is not None else (compare[0] if compare else None)


def accuracy_view(
    df: pd.DataFrame,
    compare: Sequence[str] = (),
    protocol: str | None = None,
    shots: int | None = None,
    group_by: Sequence[str] = (),
    include_marked: bool = False,
    delta_to: str | None = None,
    all_rows: bool = False,
    ci: Path | None = None,
    heading: str = "Table 2 layout",
    baseline: Sequence[str] = (),
    keep: set[str] | None = None,
) -> TableData:
    """Table 2's layout: the dataset rows that hold a measured cell (`all_rows`: Table 2's seven
    rows whether measured or not, for the paper columns alone), any other measured dataset, the cost
    rows, measured columns, then the `compare` paper columns. `ci`: the results folder whose kept
    predictions give each cell an interval and mark significant differences (views/statistics/significance.py).
    `keep`: only these runs are shown, labelled as among all of `df` (views/measured/columns.measured_columns).
    `heading`: what the title names first (the report: the protocol's section)."""
    delta_to = resolve_delta_to(compare, delta_to)
    m = measured_columns(df, protocol, shots, group_by, keep)
    acc = pd.concat([m.acc, vtab_rollups(m.acc)], ignore_index=True) if not m.acc.empty else m.acc
    matches = match(compare, acc, paper_comparable())
    values = {name: as_values(matches, name) for name in compare}
    data = TableData(title=f"{heading}: top-1 accuracy (%)")
    measured_datasets = set(m.acc["dataset"]) if not m.acc.empty else set()
    vtab_tasks = {d for d in measured_datasets if d.startswith("vtab/")}
    extra = sorted(d for d in measured_datasets if d not in TABLE2_ROWS and not d.startswith("vtab/"))
    measured_rows = [d for d in TABLE2_ROWS if d in measured_datasets or (d == "vtab" and vtab_tasks)]
    # nothing measured: the paper's columns alone, in their full layout
    datasets = list(TABLE2_ROWS) if all_rows or m.runs.empty else measured_rows
    if not m.runs.empty or compare:
        datasets += extra
    else:
        datasets = []
    row_of = {d: title(d) for d in datasets}
    for row in row_of.values():
        data.add_row(row)
    meta = measured_cells(data, m, row_of, include_marked)
    if not m.runs.empty:
        _cost_row(data, m, set(datasets))
    paper_columns(data, compare, row_of, values)
    shown = add_deltas(data, meta, delta_to, row_of, include_marked, matches)
    if ci is not None:
        add_significance(data, m.acc, row_of, ci, baseline)
    _vtab_partial_footnote(data, m)
    _common_footnotes(data, m, compare, delta_to, shown)
    for name in compare:
        data.footnotes.append(f"{name} (paper): {paper.column(name)['source'].iloc[0]}")
    data.footnotes += matches.footnotes({d: title(d) for d in row_of})
    marker_footnotes(data, include_marked, bool(compare), m.runs)
    provenance_footnotes(data, m)
    say_once(data, m)
    return data


def say_rows_left_out(data: TableData) -> None:
    """For `vitbench table`: the Table 2 rows only paper columns would fill, named in a footnote."""
    hidden = [title(d) for d in TABLE2_ROWS if title(d) not in data.rows]
    if hidden and any(c.endswith("(paper)") for c in data.columns):
        data.footnotes.append(f"rows with paper cells only not shown: {', '.join(hidden)} (--all-rows shows them)")


def _vtab_partial_footnote(data: TableData, m: Measured) -> None:
    if m.acc.empty:
        return
    tasks = m.acc[m.acc["dataset"].str.startswith("vtab/")]
    for col, part in tasks.groupby("column", sort=False):
        have = part["dataset"].nunique()
        if have < len(TASKS):
            data.footnotes.append(
                f"VTAB (19 tasks) for [{col}]: {have} of {len(TASKS)} tasks stored; the mean needs all 19 "
                "(--table 9 shows each task)"
            )


def table9_view(
    df: pd.DataFrame,
    compare: Sequence[str] = (),
    protocol: str | None = None,
    group_by: Sequence[str] = (),
    include_marked: bool = False,
    delta_to: str | None = None,
) -> TableData:
    """Table 9: the 19 VTAB-1k tasks, the three group means and the mean; paper columns from Table 9
    (all three when `compare` is empty), their group means computed from the tasks as in Table 2."""
    t9 = paper.table("9")
    names = list(compare) or list(dict.fromkeys(t9["column"]))
    unknown = [n for n in names if n not in set(t9["column"])]
    if unknown:
        raise UserError(f"--compare {unknown[0]}: Table 9 has {', '.join(dict.fromkeys(t9['column']))}")
    delta_to = resolve_delta_to(names, delta_to)
    m = measured_columns(df[df["dataset"].str.startswith("vtab/")] if not df.empty else df, protocol, None, group_by)
    data = TableData(title="Table 9: VTAB-1k per task, top-1 accuracy (%)")
    row_of: dict[str, str] = {}
    for group in GROUPS:
        for t in TASKS:
            if t.group == group:
                row_of[f"vtab/{t.key}"] = f"{t.title} ({group})"
    for group in GROUPS:
        row_of[f"vtab_{group}"] = f"{group.capitalize()} mean ({sum(t.group == group for t in TASKS)} tasks)"
    row_of["vtab"] = "Mean (19 tasks)"
    for row in row_of.values():
        data.add_row(row)
    meta = measured_cells(data, m, row_of, include_marked)
    values = {}
    for name in names:
        tasks = t9[(t9["column"] == name) & (t9["task"] != "vtab")]
        task_values = {k[len("vtab/") :]: v for k, v in zip(tasks["task"], tasks["value"], strict=True)}
        rows = [(task, value) for task, value in zip(tasks["task"], tasks["value"], strict=True)]
        rows += [(k if k == "vtab" else f"vtab_{k}", v) for k, v in group_means(task_values).items()]
        values[name] = pd.DataFrame(rows, columns=["dataset", "value"]).assign(std=float("nan"))
    paper_columns(data, names, row_of, values, cost=False)
    shown = add_deltas(data, meta, delta_to, row_of, include_marked)
    _common_footnotes(data, m, names, delta_to, shown)
    data.footnotes.append(
        "paper columns: ViT paper Table 9 (one decimal per task); group means and the mean computed from its tasks"
    )
    marker_footnotes(data, include_marked, True, m.runs)
    provenance_footnotes(data, m)
    return data


def table5_view(df: pd.DataFrame, protocol: str | None = None, include_marked: bool = False) -> TableData:
    """Table 5: rows by pre-training dataset × transfer dataset, one column per model. Measured
    weights form blocks of their own under their model's column (Table 5 cannot know what your
    weights were pre-trained on, so no Δ here: use `--compare vit-b/16-i21k` in the default view)."""
    t5 = paper.table("5")
    data = TableData(title="Table 5: top-1 accuracy (%) by pre-training dataset (paper: 384 px, no Polyak)")
    for model in dict.fromkeys(t5["model"]):
        data.add_column(str(model), is_paper=False)
    for pretrain, block in t5.groupby("pretrain", sort=False):
        for dataset in TABLE5_ROWS:
            row = f"{pretrain} · {TITLES[dataset]}"
            data.add_row(row)
            for r in block[block["dataset"] == dataset].itertuples():
                data.cells[(row, str(r.model))] = Cell(mean=float(r.value), is_paper=True, rankable=True)
    m = measured_columns(df, protocol)
    if not m.acc.empty:
        m.acc["block"] = m.acc.apply(
            lambda r: (
                weights_label(r["model"], r["weights"], r["weights_sha256"], bool(r["random_init"]))
                .split(" (", 1)[1]
                .rstrip(")")
            ),
            axis=1,
        )
        acc = m.acc[m.acc["dataset"].isin(TABLE5_ROWS)]
        meta = meta_by_column(m.runs)
        for (block, col, model, dataset), part in acc.groupby(["block", "column", "model", "dataset"], sort=False):
            column_meta = meta[str(col)]
            marks = (RANDOM_MARK if column_meta["random"] else "") + (SMOKE_MARK if column_meta["smoke"] else "")
            suffix = str(col).split(" · ", 1)[1] if " · " in str(col) else ""
            row = f"measured: {block}{(' · ' + suffix) if suffix else ''}{marks} · {TITLES[str(dataset)]}"
            data.add_row(row)
            data.add_column(str(model))
            data.cells[(row, str(model))] = seed_cell(part, column_meta, include_marked)
    data.footnotes.append("paper cells: ViT paper Table 5 (fine-tuned at 384 px, no Polyak averaging)")
    if not m.acc.empty:
        data.footnotes.append("measured cells: top-1 accuracy (%), mean ± std over seeds (n runs); no Δ in this view")
    marker_footnotes(data, include_marked, False, m.runs)
    provenance_footnotes(data, m)
    return data


def table6_view(df: pd.DataFrame, protocol: str | None = None, include_marked: bool = False) -> TableData:
    """Table 6: one row per model (the paper's, then each measured column), one column per dataset,
    with the paper's pre-training exaFLOPs and vitbench's measured exaFLOPs as separate columns."""
    t6 = paper.table("6")
    data = TableData(title="Table 6: model scaling, top-1 accuracy (%) and compute")
    cols = {d: TITLES[d] for d in TABLE6_ROWS}
    paper_flops, our_flops = "paper pre-training exaFLOPs", "vitbench exaFLOPs (this evaluation)"
    for heading in [*cols.values(), paper_flops, our_flops]:
        data.add_column(heading)
    for _, part in t6.groupby("column", sort=False):
        first = part.iloc[0]
        row = f"{first['model']} · {int(first['epochs'])} ep (paper)"
        data.add_row(row)
        for r in part.itertuples():
            data.cells[(row, cols[str(r.dataset)])] = Cell(mean=float(r.value), is_paper=True, rankable=True)
        data.cells[(row, paper_flops)] = Cell(
            mean=float(first["pretrain_exaflops"]), text=f"{float(first['pretrain_exaflops']):g}", is_paper=True
        )
    m = measured_columns(df, protocol)
    if not m.runs.empty:
        meta = meta_by_column(m.runs)
        for col, part in m.acc.groupby("column", sort=False):
            data.add_row(str(col))
            for dataset, values in part.groupby("dataset"):
                if dataset in cols:
                    data.cells[(str(col), cols[str(dataset)])] = seed_cell(values, meta[str(col)], include_marked)
        for col, part in m.runs.groupby("column", sort=False):
            flops = pd.to_numeric(part["flops"], errors="coerce")
            if flops.notna().any() and str(col) in data.rows:
                exa = float(flops.sum()) / 1e18
                data.cells[(str(col), our_flops)] = Cell(mean=exa, text=f"{exa:.2g}")
    data.footnotes.append(
        "paper rows: ViT paper Table 6 (JFT-300M pre-training); exaFLOPs there are pre-training compute, "
        "vitbench's are the compute of the evaluation itself (not comparable units of work)"
    )
    if not m.runs.empty:
        data.footnotes.append("measured cells: top-1 accuracy (%), mean ± std over seeds (n runs)")
    marker_footnotes(data, include_marked, False, m.runs)
    provenance_footnotes(data, m)
    return data

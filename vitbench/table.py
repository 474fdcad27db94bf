"""Table 2-style comparisons: measured columns (mean ± std over seeds, with n) beside paper columns.

Rows are (dataset, protocol, shots); one column per measured (model, weights); `--compare`
adds the paper's columns. Random-init and subset-data columns carry a marker and a footnote.
"""

from __future__ import annotations

import io
import json
import math
from dataclasses import dataclass, field

import pandas as pd

from vitbench import paper
from vitbench.datasets import DATASETS
from vitbench.datasets.vtab import GROUPS, TASKS, group_means

VTAB_ROWS = ["vtab", *(f"vtab_{g}" for g in GROUPS)]  # the 19-task mean, then the group means
ROW_ORDER = [
    "imagenet",
    "imagenet_real",
    "cifar10",
    "cifar100",
    "pets",
    "flowers102",
    *VTAB_ROWS,
    *(f"vtab/{t.key}" for t in TASKS),
    "digits",
]
TITLES = {
    **{k: v.title for k, v in DATASETS.items()},
    "imagenet_real": "ImageNet ReaL",
    "vtab": "VTAB (19 tasks)",
    **{f"vtab_{g}": f"VTAB {g} ({sum(t.group == g for t in TASKS)} tasks)" for g in GROUPS},
}
RANDOM_MARK, SUBSET_MARK, SMOKE_MARK = "†", "‡", "§"


@dataclass
class TableData:
    rows: list[str] = field(default_factory=list)
    columns: list[str] = field(default_factory=list)
    cells: dict[tuple[str, str], str] = field(default_factory=dict)
    numbers: list[dict] = field(default_factory=list)  # the same cells, machine-readable (CSV)
    footnotes: list[str] = field(default_factory=list)


def select_sweep_l2(df: pd.DataFrame) -> tuple[pd.DataFrame, dict[int, float]]:
    """For runs made with `--fewshot-l2 sweep`: one λ per shot count, chosen as the ViT-era code did —
    rank every λ on each dataset (mean over seeds), average the ranks over datasets, take the best."""
    sweep = df[df["metric"].str.startswith("accuracy@l2=")].copy()
    if sweep.empty:
        return df, {}
    sweep["l2"] = sweep["metric"].str.split("=").str[1].astype(float)
    chosen: dict[int, float] = {}
    for shots, part in sweep.groupby("shots"):
        means = part.groupby(["dataset", "l2"])["value"].mean().unstack("l2")  # (dataset, λ)
        ranks = means.rank(axis=1).mean(axis=0)
        chosen[int(shots)] = float(ranks.idxmax())
    picked = sweep[sweep["l2"] == sweep["shots"].astype(int).map(chosen)].copy()
    picked["metric"] = "accuracy"
    rest = df[~df["metric"].str.startswith("accuracy@l2=")]
    return pd.concat([rest, picked.drop(columns="l2")], ignore_index=True), chosen


def _column_label(run: pd.Series) -> str:
    weights = (
        "random init"
        if run["random_init"]
        else f"{str(run['weights']).rsplit('/', 1)[-1]} [{run['weights_sha256'][:8]}]"
    )
    marks = (RANDOM_MARK if run["random_init"] else "") + (SUBSET_MARK if run["data_subset"] else "")
    marks += SMOKE_MARK if _is_smoke(run) else ""
    return f"{run['model']} ({weights}){marks}"


def _is_smoke(run: pd.Series) -> bool:
    hparams = run.get("hparams")
    return bool((json.loads(hparams) if isinstance(hparams, str) else hparams or {}).get("smoke"))


def _row_label(dataset: str, protocol: str, shots) -> str:
    title = TITLES.get(dataset, dataset)
    if protocol == "fewshot" and shots is not None and not (isinstance(shots, float) and math.isnan(shots)):
        return f"{title} · {int(shots)}-shot"
    return f"{title} · {protocol}"


def _cell(values: pd.Series, scale: float = 100.0) -> str:
    mean = values.mean() * scale
    if len(values) < 2:
        return f"{mean:.2f} (n=1)"
    return f"{mean:.2f} ± {values.std(ddof=1) * scale:.2f} (n={len(values)})"


def _real_as_rows(df: pd.DataFrame) -> pd.DataFrame:
    """ImageNet ReaL is a row of its own in Table 2: the `accuracy_real` metric of an ImageNet run."""
    real = df[df["metric"] == "accuracy_real"].copy()
    real["dataset"], real["metric"] = "imagenet_real", "accuracy"
    return real


def _vtab_rollups(acc: pd.DataFrame) -> pd.DataFrame:
    """The VTAB mean and the group means as rows, per (column, protocol, shots, seed), computed only
    where every task of the group has a result (unweighted, as in the paper)."""
    tasks = acc[acc["dataset"].str.startswith("vtab/")]
    rows = []
    for _, part in tasks.groupby(["column", "protocol", "shots", "seed"], dropna=False, sort=False):
        means = group_means(dict(zip(part["dataset"].str[len("vtab/") :], part["value"], strict=True)))
        for name, value in means.items():
            row = part.iloc[0].copy()
            row["dataset"] = name if name == "vtab" else f"vtab_{name}"
            row["value"], row["run_key"] = value, None  # a mean of runs, not a run: no cost of its own
            rows.append(row)
    return pd.DataFrame(rows) if rows else acc.iloc[0:0]


def build(df: pd.DataFrame, compare: list[str] | tuple[str, ...] = (), shots: int | None = None) -> TableData:
    data = TableData()
    df, chosen = select_sweep_l2(df)
    smoke_left_out = 0
    if compare and not df.empty:  # --smoke runs check a pipeline: never set beside the paper's numbers
        smoke = df.apply(_is_smoke, axis=1).astype(bool)
        smoke_left_out = df.loc[smoke, "run_key"].nunique()
        df = df[~smoke]
    acc = pd.concat([df[df["metric"] == "accuracy"], _real_as_rows(df)], ignore_index=True)
    if shots is not None:
        acc = acc[acc["shots"] == shots]
    if not acc.empty:
        acc["column"] = acc.apply(_column_label, axis=1)
        acc = pd.concat([acc, _vtab_rollups(acc)], ignore_index=True)
        acc["order"] = acc["dataset"].map(lambda d: ROW_ORDER.index(d) if d in ROW_ORDER else len(ROW_ORDER))
        acc = acc.sort_values(["order", "dataset", "protocol", "shots"])
        acc["row"] = [
            _row_label(d, p, s) for d, p, s in zip(acc["dataset"], acc["protocol"], acc["shots"], strict=True)
        ]
        data.columns = list(dict.fromkeys(acc["column"]))
        data.rows = list(dict.fromkeys(acc["row"]))
        for (row, col), cell in acc.groupby(["row", "column"], sort=False):
            data.cells[(row, col)] = _cell(cell["value"])
            data.numbers.append(
                {
                    "row": row,
                    "column": col,
                    "mean": cell["value"].mean() * 100,
                    "std": cell["value"].std(ddof=1) * 100 if len(cell) > 1 else None,
                    "n": len(cell),
                }
            )
        # the cost of the measurement itself, not the paper's pre-training cost (a separate row)
        cost_row = "vitbench accelerator-days (this evaluation)"
        # every run behind a column counts, the fine-tuning LR sweep's included
        runs = df.drop_duplicates("run_key").copy()
        runs["column"] = runs.apply(_column_label, axis=1)
        runs = runs[runs["column"].isin(data.columns) & runs["dataset"].isin(set(acc["dataset"]))]
        for col, part in runs.groupby("column", sort=False):
            days = part["device_seconds"].sum() / 86400
            data.cells[(cost_row, col)] = f"{days:.2g}"
            data.numbers.append({"row": cost_row, "column": col, "mean": days, "std": None, "n": len(part)})
        data.rows.append(cost_row)
        row_dataset = dict(zip(acc["row"], acc["dataset"], strict=True))
    else:
        row_dataset = {}

    for name in compare:
        paper_rows = paper.column(name)
        col = f"{name} (paper)"
        data.columns.append(col)
        by_dataset = {r.dataset: r for r in paper_rows.itertuples()}
        if not row_dataset:  # nothing measured: show the paper column on its own rows
            for r in paper_rows.itertuples():
                label = TITLES.get(r.dataset, r.dataset)
                if r.dataset == "tpuv3_core_days":
                    continue
                row_dataset.setdefault(label, r.dataset)
                if label not in data.rows:
                    data.rows.append(label)
        for row, dataset in row_dataset.items():
            if dataset in by_dataset:
                r = by_dataset[dataset]
                has_std = isinstance(r.std, float) and not math.isnan(r.std)
                data.cells[(row, col)] = f"{r.value:.2f}" + (f" ± {r.std:.2f}" if has_std else "")
                data.numbers.append(
                    {"row": row, "column": col, "mean": r.value, "std": r.std if has_std else None, "n": None}
                )
        if "tpuv3_core_days" in by_dataset:
            row = "paper TPUv3-core-days (pre-training)"
            if row not in data.rows:
                data.rows.append(row)
            value = by_dataset["tpuv3_core_days"].value
            data.cells[(row, col)] = f"{value / 1000:.2g}k"
            data.numbers.append({"row": row, "column": col, "mean": value, "std": None, "n": None})
        fewshot_measured = not acc.empty and (acc["protocol"] == "fewshot").any()
        kind = "fine-tuned, not few-shot" if fewshot_measured else "fine-tuned"
        data.footnotes.append(f"{name} (paper): {paper_rows['source'].iloc[0]}; {kind}")

    if any(RANDOM_MARK in c for c in data.columns):
        data.footnotes.append(f"{RANDOM_MARK} random-init weights: a pipeline check, not a pretrained backbone")
    if any(SUBSET_MARK in c for c in data.columns):
        data.footnotes.append(
            f"{SUBSET_MARK} measured on a subset of the official splits: not comparable with the paper"
        )
    if any(SMOKE_MARK in c for c in data.columns):
        data.footnotes.append(
            f"{SMOKE_MARK} --smoke: a few steps at a small resolution, a pipeline check, not a result"
        )
    if smoke_left_out:
        data.footnotes.append(
            f"{smoke_left_out} --smoke run(s) left out: smoke results are never compared with the paper's numbers"
        )
    for k, l2 in sorted(chosen.items()):
        data.footnotes.append(f"{k}-shot: λ = {l2:g} chosen by mean rank across datasets (--fewshot-l2 sweep)")
    if any(not c.endswith("(paper)") for c in data.columns):
        data.footnotes.append("measured cells: top-1 accuracy (%), mean ± std over seeds (n runs)")
    return data


def attention_view(df: pd.DataFrame, only: str | None = None) -> TableData:
    """Mean attention distance per layer: one column per inspected (model, weights, resolution, images),
    each cell the range over heads and their mean, in pixels (Fig. 7 right, as numbers)."""
    data = TableData()
    if only is not None:
        df = df[df["inspect_key"] == only]
    if df.empty:
        return data
    for _key, part in df.groupby("inspect_key", sort=False):
        first = part.iloc[0]
        weights = "random init" if first["random_init"] else f"{str(first['weights']).rsplit('/', 1)[-1]}"
        col = f"{first['model']} ({weights}) @{first['res']}px, {first['n_images']} images"
        data.columns.append(col)
        for layer, heads in part.groupby("layer"):
            row = f"layer {int(layer)}"
            if row not in data.rows:
                data.rows.append(row)
            lo, hi, mean = heads["distance_px"].min(), heads["distance_px"].max(), heads["distance_px"].mean()
            data.cells[(row, col)] = f"{lo:.0f}–{hi:.0f} (mean {mean:.0f})"
            data.numbers.append(
                {"row": row, "column": col, "mean": mean, "std": heads["distance_px"].std(ddof=0), "n": len(heads)}
            )
    data.rows.sort(key=lambda r: int(r.split()[1]))
    data.footnotes.append("mean attention distance in pixels: min–max over heads (mean over heads)")
    return data


def to_markdown(t: TableData) -> str:
    lines = ["| | " + " | ".join(t.columns) + " |", "|---" * (len(t.columns) + 1) + "|"]
    lines += ["| " + r + " | " + " | ".join(t.cells.get((r, c), "") for c in t.columns) + " |" for r in t.rows]
    return "\n".join(lines + [""] + [f"- {n}" for n in t.footnotes]) + "\n"


def _latex_escape(s: str) -> str:
    return (
        s.replace("\\", r"\textbackslash{}")
        .replace("_", r"\_")
        .replace("%", r"\%")
        .replace("&", r"\&")
        .replace("#", r"\#")
        .replace("±", r"$\pm$")
        .replace("†", r"$^\dagger$")
        .replace("‡", r"$^\ddagger$")
        .replace("·", r"$\cdot$")
        .replace("λ", r"$\lambda$")
    )


def to_latex(t: TableData) -> str:
    out = [
        r"\begin{tabular}{l" + "c" * len(t.columns) + "}",
        r"\toprule",
        " & " + " & ".join(_latex_escape(c) for c in t.columns) + r" \\",
        r"\midrule",
    ]
    out += [
        _latex_escape(r) + " & " + " & ".join(_latex_escape(t.cells.get((r, c), "")) for c in t.columns) + r" \\"
        for r in t.rows
    ]
    out += [r"\bottomrule", r"\end{tabular}"] + [f"% {_latex_escape(n)}" for n in t.footnotes]
    return "\n".join(out) + "\n"


def to_csv(t: TableData) -> str:
    buf = io.StringIO()
    pd.DataFrame(t.numbers, columns=["row", "column", "mean", "std", "n"]).to_csv(buf, index=False)
    return buf.getvalue()


def to_rich(t: TableData):
    from rich.table import Table
    from rich.text import Text  # Text, not markup: labels hold "[sha]" brackets

    table = Table(
        show_lines=False, caption=Text("\n".join(t.footnotes)) if t.footnotes else None, caption_justify="left"
    )
    table.add_column("")
    for c in t.columns:
        table.add_column(Text(c), justify="right", style="cyan" if c.endswith("(paper)") else None)
    for r in t.rows:
        table.add_row(Text(r), *[Text(t.cells.get((r, c), "")) for c in t.columns])
    return table

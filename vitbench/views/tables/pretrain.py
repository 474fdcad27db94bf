"""`vitbench table --view pretrain`: each pre-training run beside the few-shot accuracy of its
weights and of random init (the runs linked by measured/pretraining_runs.py)."""

from __future__ import annotations

import pandas as pd

from vitbench.reference import paper
from vitbench.views.cells import SMOKE_MARK, Cell, TableData
from vitbench.views.measured.dataset_titles import title
from vitbench.views.measured.pretraining_runs import BASELINE, link


def pretrain_view(df: pd.DataFrame) -> TableData:
    """One row per pre-training run, below a random-init row per model: the run's key, settings, best
    dev accuracy and compute, then its few-shot accuracy on each transfer dataset. What every row
    or column shares (one model, one transfer dataset) is said once, in the title."""
    linked = link(df)
    runs, transfer = linked.runs, linked.transfer
    models, sources = runs["model"].unique(), runs["dataset"].unique()
    targets = transfer[["dataset", "shots"]].drop_duplicates().sort_values(["dataset", "shots"])
    one_target = targets["dataset"].nunique() == 1
    heading = "Pre-training and what it buys: linear few-shot top-1 accuracy (%)"
    if len(models) == 1:
        heading += f" · {models[0]}"
    if one_target:
        heading += f" · on {title(targets['dataset'].iloc[0])}"
    data = TableData(title=heading)
    fixed = ("run key", "images", "steps", "dev acc.", "exaFLOPs")
    for name in (*fixed, *(f"{'' if one_target else title(d) + ' · '}{int(k)}-shot" for d, k in targets.values)):
        data.add_column(name)
    columns = dict(zip(map(tuple, targets.values), data.columns[len(fixed) :], strict=True))
    shown = {}  # link's row key -> the label shown
    for _, run in runs.iterrows():
        parts = [run["model"]] if len(models) > 1 else []
        parts += [f"{run['dataset']} n={run['images']:,}" if len(sources) > 1 else f"n={run['images']:,}"]
        parts += [run["objective"]] + ([f"pos {run['pos_embed']}"] if run["pos_embed"] != "1-d" else [])
        shown[run["row"]] = ", ".join(parts) + (SMOKE_MARK if run["smoke"] else "")
    for row in dict.fromkeys(transfer["row"]):
        if row.endswith(BASELINE):
            shown[row] = row if len(models) > 1 else BASELINE
            data.add_row(shown[row])
    for _, run in runs.iterrows():
        row = shown[run["row"]]
        data.add_row(row)
        values = (run["run_key"][:8], f"{run['images']:,}", f"{run['steps']:,}", f"{run['val_accuracy'] * 100:.2f}",
                  f"{run['exaflops']:.3g}")  # fmt: skip
        for name, text in zip(fixed, values, strict=True):
            data.cells[(row, name)] = Cell(text=text)
    for (row, dataset, shots), part in transfer.groupby(["row", "dataset", "shots"], sort=False):
        v = part["value"].to_numpy(dtype=float) * 100
        std = float(v.std(ddof=1)) if len(v) > 1 else None
        data.cells[(shown[row], columns[(dataset, shots)])] = Cell(float(v.mean()), std, len(v))
    counts = {c.n for c in data.cells.values() if c.n is not None}
    if len(counts) == 1:  # the same number of seeds everywhere: said once
        data.uniform_n = counts.pop()
        data.footnotes.append(f"few-shot cells: mean ± std over {data.uniform_n} seeds each")
    _footnotes(data, runs, sources)
    return data


def _footnotes(data: TableData, runs: pd.DataFrame, sources) -> None:
    data.footnotes.append(
        f"rows: vitbench's own pre-training from random init on {', '.join(sources)} (n: the images it learned from); "
        "run key: for --weights run:<key>; dev acc.: the kept weights' score on the dev split held out of train "
        "(the best of the run; MPP: the last step's, of the masked patches' targets); "
        "exaFLOPs: the run's training and validation FLOPs, counted"
    )
    data.footnotes.append(
        f"{BASELINE}: the same architecture and resolution, never trained: what the features give without pre-training"
    )
    if (runs["pos_embed"] != "1-d").any():  # Table 8's ablation, for reference
        t8 = paper.table("8")
        stem = t8[t8["placement"] == "stem"]
        said = ", ".join(f"{v} {x * 100:.2f}" for v, x in zip(stem["pos_embed"], stem["value"], strict=True))
        data.footnotes.append(f"paper Table 8 (ViT-B/16 on JFT-300M, ImageNet linear 5-shot, at the stem): {said}")
    if runs["smoke"].any():
        data.footnotes.append(
            f"{SMOKE_MARK} --smoke: a few steps at a small resolution: a pipeline check, not a result"
        )

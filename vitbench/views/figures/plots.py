"""`vitbench plot`: the paper's comparison figures from the store, as PNG and SVG (matplotlib, Agg).

- `vtab`    Figure 2 style: VTAB-1k group means per model, measured beside the paper's (Table 9).
- `cost`    Figure 5 style: transfer accuracy against compute (log axis), with the paper's Table 6
            (exaFLOPs) or Table 2 (TPUv3-core-days) points.
- NAME    any protocol whose runs vary along an axis (`fewshot`: shots; `knn`: k; a plugin's):
            its accuracy against that axis, a line per backbone, dataset and setting (axis_plot.py).
- `curves`  a fine-tuning run's training loss and learning rate per step.

Each figure carries a caption (also returned, for the terminal) saying what it shows and from
which runs; its layout (axes of one size, the legend under them) is figure_kit.py's.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from vitbench.datasets.vtab import GROUPS, TASKS, group_means
from vitbench.errors import UserError
from vitbench.protocols.registry import with_metric
from vitbench.reference import paper
from vitbench.store.query import json_field, written_weights_sha
from vitbench.views import cells
from vitbench.views.figures.axis_plot import axis_figure
from vitbench.views.figures.figure_kit import FILE, PAGE, Figure, Look, legend, new_figure, pyplot, runs_text, save
from vitbench.views.measured import columns

# the kit, as the figure modules beside this one have always imported it from here
__all__ = ["FILE", "PAGE", "Figure", "Look", "axis_figure", "legend", "new_figure", "pyplot", "runs_text", "save"]

AVERAGE5 = ("imagenet", "cifar10", "cifar100", "pets", "flowers102")  # Figure 5's "Average-5"
COSTS = ("flops", "days")


def _seed_stats(values: pd.Series) -> tuple[float, float]:
    v = values.to_numpy(dtype=float) * 100
    return float(v.mean()), float(v.std(ddof=1)) if len(v) > 1 else 0.0


def vtab_figure(
    df: pd.DataFrame, out_dir: Path, formats: tuple[str, ...], protocol: str | None, look: Look = FILE
) -> Figure:
    """Figure 2: bars of the natural / specialized / structured means and the VTAB mean."""
    labels = ["VTAB (19 tasks)", *(g.capitalize() for g in GROUPS)]
    keys = ["vtab", *GROUPS]
    bars: list[tuple[str, list[float], list[float], bool]] = []  # (name, means, stds, paper)
    t9 = paper.table("9")
    for name, part in t9[t9["task"] != "vtab"].groupby("column", sort=False):
        paper_means = group_means({k[len("vtab/") :]: v for k, v in zip(part["task"], part["value"], strict=True)})
        bars.append((f"{name} (paper)", [paper_means.get(k, np.nan) for k in keys], [0.0] * 4, True))
    bit = paper.column("bit-l").set_index("dataset")
    bars.append(
        ("bit-l (paper, mean only)", [float(bit.loc["vtab", "value"]), np.nan, np.nan, np.nan], [0.0] * 4, True)
    )

    m = columns.measured_columns(df[df["dataset"].str.startswith("vtab/")] if not df.empty else df, protocol)
    used, incomplete = [], []
    rollups = columns.vtab_rollups(m.acc) if not m.acc.empty else m.acc  # per (column, seed), complete groups only
    for col, part in m.acc.groupby("column", sort=False):
        means = rollups[rollups["column"] == col] if not rollups.empty else rollups
        if means.empty:
            incomplete.append(f"{col} ({part['dataset'].nunique()}/{len(TASKS)} tasks)")
            continue
        rows = ["vtab", *(f"vtab_{g}" for g in GROUPS)]
        stats = [_seed_stats(means.loc[means["dataset"] == r, "value"]) if (means["dataset"] == r).any()
                 else (np.nan, 0.0) for r in rows]  # fmt: skip
        used += list(part["run_key"])
        bars.append((str(col), [s[0] for s in stats], [s[1] for s in stats], False))
    if not used:  # the paper's bars alone are the paper's figure, not a measurement
        left = f" ({'; '.join(incomplete)})" if incomplete else ""
        raise UserError(f"no complete VTAB-1k group is stored{left}; run `vitbench run --suite vtab`")

    fig, ax = new_figure(look)
    width = 0.8 / len(bars)
    x = np.arange(len(keys))
    for i, (name, heights, stds, is_paper) in enumerate(bars):
        ax.bar(x + (i - len(bars) / 2 + 0.5) * width, heights, width, yerr=None if is_paper else stds, label=name,
               hatch="" if is_paper else "//", alpha=0.6 if is_paper else 0.95, capsize=2)  # fmt: skip
    ax.set_xticks(x, labels)
    ax.set_ylabel("top-1 accuracy (%)")
    ax.set_title("VTAB-1k: group means (Figure 2 style)")
    legend(ax, look)
    caption = (
        "Measured bars (hatched): mean ± std over seeds of the unweighted task means of each complete VTAB-1k group, "
        f"from {runs_text(used)}. Paper bars: group means computed from ViT paper Table 9; BiT-L from Table 2 "
        "(its groups are not tabulated). A group is drawn only when all of its tasks are stored."
    )
    if incomplete:
        caption += " Left out, incomplete: " + "; ".join(incomplete) + "."
    return Figure("vtab", caption, save(fig, caption, out_dir, "vtab", formats, look))


def pretraining_costs(df: pd.DataFrame) -> dict[str, tuple[float, float | None]]:
    """sha256 of the weights a vitbench pre-training run wrote -> (the exaFLOPs it counted, its
    accelerator-days): the pre-training cost of transfer runs that used those weights."""
    # the runs whose numbers are not transfer results (pre-training) and that wrote weights
    pre = df[df["protocol"].isin(with_metric(lambda m: not m.transfer))].drop_duplicates("run_key")
    costs = {}
    for _, run in pre.iterrows():
        sha = written_weights_sha(run["notes"])
        if sha:
            days = columns.accelerator_days(pre[pre["run_key"] == run["run_key"]])
            costs[sha] = (float(run["flops"]) / 1e18, days)
    return costs


def _paper_cost_points(ax, cost: str) -> str:
    """The paper's points of Figure 5 on `ax` (Table 6's exaFLOPs, or Table 2's TPUv3-core-days); the x label."""
    if cost == "flops":
        t6 = paper.table("6")
        families = {"ViT": "o", "ResNet": "s", "R50x1+ViT": "^"}
        for family, marker in families.items():
            points = []
            for _, part in t6.groupby("column", sort=False):
                model = str(part["model"].iloc[0])
                kind = "R50x1+ViT" if model.startswith("R50x1+") else ("ViT" if model.startswith("ViT") else "ResNet")
                values = part.set_index("dataset")["value"]
                if kind == family and all(d in values for d in AVERAGE5):
                    points.append((float(part["pretrain_exaflops"].iloc[0]), float(values[list(AVERAGE5)].mean())))
            if points:
                xs, ys = zip(*points, strict=True)
                ax.scatter(xs, ys, marker=marker, alpha=0.5, label=f"paper {family} (Table 6, pre-training exaFLOPs)")
        xlabel = "exaFLOPs (log)"
    else:
        t2 = paper.table("2")
        for name, part in t2.groupby("column", sort=False):
            values = part.set_index("dataset")["value"]
            if "tpuv3_core_days" in values and all(d in values for d in AVERAGE5):
                ax.scatter(
                    [float(values["tpuv3_core_days"])], [float(values[list(AVERAGE5)].mean())], alpha=0.5,
                    label=f"{name} (paper, pre-training TPUv3-core-days)",
                )  # fmt: skip
        xlabel = "accelerator-days (log)"
    return xlabel


def cost_figure(
    df: pd.DataFrame, out_dir: Path, formats: tuple[str, ...], protocol: str | None, cost: str = "flops"
) -> Figure:
    """Figure 5: average transfer accuracy against pre-training compute, log x axis. A measured point
    needs weights pre-trained here (their cost was counted); the evaluation's own cost is another
    quantity and is never drawn on this axis."""
    if cost not in COSTS:
        raise UserError(f"--cost {cost}: expected flops or days")
    fig, ax = new_figure()
    xlabel = _paper_cost_points(ax, cost)

    m = columns.measured_columns(df, protocol)
    pretrained_here = pretraining_costs(df)
    used, left_out = [], []
    for col, part in m.acc.groupby("column", sort=False):
        part = part[part["dataset"].isin(AVERAGE5)]
        runs = m.runs[m.runs["column"] == col]
        if part.empty:
            left_out.append(f"{col} (none of the Average-5 datasets)")
            continue
        shas = set(runs["weights_sha256"].astype(str))
        if runs["random_init"].any() or not shas <= set(pretrained_here):
            why = "random init" if runs["random_init"].any() else "pre-trained elsewhere: its cost is not known here"
            left_out.append(f"{col} ({why})")
            continue
        x = sum(pretrained_here[sha][0 if cost == "flops" else 1] or 0.0 for sha in shas)
        if not x > 0:
            left_out.append(f"{col} (no recorded pre-training cost)")
            continue
        accuracy = float(part.groupby("dataset")["value"].mean().mean() * 100)
        used += list(runs["run_key"])
        datasets = ",".join(sorted(set(part["dataset"])))
        subset = cells.SUBSET_MARK if part["data_subset"].any() else ""
        ax.scatter([x], [accuracy], marker="*", s=160, label=f"{col}{subset} [{datasets}] (vitbench, pre-trained here)")
    if not used:
        pyplot().close(fig)
        if not pretrained_here:
            raise UserError(
                "no transfer run of weights pre-trained here is stored (Figure 5's x is pre-training cost); "
                "run `vitbench run --protocol pretrain`"
            )
        ran_on = sorted(set(m.acc.loc[m.acc["weights_sha256"].isin(set(pretrained_here)), "dataset"]))
        raise UserError(
            "weights pre-trained here are stored, but no transfer run of them on an Average-5 dataset "
            f"({', '.join(AVERAGE5)}), Figure 5's y: their transfer ran on {', '.join(ran_on) or 'nothing yet'}"
        )
    ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("mean top-1 accuracy over Average-5 datasets (%)")
    ax.set_title("Transfer accuracy against compute (Figure 5 style)")
    legend(ax)
    what = "exaFLOPs" if cost == "flops" else "accelerator-days"
    caption = (
        f"y: mean top-1 over the Average-5 datasets ({', '.join(AVERAGE5)}); a measured point averages the ones it has "
        f"(listed in brackets). x: pre-training {what}: the paper's, and for vitbench's stars the cost vitbench "
        f"counted for pre-training their weights here (only such weights are drawn). Measured: {runs_text(used)}."
    )
    if left_out:
        caption += " Not plotted: " + "; ".join(left_out) + "."
    return Figure("cost", caption, save(fig, caption, out_dir, "cost", formats))


def curves_figure(
    df: pd.DataFrame,
    curves: pd.DataFrame,
    out_dir: Path,
    formats: tuple[str, ...],
    run: str | None,
    look: Look = FILE,
) -> Figure:
    """A run's loss and learning rate per step: `run` is a run_key (or its start) of any run with
    curves (fine-tuning or pre-training; the title says which); default the most recently finished
    fine-tuning run that has curves (the file is finetune_curves)."""
    runs = df.drop_duplicates("run_key")
    runs = runs[runs["run_key"].isin(set(curves["run_key"]))]
    if run is not None:
        runs = runs[runs["run_key"].str.startswith(run)]
        if runs.empty:
            raise UserError(f"--run {run}: no stored run with training curves has a run_key starting so")
        if runs["run_key"].nunique() > 1:
            raise UserError(f"--run {run}: matches {runs['run_key'].nunique()} runs; give more of the run_key")
    else:
        runs = runs[runs["protocol"].isin(with_metric(lambda m: m.transfer))]  # fine-tuning, not pre-training
    if runs.empty:
        raise UserError("no fine-tuning run with training curves is stored; run `vitbench run --protocol finetune`")
    chosen = runs.sort_values("finished_at").iloc[-1]
    mine = curves[curves["run_key"] == chosen["run_key"]]
    fig, (loss_ax, lr_ax) = pyplot().subplots(2, 1, figsize=look.size, sharex=True)
    fig.subplots_adjust(bottom=0.25 if look.caption_in_image else 0.1, top=0.92, left=0.09, right=0.97, hspace=0.15)
    loss = mine[mine["name"] == "train_loss"]
    lr = mine[mine["name"] == "lr"]
    loss_ax.plot(loss["step"], loss["value"], lw=1)
    loss_ax.set_ylabel("training loss")
    lr_ax.plot(lr["step"], lr["value"], lw=1, color="tab:orange")
    lr_ax.set_ylabel("learning rate")
    lr_ax.set_xlabel("step")
    h = json_field(chosen["hparams"])
    label = columns.weights_label(
        chosen["model"], chosen["weights"], chosen["weights_sha256"], bool(chosen["random_init"])
    )
    what = chosen["protocol"]
    loss_ax.set_title(f"{what}: {label} on {chosen['dataset']}, seed {int(chosen['seed'])}", fontsize=9)
    stage = f"{h['stage']} stage, " if h.get("stage") else ""
    caption = (
        f"{what}: per-step training loss and learning rate of run {chosen['run_key'][:12]} ({stage}lr "
        f"{h.get('lr')}, {h.get('steps')} steps, batch {h.get('batch')}, {h.get('res')} px"
        f"{', smoke' if h.get('smoke') else ''}), {chosen['protocol_version']}, finished {chosen['finished_at']}."
    )
    return Figure("curves", caption, save(fig, caption, out_dir, "curves", formats, look))

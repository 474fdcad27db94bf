"""Pre-training runs beside what they bought: `vitbench table --view pretrain`, and the figures
`vitbench plot datasize` (Fig 4: few-shot accuracy against pre-training images, one line per
model) and `vitbench plot compute` (Fig 5: transfer accuracy against the pre-training exaFLOPs
vitbench measured, with the paper's Table 6 points drawn beside, marked as the paper's).

A pre-training run is linked to its transfer runs by the sha256 of the weights file it wrote
(notes.weights_file), and to its baseline by architecture and resolution: the few-shot runs of
the same model at random init.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from vitbench import paper
from vitbench.errors import UserError
from vitbench.protocols.registry import along, with_metric
from vitbench.store.query import json_field, written_weights_sha
from vitbench.views.axes import with_axes
from vitbench.views.cells import SMOKE_MARK, Cell, TableData
from vitbench.views.plots import FILE, Figure, Look, legend, new_figure, runs_text, save
from vitbench.views.table import title

VIEW = "pretrain"  # `table --view pretrain`: the view the pre-training runs' metrics name (protocols/measures.py)
BASELINE = "random init"
FIG4_SHOTS = 5  # Fig 4's metric: linear 5-shot


@dataclass
class Linked:
    """One row per pre-training run (and per baseline), its settings, and its transfer accuracies
    (one row per transfer run) in `transfer`."""

    runs: pd.DataFrame  # row, run_key, model, dataset, images, objective, pos_embed, steps, val_accuracy, exaflops, ...
    transfer: pd.DataFrame  # row, run_key, dataset, shots, seed, value


def pretraining_protocols() -> set[str]:
    """The protocols whose runs make weights, shown here: their metrics name this view."""
    return with_metric(lambda m: m.view == VIEW)


def linked_runs(df: pd.DataFrame) -> set[str]:
    """The run keys the pre-training view shows: the pre-training runs and their transfer runs."""
    linked = link(df)
    return set(linked.runs["run_key"]) | set(linked.transfer["run_key"])


def link(df: pd.DataFrame) -> Linked:
    df = with_axes(df)
    pre = df[df["protocol"].isin(pretraining_protocols())]
    if pre.empty:
        raise UserError("no pre-training runs are stored; run `vitbench run --protocol pretrain`")
    few = df[df["protocol"].isin(along("shots")) & (df["metric"] == "accuracy")]
    few_res = few["hparams"].map(lambda h: json_field(h).get("res"))
    rows, transfer = [], []
    for _, run in pre.drop_duplicates("run_key").iterrows():
        h = json_field(run["hparams"])
        metrics = dict(zip(*pre.loc[pre["run_key"] == run["run_key"], ["metric", "value"]].T.values, strict=True))
        label = f"{run['model']} · {run['dataset']} n={h['subset']}, {h['objective']}"
        if h.get("pos_embed", "1-d") != "1-d":
            label += f", pos {h['pos_embed']}"
        rows.append(
            {
                "row": label, "run_key": run["run_key"], "model": run["model"], "dataset": run["dataset"],
                "images": int(h["subset"]), "objective": h["objective"], "pos_embed": h.get("pos_embed", "1-d"),
                "steps": int(h["steps"]), "res": h["res"], "val_accuracy": metrics.get("val_accuracy"),
                "exaflops": float(run["flops"]) / 1e18, "device_seconds": float(run["device_seconds"]),
                "smoke": bool(h.get("smoke")),
            }
        )  # fmt: skip
        sha = written_weights_sha(run["notes"])
        transfer.append(few[few["weights_sha256"] == sha].assign(row=label))
    runs = pd.DataFrame(rows).sort_values(["model", "dataset", "objective", "images"], kind="stable")
    for (model, res), _ in runs.groupby(["model", "res"], sort=False):
        baseline = few[few["random_init"] & (few["model"] == model) & (few_res == res)]
        transfer.insert(0, baseline.assign(row=f"{model} · {BASELINE}"))
    return Linked(runs, pd.concat(transfer, ignore_index=True))


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


def datasize_figure(df: pd.DataFrame, out_dir: Path, formats: tuple[str, ...], look: Look = FILE) -> Figure:
    """Fig 4: few-shot accuracy (5-shot where measured) against pre-training images, per model."""
    linked = link(df)
    fig, ax = new_figure(look)
    transfer = linked.transfer.merge(linked.runs[["row", "images", "objective"]], on="row")
    shots = FIG4_SHOTS if (transfer["shots"] == FIG4_SHOTS).any() else int(transfer["shots"].min())
    transfer = transfer[transfer["shots"] == shots]
    if transfer.empty:
        raise UserError("no few-shot runs of pre-trained weights are stored; run with --transfer")
    for (model, objective, dataset), part in transfer.groupby(["model", "objective", "dataset"], sort=False):
        stats = part.groupby("images")["value"].agg(["mean", "std"]).sort_index()
        ax.errorbar(stats.index, stats["mean"] * 100, yerr=stats["std"].fillna(0) * 100, marker="o", capsize=3,
                    label=f"{model} ({objective}) → {title(dataset)}")  # fmt: skip
    ax.set_xscale("log")
    ax.set_xlabel("pre-training images (log)")
    ax.set_ylabel(f"linear {shots}-shot top-1 accuracy (%)")
    ax.set_title("Accuracy against pre-training data size (Fig 4 style)")
    baselines = linked.transfer[linked.transfer["row"].str.endswith(BASELINE) & (linked.transfer["shots"] == shots)]
    for (model, dataset), part in baselines.groupby(["model", "dataset"], sort=False):
        ax.axhline(part["value"].mean() * 100, linestyle="--", linewidth=1, color="grey")
        ax.annotate(f"{model} at random init → {title(dataset)}", (0.01, part["value"].mean() * 100),
                    xycoords=("axes fraction", "data"), fontsize=look.legend_size, color="grey",
                    va="bottom")  # fmt: skip
    legend(ax, look)
    caption = (
        f"Linear {shots}-shot accuracy of each pre-training run's best weights (early stopping on dev), mean ± std "
        "over seeds, against the images it was pre-trained on (nested subsets), from "
        f"{runs_text(linked.runs['run_key'])}."
    )
    return Figure("datasize", caption, save(fig, caption, out_dir, "datasize", formats, look))


def compute_figure(df: pd.DataFrame, out_dir: Path, formats: tuple[str, ...], look: Look = FILE) -> Figure:
    """Fig 5: transfer accuracy against measured pre-training exaFLOPs, the paper's Table 6 beside."""
    linked = link(df)
    fig, ax = new_figure(look)
    transfer = linked.transfer.merge(linked.runs[["row", "exaflops"]], on="row")
    for (model, dataset, shots), part in transfer.groupby(["model", "dataset", "shots"], sort=False):
        points = part.groupby("exaflops")["value"].mean().sort_index()
        ax.plot(points.index, points.to_numpy() * 100, marker="o",
                label=f"{model} → {title(dataset)} {int(shots)}-shot (vitbench)")  # fmt: skip
    t6 = paper.table("6")
    t6 = t6[t6["dataset"].isin(["imagenet", "cifar10", "cifar100", "pets", "flowers102"])]
    means = t6.groupby(["model", "pretrain_exaflops"], sort=False)["value"].mean().reset_index()
    family = (
        means["model"]
        .str.extract(r"^(ResNet|R50|ViT)")[0]
        .map({"ResNet": "BiT ResNets", "R50": "hybrids", "ViT": "ViTs"})
    )
    for name, part in means.groupby(family, sort=False):
        ax.scatter(part["pretrain_exaflops"], part["value"], marker="s", alpha=0.5,
                   label=f"paper Table 6: {name} (JFT-300M, fine-tuned, average of 5)")  # fmt: skip
    ax.set_xscale("log")
    ax.set_xlabel("total pre-training compute (exaFLOPs, log)")
    ax.set_ylabel("transfer top-1 accuracy (%)")
    ax.set_title("Transfer accuracy against pre-training compute (Fig 5 style)")
    legend(ax, look)
    caption = (
        "vitbench points: few-shot accuracy of weights pre-trained here against the FLOPs vitbench counted for "
        f"their pre-training, from {runs_text(linked.runs['run_key'])}. Squares: the paper's Table 6 (JFT-300M "
        "pre-training, fine-tuned accuracy averaged over ImageNet, CIFAR-10/100, Pets, Flowers), for reference only."
    )
    return Figure("compute", caption, save(fig, caption, out_dir, "compute", formats, look))

"""The figures of pre-training: `vitbench plot datasize` (Fig 4: few-shot accuracy against
pre-training images, one line per model) and `vitbench plot compute` (Fig 5: transfer accuracy
against the pre-training exaFLOPs vitbench measured, with the paper's Table 6 points drawn beside,
marked as the paper's). The runs are linked by measured/pretraining_runs.py.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from vitbench.errors import UserError
from vitbench.reference import paper
from vitbench.views.figures.figure_kit import FILE, Figure, Look, legend, new_figure, runs_text, save
from vitbench.views.measured.dataset_titles import title
from vitbench.views.measured.pretraining_runs import BASELINE, link

FIG4_SHOTS = 5  # Fig 4's metric: linear 5-shot


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

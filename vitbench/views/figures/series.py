"""`vitbench plot checkpoints`: accuracy against training step for a series of checkpoints
(`--weights DIR` or a glob evaluates each checkpoint file in step order; each folder is a series)."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from vitbench.errors import UserError
from vitbench.views import cells
from vitbench.views.figures import plots
from vitbench.views.measured import columns
from vitbench.views.measured.dataset_titles import title


def checkpoint_step(weights: str) -> int | None:
    """The step a checkpoint file's name carries: its last number (`step_01500.pt` -> 1500)."""
    numbers = re.findall(r"\d+", Path(str(weights)).stem)
    return int(numbers[-1]) if numbers else None


def checkpoints_figure(df: pd.DataFrame, out_dir: Path, formats: tuple[str, ...], protocol: str | None = None):
    """One line per (series folder, model, dataset, protocol and shots): mean accuracy over seeds
    of each checkpoint against its step; a series needs two checkpoints of one folder."""
    m = columns.measured_columns(df, protocol)
    acc = m.acc[m.acc["dataset"].isin(set(df["dataset"]))].copy() if not m.acc.empty else m.acc
    if acc.empty:
        raise UserError("no stored accuracy to draw against checkpoints")
    acc["folder"] = acc["weights"].map(lambda w: str(Path(str(w)).parent))
    acc["step"] = acc["weights"].map(checkpoint_step)
    acc = acc[acc["step"].notna() & ~acc["random_init"].astype(bool)]
    acc["shots_label"] = acc["shots"].map(lambda s: "" if pd.isna(s) else f" · {int(s)}-shot")
    fig, ax = plots.new_figure()
    used: list[str] = []
    for (folder, model, dataset, protocol_name, shots), part in acc.groupby(
        ["folder", "model", "dataset", "protocol", "shots_label"], sort=False
    ):
        means = part.groupby("step")["value"].agg(["mean", "count"]).sort_index()
        if len(means) < 2:
            continue
        subset = cells.SUBSET_MARK if part["data_subset"].any() else ""
        label = f"{model} · {Path(str(folder)).name}/ · {title(str(dataset))}{subset} · {protocol_name}{shots}"
        ax.plot(means.index, means["mean"] * 100, marker="o", label=f"{label} (n={int(means['count'].min())})")
        used += list(part["run_key"])
    if not used:
        raise UserError("no series of checkpoints is stored: run with --weights DIR (or a glob) of several checkpoints")
    ax.set_xlabel("checkpoint step (from the file name)")
    ax.set_ylabel("top-1 accuracy (%)")
    ax.set_title("Accuracy over a series of checkpoints")
    plots.legend(ax)
    runs = plots.runs_text(used)
    caption = f"Mean top-1 accuracy over seeds of each checkpoint of a folder, against its step, from {runs}."
    return plots.Figure("checkpoints", caption, plots.save(fig, caption, out_dir, "checkpoints", formats))

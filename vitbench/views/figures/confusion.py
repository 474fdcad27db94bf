"""`vitbench plot confusion --run KEY`: one run's confusion matrix, from its kept per-image
predictions (store/predictions.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from vitbench.errors import UserError
from vitbench.store.predictions import read_predictions
from vitbench.store.query import json_field
from vitbench.views.figures.figure_kit import SIZE, Figure, pyplot, save

MAX_DRAWN_CLASSES = 2_000  # a (k, k) matrix drawn: ImageNet's 1,000 fit; 2e9 asked for 26.8 GiB


def confusion_figure(df: pd.DataFrame, results: Path, out_dir: Path, formats: tuple[str, ...], run: str | None):
    """One run's confusion matrix (rows: true class, columns: predicted), counts normalised per row."""
    if run is None:
        raise UserError("vitbench plot confusion: give --run KEY (the run_key, or its start)")
    runs = df.drop_duplicates("run_key")
    runs = runs[runs["run_key"].str.startswith(run)]
    if runs["run_key"].nunique() != 1:
        raise UserError(f"--run {run}: matches {runs['run_key'].nunique()} stored runs; expected one")
    chosen = runs.iloc[0]
    table = read_predictions(results, str(chosen["run_key"]), json_field(chosen["notes"]).get("predictions"))
    if table is None:
        raise UserError(f"--run {run}: the run kept no per-image predictions (stored before they were kept)")
    k = int(max(table["label"].max(), table["top1"].max())) + 1
    if k > MAX_DRAWN_CLASSES:
        raise UserError(f"--run {run}: {k:,} classes; a confusion matrix draws at most {MAX_DRAWN_CLASSES:,}")
    counts = np.zeros((k, k))
    np.add.at(counts, (table["label"].to_numpy(), table["top1"].to_numpy()), 1)
    share = counts / np.maximum(counts.sum(axis=1, keepdims=True), 1)
    fig, ax = pyplot().subplots(figsize=SIZE)
    fig.subplots_adjust(bottom=0.2, top=0.92)
    image = ax.imshow(share, cmap="Blues", vmin=0, vmax=1)
    fig.colorbar(image, ax=ax, label="share of the true class")
    ax.set_xlabel("predicted class")
    ax.set_ylabel("true class")
    ax.set_title(f"Confusion matrix: {chosen['model']} on {chosen['dataset']} ({chosen['protocol']})", fontsize=9)
    caption = (
        f"Run {str(chosen['run_key'])[:12]} ({chosen['protocol_version']}, seed {int(chosen['seed'])}): "
        f"{len(table)} test images, top-1 {table['correct'].mean() * 100:.2f} %; rows normalised."
    )
    return Figure("confusion", caption, save(fig, caption, out_dir, "confusion", formats))

"""Per-class views of the kept per-image predictions (store/predictions.py):

- `per_class_view`: one row per class of a dataset, one column per measured column, each cell the
  class's accuracy (mean ± std over seeds), and mean-per-class accuracy (the mean over classes:
  what mmpretrain and CLIP_benchmark report beside top-1) as the last row;
- `calibration_view`: the `eval` runs' expected calibration error and negative log-likelihood;
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pandas as pd

from vitbench.errors import UserError
from vitbench.files.text_safety import visible_name
from vitbench.protocols.registry import declared_metric
from vitbench.store.predictions import read_predictions
from vitbench.store.query import json_field
from vitbench.views.cells import Cell, TableData
from vitbench.views.measured.columns import measured_columns
from vitbench.views.measured.footnotes import provenance_footnotes

log = logging.getLogger("vitbench")

MEAN_PER_CLASS = "mean per-class accuracy"


def _per_class(table: pd.DataFrame, num_classes: int) -> np.ndarray:
    """(num_classes,) accuracy per class (NaN where the class has no test image)."""
    totals = np.bincount(table["label"], minlength=num_classes).astype(float)
    hits = np.bincount(table["label"], weights=table["correct"].astype(float), minlength=num_classes)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(totals > 0, hits / totals, np.nan)


def stored_dataset(given: str, stored: set[str]) -> str:
    """The stored dataset name `--per-class` means: itself, or the one stored name it is without its
    fingerprint (`folder:uni` and `folder:/data/uni` for `folder:uni@dff0c312`, the name `run` was given
    and the name it stored). Otherwise one line naming the stored names."""
    if given in stored:
        return given
    prefix, _, where = given.rpartition(":")
    short = f"{prefix}:{where.rstrip('/').rsplit('/', 1)[-1]}" if prefix else given
    matches = sorted(name for name in stored if name.split("@", 1)[0] in (given, short))
    if len(matches) == 1:
        return matches[0]
    names = matches or sorted(stored)
    listed = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
    why = "names more than one stored dataset" if matches else "no stored run on that dataset"
    raise UserError(f"--per-class {given}: {why}; stored: {listed or 'none'}")


def per_class_view(df: pd.DataFrame, dataset: str, results: Path, protocol: str | None = None) -> TableData:
    dataset = stored_dataset(dataset, set() if df.empty else set(df["dataset"]))
    m = measured_columns(df[df["dataset"] == dataset], protocol)
    data = TableData(title=f"Per-class top-1 accuracy (%) on {dataset}")
    classes: dict[str, list[np.ndarray]] = {}
    names: list = []
    lost: list[str] = []  # one changed or damaged file costs its own run, not the table (as in the report)
    for col, part in m.acc.groupby("column", sort=False):
        for run in part.drop_duplicates("run_key").itertuples():
            recorded = json_field(run.notes).get("predictions")
            try:
                table = read_predictions(results, str(run.run_key), recorded)
            except UserError as e:
                log.warning("%s; left out of the per-class table", e)
                lost.append(str(e))
                continue
            if table is not None:
                classes.setdefault(str(col), []).append(_per_class(table, int(table["label"].max()) + 1))
                names = names or (recorded or {}).get("classes") or []
    if not classes:
        raise UserError(f"--per-class {dataset}: no stored run kept per-image predictions (runs before they were)")
    width = max(len(v) for runs in classes.values() for v in runs)
    rows = [_class_label(c, names) for c in range(width)] + [MEAN_PER_CLASS]
    for row in rows:
        data.add_row(row)
    for col, runs in classes.items():
        data.add_column(col)
        values = np.stack([np.pad(v, (0, width - len(v)), constant_values=np.nan) for v in runs]) * 100
        for c in range(width):
            data.cells[(rows[c], col)] = _cell(values[:, c])
        data.cells[(MEAN_PER_CLASS, col)] = _cell(np.nanmean(values, axis=1))
    data.footnotes.append("cells: per-class top-1 accuracy (%), mean ± std over seeds (n runs), from kept predictions")
    data.footnotes += [f"left out: {line}" for line in lost]
    provenance_footnotes(data, m)
    return data


def _class_label(c: int, names: list) -> str:
    """`class 3: persian` where the run kept the dataset's class names (folder:<path>), else `class 3`."""
    name = names[c] if c < len(names) and isinstance(names[c], str) else None
    return f"class {c}: {visible_name(name)}" if name else f"class {c}"


def _cell(values: np.ndarray) -> Cell:
    values = values[~np.isnan(values)]
    if not len(values):
        return Cell()
    return Cell(mean=float(values.mean()), std=float(values.std(ddof=1)) if len(values) > 1 else None, n=len(values))


def calibration_view(df: pd.DataFrame) -> TableData:
    """ECE and NLL of the stored `eval` runs, one row per (dataset, metric)."""
    calibrated = set(df.loc[df["metric"].isin(["ece", "nll"]), "run_key"]) if not df.empty else set()
    m = measured_columns(df[df["run_key"].isin(calibrated)] if not df.empty else df)
    data = TableData(title="Calibration of the checkpoints' own classifiers (--protocol eval)")
    found = m.acc[m.acc["dataset"].isin(set(df["dataset"]))]  # the datasets themselves (ImageNet, not its ReaL row)
    metrics = df[df["metric"].isin(["ece", "nll"])].set_index(["run_key", "metric"])["value"] if not df.empty else None
    for (dataset, col), part in found.groupby(["dataset", "column"], sort=False):
        data.add_column(str(col))
        for metric, label in (("ece", "ECE (15 bins, %)"), ("nll", "NLL")):
            values = [metrics.get((k, metric)) for k in part["run_key"]] if metrics is not None else []
            values = [float(v) * (100 if metric == "ece" else 1) for v in values if v is not None]
            if values:
                row = f"{dataset} · {label}"
                data.add_row(row)
                declared = declared_metric(metric)
                if declared is not None and not declared.higher_is_better:
                    data.lower_is_better.add(row)  # the better-calibrated model is the bold one
                data.cells[(row, str(col))] = Cell(mean=float(np.mean(values)), n=len(values), rankable=True)
    data.footnotes.append(
        "ECE: expected calibration error over 15 equal-width bins of the top-1 softmax probability; "
        "NLL: mean negative log-likelihood of the label (both from the checkpoint's own logits)"
    )
    return data

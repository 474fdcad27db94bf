"""Pre-training runs linked to what they bought, for the pre-training table and figures alike.

A pre-training run is linked to its transfer runs by the sha256 of the weights file it wrote
(notes.weights_file), and to its baseline by architecture and resolution: the few-shot runs of
the same model at random init.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from vitbench.errors import UserError
from vitbench.protocols.registry import along, with_metric
from vitbench.store.query import json_field, written_weights_sha
from vitbench.views.measured.axes import with_axes

VIEW = "pretrain"  # `table --view pretrain`: the view the pre-training runs' metrics name (protocols/measures.py)
BASELINE = "random init"


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

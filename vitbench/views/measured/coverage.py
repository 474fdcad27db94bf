"""How many of a dataset's classes its runs were scored on, as the runs stored it (`notes.test_classes`,
execution/recorder.test_classes): a subset of the official splits may hold 3 of Pets' 37 breeds, and
then chance is 33 %, not 2.7 %. The table's subset footnote, the figures' chance line and their
captions read it from here."""

from __future__ import annotations

import pandas as pd

from vitbench.store.query import json_field

TOP5_ALL = ", top-5 100 %"  # at most 5 classes present: a top-5 ranks every one


def class_coverage(runs: pd.DataFrame) -> dict[str, tuple[int, int]]:
    """dataset -> (classes present in the scored split, the dataset's classes), from the runs that
    stored it (the fewest present where runs differ: the most cautious chance is the highest)."""
    found: dict[str, tuple[int, int]] = {}
    if runs.empty or "notes" not in runs:
        return found
    for dataset, notes in zip(runs["dataset"], runs["notes"], strict=True):
        counted = json_field(notes).get("test_classes")
        if not isinstance(counted, dict):
            continue
        present, total = counted.get("present"), counted.get("of")
        if not (isinstance(present, int) and isinstance(total, int) and 0 < present <= total):
            continue
        before = found.get(str(dataset))
        if before is None or present < before[0]:
            found[str(dataset)] = (present, total)
    return found


def chance_percent(coverage: dict[str, tuple[int, int]], dataset: str, classes: int | None) -> float | None:
    """100 / the classes present in the dataset's scored split where stored, else 100 / `classes`."""
    present = coverage.get(dataset, (classes, classes))[0]
    return 100.0 / present if present else None


def fewer_classes_text(
    coverage: dict[str, tuple[int, int]], datasets: set[str] | None = None, top5: bool = False
) -> str:
    """`pets 3 of 37 classes (chance 33.3 %)` for each dataset scored on fewer than all its classes;
    `top5` (the runs hold a top-5 accuracy, k-NN's): `(chance 33.3 %, top-5 100 %)` where at most 5
    are present, as a top-5 then holds every one of them and its 100 % is chance, not a result."""
    parts = [
        f"{dataset} {present} of {total} classes (chance {100 / present:.3g} %"
        f"{TOP5_ALL if top5 and present <= 5 else ''})"
        for dataset, (present, total) in sorted(coverage.items())
        if present < total and (datasets is None or dataset in datasets)
    ]
    return "; ".join(parts)


def has_top5(runs: pd.DataFrame | None) -> bool:
    """Whether the view's runs stored a top-5 accuracy (a `metric` named `…_top5`)."""
    return runs is not None and "metric" in runs and runs["metric"].astype(str).str.endswith("_top5").any()

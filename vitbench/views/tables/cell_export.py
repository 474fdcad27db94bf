"""`vitbench export --cells`: the cells a table shows, flat, one row per measured cell, the form
CLIP_benchmark's and timm's results CSVs take. Each row is a cell of `vitbench table --ci` (the same
labels, marks, intervals and baseline pairing; nothing worked out again): its dataset and column,
the backbone, the protocol and its version, a column per setting (every setting its runs record,
the defaults too: `precision`, `decoder`, `res`, …; empty where the protocol has no such setting),
then mean, std and n over seeds, the 95 % interval, the column it was tested against, the test's
p-value and the p-value after Holm's correction, its marks and the runs behind it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from vitbench.store.query import json_field
from vitbench.views.measured.settings import run_setting
from vitbench.views.tables.table import accuracy_view

FIXED = ["row", "dataset", "column", "model", "weights", "weights_sha256", "random_init", "protocol",
         "protocol_version", "shots"]  # fmt: skip
MEASURED = ["mean", "std", "n", "ci_low", "ci_high", "baseline", "p", "p_holm", "delta", "marks", "seeds", "run_keys"]


def cells_frame(
    df: pd.DataFrame, results: Path, protocol: str | None = None, baseline: Sequence[str] = (),
    group_by: Sequence[str] = (),
) -> pd.DataFrame:  # fmt: skip
    """The measured cells of `vitbench table --ci` over `df` (stored rows), one row each."""
    data = accuracy_view(df, protocol=protocol, group_by=group_by, ci=results, baseline=baseline)
    runs = df.drop_duplicates("run_key").set_index("run_key", drop=False)
    records = []
    for (row, column), cell in data.cells.items():
        if not cell.run_keys or cell.is_paper:  # the paper's cells and the cost rows: no runs of their own
            continue
        mine = runs.loc[[k for k in cell.run_keys if k in runs.index]]
        if mine.empty:
            continue
        first = mine.iloc[0]
        record = {
            "row": row, "dataset": first["dataset"] if mine["dataset"].nunique() == 1 else None, "column": column,
            "model": first["model"], "weights": first["weights"], "weights_sha256": first["weights_sha256"],
            "random_init": bool(first["random_init"]), "protocol": first["protocol"],
            "protocol_version": first["protocol_version"], "shots": json_field(first["hparams"]).get("shots"),
        }  # fmt: skip
        record |= {f"setting:{k}": v for k, v in run_setting(first["hparams"]).items() if k != "shots"}
        interval = cell.interval or (None, None)
        record |= {
            "mean": cell.mean, "std": cell.std, "n": cell.n,
            "ci_low": None if interval[0] is None else interval[0] * 100,
            "ci_high": None if interval[1] is None else interval[1] * 100,
            "baseline": cell.baseline, "p": cell.p, "p_holm": cell.p_holm, "delta": cell.delta,
            "marks": cell.marks.strip(), "seeds": ",".join(str(int(s)) for s in sorted(set(mine["seed"]))),
            "run_keys": " ".join(cell.run_keys),
        }  # fmt: skip
        records.append(record)
    frame = pd.DataFrame(records)
    if frame.empty:
        return frame
    settings = sorted(c for c in frame.columns if c.startswith("setting:"))
    frame = frame[[*FIXED, *settings, *MEASURED]]
    # a setting named like a column of the cell's own (`mean`, `N`, `p`: any case) keeps its
    # `setting:` prefix; before, it took the column and the measured mean became `mean_1`, as text
    reserved = {c.lower() for c in (*FIXED, *MEASURED)}
    named = [c if c.removeprefix("setting:").lower() in reserved else c.removeprefix("setting:") for c in settings]
    frame.columns = [*FIXED, *named, *MEASURED]
    for name in frame.columns[len(FIXED) : len(FIXED) + len(settings)]:
        frame[name] = _typed(frame[name])
    frame["shots"] = _typed(frame["shots"])
    return frame


INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1  # a whole number beyond them is written as text (was an OverflowError)


def _typed(values: pd.Series) -> pd.Series:
    """One column of one type, for Parquet: whole numbers as integers, numbers as floats, anything
    else as text (a list or object as its JSON); missing (a protocol without that setting) as null."""
    present = [v for v in values if v is not None and not (isinstance(v, float) and pd.isna(v))]
    whole = [v for v in present if isinstance(v, int) and not isinstance(v, bool)]
    huge = any(not INT64_MIN <= v <= INT64_MAX for v in whole)  # neither Int64 nor a float holds it exactly
    if whole and len(whole) == len(present) and not huge:
        return pd.array([None if v is None or pd.isna(v) else int(v) for v in values], dtype="Int64")
    if present and not huge and all(isinstance(v, int | float) and not isinstance(v, bool) for v in present):
        return pd.to_numeric(values, errors="coerce").astype(float)
    return values.map(lambda v: None if v is None or (isinstance(v, float) and pd.isna(v)) else
                      json.dumps(v, sort_keys=True) if isinstance(v, list | dict) else str(v))  # fmt: skip

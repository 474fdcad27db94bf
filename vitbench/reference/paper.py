"""The paper's own numbers (results/paper/*.csv): data, loaded beside measured rows, never mixed in."""

from __future__ import annotations

import os
import sys
from functools import cache
from pathlib import Path

import pandas as pd

from vitbench.catalog.entry_points import Registry
from vitbench.errors import UserError

TABLES = {
    "1": "table1.csv",
    "2": "table2.csv",
    "5": "table5.csv",
    "6": "table6.csv",
    "8": "table8.csv",  # App. D.4: position-embedding ablation, ViT-B/16 ImageNet 5-shot linear
    "9": "table9.csv",
    "robustness": "robustness.csv",  # App. D.9: ViT-H/14 on ObjectNet
}


def paper_dir() -> Path:
    """VITBENCH_PAPER_DIR, else the source tree's results/paper, else the installed copy."""
    candidates = [
        Path(os.environ["VITBENCH_PAPER_DIR"]) if os.environ.get("VITBENCH_PAPER_DIR") else None,
        Path(__file__).resolve().parents[2] / "results" / "paper",
        Path(sys.prefix) / "share" / "vitbench" / "paper",
    ]
    for path in candidates:
        if path and (path / "table2.csv").exists():
            return path
    raise UserError("cannot find the paper tables (results/paper/*.csv); set VITBENCH_PAPER_DIR")


@cache
def table(number: str) -> pd.DataFrame:
    return pd.read_csv(paper_dir() / TABLES[number])


def columns() -> list[str]:
    """Every name `--compare` accepts: Table 2's columns, then Tables 5 and 6."""
    names: list[str] = []
    for number in ("2", "5", "6"):
        names += [c for c in table(number)["column"].unique() if c not in names]
    return names


def column(name: str) -> pd.DataFrame:
    """One paper column as rows (dataset, value, std, source); first table that has it wins."""
    for number in ("2", "5", "6"):
        df = table(number)
        rows = df[df["column"] == name]
        if len(rows):
            out = rows[["dataset", "value"]].copy()
            out["std"] = rows["std"] if "std" in rows else float("nan")
            out["source"] = rows["source"]
            return out.reset_index(drop=True)

    Registry("paper column", str, columns).find(name)  # raises with suggestions
    raise AssertionError


def model_of(name: str) -> str:
    """The model a paper column measured, lower-cased as vitbench names models (`ViT-L/16` ->
    `vit-l/16`; BiT-L is `bit-l`)."""
    for number in ("2", "5", "6"):
        rows = table(number)
        rows = rows[rows["column"] == name]
        if len(rows):
            return str(rows["model"].iloc[0]).lower()
    column(name)  # raises, with suggestions, for an unknown name
    return ""


def cells(name: str) -> pd.DataFrame:
    """Every cell of one paper column in every table that has it (2, then 5, then 6), with the
    setting it was measured in: rows (dataset, value, std, table, res, polyak, note, source).
    `res` NaN and `polyak` "" where the table does not say; `polyak` "none" where it says none."""
    parts = []
    for number in ("2", "5", "6"):
        df = table(number)
        rows = df[df["column"] == name]
        if not len(rows):
            continue
        out = rows[["dataset", "value"]].copy()
        for key, empty in (("std", float("nan")), ("res", float("nan")), ("polyak", ""), ("note", "")):
            out[key] = rows.get(key, empty)
        out["polyak"] = out["polyak"].fillna("").astype(str)
        out["note"] = out["note"].fillna("").astype(str)
        out["table"] = number
        out["source"] = rows["source"]
        parts.append(out)
    if not parts:
        column(name)  # the one-line error with suggestions
    return pd.concat(parts, ignore_index=True)

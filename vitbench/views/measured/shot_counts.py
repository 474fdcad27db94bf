"""The shots a few-shot cell really had: where a class has fewer images than the shots asked for,
its runs note `effective_shots`, and the cell says so (`[3-shot]`); read for a whole store in one
vectorised pass."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd


def cell_effective_shots(part: pd.DataFrame) -> int | None:
    if "shots" not in part:
        return None
    if "effective_shots" in part:  # read once for every run by measured_columns
        counts = part["effective_shots"].to_numpy(dtype=float)
    elif "notes" in part:
        counts = effective_shots(part["notes"]).to_numpy(dtype=float)
    else:
        return None
    return fewest_shots(counts, pd.to_numeric(part["shots"], errors="coerce").to_numpy(dtype=float))


def fewest_shots(effective: np.ndarray, shots: np.ndarray) -> int | None:
    """The fewest shots any run of a few-shot cell had in a class, where fewer than its label says
    (NaN: a run with no shots, or no such note)."""
    if np.isnan(shots).all() or np.isnan(effective).all():
        return None
    least = int(np.nanmin(effective))
    return least if least < int(np.nanmax(shots)) else None


def effective_shots(notes: pd.Series) -> pd.Series:
    """Each run's `effective_shots` note (NaN where it has none), read from the notes' JSON text in
    one vectorised pass: 100,000 runs would otherwise be 100,000 JSON parses. The notes are written
    by json.dumps (the recorder), so the key and its integer value have one form."""
    if notes.empty:  # (an empty Arrow-backed column cannot compare types)
        return pd.Series(dtype=float)
    text = notes.map(lambda n: n if isinstance(n, str) else json.dumps(n)) if notes.map(type).ne(str).any() else notes
    return pd.to_numeric(text.str.extract(r'"effective_shots":\s*(-?\d+)', expand=False), errors="coerce")

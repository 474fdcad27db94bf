"""What a stored number may be, wherever it is read from: a shard, the database, or a result about to
be stored. Every metric is a finite number; one its protocol declares a fraction (unit "%", shown
× 100) lies within [0, 1]. A database row is checked as a shard is: a `vitbench.duckdb` handed over
with an accuracy of 1.7 and no shard behind it was tabled as 170.00.

A row that fails is left out of every view with one line naming its run and why (a database row
cannot be quarantined as a shard is: `ingest --rebuild` rebuilds the database from the shards)."""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pandas only where rows are read: shards.py's checks are on every light command's path
    import pandas as pd

log = logging.getLogger("vitbench")

# run columns a shard must carry as non-empty text (store/shards.REQUIRED_TEXT): NOT NULL alone lets ''
REQUIRED_TEXT = (
    *("model", "weights", "weights_sha256", "dataset", "data_source", "data_fingerprint", "protocol"),
    *("protocol_version", "status"),
)
SAID = 5  # rows named one by one at most; the rest counted


# which metrics a protocol declares fractions: only the protocols, a layer above the store, know; their
# registry says so when it is imported (protocols/registry.py), as the CLI and the library API do
# before they read or store anything. Until then (this module alone) only finiteness is checked.
_fractions_of: Callable[[str], frozenset[str]] | None = None


def declare_fractions(lookup: Callable[[str], frozenset[str]]) -> None:
    """Where the store learns which of a protocol's metrics are fractions (`lookup(protocol name)`)."""
    global _fractions_of
    _fractions_of = lookup


def fractions(protocol: str) -> frozenset[str]:
    """The metrics `protocol` declares fractions; none where it is not known here (a plugin's protocol
    not installed: only finiteness is checked)."""
    return _fractions_of(protocol) if _fractions_of is not None else frozenset()


def metric_problem(name: object, value: object, fraction_names: frozenset[str] | set[str]) -> str | None:
    """Why `value` cannot be stored as metric `name` (of a protocol whose fractions are `fraction_names`),
    or None where it can."""
    if not isinstance(name, str) or isinstance(value, bool) or not isinstance(value, int | float):
        return f"metric {name!r} = {value!r:.60} is not a number"
    if not math.isfinite(value):
        return f"metric {name!r} = {value!r} is not a finite number"
    if name in fraction_names and not 0 <= value <= 1:
        return f"metric {name!r} = {value!r} is declared a fraction (shown as %), expected from 0 to 1"
    return None


def checked_rows(frame: pd.DataFrame, path: Path) -> pd.DataFrame:
    """`frame` (runs joined with their metrics, a row per metric, as `read_results` reads them from the
    database at `path`) without the runs a row of which fails a shard's checks, each said in one line.
    Found column by column (a 100,000-run store), said row by row (the few found)."""
    if frame.empty:
        return frame
    suspect = _suspects(frame)
    if not suspect.any():
        return frame
    bad: dict[str, str] = {}
    for row in frame[suspect].to_dict("records"):
        reason = _run_problem(row) or metric_problem(row["metric"], float(row["value"]), fractions(row["protocol"]))
        if reason and row["run_key"] not in bad:
            bad[row["run_key"]] = reason
    for key, reason in list(bad.items())[:SAID]:
        log.warning(
            "%s: run %s… left out of every view: %s (`vitbench ingest --rebuild --results %s` rebuilds the "
            "database from the run shards)", path, str(key)[:12], reason, path.parent,
        )  # fmt: skip
    if len(bad) > SAID:
        log.warning("%s: %d more run(s) left out of every view for the same kind of reason", path, len(bad) - SAID)
    return frame[~frame["run_key"].isin(bad)]


def _suspects(frame: pd.DataFrame) -> pd.Series:
    """The rows that may fail a check (each then checked one by one)."""
    import numpy as np
    import pandas as pd

    suspect = pd.Series(False, index=frame.index)
    for name in REQUIRED_TEXT:
        suspect |= frame[name].isna() | (frame[name].astype(str) == "")
    suspect |= ~frame["hparams"].astype(str).str.lstrip().str.startswith("{")
    suspect |= frame["notes"].notna() & ~frame["notes"].astype(str).str.lstrip().str.startswith("{")
    values = pd.to_numeric(frame["value"], errors="coerce").astype(float)
    suspect |= pd.Series(~np.isfinite(values.to_numpy()), index=frame.index)
    for protocol in frame["protocol"].dropna().unique():
        named = frame["metric"].isin(fractions(str(protocol)))
        suspect |= (frame["protocol"] == protocol) & named & ((values < 0) | (values > 1))
    return suspect


def _run_problem(run: dict) -> str | None:
    for name in REQUIRED_TEXT:
        value = run.get(name)
        if not isinstance(value, str) or not value:
            return f"run.{name} is missing or not text"
    for name in ("hparams", "notes"):
        value = run.get(name)
        if value is None and name == "notes":
            continue
        try:
            parsed = json.loads(value) if isinstance(value, str) else value
        except ValueError:
            return f"run.{name} is not JSON"
        if not isinstance(parsed, dict):
            return f"run.{name} is not an object"
    return None

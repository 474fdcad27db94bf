"""Test images with a near-duplicate in the train split a run learned from, from the stored
`vitbench dedup` audits: a cell whose runs' test split has any carries DUPLICATE_MARK and the count."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from vitbench import store

DUPLICATE_MARK = "¶"
COLUMN = "test_duplicates"  # per run: test images with a near-duplicate in the dataset's own train (NaN: no audit)


def with_test_duplicates(df: pd.DataFrame, results: Path) -> pd.DataFrame:
    """`df` (stored runs) with COLUMN: for a run on dataset D scored on a test split of fingerprint F,
    the test images of every stored audit of D's (F) against D's own other splits that have a
    near-duplicate there, counted once each; NaN where no such audit is stored."""
    audits = store.read_audits(results)
    if df.empty or audits.empty:
        return df.assign(**{COLUMN: float("nan")}) if not df.empty else df
    own = audits[audits["test_dataset"] == audits["audited_dataset"]]
    pairs = store.read_pairs(results, list(own["audit_key"]))
    flagged = pairs.merge(own[["audit_key", "test_dataset", "test_fingerprint"]], on="audit_key")
    counts = flagged.groupby(["test_dataset", "test_fingerprint"])["test_index"].nunique()
    audited = {(d, f): 0 for d, f in zip(own["test_dataset"], own["test_fingerprint"], strict=True)}
    audited.update({key: int(n) for key, n in counts.items()})
    fingerprints = df["hparams"].astype(str).str.extract(r'"test_fingerprint":\s*"([^"]+)"', expand=False)
    keys = list(zip(df["dataset"], fingerprints, strict=True))
    return df.assign(**{COLUMN: [float(audited[k]) if k in audited else float("nan") for k in keys]})


def mark(duplicates: float | None) -> str:
    """A cell's mark for the most test duplicates any of its runs has (none for 0 or no audit)."""
    return f" {DUPLICATE_MARK}{int(duplicates)}" if duplicates and duplicates == duplicates else ""


FOOTNOTE = (
    f"{DUPLICATE_MARK}N: N images of the test split have a near-duplicate in the dataset's own train split (a stored "
    "`vitbench dedup` audit); the accuracy counts them"
)

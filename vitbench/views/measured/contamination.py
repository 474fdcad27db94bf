"""Test images with a near-duplicate in the train split a run learned from, from the stored
`vitbench dedup` audits: a cell whose runs' test split has any carries DUPLICATE_MARK and the count."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pandas as pd

from vitbench import store
from vitbench.store.dedup_method import Method
from vitbench.store.query import json_field

DUPLICATE_MARK = "¶"
COLUMN = "test_duplicates"  # per run: test images with a near-duplicate in the dataset's own train (NaN: no audit)


def with_test_duplicates(df: pd.DataFrame, results: Path) -> pd.DataFrame:
    """`df` (stored runs) with COLUMN: the test images that have a near-duplicate in the split the
    run learned from, by the one audit that matches the run — its dataset's test split of the run's
    test fingerprint against the split of the run's data fingerprint (the train split it learned
    from; for eval, which learns nothing, any other split of the dataset), at the default method
    and threshold, the latest such audit where several are stored; NaN where none is. An audit at
    another threshold, of a test split against itself, or of an earlier state of the files never
    adds to a mark (before, every audit whose test fingerprint matched was added up)."""
    audits = store.read_audits(results)
    if df.empty or audits.empty:
        return df.assign(**{COLUMN: float("nan")}) if not df.empty else df
    default = Method().describe()
    at_default = audits["method"].map(lambda m: json_field(m) == default)
    own = audits[
        (audits["test_dataset"] == audits["audited_dataset"])
        & (audits["audited_fingerprint"] != audits["test_fingerprint"])  # a split against itself is no train
        & at_default
    ].sort_values("created_at")
    latest = own.drop_duplicates(["test_dataset", "test_fingerprint", "audited_fingerprint"], keep="last")
    exact = {
        (d, t, a): float(n)
        for d, t, a, n in latest[["test_dataset", "test_fingerprint", "audited_fingerprint", "n_test_flagged"]]
        .itertuples(index=False)
    }  # fmt: skip
    any_other = {
        (d, t): float(n)
        for d, t, n in latest[["test_dataset", "test_fingerprint", "n_test_flagged"]].itertuples(index=False)
    }  # fmt: skip  (the latest of them, last in created order)
    # each distinct (dataset, test split, learned split) looked up once; the text read as before
    tests = df["hparams"].astype(str).str.extract(r'"test_fingerprint":\s*"([^"]+)"', expand=False)
    tests = tests.where(tests.notna(), df["data_fingerprint"])  # eval's data identity is the split it scores
    keys = list(zip(df["dataset"], tests, df["data_fingerprint"], strict=True))

    def count(key: tuple) -> float:
        dataset, test, learned = key
        if key in exact:
            return exact[key]
        return any_other.get((dataset, test), float("nan")) if learned == test else float("nan")

    counted = {key: count(key) for key in set(keys)}
    found = [counted[key] for key in keys]
    return df.assign(**{COLUMN: found})


# what every list of audits says of each (`vitbench dedup`'s summary, the report's section)
AUDIT_COLUMNS = ("searched in", "test images", "with a near-duplicate", "pairs")


def audit_cells(audit: Mapping) -> list[str]:
    """An audit's AUDIT_COLUMNS as text: the split searched (and how many of its images), the test
    images (and how many could not be read), how many of those read have a near-duplicate (and the
    share), the pairs found. An audit that read no test image says so: "0 (0.00 %)" read as clean."""
    unreadable = test_unreadable(audit)
    searched = audit["n_test"] - unreadable
    tests = f"{audit['n_test']:,}" + (f" ({unreadable:,} unreadable)" if unreadable else "")
    if searched <= 0:
        flagged = "— (no test image could be read)"
    else:
        flagged = f"{audit['n_test_flagged']:,} ({100.0 * audit['n_test_flagged'] / searched:.2f} %)"
    return [
        f"{audit['audited_dataset']} {audit['audited_split']} ({audit['n_audited']:,})",
        tests,
        flagged,
        f"{audit['n_pairs']:,}",
    ]


def test_unreadable(audit: Mapping) -> int:
    """The test images an audit could not read (its notes, as stored: a dict or JSON text)."""
    notes = json_field(audit.get("notes")) or {}
    return int(notes.get("test_unreadable", 0))


def mark(duplicates: float | None) -> str:
    """A cell's mark for the most test duplicates any of its runs has (none for 0 or no audit)."""
    return f" {DUPLICATE_MARK}{int(duplicates)}" if duplicates and duplicates == duplicates else ""


FOOTNOTE = (
    f"{DUPLICATE_MARK}N: N images of the test split have a near-duplicate in the dataset's own train split (a stored "
    "`vitbench dedup` audit); the accuracy counts them"
)

"""Near-duplicate audits (`vitbench dedup`) read back: one row per (test split, audited split) with the
method, its settings and provenance, and every pair found (written as shards: audit_shards.py)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from vitbench.store.audit_shards import AUDIT_COLUMNS, PAIR_COLUMNS, save_audit
from vitbench.store.database import AUDITS_SINCE, read_table

__all__ = ["AUDIT_COLUMNS", "PAIR_COLUMNS", "read_audits", "read_pairs", "save_audit"]


def read_audits(results: Path) -> pd.DataFrame:
    """Every stored audit (no pairs); empty where the store or the table is not there yet."""
    return read_table(results, AUDITS_SINCE, "SELECT * FROM dedup_audits ORDER BY created_at", AUDIT_COLUMNS)


def read_pairs(results: Path, audit_keys: list[str]) -> pd.DataFrame:
    """The pairs of the audits `audit_keys`, nearest first per test image."""
    if not audit_keys:
        return pd.DataFrame(columns=PAIR_COLUMNS)
    keys = ", ".join("'" + k.replace("'", "") + "'" for k in audit_keys)
    sql = f"SELECT * FROM dedup_pairs WHERE audit_key IN ({keys}) ORDER BY audit_key, test_index, distance"
    return read_table(results, AUDITS_SINCE, sql, PAIR_COLUMNS)

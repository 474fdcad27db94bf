"""Near-duplicate audits (`vitbench dedup`): one row per (test split, audited split) with the method,
its settings and provenance, and every pair found."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pandas as pd

from vitbench.store.database import read_table
from vitbench.store.schema import ENVIRONMENT_COLUMNS, transaction

AUDIT_COLUMNS = [
    "audit_key",
    "created_at",
    "test_dataset",
    "test_split",
    "test_source",
    "test_fingerprint",
    "n_test",
    "audited_dataset",
    "audited_split",
    "audited_source",
    "audited_fingerprint",
    "n_audited",
    "method",
    "threshold",
    "n_pairs",
    "n_test_flagged",
    "skipped_images",
    "seconds",
    "images_per_second",
    "data_dir",
    "device_name",
    *ENVIRONMENT_COLUMNS,
    "notes",
]
PAIR_COLUMNS = ["audit_key", "test_index", "test_image", "duplicate_index", "duplicate", "distance", "exact"]
JSON_COLUMNS = ("method", "notes")


def save_audit(con: duckdb.DuckDBPyConnection, audit: dict, pairs: list[dict]) -> None:
    """One audit and its pairs, in one transaction; an audit stored again (--rerun) replaces the old."""
    row = [json.dumps(audit[c]) if c in JSON_COLUMNS else audit[c] for c in AUDIT_COLUMNS]
    with transaction(con):
        con.execute("DELETE FROM dedup_pairs WHERE audit_key = ?", [audit["audit_key"]])
        con.execute("DELETE FROM dedup_audits WHERE audit_key = ?", [audit["audit_key"]])
        con.execute(
            f"INSERT INTO dedup_audits ({', '.join(AUDIT_COLUMNS)}) VALUES ({', '.join('?' * len(AUDIT_COLUMNS))})",
            row,
        )
        if pairs:
            frame = pd.DataFrame(pairs, columns=PAIR_COLUMNS)
            con.register("new_pairs", frame)
            con.execute("INSERT INTO dedup_pairs BY NAME SELECT * FROM new_pairs")
            con.unregister("new_pairs")


def read_audits(results: Path) -> pd.DataFrame:
    """Every stored audit (no pairs); empty where the store or the table is not there yet."""
    return read_table(results, 6, "SELECT * FROM dedup_audits ORDER BY created_at", AUDIT_COLUMNS)


def read_pairs(results: Path, audit_keys: list[str]) -> pd.DataFrame:
    """The pairs of the audits `audit_keys`, nearest first per test image."""
    if not audit_keys:
        return pd.DataFrame(columns=PAIR_COLUMNS)
    keys = ", ".join("'" + k.replace("'", "") + "'" for k in audit_keys)
    sql = f"SELECT * FROM dedup_pairs WHERE audit_key IN ({keys}) ORDER BY audit_key, test_index, distance"
    return read_table(results, 6, sql, PAIR_COLUMNS)

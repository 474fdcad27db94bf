"""Near-duplicate audits as shards: `audits/<audit_key>.json`, written atomically before the
search's checkpoint is removed and before the database is asked to take the audit, as runs are.
An audit searched while another process held the database (or the disk was full) was lost with
its checkpoint; now the next command that opens the store merges it, and `ingest --rebuild`
builds the audits back from their shards as it builds the runs.

A shard is checked before it is merged (an object of the audit's columns, its pairs a list of
rows, its name its audit_key); one that fails is quarantined, as a run's shard is."""

from __future__ import annotations

import json
import math
import os
from datetime import datetime
from pathlib import Path

import duckdb
import pandas as pd

from vitbench.errors import one_line
from vitbench.files.atomic import read_regular, write_atomic
from vitbench.store.merge import is_store_error, unavailable
from vitbench.store.schema import ENVIRONMENT_COLUMNS, transaction
from vitbench.store.shards import quarantine

AUDIT_SCHEMA = 1
AUDIT_COLUMNS = [
    *("audit_key", "created_at", "test_dataset", "test_split", "test_source", "test_fingerprint", "n_test"),
    *("audited_dataset", "audited_split", "audited_source", "audited_fingerprint", "n_audited", "method"),
    *("threshold", "n_pairs", "n_test_flagged", "skipped_images", "seconds", "images_per_second", "data_dir"),
    "device_name",
    *ENVIRONMENT_COLUMNS,
    "notes",
]
PAIR_COLUMNS = ["audit_key", "test_index", "test_image", "duplicate_index", "duplicate", "distance", "exact"]
JSON_COLUMNS = ("method", "notes")


def audit_dir(results: Path) -> Path:
    return results / "audits"


def write_audit_shard(results: Path, audit: dict, pairs: list[dict]) -> Path:
    """The audit and its pairs as one file (a UserError naming it where it cannot be written)."""
    row = {c: audit[c].isoformat() if isinstance(audit[c], datetime) else audit[c] for c in AUDIT_COLUMNS}
    path = audit_dir(results) / f"{audit['audit_key']}.json"
    document = {"schema": AUDIT_SCHEMA, "audit": row, "pairs": [[p[c] for c in PAIR_COLUMNS] for p in pairs]}
    write_atomic(path, json.dumps(document, allow_nan=False))
    return path


def audit_shard_keys(results: Path) -> set[str]:
    folder = audit_dir(results)
    if not folder.is_dir():
        return set()
    return {e.name[:-5] for e in os.scandir(folder) if e.name.endswith(".json")}


class BadAudit(ValueError):
    """An audit shard that cannot be merged; the message says why."""


MAX_AUDIT_BYTES = 128 * 2**20  # some 800,000 pairs: far more than a test set's near-duplicates
COUNTS = ("n_test", "n_audited", "n_pairs", "n_test_flagged", "skipped_images")
TEXTS = ("audit_key", "test_dataset", "test_split", "test_source", "test_fingerprint", "audited_dataset",
         "audited_split", "audited_source", "audited_fingerprint")  # fmt: skip
INT32_MAX = 2**31 - 1


def read_audit_shard(path: Path) -> tuple[dict, list[dict]]:
    """(audit row, pairs) of a checked shard; BadAudit (or OSError) where it is not one. Its size is
    bounded before it is read (a 137 MB shard took 1.9 GB), and every value is in its range: counts
    whole and not negative, no more flagged test images than test images, a threshold and distances
    a correlation's, indices within their splits (a shard claiming 5,000 flagged of 797 put ¶5000
    in the tables; -5 hid the mark; NaN thresholds merged)."""
    size = path.stat().st_size
    if size > MAX_AUDIT_BYTES:
        raise BadAudit(f"{size:,} bytes, more than an audit shard holds ({MAX_AUDIT_BYTES:,})")
    try:
        document = json.loads(read_regular(path))
    except (UnicodeDecodeError, ValueError) as e:
        raise BadAudit(f"not JSON ({one_line(e, 80)})") from None
    if not isinstance(document, dict) or document.get("schema") != AUDIT_SCHEMA:
        raise BadAudit(f"not an audit shard of schema {AUDIT_SCHEMA}")
    audit, pairs = document.get("audit"), document.get("pairs")
    if not isinstance(audit, dict) or set(audit) != set(AUDIT_COLUMNS):
        raise BadAudit("'audit' is missing or does not hold the audit's columns")
    if audit["audit_key"] != path.stem:
        raise BadAudit("its audit_key is not its file name (a copy?)")
    if not isinstance(pairs, list) or not all(isinstance(p, list) and len(p) == len(PAIR_COLUMNS) for p in pairs):
        raise BadAudit(f"'pairs' is not a list of rows of {len(PAIR_COLUMNS)} values")
    rows = [dict(zip(PAIR_COLUMNS, p, strict=True)) for p in pairs]
    _check_audit(audit, len(rows))
    for number, pair in enumerate(rows):
        _check_pair(pair, audit, number)
    return audit, rows


def _whole(value: object, high: int = INT32_MAX) -> bool:
    return type(value) is int and 0 <= value <= high


def _finite(value: object, low: float, high: float) -> bool:
    return (
        isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and low <= value <= high
    )


def _check_audit(audit: dict, n_pairs: int) -> None:
    for name in TEXTS:
        if not isinstance(audit[name], str) or not audit[name]:
            raise BadAudit(f"audit.{name} is missing or not text")
    for name in COUNTS:
        if not _whole(audit[name]):
            raise BadAudit(f"audit.{name} = {str(audit[name])[:20]} is not a whole number from 0 to {INT32_MAX}")
    if audit["n_test_flagged"] > audit["n_test"]:
        raise BadAudit(
            f"audit.n_test_flagged = {audit['n_test_flagged']} is more than its {audit['n_test']} test images"
        )
    if audit["n_pairs"] != n_pairs:
        raise BadAudit(f"audit.n_pairs = {audit['n_pairs']}, but it holds {n_pairs} pairs")
    if not _finite(audit["threshold"], -1.0, 1.0):
        raise BadAudit(f"audit.threshold = {audit['threshold']!r} is not a correlation from -1 to 1")
    for name in ("seconds", "images_per_second"):
        if audit[name] is not None and not _finite(audit[name], 0.0, math.inf):
            raise BadAudit(f"audit.{name} = {audit[name]!r} is not a finite number ≥ 0")


def _check_pair(pair: dict, audit: dict, number: int) -> None:
    where = f"pair {number}"
    if pair["audit_key"] != audit["audit_key"]:
        raise BadAudit(f"{where} belongs to another audit")
    if not (
        _whole(pair["test_index"], audit["n_test"] - 1) and _whole(pair["duplicate_index"], audit["n_audited"] - 1)
    ):
        raise BadAudit(f"{where}: an image index outside its split ({audit['n_test']} and {audit['n_audited']} images)")
    if not isinstance(pair["test_image"], str) or not isinstance(pair["duplicate"], str):
        raise BadAudit(f"{where}: an image name is not text")
    if not _finite(pair["distance"], 0.0, 2.0) or type(pair["exact"]) is not bool:
        raise BadAudit(f"{where}: distance {pair['distance']!r} is not 1 - a correlation, or exact is not true/false")


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


def stored_audit_keys(con: duckdb.DuckDBPyConnection) -> set[str]:
    return {r[0] for r in con.execute("SELECT audit_key FROM dedup_audits").fetchall()}


def ingest_audits(con: duckdb.DuckDBPyConnection, results: Path, keys: set[str] | None = None) -> int:
    """Merge the audit shards the database lacks (or those of `keys`); returns how many. A shard that
    fails its checks, or that the database refuses for its rows, is quarantined; a database that
    fails itself (disk, I/O) raises StoreUnavailable from merge.py, the shards left pending."""
    wanted = (audit_shard_keys(results) - stored_audit_keys(con)) if keys is None else keys
    merged = 0
    for key in sorted(wanted):
        path = audit_dir(results) / f"{key}.json"
        try:
            audit, pairs = read_audit_shard(path)
        except (BadAudit, OSError) as e:
            if path.exists():
                quarantine(path, str(e) if isinstance(e, BadAudit) else f"cannot be read ({e})", results)
            continue
        try:
            save_audit(con, audit, pairs)
            merged += 1
        except duckdb.Error as e:
            if is_store_error(e):
                raise unavailable([path], e, "audit shard(s)") from None
            quarantine(path, f"refused by the database ({one_line(e, 120)})", results)
    return merged

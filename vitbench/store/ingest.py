"""Merging shards into the database: one transaction per call, idempotent on run_key."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import duckdb
import pandas as pd

from vitbench.errors import one_line
from vitbench.store.schema import CURVE_COLUMNS, RUN_COLUMNS, transaction
from vitbench.store.shards import quarantine, read_shards, shard_dir


def ingest(con: duckdb.DuckDBPyConnection, shards: Iterable[Path]) -> int:
    """Merge shards into the store in one transaction; re-ingesting a shard replaces its rows. A
    shard that fails its checks is quarantined (shards.read_shards); should the database still
    refuse one, the batch is merged one shard at a time and the refused one quarantined, so one
    bad file never stops the others."""
    records = read_shards(list(shards)).records
    if not records:
        return 0
    try:
        with transaction(con):
            for _, rec in records:
                _insert(con, rec)
        return len(records)
    except duckdb.Error:
        merged = 0
        for path, rec in records:
            try:
                with transaction(con):
                    _insert(con, rec)
                merged += 1
            except duckdb.Error as e:
                quarantine(path, f"refused by the database ({one_line(e, 120)})")
        return merged


def _insert(con: duckdb.DuckDBPyConnection, rec: dict) -> None:
    run = rec["run"]
    con.execute("DELETE FROM metrics WHERE run_key = ?", [run["run_key"]])
    con.execute("DELETE FROM runs WHERE run_key = ?", [run["run_key"]])
    values = [json.dumps(run[c]) if c in ("hparams", "notes") else run.get(c) for c in RUN_COLUMNS]
    con.execute(f"INSERT INTO runs ({', '.join(RUN_COLUMNS)}) VALUES ({', '.join('?' * len(RUN_COLUMNS))})", values)
    con.executemany("INSERT INTO metrics VALUES (?, ?, ?)", [[run["run_key"], k, v] for k, v in rec["metrics"].items()])
    _replace_curves(con, run["run_key"], rec.get("curves") or {})


def _replace_curves(con: duckdb.DuckDBPyConnection, run_key: str, curves: dict[str, list[float]]) -> None:
    """A fine-tuning run's per-step curves (step 1 = after the first update), in one bulk insert:
    20k steps x 3 curves row by row would take minutes. Few-shot and eval runs have none."""
    if not curves:
        return
    con.execute("DELETE FROM curves WHERE run_key = ?", [run_key])
    frame = pd.DataFrame(
        [(run_key, name, step, value) for name, values in curves.items() for step, value in enumerate(values, 1)],
        columns=CURVE_COLUMNS,
    )
    con.register("curves_frame", frame)
    con.execute("INSERT INTO curves SELECT run_key, name, step, value FROM curves_frame")
    con.unregister("curves_frame")


def done_keys(con: duckdb.DuckDBPyConnection) -> set[str]:
    return {r[0] for r in con.execute("SELECT run_key FROM runs WHERE status = 'done'").fetchall()}


def ingest_pending(con: duckdb.DuckDBPyConnection, results: Path) -> int:
    """Shards written (by this or another process) but not yet in the database."""
    folder = shard_dir(results)
    if not folder.is_dir():
        return 0
    known = done_keys(con)
    return ingest(con, [p for p in sorted(folder.glob("*.json")) if p.stem not in known])


def metric_values(con: duckdb.DuckDBPyConnection, run_keys: list[str], name: str) -> dict[str, float]:
    """{run_key: value} of one metric for the given runs (those that have it)."""
    if not run_keys:
        return {}
    rows = con.execute(
        f"SELECT run_key, value FROM metrics WHERE name = ? AND run_key IN ({', '.join('?' * len(run_keys))})",
        [name, *run_keys],
    ).fetchall()
    return {k: float(v) for k, v in rows}

"""Throughput measurements (`vitbench bench`): one row per (configuration, mode, runner, data)."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pandas as pd

from vitbench.store import duck
from vitbench.store.catalog import StoreRefused, checked_version
from vitbench.store.database import read_table
from vitbench.store.schema import DB_NAME, ENVIRONMENT_COLUMNS, transaction

BENCH_COLUMNS = [
    "bench_id",
    "created_at",
    "model",
    "arch",
    "res",
    "mode",
    "runner",
    "data",
    "input_pipeline",
    "batch",
    "micro_batch",
    "activation_checkpointing",
    "precision",
    "compile",
    "steps",
    "warmup_steps",
    "images_per_second",
    "mfu",
    "peak_memory_bytes",
    "flops_per_image",
    "device",
    "device_name",
    "device_count",
    *ENVIRONMENT_COLUMNS,
    "notes",
]


def save_bench(con: duckdb.DuckDBPyConnection, records: list[dict]) -> None:
    """One `vitbench bench` invocation's rows, in one transaction."""
    rows = [[json.dumps(r[c]) if c == "notes" else r[c] for c in BENCH_COLUMNS] for r in records]
    with transaction(con):
        con.executemany(
            f"INSERT INTO bench ({', '.join(BENCH_COLUMNS)}) VALUES ({', '.join('?' * len(BENCH_COLUMNS))})", rows
        )


def read_bench(results: Path) -> pd.DataFrame:
    return read_table(results, 5, "SELECT * FROM bench ORDER BY created_at, model, res, mode", BENCH_COLUMNS)


def read_bench_quietly(results: Path) -> pd.DataFrame | None:
    """The throughput measurements, or None where the store is absent, held by a writer, damaged or
    older than the bench table: for what is only a help (the dry run's estimate), which must not
    warn, nor stand between a run and its own one-line error about the store."""
    path = results / DB_NAME
    if not path.is_file():
        return None
    try:
        con = duck.connect(path, read_only=True)
    except duckdb.Error:
        return None
    try:
        return con.execute("SELECT * FROM bench").df() if checked_version(con, path) >= 5 else None
    except (duckdb.Error, StoreRefused):  # refused: no view or macro of someone else's runs here either
        return None
    finally:
        con.close()

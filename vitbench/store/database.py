"""The results store: one DuckDB file, opened for writing by one process at a time.

Runs first land as JSON shards (shards.py); `ingest` merges them into the database. DuckDB allows
one writing process, so workers never open the database: shards make crashes, concurrent
`vitbench run` calls and cluster array jobs safe, and readers fall back to a snapshot of the
shards while a run holds the file.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pandas as pd

from vitbench.errors import UserError, one_line
from vitbench.store.ingest import done_keys, ingest, ingest_pending
from vitbench.store.schema import (
    CURVE_COLUMNS,
    DB_NAME,
    RUN_COLUMNS,
    check_not_newer,
    migrate,
    schema_version,
)
from vitbench.store.shards import shard_dir, shard_keys


def connect(results: Path) -> duckdb.DuckDBPyConnection:
    """Open (creating or migrating) the store for writing. Only the CLI process calls this."""
    path = results / DB_NAME
    results.mkdir(parents=True, exist_ok=True)
    try:
        con = duckdb.connect(str(path))
    except duckdb.Error as e:
        raise UserError(f"{path}: cannot open the results store ({one_line(e)})") from None
    version = schema_version(con)
    try:
        check_not_newer(path, version)
    except UserError:
        con.close()
        raise
    migrate(con, version)
    return con


def sync(results: Path) -> int:
    """Merge shards the database lacks (cluster workers write only shards): what every reading
    command does first. Skipped while another process holds the database (readers then see the
    shards' snapshot anyway). Returns the number of runs merged."""
    shards = shard_keys(results)
    if not shards:
        return 0
    con = open_for_reading(results)
    if con is not None:
        try:
            known = done_keys(con) if schema_version(con) >= 1 else set()
        finally:
            con.close()
        if shards <= known:
            return 0
    try:
        con = connect(results)
    except UserError:
        return 0  # locked by a running `vitbench run`, or not writable: read the snapshot instead
    try:
        return ingest_pending(con, results)
    finally:
        con.close()


def read_curves(results: Path, run_keys: list[str] | None = None) -> pd.DataFrame:
    """The stored training curves (run_key, name, step, value), read-only; empty when there are none."""
    df = read_table(results, 4, "SELECT * FROM curves ORDER BY run_key, name, step", CURVE_COLUMNS)
    return df if run_keys is None else df[df["run_key"].isin(run_keys)]


def _shard_snapshot(results: Path) -> duckdb.DuckDBPyConnection:
    """An in-memory store built from the shards: what readers see while a `vitbench run` holds the
    database file's write lock (DuckDB lets no other process open it meanwhile). Every finished
    run is in a shard, so tables and plots stay complete; attention distances are not (empty)."""
    con = duckdb.connect()
    migrate(con, 0)
    folder = shard_dir(results)
    ingest(con, sorted(folder.glob("*.json")) if folder.is_dir() else [])
    return con


def open_for_reading(results: Path) -> duckdb.DuckDBPyConnection | None:
    """The store opened read-only (None when there is none yet); the shards' snapshot while a run
    is writing to it."""
    path = results / DB_NAME
    if not path.exists():
        return None
    try:
        con = duckdb.connect(str(path), read_only=True)
    except duckdb.IOException as e:
        if "lock" not in str(e).lower():
            raise UserError(f"{path}: cannot read the results store ({one_line(e)})") from None
        return _shard_snapshot(results)
    except duckdb.Error as e:
        raise UserError(f"{path}: cannot read the results store ({one_line(e)})") from None
    try:
        check_not_newer(path, schema_version(con))
    except UserError:
        con.close()
        raise
    return con


def read_table(results: Path, since_version: int, sql: str, columns: list[str]) -> pd.DataFrame:
    """`sql` on the store opened for reading; an empty frame when the store, or the table (added by
    migration `since_version`), is not there yet."""
    con = open_for_reading(results)
    if con is None:
        return pd.DataFrame(columns=columns)
    try:
        if schema_version(con) < since_version:
            return pd.DataFrame(columns=columns)
        return con.execute(sql).df()
    finally:
        con.close()


def read_results(results: Path) -> pd.DataFrame:
    """Every finished run joined with its metrics (one row per metric), read-only.
    An absent store is an empty frame, never an error."""
    return read_table(
        results,
        1,
        "SELECT r.*, m.name AS metric, m.value FROM runs r JOIN metrics m USING (run_key) "
        "WHERE r.status = 'done' ORDER BY r.model, r.dataset, r.shots, r.seed",
        [*RUN_COLUMNS, "metric", "value"],
    )

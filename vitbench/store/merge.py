"""Merging shards into the database: one transaction per call, idempotent on run_key."""

from __future__ import annotations

import json
from collections.abc import Iterable
from contextlib import suppress
from pathlib import Path

import duckdb
import pandas as pd

from vitbench.errors import UserError, io_reason, one_line, system_reason
from vitbench.store.schema import CURVE_COLUMNS, DB_NAME, RUN_COLUMNS, transaction
from vitbench.store.shards import mark, marked_keys, quarantine, read_shards, shard_dir, shard_keys, take_marks


class StoreUnavailable(UserError):
    """The database could not take valid shards now (a full disk, an I/O error, a held or invalidated
    file): the shards stay pending in `runs/`, and the next command that opens the store merges them."""


# errors of the database file or its disk, not of a shard's rows: a full disk at the commit (DuckDB's
# "TransactionContext Error: Failed to commit: Could not write file ... No space left on device") once
# quarantined a valid shard, and the run's result left every table
_STORE_ERRORS = (
    *(duckdb.IOException, duckdb.FatalException, duckdb.OutOfMemoryException, duckdb.ConnectionException),
    *(duckdb.InterruptException, duckdb.PermissionException),
)


def is_store_error(error: BaseException) -> bool:
    """Whether the database failed for a reason of its own (disk, lock, I/O), not one of the rows.
    (A failed COMMIT is a TransactionException whose words name the disk; "Current transaction is
    aborted" follows a row's own error, and is not one.)"""
    if isinstance(error, _STORE_ERRORS) or system_reason(error) is not None:
        return True
    return "could not write" in str(error).lower()


def unavailable(paths: list[Path], error: BaseException, what: str = "result shard(s)") -> StoreUnavailable:
    folder = paths[0].parent
    return StoreUnavailable(
        f"{folder.parent / DB_NAME}: could not take {len(paths)} {what} ({io_reason(error)}); "
        f"they stay in {folder} and the next command that opens the store merges them"
    )


def ingest(con: duckdb.DuckDBPyConnection, shards: Iterable[Path]) -> int:
    """Merge shards into the store in one transaction; re-ingesting a shard replaces its rows. A
    shard that fails its checks is quarantined (shards.read_shards); should the database still
    refuse one, the batch is merged one shard at a time and the refused one quarantined, so one
    bad file never stops the others. Where the database itself fails (disk full, I/O, lock), no
    shard is blamed: StoreUnavailable, and the shards stay pending."""
    records = read_shards(list(shards)).records
    if not records:
        return 0
    try:
        with transaction(con):
            _insert_all(con, [rec for _, rec in records])
        return len(records)
    except duckdb.Error as e:
        if is_store_error(e):
            raise unavailable([path for path, _ in records], e) from None
        merged = 0
        for i, (path, rec) in enumerate(records):
            try:
                with transaction(con):
                    _insert_all(con, [rec])
                merged += 1
            except duckdb.Error as e:
                if is_store_error(e):
                    raise unavailable([p for p, _ in records[i:]], e) from None
                quarantine(path, f"refused by the database ({one_line(e, 120)})")
        return merged


# pandas dtypes of the runs table's typed columns (text, timestamps and JSON go in as strings: DuckDB
# casts them on insert, as it cast the parameters of row-by-row inserts before)
RUN_DTYPES = {
    **dict.fromkeys(("n_train", "n_test", "skipped_images", "seed", "device_count"), "Int32"),
    "flops_per_image": "Int64",
    **dict.fromkeys(("device_seconds", "flops"), "Float64"),
    **dict.fromkeys(("random_init", "data_subset"), "boolean"),
}


def _insert_all(con: duckdb.DuckDBPyConnection, records: list[dict]) -> None:
    """Replace the rows of these records' runs with theirs, as three bulk inserts from DataFrames:
    row-by-row statements cost milliseconds a shard (a 20,000-shard ingest took over a minute)."""
    latest = {rec["run"]["run_key"]: rec for rec in records}  # one row per run_key, the last one read
    runs = [rec["run"] for rec in latest.values()]
    columns = {
        c: pd.array(
            [json.dumps(r.get(c)) if c in ("hparams", "notes") else r.get(c) for r in runs],
            dtype=RUN_DTYPES.get(c, object),
        )
        for c in RUN_COLUMNS
    }
    metrics = pd.DataFrame(
        [(key, name, value) for key, rec in latest.items() for name, value in rec["metrics"].items()],
        columns=["run_key", "name", "value"],
    ).astype({"value": "float64"})
    curves = pd.DataFrame(
        [
            (key, name, step, value)
            for key, rec in latest.items()
            for name, values in (rec.get("curves") or {}).items()
            for step, value in enumerate(values, 1)  # step 1 = after the first update
        ],
        columns=CURVE_COLUMNS,
    ).astype({"step": "int64", "value": "Float64"})
    frames = {"batch_runs": pd.DataFrame(columns), "batch_metrics": metrics, "batch_curves": curves}
    for name, frame in frames.items():
        con.register(name, frame)
    try:
        con.execute("DELETE FROM metrics WHERE run_key IN (SELECT run_key FROM batch_runs)")
        con.execute("DELETE FROM runs WHERE run_key IN (SELECT run_key FROM batch_runs)")
        # a run's curves are replaced only by a shard that has curves (few-shot and eval runs have none)
        con.execute("DELETE FROM curves WHERE run_key IN (SELECT DISTINCT run_key FROM batch_curves)")
        con.execute(f"INSERT INTO runs ({', '.join(RUN_COLUMNS)}) SELECT {', '.join(RUN_COLUMNS)} FROM batch_runs")
        con.execute("INSERT INTO metrics SELECT run_key, name, value FROM batch_metrics")
        con.execute("INSERT INTO curves SELECT run_key, name, step, value FROM batch_curves")
    finally:
        for name in frames:
            with suppress(duckdb.Error):  # in a transaction a row's error aborted: that error is what counts
                con.unregister(name)


def done_keys(con: duckdb.DuckDBPyConnection) -> set[str]:
    return {r[0] for r in con.execute("SELECT run_key FROM runs WHERE status = 'done'").fetchall()}


def ingest_pending(con: duckdb.DuckDBPyConnection, results: Path) -> int:
    """Shards written (by this or another process) but not yet in the database: those of runs it lacks,
    and those marked newer than its row (a rerun written while another process held it)."""
    if not shard_dir(results).is_dir():
        return 0
    shards = shard_keys(results)
    marked = marked_keys(results)
    take_marks(results, sorted(marked - shards))  # a mark whose shard is gone (quarantined): nothing to merge
    return merge_runs(con, results, sorted((shards - done_keys(con)) | (marked & shards)), marked)


def merge_runs(
    con: duckdb.DuckDBPyConnection, results: Path, run_keys: list[str], marked: set[str] | None = None
) -> int:
    """These runs' shards into the database, their marks taken off first (so a shard rewritten
    meanwhile is marked again) and put back should the database fail. `marked`: the marks the caller
    listed, so that 100,000 pending shards are not 100,000 unlinks of marks that are not there (a mark
    made since is merged, harmlessly again, by the next command)."""
    taken = take_marks(results, run_keys if marked is None else [k for k in run_keys if k in marked])
    try:
        return ingest(con, [shard_dir(results) / f"{key}.json" for key in run_keys])
    except BaseException:
        for key in taken:
            mark(results, key)
        raise


def metric_values(con: duckdb.DuckDBPyConnection, run_keys: list[str], name: str) -> dict[str, float]:
    """{run_key: value} of one metric for the given runs (those that have it)."""
    if not run_keys:
        return {}
    rows = con.execute(
        f"SELECT run_key, value FROM metrics WHERE name = ? AND run_key IN ({', '.join('?' * len(run_keys))})",
        [name, *run_keys],
    ).fetchall()
    return {k: float(v) for k, v in rows}

"""The results store: one DuckDB file, opened for writing by one process at a time.

Runs first land as JSON shards (shards.py); `ingest` merges them into the database. DuckDB allows
one writing process, so workers never open the database: shards make crashes, concurrent
`vitbench run` calls and cluster array jobs safe, and readers fall back to a snapshot of the
shards while a run holds the file.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from pathlib import Path

import duckdb
import pandas as pd

from vitbench.errors import UserError, one_line
from vitbench.store import duck
from vitbench.store.audit_shards import audit_shard_keys, ingest_audits, stored_audit_keys
from vitbench.store.catalog import StoreRefused, checked_version
from vitbench.store.merge import StoreUnavailable, done_keys, ingest, ingest_pending
from vitbench.store.row_checks import checked_rows
from vitbench.store.schema import (
    CURVE_COLUMNS,
    DB_NAME,
    RUN_COLUMNS,
    SCHEMA_VERSION,
    check_not_newer,
    migrate,
    schema_version,
)
from vitbench.store.shards import marked_keys, shard_dir, shard_keys

log = logging.getLogger("vitbench")


AUDITS_SINCE = 6  # the schema migration that added the audits' tables


class StoreLocked(UserError):
    """Another process holds the database for writing (DuckDB allows one writer)."""


# DuckDB's words for a file another process holds; a bare "lock" also matches a damaged file's
# "checksum ... in block", which was then reported as held by another process
_LOCK = re.compile(r"could not set lock|conflicting lock", re.IGNORECASE)
_READ_ONLY = re.compile(r"read-only file system|permission denied", re.IGNORECASE)
_HOLDER = re.compile(r"lock is held in (?P<program>.+?) \(PID (?P<pid>\d+)\)")


def is_lock(error: BaseException) -> bool:
    return bool(_LOCK.search(str(error)))


def locked(path: Path, error: BaseException, then: str = "") -> StoreLocked:
    """The one line for a held database: the holder's whole PID and program as DuckDB names them
    (cut to a width, the message once named PID 2038 for 20386)."""
    found = _HOLDER.search(str(error))
    holder = f" (PID {found['pid']}, {found['program']})" if found else ""
    return StoreLocked(f"{path}: held by another process{holder}{then}")


def _damaged(path: Path, error: BaseException) -> str:
    return (
        f"{path}: damaged, not a readable DuckDB file ({one_line(error, 120)}); `vitbench ingest --rebuild "
        f"--results {path.parent}` sets it aside and rebuilds it from the run shards"
    )


_MIGRATING = threading.Lock()  # DuckDB's catalog takes one writer at a time within a process


def connect(results: Path, file: Path | None = None) -> duckdb.DuckDBPyConnection:
    """Open (creating or migrating) the store for writing (its database, or `file`: one being built
    beside it). StoreLocked while another process holds it; a damaged file is a UserError suggesting
    `ingest --rebuild` (and is not touched)."""
    path = file or results / DB_NAME
    duck.check_path(results)
    results.mkdir(parents=True, exist_ok=True)
    if path.exists() and not path.is_file():
        raise UserError(f"{path}: is not a file, expected the results database")
    try:
        con = duck.connect(path)
    except duckdb.Error as e:
        if is_lock(e):
            raise locked(path, e) from None
        if _READ_ONLY.search(str(e)):  # a read-only folder or mount: the file is fine, called "damaged" before
            raise UserError(
                f"{path}: cannot be opened for writing ({one_line(e, 120)}); is {results} read-only?"
            ) from None
        raise UserError(_damaged(path, e) if path.exists() else f"{path}: cannot create it ({one_line(e)})") from None
    try:
        with _MIGRATING:  # two threads of one process opening a new store both created its tables: a conflict
            version = checked_version(con, path)
            check_not_newer(path, version)
            migrate(con, version)
        done_keys(con)  # a file damaged inside opens, and fails at its first real read: fail here instead
    except duckdb.Error as e:
        con.close()
        raise UserError(_damaged(path, e)) from None
    except UserError:
        con.close()
        raise
    return con


WAIT_SECONDS = 60.0  # how long a command that needs the database waits while another process holds it


def connect_when_free(results: Path, seconds: float = WAIT_SECONDS) -> duckdb.DuckDBPyConnection:
    """`connect`, waiting up to `seconds` while another process holds the database (said once, in one
    line): two `vitbench submit`s into one folder each hold it a moment, and the second ended rc 2."""
    deadline = time.monotonic() + seconds
    said = False
    while True:
        try:
            return connect(results)
        except StoreLocked as e:
            if time.monotonic() >= deadline:
                raise StoreLocked(f"{e}; waited {seconds:.0f} s: run the command again once that one ends") from None
            if not said:
                log.warning("%s; waiting for it (up to %.0f s)", e, seconds)
                said = True
            time.sleep(0.25)


def pending_keys(results: Path, known: set[str]) -> set[str]:
    """The shards the database lacks: runs it does not hold, and reruns marked newer than its row."""
    shards = shard_keys(results)
    return (shards - known) | (marked_keys(results) & shards)


def sync(results: Path, strict: bool = False) -> int:
    """Merge shards the database lacks (cluster workers and concurrent runs write only shards; an
    audit is a shard first too): what every reading command does first. Where it cannot (another
    process holds the database, the folder is read-only, the disk is full) it says how many shards
    are pending, and readers read the shards themselves; with `strict` (`vitbench ingest`) that is
    an error. Returns the runs merged."""
    shards, audits = shard_keys(results), audit_shard_keys(results)
    if not shards and not audits:
        return 0
    path = results / DB_NAME
    known: set[str] | None = None  # the runs the database holds, where it could be read
    if path.is_file():  # nothing to merge: done without taking the write lock
        try:
            con = duck.connect(path, read_only=True)
            try:
                version = checked_version(con, path)
                check_not_newer(path, version)  # "merged 0" and exit 0 on a newer vitbench's file, before
                known = done_keys(con) if version >= 1 else set()
                known_audits = stored_audit_keys(con) if version >= AUDITS_SINCE else set()
            finally:
                con.close()
            if not pending_keys(results, known) and audits <= known_audits:
                return 0
        except duckdb.Error:
            pass  # held by a writer, or damaged: `connect` below says which
    try:
        con = connect(results)
    except UserError as e:
        if strict:
            raise
        if known is None:  # held by another process: what it lacks cannot be counted, only that merging waits
            log.warning("result shards not merged now: %s; tables read the shards meanwhile", e)
        else:  # those the database lacks, not every shard
            log.warning(
                "%d result shard(s) not merged yet: %s; tables read the shards meanwhile",
                len(pending_keys(results, known)),
                e,
            )
        return 0
    try:
        merged = ingest_pending(con, results)
        if ingest_audits(con, results):
            log.info("merged the audit shard(s) the database lacked")
        return merged
    except StoreUnavailable as e:
        if strict:
            raise
        log.warning("%s; tables read the shards meanwhile", e)
        return 0
    finally:
        con.close()


def read_curves(results: Path, run_keys: list[str] | None = None) -> pd.DataFrame:
    """The stored training curves (run_key, name, step, value), read-only; empty when there are none."""
    df = read_table(results, 4, "SELECT * FROM curves ORDER BY run_key, name, step", CURVE_COLUMNS)
    return df if run_keys is None else df[df["run_key"].isin(run_keys)]


def _shard_snapshot(results: Path) -> duckdb.DuckDBPyConnection:
    """An in-memory store built from the shards: what readers see while a `vitbench run` holds the
    database file's write lock (DuckDB lets no other process open it meanwhile), while shards are
    pending that cannot be merged, or when the file is damaged. Every finished run is in a shard,
    so tables and plots stay complete; attention distances and bench rows are not (empty)."""
    con = duck.connect()
    migrate(con, 0)
    folder = shard_dir(results)
    ingest(con, [folder / f"{key}.json" for key in sorted(shard_keys(results))])
    ingest_audits(con, results)
    return con


def _snapshot_instead(con: duckdb.DuckDBPyConnection, path: Path, error: duckdb.Error) -> duckdb.DuckDBPyConnection:
    """The shards' snapshot, where the database at `path` failed at a read (damaged inside): said once."""
    con.close()
    log.warning("%s; reading the shards meanwhile", _damaged(path, error))
    return _shard_snapshot(path.parent)


def open_for_reading(results: Path) -> duckdb.DuckDBPyConnection | None:
    """The store opened read-only (None when there is none yet), or the shards' snapshot: while a
    run is writing to it, while it lacks shards it cannot take in (a read-only folder), or when it
    is damaged (with a warning suggesting `ingest --rebuild`)."""
    path = results / DB_NAME
    if not path.exists():  # shards but no database: a read-only folder, or only workers wrote here
        return _shard_snapshot(results) if shard_keys(results) or audit_shard_keys(results) else None
    try:
        con = duck.connect(path, read_only=True)
    except duckdb.Error as e:
        if not is_lock(e):
            log.warning("%s; reading the shards meanwhile", _damaged(path, e))
        return _shard_snapshot(results)
    try:
        version = checked_version(con, path)
    except duckdb.Error as e:
        return _snapshot_instead(con, path, e)
    except StoreRefused:
        con.close()
        raise
    try:
        check_not_newer(path, version)
    except UserError:
        con.close()
        raise
    if version < 1:
        return con
    if version < SCHEMA_VERSION:  # an older vitbench's: migrated once (a write), else the shards are read
        con.close()
        try:
            connect(results).close()
        except UserError as e:
            log.warning("%s is at schema %d and cannot be migrated now (%s); reading the shards meanwhile",
                        path, version, e)  # fmt: skip
            return _shard_snapshot(results)
        con = duck.connect(path, read_only=True)
        checked_version(con, path)  # migrated by this process, as it was checked: still plain tables
    try:
        pending = len(pending_keys(results, done_keys(con)))
        pending += len(audit_shard_keys(results) - stored_audit_keys(con))
    except duckdb.Error as e:
        return _snapshot_instead(con, path, e)
    if pending:
        con.close()
        log.warning("%s lacks %d shard(s) it could not merge; reading the shards instead", path, pending)
        return _shard_snapshot(results)
    return con


def read_table(results: Path | str, since_version: int, sql: str, columns: list[str]) -> pd.DataFrame:
    """`sql` on the store opened for reading; an empty frame when the store, or the table (added by
    migration `since_version`), is not there yet. `results` a Path or a str (a notebook's "results")."""
    results = Path(results)
    con = open_for_reading(results)
    if con is None:
        return pd.DataFrame(columns=columns)
    try:
        if schema_version(con) < since_version:
            return pd.DataFrame(columns=columns)
        return con.execute(sql).df()
    except duckdb.Error as e:  # opened, but a table cannot be read: damaged inside
        log.warning("%s; reading the shards meanwhile", _damaged(results / DB_NAME, e))
        snapshot = _shard_snapshot(results)
        try:
            return snapshot.execute(sql).df()
        finally:
            snapshot.close()
    finally:
        con.close()


def read_results(results: Path | str) -> pd.DataFrame:
    """Every finished run joined with its metrics (one row per metric), read-only.
    An absent store is an empty frame, never an error; a run whose rows fail a shard's checks is left
    out, in one line (store/row_checks.py)."""
    frame = read_table(
        results,
        1,
        "SELECT r.*, m.name AS metric, m.value FROM runs r JOIN metrics m USING (run_key) "
        "WHERE r.status = 'done' ORDER BY r.model, r.dataset, r.seed",
        [*RUN_COLUMNS, "metric", "value"],
    )
    return checked_rows(frame, Path(results) / DB_NAME)

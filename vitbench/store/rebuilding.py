"""`vitbench ingest --rebuild`: a new database built from the run shards beside the old one, swapped in
last. Before, the old file was renamed first and the new one built in its place: a SIGKILL at the new
database's first commit left a database without the old one's `inspect` and `bench` rows, and a second
`--rebuild` set that one aside and said its 0 rows were "copied over". Now a kill at any point leaves the
old database where it was, whole; the half-built one is a dead writer's temp file, which the next
rebuild removes (atomic.remove_dead_writers_temps)."""

from __future__ import annotations

import os
import shutil
from datetime import UTC, datetime
from pathlib import Path

import duckdb
import pandas as pd

from vitbench.errors import UserError
from vitbench.files.atomic import remove_dead_writers_temps, temp_beside
from vitbench.store import duck
from vitbench.store.audit_shards import ingest_audits
from vitbench.store.catalog import StoreRefused, checked_version
from vitbench.store.database import connect, is_lock, locked
from vitbench.store.merge import done_keys, ingest
from vitbench.store.schema import DB_NAME, check_not_newer
from vitbench.store.shards import shard_dir, shard_keys

DATABASE_ONLY = (
    "attention_distance",
    "bench",
    "dedup_audits",
    "dedup_pairs",
)  # `inspect`, `bench`, `dedup` rows: no shard carries them


def rebuild(results: Path) -> tuple[Path | None, int, int | None]:
    """Build a new database from the run shards and swap it in for the old one, which keeps a name of
    its own (never modified). Returns (that name, runs merged, `inspect`/`bench` rows copied over: None
    when the old file could not be read, so they stay in the set-aside file only). A readable file is
    set aside as `.previous-<time>`, a damaged one as `.damaged-<time>`, one holding objects that are
    not vitbench's plain tables (store/catalog.py) as `.refused-<time>`; one written by a newer vitbench
    is refused (this version would lose what it does not know)."""
    path = results / DB_NAME
    duck.check_path(results)
    holder, kept, state = None, None, None
    if path.exists():
        try:
            holder, kept = _held_for_rebuild(path)  # never from under a running process: raises StoreLocked
            state = "previous" if kept is not None else "damaged"
        except StoreRefused:  # objects of someone else's: set aside unread, nothing of it copied
            state = "refused"
    aside = path.with_name(f"{DB_NAME}.{state}-{datetime.now(UTC).strftime('%Y%m%dT%H%M%S')}") if state else None
    try:
        if aside is not None and holder is None:  # unreadable: nothing of it to keep in place meanwhile
            _set_aside(path, aside, move=True)
        remove_dead_writers_temps(results)  # an earlier rebuild's half-built database, killed
        new = temp_beside(path)
        merged, copied = _build(results, new, kept or {})
    except BaseException:
        if holder is not None:
            holder.close()
        raise
    if holder is not None:  # the old file held read-only until now: no writer changed it meanwhile
        holder.close()
        _set_aside(path, aside, move=False)
    os.replace(new, path)  # the swap, last and in one step: before it the old database is in place, whole
    return aside, merged, copied if kept is not None else None


def _held_for_rebuild(path: Path) -> tuple[duckdb.DuckDBPyConnection | None, dict[str, pd.DataFrame] | None]:
    """A read-only connection to a readable database, held while its successor is built (no other
    process writes it meanwhile), and its `inspect`/`bench` tables; (None, None) where it is damaged.
    StoreLocked while another process holds it; a UserError, the file unchanged, when a newer vitbench
    wrote it."""
    try:
        con = duck.connect(path, read_only=True)
    except duckdb.Error as e:
        if is_lock(e):
            raise locked(path, e, "; rebuild it once that one ends") from None
        return None, None
    try:
        check_not_newer(path, checked_version(con, path))
        done_keys(con)  # a file damaged inside opens, and fails at its first real read
        tables = {row[0] for row in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
        kept = {t: con.execute(f"SELECT * FROM {t}").df() for t in DATABASE_ONLY if t in tables}
    except duckdb.Error:
        con.close()
        return None, None
    except BaseException:
        con.close()
        raise
    wal = path.with_name(f"{DB_NAME}.wal")
    if not wal.exists():
        return con, kept
    # a killed writer's log beside it (checked above, replayed in memory): written into the file first, for
    # the new database must never meet it; where that cannot be, both are moved aside before building
    con.close()
    try:
        duck.connect(path).close()
        return (duck.connect(path, read_only=True) if not wal.exists() else None), kept
    except duckdb.Error as e:
        if is_lock(e):
            raise locked(path, e, "; rebuild it once that one ends") from None
        return None, kept


def _build(results: Path, new: Path, kept: dict[str, pd.DataFrame]) -> tuple[int, int]:
    """The new database at `new`, whole and closed: the kept rows, every run shard, every audit shard.
    Run shards marked newer than the old database's rows keep their marks: merged again, harmlessly,
    by the next command that opens the store, whichever database it finds."""
    con = connect(results, file=new)
    try:
        copied = 0
        for table, frame in kept.items():
            if len(frame):
                con.register("kept_rows", frame)
                con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM kept_rows")
                con.unregister("kept_rows")
                copied += len(frame)
        folder = shard_dir(results)
        merged = ingest(con, [folder / f"{key}.json" for key in sorted(shard_keys(results))])
        ingest_audits(con, results)  # those the old file held are copied above; the rest from their shards
        con.execute("CHECKPOINT")
    finally:
        con.close()
    return merged, copied


def _set_aside(path: Path, aside: Path, move: bool) -> None:
    """Give the old database (and a write-ahead log of its own) the name `aside`: moved where it is
    unreadable, else a second name (a hard link, or a copy where the file system has none), so that
    the database stays in place until the new one replaces it."""
    wal = path.with_name(f"{DB_NAME}.wal")
    try:
        if move:
            os.replace(path, aside)
            if wal.exists():
                os.replace(wal, aside.with_name(f"{aside.name}.wal"))
            return
        try:
            os.link(path, aside)
        except OSError:
            shutil.copy2(path, aside)
    except OSError as e:  # a read-only folder: EROFS was a traceback
        raise UserError(f"{path}: cannot set it aside ({e.strerror or e}); is {path.parent} read-only?") from None

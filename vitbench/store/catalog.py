"""A results database is data, never code: one handed over by someone else holds vitbench's own plain
tables, or it is refused before any of it is read.

DuckDB keeps views and macros in the file, and runs them when the store is read: a received
`vitbench.duckdb` whose `runs` was a view over `read_text('/some/file')` put that file's content into
`table`, `export` and the report meant to be forwarded; a view over `range(1e11)` took a one-run table
25 s. So every store is opened with DuckDB's external access off and its configuration locked
(store/duck.py), and before its first read, its catalog is compared with the one vitbench's own
migrations make at the file's schema version: a view, macro, sequence, index, type or schema of its
own, or a table, column, default, generated column or constraint other than vitbench's, is one line
naming it (StoreRefused)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING

from vitbench.errors import UserError
from vitbench.store import duck

if TYPE_CHECKING:
    import duckdb

# every object of the file's own catalog (DuckDB's built-ins are `internal`), as (kind, name, detail)
_CATALOG = """
SELECT 'table', schema_name || '.' || table_name, '' FROM duckdb_tables() WHERE database_name = current_database()
UNION ALL SELECT 'column', schema_name || '.' || table_name || '.' || column_name,
    data_type || ' default ' || coalesce(column_default, 'none') || ' nullable ' || is_nullable
    FROM duckdb_columns() WHERE database_name = current_database()
UNION ALL SELECT 'constraint', schema_name || '.' || table_name,
    constraint_type || ' (' || array_to_string(constraint_column_names, ', ') || ') ' || coalesce(expression, '')
    FROM duckdb_constraints() WHERE database_name = current_database()
UNION ALL SELECT 'view', schema_name || '.' || view_name, ''
    FROM duckdb_views() WHERE database_name = current_database() AND NOT internal
UNION ALL SELECT function_type, schema_name || '.' || function_name, ''
    FROM duckdb_functions() WHERE database_name = current_database() AND NOT internal
UNION ALL SELECT 'sequence', schema_name || '.' || sequence_name, ''
    FROM duckdb_sequences() WHERE database_name = current_database()
UNION ALL SELECT 'index', schema_name || '.' || index_name, ''
    FROM duckdb_indexes() WHERE database_name = current_database()
UNION ALL SELECT 'type', schema_name || '.' || type_name, ''
    FROM duckdb_types() WHERE database_name = current_database() AND NOT internal
UNION ALL SELECT 'schema', schema_name, ''
    FROM duckdb_schemas() WHERE database_name = current_database() AND NOT internal
"""
PLAIN = {"table", "column", "constraint"}  # what a store of vitbench's holds; every other kind is refused
SHOWN = 3  # objects named in the line at most


class StoreRefused(UserError):
    """A database whose catalog is not vitbench's own: it is never read (nothing of it runs)."""


def checked_version(con: duckdb.DuckDBPyConnection, path: Path) -> int:
    """The schema version of the store open on `con` (at `path`), once its catalog is vitbench's own
    at that version; StoreRefused otherwise. Objects that run when read are refused before the version
    itself is read (it is a table of the store: `schema_version` could have been a view)."""
    from vitbench.store.schema import schema_version

    found = _catalog(con)
    running = sorted(f"{kind} {name}" for kind, name, _ in found if kind not in PLAIN)
    if running:
        raise _refused(path, running)
    version = schema_version(con)
    expected = _reference(version) if version >= 0 else frozenset()
    other = sorted(_said(entry) for entry in found - expected)
    if other and version <= _newest():  # a newer vitbench's tables: check_not_newer says so instead
        raise _refused(path, other)
    return version


def _refused(path: Path, objects: list[str]) -> StoreRefused:
    shown = ", ".join(objects[:SHOWN]) + (f" and {len(objects) - SHOWN} more" if len(objects) > SHOWN else "")
    return StoreRefused(
        f"{path}: not vitbench's own plain tables ({shown}); a store is read as data only, never run. "
        f"`vitbench ingest --rebuild --results {path.parent}` sets it aside and rebuilds it from the run shards"
    )


def _said(entry: tuple[str, str, str]) -> str:
    kind, name, detail = entry
    return f"{kind} {name}" + (f" ({detail.strip()})" if kind != "table" and detail.strip() else "")


def _catalog(con: duckdb.DuckDBPyConnection) -> frozenset[tuple[str, str, str]]:
    return frozenset((str(kind), str(name), str(detail)) for kind, name, detail in con.execute(_CATALOG).fetchall())


def _newest() -> int:
    from vitbench.store.schema import SCHEMA_VERSION

    return SCHEMA_VERSION


@functools.cache
def _reference(version: int) -> frozenset[tuple[str, str, str]]:
    """The catalog vitbench's migrations make up to `version`, built in memory."""
    from vitbench.store.schema import MIGRATIONS, migrate

    con = duck.connect()
    try:
        if version > 0:
            migrate(con, 0, upto=min(version, len(MIGRATIONS)))
        return _catalog(con)
    finally:
        con.close()

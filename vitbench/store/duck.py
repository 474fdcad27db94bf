"""Every DuckDB connection vitbench opens, on a file or in memory: offline, and on the file named.

- DuckDB installs and loads "known" extensions on demand, from the network: a results folder named
  `md:foo` (or `motherduck:foo`) made it fetch the MotherDuck extension (and, with a token in the
  environment, would have connected to the cloud). The file is named by its absolute path, which
  no scheme starts, and no extension is installed or loaded by itself.
- DuckDB reads a `?` in a file's path as the start of connection options: the database opened,
  its write-ahead log went to another path, and the first commit failed as "damaged". Such a path
  is refused in one line, as is one whose name is not UTF-8 (a `RuntimeError: std::bad_cast` before).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from vitbench.errors import UserError
from vitbench.files.text_safety import non_utf8_byte

if TYPE_CHECKING:
    import duckdb

OFFLINE: dict[str, str | bool | int | float | list[str]] = {
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
}


def check_path(path: Path, option: str = "--results") -> Path:
    """A path DuckDB can keep a file under (checked before any folder is made for it)."""
    absolute = str(Path(path).absolute())
    if "?" in absolute:
        raise UserError(
            f"{option} {path}: DuckDB reads a '?' in a path as the start of connection options; "
            "name a folder without '?'"
        )
    byte = non_utf8_byte(absolute)
    if byte is not None:  # DuckDB's `RuntimeError: std::bad_cast`
        raise UserError(
            f"{option} {ascii(str(path))}: byte {byte} of its name is not UTF-8, and DuckDB names its files "
            "in UTF-8 only; name a folder in UTF-8"
        )
    return path


# a results database is data, never code (store/catalog.py): on its connection nothing reads or writes any
# file but the database's own (a view over read_text('/some/file') fails), and no statement changes that
STORE: dict[str, str | bool | int | float | list[str]] = {
    **OFFLINE,
    "enable_external_access": False,
    "lock_configuration": True,
}


def connect(path: Path | None = None, read_only: bool = False) -> duckdb.DuckDBPyConnection:
    """DuckDB on the results database at `path`, offline and without access to any other file; None:
    in memory, offline (vitbench's own frames, written out with COPY)."""
    import duckdb  # (half a second: loaded by what opens a database, not by what checks a path)

    if path is None:
        return duckdb.connect(config=OFFLINE)
    return duckdb.connect(str(check_path(Path(path), "the database").absolute()), read_only=read_only, config=STORE)

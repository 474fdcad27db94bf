"""`vitbench export`: every stored run and metric with its full provenance, for sharing and pandas.

Parquet and CSV: one row per (run, metric): all `runs` columns (model, weights sha256, data source
and fingerprint, protocol version, hparams and notes as JSON text, seed, device, versions, …), then
`metric` and `value`; DuckDB writes the file (Parquet needs no pyarrow). JSON: one document per run
(its fields, `hparams` and `notes` as objects, `metrics` as name -> value), versioned by
RUN_DOCUMENT and described by docs/results-schema.json, for other tools and leaderboards. Every
format is written atomically.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime
from pathlib import Path

import duckdb
import pandas as pd

from vitbench import store
from vitbench.errors import UserError, io_reason, one_line
from vitbench.files.atomic import write_atomic
from vitbench.files.text_safety import csv_frame, csv_text
from vitbench.store import duck
from vitbench.store.predictions import checked_predictions
from vitbench.store.query import apply_where, json_field

log = logging.getLogger("vitbench")

FORMATS = {"parquet": "(FORMAT parquet)", "csv": "(FORMAT csv, HEADER true)", "json": "(FORMAT json, ARRAY true)"}
# the JSON export's per-run document (docs/results-schema.json): bump on change. 2: `shots` is among
# the hparams, no longer a field of its own
RUN_DOCUMENT = "vitbench.run/2"


def export(results: Path, fmt: str, out: Path, where: list[str] | None = None) -> int:
    """Write the (filtered) runs × metrics to `out`; returns the number of rows written."""
    _check(fmt, out)
    store.sync(results)  # shards that cluster workers wrote since the last merge
    df = apply_where(store.read_results(results), where)
    # none stored yet (a cluster's first shard not landed) or none that --where keeps: as `table`, not an
    # error; the file is still written, empty but for its columns, so no earlier export is read as this one
    if fmt == "json":
        documents = run_documents(df)
        write_atomic(out, json.dumps(documents, indent=1, ensure_ascii=False, allow_nan=False) + "\n")
        return len(documents)
    frame = df.reset_index(drop=True)
    for column in ("hparams", "notes"):  # JSON text, identical in every format
        frame[column] = frame[column].astype(str)
    _write(frame, fmt, out)
    return len(frame)


def export_cells(results: Path, fmt: str, out: Path, where: list[str] | None, cells) -> int:
    """Write the cells `cells` makes of the (filtered) stored rows (views/tables/cell_export.cells_frame) to
    `out`; returns the number of cells written. JSON: an array of one object per cell."""
    _check(fmt, out)
    store.sync(results)
    df = apply_where(store.read_results(results), where)
    frame = cells(df) if not df.empty else pd.DataFrame()
    if frame.empty:
        raise UserError(f"no stored accuracy in {results / store.DB_NAME}" + (" matches --where" if where else ""))
    _write(frame, fmt, out)
    return len(frame)


def run_documents(df: pd.DataFrame) -> list[dict]:
    """One JSON-ready document per stored run: its fields (timestamps in ISO 8601, a missing value as
    null), `hparams` and `notes` as objects, `metrics` as name -> value."""
    documents = []
    for key, part in df.groupby("run_key", sort=False):
        first = part.iloc[0]
        fields = {c: _plain(first[c]) for c in store.RUN_COLUMNS if c in part.columns}
        fields |= {"hparams": json_field(first["hparams"]), "notes": json_field(first["notes"])}
        metrics = {str(m): float(v) for m, v in zip(part["metric"], part["value"], strict=True) if pd.notna(v)}
        documents.append({"schema": RUN_DOCUMENT, **fields, "run_key": str(key), "metrics": metrics})
    return documents


def _plain(value: object) -> object:
    """A stored value as JSON has it: numpy and pandas scalars as Python's, NaN/NaT as null."""
    if value is None or (not isinstance(value, str | bytes) and pd.isna(value)):
        return None
    if isinstance(value, pd.Timestamp | datetime):  # stored in UTC, without the zone: said here
        return value.isoformat() + ("+00:00" if value.tzinfo is None else "")
    return value.item() if hasattr(value, "item") else value


def _check(fmt: str, out: Path) -> None:
    if fmt not in FORMATS:
        raise UserError(f"--format {fmt}: expected {', '.join(FORMATS)}")
    if out.exists() and out.is_dir():
        raise UserError(f"--out {out}: is a folder, expected a file name (e.g. {out / ('runs.' + fmt)})")


def _write(frame: pd.DataFrame, fmt: str, out: Path) -> None:
    """`frame` to `out` in `fmt`, atomically, through DuckDB."""
    con = duck.connect()
    try:
        con.register("export_frame", csv_frame(frame) if fmt == "csv" else frame)  # formulas as text
        write_atomic(out, lambda tmp: con.execute(f"COPY export_frame TO '{_quote(tmp)}' {FORMATS[fmt]}"))
    except duckdb.InterruptException:  # Ctrl-C, SIGTERM or SIGHUP inside DuckDB's write: the command's
        raise KeyboardInterrupt from None  # "interrupted" line (the temp file is gone), not a traceback
    except RuntimeError as e:
        if "interrupted" in str(e).lower():  # DuckDB's other spelling of the same
            raise KeyboardInterrupt from None
        raise
    except (duckdb.Error, OSError) as e:  # a full disk in the words of the system, not DuckDB's JSON
        raise UserError(f"--out {out}: cannot write ({io_reason(e)})") from None
    finally:
        con.close()


def _quote(path: Path) -> str:
    return str(path).replace("'", "''")


# each prediction's run: its identity, and its hparams (JSON text) for what it varied (few-shot's shots)
RUN_FIELDS = ["run_key", "model", "weights_sha256", "dataset", "protocol", "protocol_version", "seed", "hparams"]
# an image id a spreadsheet would run as a formula, or holding a control character: through csv_text
CSV_UNSAFE_ID = r"^[=+@\t\r-]|[\x00-\x08\x0b-\x1f\x7f-\x9f]"


def export_predictions(results: Path, fmt: str, out: Path, where: list[str] | None = None) -> tuple[int, int]:
    """Every kept per-image prediction of the (filtered) runs, one row per (run, image), with the
    run's identity; returns (rows, runs). Runs that kept none (stored before predictions were
    kept, or a λ sweep) are left out. DuckDB streams the files into the export (10M-row runs were
    gathered in pandas first: killed for memory at 24 GB)."""
    _check(fmt, out)
    store.sync(results)
    runs = apply_where(store.read_results(results), where).drop_duplicates("run_key")
    parts, lost = [], []
    for run in runs.itertuples():
        try:
            path = checked_predictions(results, str(run.run_key), json_field(run.notes).get("predictions"))
        except UserError as e:  # one changed or damaged file costs its own run, not the export
            log.warning("%s; left out of the export", e)
            lost.append(e)
            continue
        if path is not None:
            fields = ", ".join(_literal(getattr(run, f), fmt) + f" AS {f}" for f in RUN_FIELDS)
            parts.append((fields, f"read_parquet('{_quote(path)}')"))
    if not parts and lost:
        raise lost[0]
    if not parts:
        raise UserError(
            f"no stored run in {results} kept per-image predictions" + (" matching --where" if where else "")
        )
    con = duck.connect()
    try:
        # one thread streams: several buffered up to 10 GB for two 10M-row runs, to keep the rows in order
        # (and no slower: writing is the work); the limit bounds the rest, with nothing spilled to disk
        con.execute("SET enable_progress_bar = false; SET threads = 1")
        con.execute("SET memory_limit = '1GB'; SET temp_directory = ''")
        ids = "id"
        if fmt == "csv":  # formulas as text, as every other CSV cell (a Python call only where one is)
            con.create_function("csv_text", csv_text, ["VARCHAR"], "VARCHAR")
            ids = f"CASE WHEN regexp_matches(id, '{CSV_UNSAFE_ID}') THEN csv_text(id) ELSE id END"
        union = " UNION ALL ".join(  # in run order, each file's rows in order
            f"SELECT {fields}, {ids} AS id, label, top1, topk, correct FROM {file}" for fields, file in parts
        )
        write_atomic(out, lambda tmp: con.execute(f"COPY ({union}) TO '{_quote(tmp)}' {FORMATS[fmt]}"))
        rows = sum(con.execute(f"SELECT count(*) FROM {file}").fetchone()[0] for _, file in parts)
    except duckdb.InterruptException:
        raise KeyboardInterrupt from None
    except duckdb.OutOfMemoryException as e:
        raise UserError(f"--out {out}: the export ran out of its 1 GB ({one_line(e)}); nothing was written") from None
    finally:
        con.close()
    return rows, len(parts)


def _literal(value: object, fmt: str) -> str:
    """A run field as a SQL literal (text quoted, a missing value NULL; CSV's text through csv_text)."""
    if value is None or (not isinstance(value, str) and pd.isna(value)):
        return "NULL"
    if not isinstance(value, str):
        return str(int(value))  # the seed
    text = str(csv_text(value)) if fmt == "csv" else value
    return "'" + text.replace("'", "''") + "'::VARCHAR"

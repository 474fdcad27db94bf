"""`vitbench export`: every stored run and metric with its full provenance, for sharing and pandas.

One row per (run, metric): all `runs` columns (model, weights sha256, data source and
fingerprint, protocol version, hparams and notes as JSON text, seed, device, versions, …),
then `metric` and `value`. DuckDB writes the file (Parquet needs no pyarrow), atomically.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pandas as pd

from vitbench import store
from vitbench.atomic import write_atomic
from vitbench.errors import UserError, one_line
from vitbench.store.query import apply_where

FORMATS = {"parquet": "(FORMAT parquet)", "csv": "(FORMAT csv, HEADER true)", "json": "(FORMAT json, ARRAY true)"}


def export(results: Path, fmt: str, out: Path, where: list[str] | None = None) -> int:
    """Write the (filtered) runs × metrics to `out`; returns the number of rows written."""
    if fmt not in FORMATS:
        raise UserError(f"--format {fmt}: expected {', '.join(FORMATS)}")
    store.sync(results)  # shards that cluster workers wrote since the last merge
    df = apply_where(store.read_results(results), where)
    if df.empty:
        raise UserError(f"no stored runs in {results / store.DB_NAME}" + (" match --where" if where else ""))
    if out.exists() and out.is_dir():
        raise UserError(f"--out {out}: is a folder, expected a file name (e.g. {out / ('runs.' + fmt)})")
    frame = df.reset_index(drop=True)
    for column in ("hparams", "notes"):  # JSON text, identical in every format
        frame[column] = frame[column].astype(str)
    frame["shots"] = pd.to_numeric(frame["shots"], errors="coerce").astype("Int64")
    con = duckdb.connect()
    try:
        con.register("export_frame", frame)
        write_atomic(out, lambda tmp: con.execute(f"COPY export_frame TO '{_quote(tmp)}' {FORMATS[fmt]}"))
    except (duckdb.Error, OSError) as e:
        raise UserError(f"--out {out}: cannot write ({one_line(e)})") from None
    finally:
        con.close()
    return len(frame)


def _quote(path: Path) -> str:
    return str(path).replace("'", "''")

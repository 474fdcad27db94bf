"""The results store: one DuckDB file, written only by the CLI process, one transaction per ingest.

Runs first land as JSON shards (`runs/<run_key>.json`, written atomically by whoever ran them);
`ingest` merges shards into the database, idempotent on run_key. DuckDB allows one writing
process, so workers never open the database: shards make crashes, concurrent `vitbench run`
calls and cluster array jobs safe.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import duckdb
import pandas as pd

from vitbench.errors import UserError

DB_NAME = "vitbench.duckdb"

# Migrations, applied in order inside one transaction; never edit a released step, append one.
MIGRATIONS: list[list[str]] = [
    [  # 1: the initial schema
        """CREATE TABLE runs (
            run_key VARCHAR PRIMARY KEY,
            model VARCHAR NOT NULL, arch VARCHAR, backend VARCHAR,
            weights VARCHAR NOT NULL, weights_sha256 VARCHAR NOT NULL, random_init BOOLEAN NOT NULL,
            dataset VARCHAR NOT NULL, data_source VARCHAR NOT NULL, data_dir VARCHAR,
            data_fingerprint VARCHAR NOT NULL, data_subset BOOLEAN NOT NULL,
            n_train INTEGER, n_test INTEGER,
            protocol VARCHAR NOT NULL, protocol_version VARCHAR NOT NULL, hparams JSON NOT NULL,
            seed INTEGER NOT NULL, shots INTEGER,
            status VARCHAR NOT NULL, started_at TIMESTAMP, finished_at TIMESTAMP,
            device VARCHAR, device_name VARCHAR, device_count INTEGER, device_seconds DOUBLE,
            flops_per_image BIGINT, flops DOUBLE,
            git_sha VARCHAR, vitbench_version VARCHAR, torch_version VARCHAR, timm_version VARCHAR,
            python_version VARCHAR, hostname VARCHAR, command VARCHAR, notes JSON
        )""",
        """CREATE TABLE metrics (
            run_key VARCHAR NOT NULL, name VARCHAR NOT NULL, value DOUBLE NOT NULL,
            PRIMARY KEY (run_key, name)
        )""",
    ],
    [  # 2: mean attention distance per layer and head (vitbench inspect), with its provenance
        """CREATE TABLE attention_distance (
            inspect_key VARCHAR NOT NULL, model VARCHAR NOT NULL, weights VARCHAR,
            weights_sha256 VARCHAR NOT NULL, random_init BOOLEAN NOT NULL, res INTEGER NOT NULL,
            images VARCHAR NOT NULL, images_fingerprint VARCHAR NOT NULL, n_images INTEGER NOT NULL,
            layer INTEGER NOT NULL, head INTEGER NOT NULL, distance_px DOUBLE NOT NULL,
            created_at TIMESTAMP, device_name VARCHAR, git_sha VARCHAR, vitbench_version VARCHAR,
            torch_version VARCHAR, timm_version VARCHAR,
            PRIMARY KEY (inspect_key, layer, head)
        )""",
    ],
    [  # 3: images left out as corrupt (--skip-corrupt), counted with every result
        "ALTER TABLE runs ADD COLUMN skipped_images INTEGER DEFAULT 0",
    ],
    [  # 4: per-step training curves of fine-tuning runs (train_loss, lr, grad_norm), for plots
        """CREATE TABLE curves (
            run_key VARCHAR NOT NULL, name VARCHAR NOT NULL, step INTEGER NOT NULL, value DOUBLE,
            PRIMARY KEY (run_key, name, step)
        )""",
    ],
    [  # 5: throughput measurements (`vitbench bench`), one row per (config, mode, runner, data)
        """CREATE TABLE bench (
            bench_id VARCHAR NOT NULL, created_at TIMESTAMP NOT NULL,
            model VARCHAR NOT NULL, arch VARCHAR, res INTEGER NOT NULL,
            mode VARCHAR NOT NULL, runner VARCHAR NOT NULL, data VARCHAR NOT NULL, input_pipeline VARCHAR,
            batch INTEGER NOT NULL, micro_batch INTEGER, activation_checkpointing BOOLEAN,
            precision VARCHAR NOT NULL, compile BOOLEAN NOT NULL, steps INTEGER, warmup_steps INTEGER,
            images_per_second DOUBLE NOT NULL, mfu DOUBLE, peak_memory_bytes BIGINT, flops_per_image BIGINT,
            device VARCHAR, device_name VARCHAR, device_count INTEGER,
            git_sha VARCHAR, vitbench_version VARCHAR, torch_version VARCHAR, timm_version VARCHAR,
            python_version VARCHAR, hostname VARCHAR, command VARCHAR, notes JSON,
            PRIMARY KEY (bench_id, model, res, mode, runner, data)
        )""",
    ],
]
SCHEMA_VERSION = len(MIGRATIONS)
# provenance.environment()'s fields: which code, libraries, host and command produced a number
ENVIRONMENT_COLUMNS = [
    "git_sha",
    "vitbench_version",
    "torch_version",
    "timm_version",
    "python_version",
    "hostname",
    "command",
]
RUN_COLUMNS = [
    "run_key",
    "model",
    "arch",
    "backend",
    "weights",
    "weights_sha256",
    "random_init",
    "dataset",
    "data_source",
    "data_dir",
    "data_fingerprint",
    "data_subset",
    "n_train",
    "n_test",
    "skipped_images",
    "protocol",
    "protocol_version",
    "hparams",
    "seed",
    "shots",
    "status",
    "started_at",
    "finished_at",
    "device",
    "device_name",
    "device_count",
    "device_seconds",
    "flops_per_image",
    "flops",
    *ENVIRONMENT_COLUMNS,
    "notes",
]


CURVE_COLUMNS = ["run_key", "name", "step", "value"]


def shard_dir(results: Path) -> Path:
    return results / "runs"


def _schema_version(con: duckdb.DuckDBPyConnection) -> int:
    exists = con.execute(
        "SELECT count(*) FROM information_schema.tables WHERE table_name = 'schema_version'"
    ).fetchone()
    if not exists or not exists[0]:
        return 0
    row = con.execute("SELECT max(version) FROM schema_version").fetchone()
    return int(row[0] or 0) if row else 0


def _check_not_newer(path: Path, version: int) -> None:
    if version > SCHEMA_VERSION:
        raise UserError(
            f"{path}: written by a newer vitbench (schema {version}; this one knows up to {SCHEMA_VERSION}); "
            "upgrade vitbench or point --results elsewhere. The file was not changed."
        )


def connect(results: Path) -> duckdb.DuckDBPyConnection:
    """Open (creating or migrating) the store for writing. Only the CLI process calls this."""
    path = results / DB_NAME
    results.mkdir(parents=True, exist_ok=True)
    try:
        con = duckdb.connect(str(path))
    except duckdb.Error as e:
        raise UserError(f"{path}: cannot open the results store ({' '.join(str(e).split())[:200]})") from None
    version = _schema_version(con)
    try:
        _check_not_newer(path, version)
    except UserError:
        con.close()
        raise
    _migrate(con, version)
    return con


def _migrate(con: duckdb.DuckDBPyConnection, version: int) -> None:
    """Apply the migrations after `version` in one transaction (0: a new, empty store)."""
    if version >= SCHEMA_VERSION:
        return
    import vitbench

    con.execute("BEGIN TRANSACTION")
    if version == 0:
        con.execute("CREATE TABLE schema_version (version INTEGER, applied_at TIMESTAMP, vitbench_version VARCHAR)")
    for number, steps in enumerate(MIGRATIONS[version:], start=version + 1):
        for sql in steps:
            con.execute(sql)
        con.execute("INSERT INTO schema_version VALUES (?, now(), ?)", [number, vitbench.__version__])
    con.execute("COMMIT")


def ingest(con: duckdb.DuckDBPyConnection, shards: Iterable[Path]) -> int:
    """Merge shards into the store in one transaction; re-ingesting a shard replaces its rows."""
    records = [json.loads(p.read_text()) for p in shards]
    if not records:
        return 0
    con.execute("BEGIN TRANSACTION")
    try:
        for rec in records:
            run = rec["run"]
            con.execute("DELETE FROM metrics WHERE run_key = ?", [run["run_key"]])
            con.execute("DELETE FROM runs WHERE run_key = ?", [run["run_key"]])
            values = [json.dumps(run[c]) if c in ("hparams", "notes") else run.get(c) for c in RUN_COLUMNS]
            con.execute(
                f"INSERT INTO runs ({', '.join(RUN_COLUMNS)}) VALUES ({', '.join('?' * len(RUN_COLUMNS))})", values
            )
            con.executemany(
                "INSERT INTO metrics VALUES (?, ?, ?)", [[run["run_key"], k, v] for k, v in rec["metrics"].items()]
            )
            _replace_curves(con, run["run_key"], rec.get("curves") or {})
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    return len(records)


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


def metric_values(con: duckdb.DuckDBPyConnection, run_keys: list[str], name: str) -> dict[str, float]:
    """{run_key: value} of one metric for the given runs (those that have it)."""
    if not run_keys:
        return {}
    rows = con.execute(
        f"SELECT run_key, value FROM metrics WHERE name = ? AND run_key IN ({', '.join('?' * len(run_keys))})",
        [name, *run_keys],
    ).fetchall()
    return {k: float(v) for k, v in rows}


def shard_metric_values(results: Path, run_keys: list[str], name: str) -> dict[str, float]:
    """`metric_values` from the shards themselves (a cluster worker never opens the database)."""
    found = {}
    for key in run_keys:
        path = shard_dir(results) / f"{key}.json"
        if path.exists():
            value = json.loads(path.read_text())["metrics"].get(name)
            if value is not None:
                found[key] = float(value)
    return found


def shard_keys(results: Path) -> set[str]:
    folder = shard_dir(results)
    return {p.stem for p in folder.glob("*.json")} if folder.is_dir() else set()


def sync(results: Path) -> int:
    """Merge shards the database lacks (cluster workers write only shards): what every reading
    command does first. Skipped while another process holds the database (readers then see the
    shards' snapshot anyway). Returns the number of runs merged."""
    shards = shard_keys(results)
    if not shards:
        return 0
    con = _open_for_reading(results)
    if con is not None:
        try:
            known = done_keys(con) if _schema_version(con) >= 1 else set()
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
    df = _read_table(results, 4, "SELECT * FROM curves ORDER BY run_key, name, step", CURVE_COLUMNS)
    return df if run_keys is None else df[df["run_key"].isin(run_keys)]


def _shard_snapshot(results: Path) -> duckdb.DuckDBPyConnection:
    """An in-memory store built from the shards: what readers see while a `vitbench run` holds the
    database file's write lock (DuckDB lets no other process open it meanwhile). Every finished
    run is in a shard, so tables and plots stay complete; attention distances are not (empty)."""
    con = duckdb.connect()
    _migrate(con, 0)
    folder = shard_dir(results)
    ingest(con, sorted(folder.glob("*.json")) if folder.is_dir() else [])
    return con


def _open_for_reading(results: Path) -> duckdb.DuckDBPyConnection | None:
    """The store opened read-only (None when there is none yet); the shards' snapshot while a run
    is writing to it."""
    path = results / DB_NAME
    if not path.exists():
        return None
    try:
        con = duckdb.connect(str(path), read_only=True)
    except duckdb.IOException as e:
        if "lock" not in str(e).lower():
            raise UserError(f"{path}: cannot read the results store ({' '.join(str(e).split())[:200]})") from None
        return _shard_snapshot(results)
    except duckdb.Error as e:
        raise UserError(f"{path}: cannot read the results store ({' '.join(str(e).split())[:200]})") from None
    try:
        _check_not_newer(path, _schema_version(con))
    except UserError:
        con.close()
        raise
    return con


def _read_table(results: Path, since_version: int, sql: str, columns: list[str]) -> pd.DataFrame:
    """`sql` on the store opened for reading; an empty frame when the store, or the table (added by
    migration `since_version`), is not there yet."""
    con = _open_for_reading(results)
    if con is None:
        return pd.DataFrame(columns=columns)
    try:
        if _schema_version(con) < since_version:
            return pd.DataFrame(columns=columns)
        return con.execute(sql).df()
    finally:
        con.close()


def done_keys(con: duckdb.DuckDBPyConnection) -> set[str]:
    return {r[0] for r in con.execute("SELECT run_key FROM runs WHERE status = 'done'").fetchall()}


def ingest_pending(con: duckdb.DuckDBPyConnection, results: Path) -> int:
    """Shards written (by this or another process) but not yet in the database."""
    folder = shard_dir(results)
    if not folder.is_dir():
        return 0
    known = done_keys(con)
    return ingest(con, [p for p in sorted(folder.glob("*.json")) if p.stem not in known])


def read_results(results: Path) -> pd.DataFrame:
    """Every finished run joined with its metrics (one row per metric), read-only.
    An absent store is an empty frame, never an error."""
    return _read_table(
        results,
        1,
        "SELECT r.*, m.name AS metric, m.value FROM runs r JOIN metrics m USING (run_key) "
        "WHERE r.status = 'done' ORDER BY r.model, r.dataset, r.shots, r.seed",
        [*RUN_COLUMNS, "metric", "value"],
    )


ATTENTION_COLUMNS = [
    "inspect_key",
    "model",
    "weights",
    "weights_sha256",
    "random_init",
    "res",
    "images",
    "images_fingerprint",
    "n_images",
    "layer",
    "head",
    "distance_px",
    "created_at",
    "device_name",
    "git_sha",
    "vitbench_version",
    "torch_version",
    "timm_version",
]


def save_attention_distance(con: duckdb.DuckDBPyConnection, rows: list[dict]) -> None:
    """Replace one inspection's rows (same inspect_key) in one transaction."""
    con.execute("BEGIN TRANSACTION")
    try:
        for key in {r["inspect_key"] for r in rows}:
            con.execute("DELETE FROM attention_distance WHERE inspect_key = ?", [key])
        con.executemany(
            f"INSERT INTO attention_distance VALUES ({', '.join('?' * len(ATTENTION_COLUMNS))})",
            [[r[c] for c in ATTENTION_COLUMNS] for r in rows],
        )
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise


def read_attention_distance(results: Path) -> pd.DataFrame:
    return _read_table(
        results, 2, "SELECT * FROM attention_distance ORDER BY model, inspect_key, layer, head", ATTENTION_COLUMNS
    )


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
    con.execute("BEGIN TRANSACTION")
    try:
        con.executemany(
            f"INSERT INTO bench ({', '.join(BENCH_COLUMNS)}) VALUES ({', '.join('?' * len(BENCH_COLUMNS))})", rows
        )
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise


def read_bench(results: Path) -> pd.DataFrame:
    return _read_table(results, 5, "SELECT * FROM bench ORDER BY created_at, model, res, mode", BENCH_COLUMNS)

"""The store's schema: tables, migrations (applied in order, never edited once released) and the
one transaction helper every writer uses."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import duckdb

from vitbench.errors import UserError
from vitbench.provenance import ANY, DEFAULT_SETTINGS
from vitbench.version import __version__

DB_NAME = "vitbench.duckdb"


def sql_text(text: str) -> str:
    """`text` as an SQL string literal (a quote doubled)."""
    return "'" + text.replace("'", "''") + "'"


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
    [  # 6: near-duplicate audits (`vitbench dedup`): one row per (test split, audited split), and the pairs
        """CREATE TABLE dedup_audits (
            audit_key VARCHAR PRIMARY KEY, created_at TIMESTAMP NOT NULL,
            test_dataset VARCHAR NOT NULL, test_split VARCHAR NOT NULL, test_source VARCHAR NOT NULL,
            test_fingerprint VARCHAR NOT NULL, n_test INTEGER NOT NULL,
            audited_dataset VARCHAR NOT NULL, audited_split VARCHAR NOT NULL, audited_source VARCHAR NOT NULL,
            audited_fingerprint VARCHAR NOT NULL, n_audited INTEGER NOT NULL,
            method JSON NOT NULL, threshold DOUBLE NOT NULL,
            n_pairs INTEGER NOT NULL, n_test_flagged INTEGER NOT NULL, skipped_images INTEGER NOT NULL,
            seconds DOUBLE, images_per_second DOUBLE, data_dir VARCHAR, device_name VARCHAR,
            git_sha VARCHAR, vitbench_version VARCHAR, torch_version VARCHAR, timm_version VARCHAR,
            python_version VARCHAR, hostname VARCHAR, command VARCHAR, notes JSON
        )""",
        """CREATE TABLE dedup_pairs (
            audit_key VARCHAR NOT NULL, test_index INTEGER NOT NULL, test_image VARCHAR NOT NULL,
            duplicate_index INTEGER NOT NULL, duplicate VARCHAR NOT NULL, distance DOUBLE NOT NULL,
            exact BOOLEAN NOT NULL,
            PRIMARY KEY (audit_key, test_index, duplicate_index)
        )""",
    ],
    [  # 7: settings stored under their own names, few-shot's shots among the hparams (shard schema 2); run
        # keys unchanged (provenance.KEYED_AS, KEYED_APART)
        "UPDATE runs SET hparams = json_merge_patch(hparams, json_object('shots', shots)) WHERE shots IS NOT NULL",
        "ALTER TABLE runs DROP COLUMN shots",
        *(
            f"UPDATE runs SET hparams = json_merge_patch(hparams, json_object('{new}', hparams->'$.{old}', '{old}', "
            f"NULL)) WHERE protocol = '{protocol}' AND json_exists(hparams, '$.{old}')"
            for protocol, old, new in (
                ("knn", "k", "knn_k"),
                ("fewshot", "l2", "fewshot_l2"),
                ("linear", "features", "linear_features"),
            )
        ),
    ],
    [  # 8: every setting explicit, the defaults too (`precision: fp32`; shard schema 3); run keys unchanged
        # (provenance.keyed_hparams). Only what is missing is added: a patch of the defaults alone, never
        # the stored hparams as a patch (a JSON merge patch drops the null members of a patch)
        *(
            f"UPDATE runs SET hparams = json_merge_patch(hparams, json_object('{name}', {sql_text(value)})) "
            f"WHERE NOT json_exists(hparams, '$.{name}')" + ("" if protocol == ANY else f" AND protocol = '{protocol}'")
            for protocol, defaults in DEFAULT_SETTINGS.items()
            for name, value in defaults.items()
        ),
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


@contextmanager
def transaction(con: duckdb.DuckDBPyConnection) -> Iterator[duckdb.DuckDBPyConnection]:
    """All of the block's writes, or none of them."""
    con.execute("BEGIN TRANSACTION")
    try:
        yield con
    except BaseException:
        con.execute("ROLLBACK")
        raise
    con.execute("COMMIT")


def schema_version(con: duckdb.DuckDBPyConnection) -> int:
    exists = con.execute(
        "SELECT count(*) FROM information_schema.tables WHERE table_name = 'schema_version'"
    ).fetchone()
    if not exists or not exists[0]:
        return 0
    row = con.execute("SELECT max(version) FROM schema_version").fetchone()
    return int(row[0] or 0) if row else 0


def check_not_newer(path: Path, version: int) -> None:
    if version > SCHEMA_VERSION:
        raise UserError(
            f"{path}: written by a newer vitbench (schema {version}; this one knows up to {SCHEMA_VERSION}); "
            "upgrade vitbench or point --results elsewhere. The file was not changed."
        )


def migrate(con: duckdb.DuckDBPyConnection, version: int, upto: int = SCHEMA_VERSION) -> None:
    """Apply the migrations after `version`, up to `upto` (the newest), in one transaction (0: a new,
    empty store)."""
    if version >= upto:
        return
    with transaction(con):
        if version == 0:
            con.execute("CREATE TABLE schema_version (version INTEGER, applied_at TIMESTAMP, vitbench_version VARCHAR)")
        for number, steps in enumerate(MIGRATIONS[version:upto], start=version + 1):
            for sql in steps:
                con.execute(sql)
            con.execute("INSERT INTO schema_version VALUES (?, now(), ?)", [number, __version__])

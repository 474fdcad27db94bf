"""The results store: shards on disk, merged into one DuckDB file, read by every view.

This package's public API (what the rest of vitbench and users import as `vitbench.store`)."""

from vitbench.store.attention import ATTENTION_COLUMNS, read_attention_distance, save_attention_distance
from vitbench.store.bench import BENCH_COLUMNS, read_bench, save_bench
from vitbench.store.database import (
    StoreLocked,
    connect,
    open_for_reading,
    read_curves,
    read_results,
    read_table,
    rebuild,
    sync,
)
from vitbench.store.dedup import AUDIT_COLUMNS, PAIR_COLUMNS, read_audits, read_pairs, save_audit
from vitbench.store.ingest import done_keys, ingest, ingest_pending, metric_values
from vitbench.store.schema import (
    DB_NAME,
    ENVIRONMENT_COLUMNS,
    MIGRATIONS,
    RUN_COLUMNS,
    SCHEMA_VERSION,
    migrate,
    transaction,
)
from vitbench.store.shards import SHARD_SCHEMA, checkpoint_path, shard_dir, shard_keys, shard_metric_values

__all__ = [
    "ATTENTION_COLUMNS",
    "AUDIT_COLUMNS",
    "PAIR_COLUMNS",
    "read_audits",
    "read_pairs",
    "save_audit",
    "BENCH_COLUMNS",
    "DB_NAME",
    "ENVIRONMENT_COLUMNS",
    "MIGRATIONS",
    "RUN_COLUMNS",
    "SCHEMA_VERSION",
    "SHARD_SCHEMA",
    "StoreLocked",
    "connect",
    "done_keys",
    "ingest",
    "ingest_pending",
    "metric_values",
    "migrate",
    "open_for_reading",
    "read_attention_distance",
    "read_bench",
    "read_curves",
    "read_results",
    "read_table",
    "rebuild",
    "save_attention_distance",
    "save_bench",
    "checkpoint_path",
    "shard_dir",
    "shard_keys",
    "shard_metric_values",
    "sync",
    "transaction",
]

"""The results store: shards on disk, merged into one DuckDB file, read by every view.

This package's public API (what the rest of vitbench and users import as `vitbench.store`), loaded
on first use: DuckDB and pandas cost half a second, which `vitbench --help` and a protocol's
declarations never pay.

May import: what is below it in pyproject.toml's layers (it uses provenance, files, version and
errors; the protocols' registry tells it which metrics are fractions by registering them with it);
never the engine, the protocols or anything above."""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vitbench.store.attention import ATTENTION_COLUMNS, read_attention_distance, save_attention_distance
    from vitbench.store.bench import BENCH_COLUMNS, read_bench, save_bench
    from vitbench.store.database import (
        StoreLocked,
        connect,
        connect_when_free,
        open_for_reading,
        read_curves,
        read_results,
        read_table,
        sync,
    )
    from vitbench.store.dedup import AUDIT_COLUMNS, PAIR_COLUMNS, read_audits, read_pairs, save_audit
    from vitbench.store.merge import StoreUnavailable, done_keys, ingest, ingest_pending, metric_values
    from vitbench.store.rebuilding import rebuild
    from vitbench.store.schema import (
        DB_NAME,
        ENVIRONMENT_COLUMNS,
        MIGRATIONS,
        RUN_COLUMNS,
        SCHEMA_VERSION,
        migrate,
        transaction,
    )
    from vitbench.store.shards import (
        SHARD_SCHEMA,
        checkpoint_path,
        shard_dir,
        shard_keys,
        shard_metric_values,
        stored_before,
    )

# each public name -> the module that defines it
_WHERE = {
    "ATTENTION_COLUMNS": "vitbench.store.attention",
    "read_attention_distance": "vitbench.store.attention",
    "save_attention_distance": "vitbench.store.attention",
    "BENCH_COLUMNS": "vitbench.store.bench",
    "read_bench": "vitbench.store.bench",
    "save_bench": "vitbench.store.bench",
    "StoreLocked": "vitbench.store.database",
    "connect": "vitbench.store.database",
    "connect_when_free": "vitbench.store.database",
    "open_for_reading": "vitbench.store.database",
    "read_curves": "vitbench.store.database",
    "read_results": "vitbench.store.database",
    "read_table": "vitbench.store.database",
    "rebuild": "vitbench.store.rebuilding",
    "sync": "vitbench.store.database",
    "AUDIT_COLUMNS": "vitbench.store.dedup",
    "PAIR_COLUMNS": "vitbench.store.dedup",
    "read_audits": "vitbench.store.dedup",
    "read_pairs": "vitbench.store.dedup",
    "save_audit": "vitbench.store.dedup",
    "StoreUnavailable": "vitbench.store.merge",
    "done_keys": "vitbench.store.merge",
    "ingest": "vitbench.store.merge",
    "ingest_pending": "vitbench.store.merge",
    "metric_values": "vitbench.store.merge",
    "DB_NAME": "vitbench.store.schema",
    "ENVIRONMENT_COLUMNS": "vitbench.store.schema",
    "MIGRATIONS": "vitbench.store.schema",
    "RUN_COLUMNS": "vitbench.store.schema",
    "SCHEMA_VERSION": "vitbench.store.schema",
    "migrate": "vitbench.store.schema",
    "transaction": "vitbench.store.schema",
    "SHARD_SCHEMA": "vitbench.store.shards",
    "checkpoint_path": "vitbench.store.shards",
    "shard_dir": "vitbench.store.shards",
    "shard_keys": "vitbench.store.shards",
    "stored_before": "vitbench.store.shards",
    "shard_metric_values": "vitbench.store.shards",
}


def __getattr__(name: str) -> Any:
    # (no public name is also a module's: a submodule, once imported, would shadow it)
    if name in _WHERE:
        return getattr(import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'vitbench.store' has no attribute {name!r}")


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
    "StoreUnavailable",
    "connect",
    "connect_when_free",
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
    "stored_before",
    "shard_metric_values",
    "sync",
    "transaction",
]

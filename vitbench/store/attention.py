"""Mean attention distances per layer and head (`vitbench inspect`), with their provenance."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pandas as pd

from vitbench.store.database import read_table
from vitbench.store.schema import transaction

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
    with transaction(con):
        for key in {r["inspect_key"] for r in rows}:
            con.execute("DELETE FROM attention_distance WHERE inspect_key = ?", [key])
        con.executemany(
            f"INSERT INTO attention_distance VALUES ({', '.join('?' * len(ATTENTION_COLUMNS))})",
            [[r[c] for c in ATTENTION_COLUMNS] for r in rows],
        )


def read_attention_distance(results: Path) -> pd.DataFrame:
    return read_table(
        results, 2, "SELECT * FROM attention_distance ORDER BY model, inspect_key, layer, head", ATTENTION_COLUMNS
    )

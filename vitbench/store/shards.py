"""Result shards: `runs/<run_key>.json`, one per finished run, written atomically by whoever ran
it. They are the store's source of truth; the database is their merged index."""

from __future__ import annotations

import json
from pathlib import Path


def shard_dir(results: Path) -> Path:
    return results / "runs"


def shard_keys(results: Path) -> set[str]:
    folder = shard_dir(results)
    return {p.stem for p in folder.glob("*.json")} if folder.is_dir() else set()


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

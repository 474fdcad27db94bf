"""A lab-sized results folder for the store benchmarks: copies of one real few-shot shard (the
committed legacy store's, brought to the current protocol version) under distinct run keys,
models, weights, datasets, shots and seeds, as a sweep of checkpoints × datasets × shots × seeds
leaves them."""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

from vitbench.protocols.fewshot import FEWSHOT

TEMPLATE = (
    Path(__file__).resolve().parents[1]
    / "tests"
    / "data"
    / "store_v0_1"
    / "runs"
    / "581e4f3734d310da331322a390b1e6eb6215080bd15e4ce768efcc76afd80e6f.json"
)
MODELS = ("vit-ti/16", "vit-s/16", "vit-b/16", "vit-b/32", "vit-l/16", "deit-ti/16", "deit-s/16", "deit-b/16")
DATASETS = (
    "cifar10", "cifar100", "pets", "flowers102", "imagenet",
    *(f"vtab/{t}" for t in ("caltech101", "dtd", "eurosat", "resisc45", "svhn", "dsprites_location")),
)  # fmt: skip
SHOTS = (1, 5, 10, 25)
CHECKPOINTS = 5  # weights per model (a checkpoint sweep)


def template() -> dict:
    record = json.loads(TEMPLATE.read_text())
    record["run"]["protocol_version"] = FEWSHOT.version
    record["schema"] = 1
    return record


def shard_text(record: dict, i: int) -> tuple[str, str]:
    """(run_key, shard JSON) of the i-th synthetic run: model, checkpoint, dataset and shots cycle
    fastest, then the seed grows, so that every n-run prefix is a complete-looking sweep."""
    per_seed = len(MODELS) * CHECKPOINTS * len(DATASETS) * len(SHOTS)
    seed, rest = divmod(i, per_seed)
    rest, shots = divmod(rest, len(SHOTS))
    rest, dataset = divmod(rest, len(DATASETS))
    model, checkpoint = divmod(rest, CHECKPOINTS)
    weights = f"ckpt/{MODELS[model].replace('/', '')}-step{(checkpoint + 1) * 1000}.safetensors"
    key = hashlib.sha256(f"{MODELS[model]}|{weights}|{DATASETS[dataset]}|{SHOTS[shots]}|{seed}".encode()).hexdigest()
    run = {
        **record["run"],
        "run_key": key,
        "model": MODELS[model],
        "weights": weights,
        "weights_sha256": hashlib.sha256(weights.encode()).hexdigest(),
        "random_init": False,
        "dataset": DATASETS[dataset],
        "shots": SHOTS[shots],
        "seed": seed,
    }
    accuracy = random.Random(key).uniform(0.2, 0.9)
    return key, json.dumps({**record, "run": run, "metrics": {"accuracy": accuracy}})


def write_shards(folder: Path, n: int, start: int = 0) -> list[Path]:
    """Shards start..start+n-1 under `folder`/runs (the layout `--results` expects)."""
    runs = folder / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    record, paths = template(), []
    for i in range(start, start + n):
        key, text = shard_text(record, i)
        path = runs / f"{key}.json"
        path.write_text(text)
        paths.append(path)
    return paths


def write_predicted_runs(folder: Path, rows: int, models: tuple[str, ...] = ("vit-b/16", "vit-l/16")) -> list[str]:
    """One few-shot run per model on the same `rows` test images, each with its per-image predictions
    kept as a run keeps them (`runs/<key>.predictions.parquet`, named with its sha256 and row count in
    the shard's notes): top-1 right for about 70 % and 72 % of the images, 1,000 classes, top-5 kept.
    DuckDB writes the rows from a range, so that 10M of them take seconds and no memory here."""
    from vitbench.provenance import sha256_file
    from vitbench.store import duck

    runs = folder / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    record, keys = template(), []
    for i, model in enumerate(models):
        key = hashlib.sha256(f"predicted|{model}|{rows}".encode()).hexdigest()
        path = runs / f"{key}.predictions.parquet"
        right = 0.70 + 0.02 * i
        con = duck.connect()
        con.execute("SET enable_progress_bar = false")
        con.execute(f"""
            COPY (
                SELECT 'val/' || lpad(CAST(r AS VARCHAR), 9, '0') || '.JPEG' AS id, label, top1,
                       [top1, (top1 + 1) % 1000, (top1 + 2) % 1000, (top1 + 3) % 1000, (top1 + 4) % 1000] AS topk,
                       top1 = label AS correct
                FROM (SELECT r, r % 1000 AS label,
                             CASE WHEN hash(r, {i}) % 10000 < {round(right * 10000)} THEN r % 1000
                                  ELSE (r + 1) % 1000 END AS top1
                      FROM range({rows}) t(r))
            ) TO '{path}' (FORMAT parquet)""")
        con.close()
        predictions = {"file": path.name, "sha256": sha256_file(path), "rows": rows}
        run = {
            **record["run"], "run_key": key, "model": model, "weights": f"{model.replace('/', '')}.npz",
            "weights_sha256": hashlib.sha256(model.encode()).hexdigest(), "random_init": False,
            "dataset": "imagenet", "shots": 10, "seed": 0, "n_test": rows,
            "notes": {**record["run"]["notes"], "predictions": predictions},
        }  # fmt: skip
        (runs / f"{key}.json").write_text(json.dumps({**record, "run": run, "metrics": {"accuracy": right}}))
        keys.append(key)
    return keys

"""Cost growth of the store (`nox -s bench`): ingest, `vitbench table` and `report` at 1k / 10k / 100k runs,
each against its baseline measured in the same run, alternately round by round:

- ingest: merging the shards into a new database, against `json.load` of the same shards in one
  Python process (the least any reader of them must do);
- table: `vitbench table` as a person types it (a fresh interpreter), against a fresh interpreter
  that only imports duckdb, pandas, typer and rich;
- report: `vitbench report` (every section), against `vitbench table` on the same store.

With `--benchmark-disable` (CI) only the 1k case runs, once: it must keep working."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from synthetic_store import write_shards

from vitbench import store

SIZES = (1_000, 10_000, 100_000)
LIGHT_BASELINE = "import duckdb, pandas, typer, rich"


@pytest.fixture(scope="module", params=SIZES, ids=lambda n: f"{n}-runs")
def shards(request, tmp_path_factory) -> Path:
    """A results folder of n shards (no database yet)."""
    n = request.param
    if n > SIZES[0] and request.config.getoption("benchmark_disable"):
        pytest.skip("CI runs each benchmark once: the smallest store shows it works")
    folder = tmp_path_factory.mktemp(f"store-{n}") / "results"
    write_shards(folder, n)
    return folder


def alternate(benchmark, runners: dict, rounds: int) -> dict[str, float]:
    """Median seconds of each runner, timed one after the other, who goes first alternating."""
    times: dict[str, list[float]] = {name: [] for name in runners}

    def each_once():
        names = list(runners) if len(next(iter(times.values()))) % 2 == 0 else list(runners)[::-1]
        for name in names:
            start = time.perf_counter()
            runners[name]()
            times[name].append(time.perf_counter() - start)

    benchmark.pedantic(each_once, rounds=rounds, warmup_rounds=0)
    return {name: float(np.median(values)) for name, values in times.items()}


def report(benchmark, capsys, label: str, medians: dict[str, float], runs: int) -> None:
    ours, base = medians["vitbench"], medians["baseline"]
    benchmark.extra_info.update(runs=runs, vitbench_s=ours, baseline_s=base, ratio=ours / base, over_s=ours - base)
    with capsys.disabled():
        print(f"\n  {label} {runs:,} runs: vitbench {ours:.2f} s, baseline {base:.2f} s, "
              f"ratio {ours / base:.2f}, difference {ours - base:+.2f} s")  # fmt: skip


def test_ingest_against_json_load(benchmark, shards, capsys):
    benchmark.group = "store: ingest of n shards into a new database, against json.load of them"
    paths = sorted(store.shard_dir(shards).glob("*.json"))

    def ingest():
        for name in (store.DB_NAME, f"{store.DB_NAME}.wal"):
            (shards / name).unlink(missing_ok=True)
        assert store.sync(shards, strict=True) == len(paths)

    def json_load():
        for path in paths:
            with open(path, "rb") as f:
                json.load(f)

    medians = alternate(benchmark, {"vitbench": ingest, "baseline": json_load}, rounds=3)
    report(benchmark, capsys, "ingest", medians, len(paths))


def test_table_against_the_light_imports(benchmark, shards, capsys):
    benchmark.group = "store: `vitbench table` over n runs, against importing duckdb, pandas, typer, rich"
    if not (shards / store.DB_NAME).exists():
        store.sync(shards, strict=True)
    vitbench = [sys.executable, "-m", "vitbench", "table", "--results", str(shards)]
    env = {**os.environ, "COLUMNS": "200"}

    def table():
        done = subprocess.run(vitbench, capture_output=True, text=True, env=env)
        assert done.returncode == 0 and "Table 2 layout" in done.stdout, done.stderr[-500:]

    def light():
        subprocess.run([sys.executable, "-c", LIGHT_BASELINE], check=True)

    medians = alternate(benchmark, {"vitbench": table, "baseline": light}, rounds=5)
    report(benchmark, capsys, "table", medians, len(list(store.shard_dir(shards).glob("*.json"))))


def test_help_against_the_light_imports(benchmark, capsys):
    benchmark.group = "cli: `vitbench --help`, against importing duckdb, pandas, typer, rich"

    def help_():
        subprocess.run([sys.executable, "-m", "vitbench", "--help"], check=True, capture_output=True)

    def light():
        subprocess.run([sys.executable, "-c", LIGHT_BASELINE], check=True)

    medians = alternate(benchmark, {"vitbench": help_, "baseline": light}, rounds=7)
    report(benchmark, capsys, "--help", medians, 0)


def test_report_against_table(benchmark, shards, capsys):
    """The whole page (summary, every protocol's views and figures, provenance) against `vitbench
    table`, the one view a person would otherwise read: both fresh interpreters on the same store."""
    benchmark.group = "store: `vitbench report` over n runs, against `vitbench table`"
    if not (shards / store.DB_NAME).exists():
        store.sync(shards, strict=True)
    page = shards.parent / "report.html"
    env = {**os.environ, "COLUMNS": "200"}

    def report_():
        done = subprocess.run([sys.executable, "-m", "vitbench", "report", "--out", str(page), "--results",
                               str(shards)], capture_output=True, text=True, env=env)  # fmt: skip
        assert done.returncode == 0 and '<section id="summary">' in page.read_text(), done.stderr[-500:]

    def table():
        done = subprocess.run([sys.executable, "-m", "vitbench", "table", "--results", str(shards)],
                              capture_output=True, text=True, env=env)  # fmt: skip
        assert done.returncode == 0, done.stderr[-500:]

    medians = alternate(benchmark, {"vitbench": report_, "baseline": table}, rounds=3)
    report(benchmark, capsys, "report", medians, len(list(store.shard_dir(shards).glob("*.json"))))

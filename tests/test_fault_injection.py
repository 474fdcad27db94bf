"""SIGKILL at random moments: `vitbench run` killed again and again (seeded moments: while torch
imports, while features are extracted, solved, written as shards or merged into the database),
then run to the end, stores each run exactly once, with the metrics of a run never interrupted.
VITBENCH_FAULT_ITERATIONS (default 3 in CI) and VITBENCH_FAULT_SEED set the loop."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vitbench import store

RUN = ("run", "--model", "vit-ti/16", "--weights", "random", "--dataset", "digits", "--res", "32", "--workers", "0",
       "--shots", "1,5", "--seeds", "0,1")  # fmt: skip


def _command(results: Path) -> list[str]:
    return [sys.executable, "-m", "vitbench", *RUN, "--results", str(results)]


def _metrics(results: Path) -> dict[str, dict[str, float]]:
    rows = store.read_results(results)
    return {k: dict(zip(p["metric"], p["value"], strict=True)) for k, p in rows.groupby("run_key")}


@pytest.mark.slow
def test_sigkill_at_random_moments_stores_each_run_once_as_if_never_interrupted(tmp_path):
    reference = tmp_path / "reference"
    started = time.monotonic()
    done = subprocess.run(_command(reference), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    lasts = time.monotonic() - started  # the kills land anywhere in a run's life, not after its end
    expected = _metrics(reference)
    assert len(expected) == 4

    results = tmp_path / "killed"
    rng = random.Random(int(os.environ.get("VITBENCH_FAULT_SEED", "0")))
    for _ in range(int(os.environ.get("VITBENCH_FAULT_ITERATIONS", "3"))):
        process = subprocess.Popen(_command(results), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(1.0, max(lasts, 2.0)))
        process.send_signal(signal.SIGKILL)
        process.wait()

    final = subprocess.run(_command(results), capture_output=True, text=True, timeout=600)
    assert final.returncode == 0, final.stderr
    assert sorted(p.stem for p in (results / "runs").glob("*.json")) == sorted(expected)  # one shard per run
    con = store.connect(results)
    try:
        rows = con.execute("SELECT run_key, count(*) FROM runs GROUP BY run_key").fetchall()
    finally:
        con.close()
    assert sorted(rows) == sorted((key, 1) for key in expected)  # each run stored exactly once
    assert _metrics(results) == expected  # with the numbers of the uninterrupted run
    assert not (results / "quarantine").exists()

"""Pricing a large plan takes less than the plan (`nox -s bench`; issue 89, item 11: a 10,000-run
dry run took 103 s to price 49 s of work, a 100,000-run one said nothing for 300 s: each run's key
was made 28 times through `dataclasses.asdict`'s deep copy, the shared extraction was charged by a
list lookup per run, and rich printed each plan line on its own).

Few-shot on scikit-learn's digits, 100 shot counts x 100 and x 1,000 seeds, dry-run in a fresh
process as typed: the command's whole wall time (start-up included) must be below the time it
prices, for both. With `--benchmark-disable` (CI) 1,000 runs, dry-run, and no ratio asserted."""

from __future__ import annotations

import re
import subprocess
import sys
import time

UNITS = {"s": 1, "min": 60, "h": 3600, "days": 86400}


def _priced_seconds(stdout: str) -> float:
    found = re.search(r"run\(s\) to do, estimated time (< 1 s|[\d.]+ (?:s|min|h|days))", stdout)
    assert found, stdout[-2000:]
    said = found.group(1)
    if said == "< 1 s":
        return 0.5
    number, unit = said.split()
    return float(number) * UNITS[unit]


def _dry_run(tmp_path, shots: int, seeds: int) -> tuple[float, float]:
    command = [sys.executable, "-m", "vitbench", "run", "--model", "vit-ti/16", "--weights", "random",
               "--dataset", "digits", "--res", "32", "--workers", "0", "--shots",
               ",".join(map(str, range(1, shots + 1))), "--seeds", ",".join(map(str, range(seeds))),
               "--results", str(tmp_path / f"plan-{shots}x{seeds}"), "--dry-run"]  # fmt: skip
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    took = time.monotonic() - started
    assert done.returncode == 0, done.stderr[-2000:]
    assert len(done.stdout.splitlines()) >= shots * seeds  # a line per run
    return took, _priced_seconds(done.stdout)


def test_a_large_plan_is_priced_in_less_time_than_it_prices(tmp_path, request):
    plans = [(10, 100)] if request.config.getoption("benchmark_disable") else [(100, 100), (100, 1000)]
    for shots, seeds in plans:
        took, priced = _dry_run(tmp_path, shots, seeds)
        print(f"\n{shots * seeds:,} runs: dry run {took:.1f} s, pricing {priced:.0f} s of work ({took / priced:.2f}x)")
        if len(plans) > 1:
            assert took < priced, (shots * seeds, took, priced)

"""The dry run's price against the run it prices (`nox -s bench`): the README's two runnable
examples on this machine — the demo (`vitbench run`) and DeiT-Ti few-shot on the shared CIFAR-10
subset — each dry-run twice (the same estimate both times), then run, each command a process of
its own as typed; the run's wall time must lie within 2x of the estimate. With
`--benchmark-disable` (CI) only the demo's dry run happens: no training, no ratio."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
WEIGHTS = SHARED / "weights" / "deit_tiny_patch16_224.safetensors"
EXAMPLES = {
    "demo": [],
    "fewshot": [
        "--model",
        "deit-ti/16",
        "--weights",
        str(WEIGHTS),
        "--dataset",
        "cifar10",
        "--data-dir",
        str(SHARED),
        "--protocol",
        "fewshot",
    ],  # fmt: skip
}
SECONDS = {"s": 1, "min": 60, "h": 3600, "days": 86400}


def vitbench(*args) -> tuple[int, str]:
    """`vitbench ARGS` as a person types it: a process of its own (its start-up is part of the wait)."""
    done = subprocess.run([sys.executable, "-m", "vitbench", *map(str, args)], capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "1000"})  # fmt: skip
    return done.returncode, done.stdout + done.stderr


def dry_run(args: list[str], results: Path) -> tuple[float, str]:
    code, out = vitbench("run", *args, "--results", results, "--dry-run")
    assert code == 0, out
    line = next(x for x in out.splitlines() if "estimated device time" in x)
    value, unit = re.search(r"estimated device time ([\d.]+) (s|min|h|days)", line).groups()
    return float(value) * SECONDS[unit], line


@pytest.mark.parametrize("example", sorted(EXAMPLES))
def test_the_dry_runs_estimate_is_within_twice_the_run(benchmark, example, tmp_path, capsys):
    if example == "fewshot" and not WEIGHTS.exists():
        pytest.skip("../shared/data is not present")
    if benchmark.disabled and example != "demo":
        pytest.skip("--benchmark-disable: the demo's dry run alone keeps the path working")
    results = tmp_path / "results"
    estimate, first = dry_run(EXAMPLES[example], results)
    assert estimate > 0
    if benchmark.disabled:
        return
    assert dry_run(EXAMPLES[example], results)[1] == first  # the kept rate: the same estimate

    def real():
        start = time.perf_counter()
        code, out = vitbench("run", *EXAMPLES[example], "--results", results)
        assert code == 0, out
        return time.perf_counter() - start

    took = benchmark.pedantic(real, rounds=1, iterations=1)
    took = benchmark.stats.stats.max if took is None else took
    ratio = took / estimate
    with capsys.disabled():
        print(f"\n{example}: estimated {estimate:.0f} s, ran {took:.0f} s (run / estimate {ratio:.2f})")
    assert 0.5 <= ratio <= 2.0, (estimate, took)

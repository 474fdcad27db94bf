"""The dry run's price against the run it prices (`nox -s bench`): the README's two runnable
examples on this machine — the demo (`vitbench run`) and DeiT-Ti few-shot on the shared CIFAR-10
subset — each dry-run twice (the same estimate both times), then run; the run's wall time must lie
within 2x of the estimate. With `--benchmark-disable` (CI) only the demo's dry runs happen: no
training, no ratio."""

from __future__ import annotations

import re
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


def dry_run(cli, args: list[str], results: Path) -> tuple[float, str]:
    code, out, _ = cli("run", *args, "--results", str(results), "--dry-run")
    assert code == 0, out
    line = next(x for x in out.splitlines() if "estimated device time" in x)
    value, unit = re.search(r"estimated device time ([\d.]+) (s|min|h|days)", line).groups()
    return float(value) * SECONDS[unit], line


@pytest.mark.parametrize("example", sorted(EXAMPLES))
def test_the_dry_runs_estimate_is_within_twice_the_run(benchmark, example, cli, tmp_path, capsys):
    if example == "fewshot" and not WEIGHTS.exists():
        pytest.skip("../shared/data is not present")
    if benchmark.disabled and example != "demo":
        pytest.skip("--benchmark-disable: the demo's dry run alone keeps the path working")
    results = tmp_path / "results"
    estimate, first = dry_run(cli, EXAMPLES[example], results)
    assert estimate > 0
    if benchmark.disabled:
        return
    assert dry_run(cli, EXAMPLES[example], results)[1] == first  # the kept rate: the same estimate

    def real():
        start = time.perf_counter()
        assert cli("run", *EXAMPLES[example], "--results", str(results))[0] == 0
        return time.perf_counter() - start

    took = benchmark.pedantic(real, rounds=1, iterations=1)
    took = benchmark.stats.stats.max if took is None else took
    ratio = took / estimate
    with capsys.disabled():
        print(f"\n{example}: estimated {estimate:.0f} s, ran {took:.0f} s (run / estimate {ratio:.2f})")
    assert 0.5 <= ratio <= 2.0, (estimate, took)


@pytest.fixture
def cli(capsys, monkeypatch):
    """`vitbench ARGS` in-process, as tests/conftest.py's fixture runs it (benchmarks do not see that conftest)."""
    import sys

    from vitbench import cli as cli_module

    for console in (cli_module.out, cli_module.err):
        monkeypatch.setattr(console, "width", 1000)

    def run(*args: str) -> tuple[int, str, str]:
        monkeypatch.setattr(sys, "argv", ["vitbench", *map(str, args)])
        with pytest.raises(SystemExit) as exit_info:
            cli_module.main()
        captured = capsys.readouterr()
        return int(exit_info.value.code or 0), captured.out, captured.err

    return run

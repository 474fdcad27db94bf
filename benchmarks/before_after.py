"""Before and after on one machine, in one run: `vitbench --help`, `vitbench ingest` and `vitbench
table` over n synthetic shards, for an older checkout and this one, beside their baselines.

    git worktree add /tmp/old 92d8bc2
    python benchmarks/before_after.py /tmp/old /tmp/before-after 20000

Each command runs in a fresh interpreter, as a person types it (`python -m vitbench`, with
PYTHONPATH pointing at the checkout, plugins/ as vitbench_plugins)."""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from synthetic_store import write_shards

HERE = Path(__file__).resolve().parents[1]


def pythonpath(checkout: Path, scratch: Path) -> str:
    """The checkout's vitbench, and its plugins/ importable as vitbench_plugins (as an install maps it)."""
    link = scratch / f"plugins-{abs(hash(str(checkout)))}"
    link.mkdir(parents=True, exist_ok=True)
    if not (link / "vitbench_plugins").exists():
        (link / "vitbench_plugins").symlink_to(checkout / "plugins")
    return f"{checkout}{os.pathsep}{link}"


def timed(command: list[str], env: dict | None = None) -> float:
    """Seconds of one command, run from a neutral folder (`python -m` puts the current one first on sys.path)."""
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tempfile.gettempdir())
    assert done.returncode == 0, done.stderr[-500:]
    return time.perf_counter() - start


def main(old: Path, root: Path, n: int) -> None:
    template = root / "template"
    if not (template / "runs").exists():
        write_shards(template, n)
    paths = sorted((template / "runs").glob("*.json"))
    found = {"light imports": statistics.median(timed([sys.executable, "-c", "import duckdb, pandas, typer, rich"])
                                                for _ in range(5))}  # fmt: skip
    loads = []
    for _ in range(2):
        start = time.perf_counter()
        for path in paths:
            with open(path, "rb") as f:
                json.load(f)
        loads.append(time.perf_counter() - start)
    found["json.load of the shards"] = min(loads)
    scratch = Path(tempfile.mkdtemp())
    for name, checkout in (("before", old), ("after", HERE)):
        env = {**os.environ, "PYTHONPATH": pythonpath(checkout, scratch), "COLUMNS": "200"}
        vitbench = [sys.executable, "-m", "vitbench"]
        found[f"{name}: --help"] = statistics.median(timed([*vitbench, "--help"], env) for _ in range(5))
        folder = root / name
        shutil.rmtree(folder, ignore_errors=True)
        shutil.copytree(template, folder)
        found[f"{name}: ingest"] = timed([*vitbench, "ingest", "--results", str(folder)], env)
        table = [*vitbench, "table", "--results", str(folder)]
        found[f"{name}: table"] = statistics.median(timed(table, env) for _ in range(3))
    for what, seconds in found.items():
        print(f"{what:28s} {seconds:8.2f} s")


if __name__ == "__main__":
    main(Path(sys.argv[1]).resolve(), Path(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else 20_000)

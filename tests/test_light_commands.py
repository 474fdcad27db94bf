"""Commands that only read results, list or explain answer at once: none of them imports torch,
timm or torchvision (seconds of import), only the figure commands import matplotlib, and only those
that read a table or the store import pandas and DuckDB (half a second: `vitbench --help` took 1.6 s
under load with them). Each command runs in a fresh interpreter, as a person's shell runs it, and
reports `sys.modules` after."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HEAVY = ("torch", "timm", "torchvision", "matplotlib", "pandas", "duckdb")
PROBE = f"""
import json, sys
from vitbench.cli import main
sys.argv = ["vitbench", *json.loads(sys.argv[1])]
try:
    main()
except SystemExit as e:
    code = e.code
else:
    code = 0
print("\\nMODULES " + json.dumps([m for m in {HEAVY} if m in sys.modules]))
sys.exit(code or 0)
"""


def light_commands(results: Path, out: Path) -> dict[str, tuple[list[str], set[str]]]:
    """name -> (argv, heavy modules it may import)."""
    r = ["--results", str(results)]
    tables = {"pandas"}  # the paper's tables (ls models), scikit-learn's digits (doctor)
    store = {"pandas", "duckdb"}
    figures = {"matplotlib", *store}
    return {
        "--help": (["--help"], set()),
        "run --help": (["run", "--help"], set()),
        "bench --help": (["bench", "--help"], set()),
        "inspect --help": (["inspect", "--help"], set()),
        "ls models": (["ls", "models"], tables),
        "ls datasets": (["ls", "datasets"], set()),
        "ls protocols": (["ls", "protocols"], set()),
        "ls suites": (["ls", "suites"], set()),
        "doctor": (["doctor"], tables),
        "table": (["table", *r], store),
        "table --ci": (["table", "--ci", "--protocol", "fewshot", *r], store),
        "table --shots 1 --format md": (["table", "--shots", "1", "--format", "md", *r], store),
        "export": (["export", "--format", "csv", "--out", str(out / "runs.csv"), *r], store),
        "compare": (["compare", "seed=0", "seed=0", *r], store),
        "ingest": (["ingest", *r], store),
        "report": (["report", "--out", str(out / "report.html"), *r], figures),
        "plot fewshot": (["plot", "fewshot", "--out", str(out / "plots"), *r], figures),
    }


@pytest.fixture(scope="module")
def probed(one_run, tmp_path_factory) -> dict[str, tuple[int, list[str], str]]:
    """Every light command run once, two at a time (the machine's cores), on a copy of a real store."""
    base = tmp_path_factory.mktemp("light")
    results = base / "results"
    shutil.copytree(one_run, results)
    commands = light_commands(results, base)
    env = {**os.environ, "COLUMNS": "200"}
    found: dict[str, tuple[int, list[str], str]] = {}
    names = list(commands)
    for start in range(0, len(names), 2):
        running = {
            name: subprocess.Popen(
                [sys.executable, "-c", PROBE, json.dumps(commands[name][0])],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
            )  # fmt: skip
            for name in names[start : start + 2]
        }
        for name, proc in running.items():
            stdout, stderr = proc.communicate(timeout=120)
            line = next((x for x in stdout.splitlines() if x.startswith("MODULES ")), "MODULES null")
            found[name] = (proc.returncode, json.loads(line.removeprefix("MODULES ")), stderr)
    return found


@pytest.mark.parametrize("name", list(light_commands(Path("r"), Path("o"))))
def test_a_light_command_imports_no_engine(probed, name):
    code, modules, stderr = probed[name]
    allowed = light_commands(Path("r"), Path("o"))[name][1]
    assert code == 0, f"vitbench {name} failed: {stderr[-800:]}"
    assert modules is not None, f"vitbench {name} did not report its modules: {stderr[-800:]}"
    assert set(modules) <= allowed, f"vitbench {name} imported {sorted(set(modules) - allowed)}"


def test_the_probe_sees_heavy_imports(tmp_path):
    """The probe is not blind: a command that builds a model reports torch and timm."""
    weights = tmp_path / "w"
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(["weights", "inspect", str(weights)])],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    line = next(x for x in proc.stdout.splitlines() if x.startswith("MODULES "))
    assert proc.returncode == 2 and "torch" in json.loads(line.removeprefix("MODULES "))

"""A results folder written by the vitbench before the protocol redesign is read, skipped and tabled
by today's: its run keys are planned again, nothing is re-run, and the tables are the same."""

import re
import shutil
from pathlib import Path

import pytest

LEGACY = Path(__file__).parent / "data" / "store_v0_1"
COMMON = ("--model", "vit-ti/16", "--weights", "random", "--dataset", "digits", "--res", "32", "--workers", "0")
COMMANDS = [
    ("--shots", "1,5", "--seeds", "0"),
    ("--shots", "5", "--seeds", "1", "--fewshot-l2", "sweep"),
    ("--protocol", "finetune", "--smoke", "--steps", "2", "--lr", "0.01", "--seeds", "0"),
]


@pytest.fixture
def legacy(tmp_path: Path) -> Path:
    results = tmp_path / "results"
    shutil.copytree(LEGACY / "runs", results / "runs")
    return results


def test_the_database_is_rebuilt_from_old_shards(cli, legacy):
    code, out, _ = cli("ingest", "--results", legacy)
    assert code == 0 and "merged 4 new run(s)" in out


def test_old_runs_are_planned_with_the_same_keys_and_skipped(cli, legacy):
    """The few-shot runs keep their keys. The fine-tune smoke run was finetune/1: its protocol has
    been bumped since (finetune/2, TensorFlow's inception crop), so it plans anew, as a new key."""
    stored = {p.stem[:12] for p in (legacy / "runs").glob("*.json")}
    planned = set()
    for command in COMMANDS[:2]:
        code, out, err = cli("run", *COMMON, *command, "--results", legacy, "--dry-run")
        assert code == 0, err
        rows = [line for line in out.splitlines() if re.match(r"^[0-9a-f]{12}  ", line)]
        assert rows and all(line.rstrip().endswith("done") for line in rows), out
        planned |= {line[:12] for line in rows}
    code, out, err = cli("run", *COMMON, *COMMANDS[2], "--results", legacy, "--dry-run")
    (finetune,) = [line for line in out.splitlines() if re.match(r"^[0-9a-f]{12}  ", line)]
    assert finetune.rstrip().endswith("todo") and finetune[:12] not in stored
    assert planned | {"b3fa5a1cd5b6"} == stored  # the finetune/1 shard
    code, _, err = cli("run", *COMMON, *COMMANDS[0], "--results", legacy)
    assert code == 0 and "0 to run" in err


@pytest.mark.parametrize("args,golden", [((), "table.md"), (("--protocol", "fewshot"), "table_fewshot.md")])
def test_old_results_render_the_same_tables(cli, legacy, args, golden):
    code, out, _ = cli("table", *args, "--format", "md", "--results", legacy)
    assert code == 0
    assert out == (LEGACY / golden).read_text()

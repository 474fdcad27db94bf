"""A results folder written by the vitbench before the protocol redesign is read and tabled by
today's: the tables are the same, and runs of protocols bumped since plan anew beside the old ones."""

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


def test_old_runs_are_kept_and_bumped_protocols_plan_anew(cli, legacy):
    """Every protocol of the old shards has been bumped since (fewshot-lsr/3: big_vision's resize
    without antialiasing; finetune/3: TF's resize), so the same commands plan new keys and run
    them; the old runs stay stored and the tables show both versions side by side, never merged."""
    stored = {p.stem[:12] for p in (legacy / "runs").glob("*.json")}
    for command in COMMANDS:
        code, out, err = cli("run", *COMMON, *command, "--results", legacy, "--dry-run")
        assert code == 0, err
        rows = [line for line in out.splitlines() if re.match(r"^[0-9a-f]{12}  ", line)]
        assert rows and all(" todo" in line and " done" not in line and line[:12] not in stored for line in rows), out
    code, _, err = cli("run", *COMMON, *COMMANDS[0], "--results", legacy)
    assert code == 0 and "2 to run" in err
    code, md, _ = cli("table", "--protocol", "fewshot", "--shots", "5", "--format", "md", "--results", legacy)
    header = md.splitlines()[2]
    # two columns, never averaged
    assert "| 5-shot · fewshot-lsr/2 · l2=1024† |" in header and "| 5-shot · fewshot-lsr/3† |" in header
    assert {p.stem[:12] for p in (legacy / "runs").glob("*.json")} > stored  # nothing old was replaced


@pytest.mark.parametrize("args,golden", [((), "table.md"), (("--protocol", "fewshot"), "table_fewshot.md")])
def test_old_results_render_the_same_tables(cli, legacy, args, golden):
    code, out, _ = cli("table", *args, "--format", "md", "--results", legacy)
    assert code == 0
    assert out == (LEGACY / golden).read_text()

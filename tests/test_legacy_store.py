"""A results folder written by the vitbench before the protocol redesign is read and tabled by
today's: the tables are the same, and runs of protocols bumped since plan anew beside the old ones."""

import json
import re
import shutil
from dataclasses import fields
from pathlib import Path

import duckdb
import pytest

from vitbench import store
from vitbench.protocols.base import RunSpec
from vitbench.provenance import explicit_hparams
from vitbench.store.schema import MIGRATIONS
from vitbench.store.shards import read_shards

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
    # two columns, never averaged; λ differs among the stored runs, so every column names it
    assert "| 5-shot · fewshot-lsr/2 · fewshot_l2=1024 |" in header
    assert "| 5-shot · fewshot-lsr/3 · fewshot_l2=1024 |" in header
    assert {p.stem[:12] for p in (legacy / "runs").glob("*.json")} > stored  # nothing old was replaced


@pytest.mark.parametrize("args,golden", [((), "table.md"), (("--protocol", "fewshot"), "table_fewshot.md")])
def test_old_results_render_the_same_tables(cli, legacy, args, golden):
    code, out, _ = cli("table", *args, "--format", "md", "--results", legacy)
    assert code == 0
    assert out == (LEGACY / golden).read_text()


def test_settings_are_read_under_their_own_names_and_keep_their_run_keys(legacy):
    """Shard schema 2 stores few-shot's λ as `fewshot_l2` (k-NN's k as `knn_k`, the linear probe's
    features as `linear_features`): an older shard's `l2` reads under that name, and its run key,
    made again from what it stores, is still its own (run keys hash the first names)."""
    records = read_shards(sorted((legacy / "runs").glob("*.json"))).records
    fewshot = [(path, rec["run"]) for path, rec in records if rec["run"]["protocol"] == "fewshot"]
    assert len(fewshot) == 3
    for path, run in fewshot:
        assert "l2" not in run["hparams"] and run["hparams"]["fewshot_l2"] in ("1024", "sweep")
        spec = RunSpec(**{f.name: run[f.name] for f in fields(RunSpec)})
        assert spec.run_key == path.stem


def test_a_database_from_before_the_rename_is_migrated_in_place(legacy):
    """A database at schema 6 (made here from the old shards as they are, `shots` a column of its
    own, λ under `l2`): the first command that reads it moves them into the hparams under today's
    names, in the file, once; keys and every other value untouched."""
    con = duckdb.connect(str(legacy / store.DB_NAME))
    con.execute("CREATE TABLE schema_version (version INTEGER, applied_at TIMESTAMP, vitbench_version VARCHAR)")
    for number, steps in enumerate(MIGRATIONS[:6], start=1):
        for sql in steps:
            con.execute(sql)
        con.execute("INSERT INTO schema_version VALUES (?, now(), '0.1.0')", [number])
    columns = {row[0] for row in con.execute("DESCRIBE runs").fetchall()}
    old = [json.loads(path.read_text()) for path in sorted((legacy / "runs").glob("*.json"))]
    for record in old:
        run = {k: json.dumps(v) if k in ("hparams", "notes") else v for k, v in record["run"].items() if k in columns}
        con.execute(f"INSERT INTO runs ({', '.join(run)}) VALUES ({', '.join('?' * len(run))})", list(run.values()))
        for name, value in record["metrics"].items():
            con.execute("INSERT INTO metrics VALUES (?, ?, ?)", [run["run_key"], name, value])
    con.close()
    read = store.read_results(legacy).drop_duplicates("run_key").set_index("run_key")
    for record in old:
        run = record["run"]
        hparams = {"fewshot_l2" if k == "l2" else k: v for k, v in run["hparams"].items()}
        hparams |= {"shots": run["shots"]} if run["shots"] is not None else {}
        # migration 8 records the defaults the run left out, as the shards' reader does (one rule)
        assert json.loads(read.loc[run["run_key"], "hparams"]) == explicit_hparams(run["protocol"], hparams)
        assert read.loc[run["run_key"], "seed"] == run["seed"] and "shots" not in read.columns
    con = duckdb.connect(str(legacy / store.DB_NAME), read_only=True)
    assert con.execute("SELECT max(version) FROM schema_version").fetchone()[0] == store.SCHEMA_VERSION  # in the file
    con.close()

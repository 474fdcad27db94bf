"""A results folder a lab shares (issue 97): a database received from someone else is data, never
code; a row read from it is checked as a shard is."""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

import duckdb
import pytest

import vitbench
from vitbench.store import DB_NAME

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from synthetic_store import write_shards  # noqa: E402

SECRET = "TOP-SECRET-LINE-0451"
VIEWS = ("table", "export", "report", "api")


@pytest.fixture(scope="module")
def three_runs(tmp_path_factory) -> Path:
    """A store of three few-shot runs, merged from their shards (no model runs: the shards are copies
    of a real one)."""
    results = tmp_path_factory.mktemp("lab") / "results"
    write_shards(results, 3)
    vitbench.results(results)  # the first read merges the shards into the database
    assert (results / DB_NAME).is_file()
    return results


def received(three_runs: Path, tmp_path: Path, *sql: str, shards: bool = False) -> Path:
    """A copy of the store as someone hands it over: its database altered by `sql` (run with DuckDB's
    defaults, as anyone's DuckDB would), with or without the shards behind it."""
    results = tmp_path / "received"
    shutil.copytree(three_runs, results, ignore=None if shards else shutil.ignore_patterns("*.json"))
    con = duckdb.connect(str(results / DB_NAME))
    try:
        for statement in sql:
            con.execute(statement.replace("SECRET_FILE", str(tmp_path / "secret.txt")))
    finally:
        con.close()
    (tmp_path / "secret.txt").write_text(SECRET + "\n")
    return results


def viewed(cli, view: str, results: Path) -> tuple[int, str]:
    """What `view` prints of `results` (its exit code, and stdout, stderr and any file it wrote, together)."""
    if view == "api":
        try:
            return 0, vitbench.results(results).to_string()
        except vitbench.UserError as e:
            return 2, str(e)
    out = results.parent / f"out.{ {'export': 'csv', 'report': 'html'}.get(view, 'txt') }"
    args = {"export": ("export", "--format", "csv", "--out", out), "report": ("report", "--out", out)}
    code, stdout, stderr = cli(*args.get(view, ("table",)), "--results", results)
    written = out.read_text(errors="replace") if out.is_file() else ""
    return code, stdout + stderr + written


HOSTILE = {
    "a view reading a file": [
        "ALTER TABLE runs RENAME TO runs_data",
        "CREATE VIEW runs AS SELECT * REPLACE (content AS model) FROM runs_data, read_text('SECRET_FILE')",
    ],
    "a view over range(1e11)": [
        "ALTER TABLE metrics RENAME TO metrics_data",
        "CREATE VIEW metrics AS SELECT m.* FROM metrics_data m, range(100000000000) r WHERE r.range = 0",
    ],
    "schema_version a view": [
        "ALTER TABLE schema_version RENAME TO versions",
        "CREATE VIEW schema_version AS SELECT * FROM versions, read_text('SECRET_FILE')",
    ],
    "a macro": ["CREATE MACRO shown(x) AS x || (SELECT content FROM read_text('SECRET_FILE'))"],
    "a column of its own": ["ALTER TABLE runs ADD COLUMN extra VARCHAR DEFAULT 'x'"],
    "another schema": ["CREATE SCHEMA lab", "CREATE TABLE lab.runs AS SELECT * FROM main.runs"],
    "a sequence": ["CREATE SEQUENCE counter"],
    "an extra table": ["CREATE TABLE notes AS SELECT 'x' AS note"],
}


@pytest.mark.parametrize("kind", sorted(HOSTILE))
@pytest.mark.parametrize("view", VIEWS)
def test_item1_a_database_with_objects_of_someone_elses_is_refused_in_one_line(cli, three_runs, tmp_path, kind, view):
    results = received(three_runs, tmp_path, *HOSTILE[kind], shards=kind.startswith("a view"))
    started = time.monotonic()
    code, said = viewed(cli, view, results)
    assert time.monotonic() - started < 30  # nothing of it ran (the view over range(1e11) took 25 s)
    assert code == 2 and SECRET not in said and "Traceback" not in said, said[-2000:]
    assert "not vitbench's own plain tables" in said and "--rebuild" in said, said[-2000:]
    assert said.count("\n") <= 1 or view == "api"  # one line


def test_item1_a_store_opened_by_vitbench_reads_no_other_file_and_locks_its_settings(three_runs):
    from vitbench.store import duck

    con = duck.connect(three_runs / DB_NAME, read_only=True)
    try:
        with pytest.raises(duckdb.PermissionException):
            con.execute("SELECT * FROM read_text('/etc/hostname')").fetchall()
        with pytest.raises(duckdb.Error, match="locked"):
            con.execute("SET enable_external_access = true")
    finally:
        con.close()


def test_item1_rebuild_sets_a_refused_store_aside_unread_and_rebuilds_it_from_the_shards(cli, three_runs, tmp_path):
    results = received(three_runs, tmp_path, *HOSTILE["a view reading a file"], shards=True)
    code, out, err = cli("ingest", "--rebuild", "--results", results)
    assert code == 0 and "never read" in out and SECRET not in out + err, out + err
    assert len(list(results.glob(f"{DB_NAME}.refused-*"))) == 1
    assert len(vitbench.results(results).drop_duplicates("run_key")) == 3  # the shards' runs, from them


def test_item1_a_hostile_store_never_reaches_the_dry_runs_estimate(cli, three_runs, tmp_path):
    """The bench rows a dry run prices with are read quietly: from a refused store, none."""
    from vitbench.store.bench import read_bench_quietly

    results = received(three_runs, tmp_path, "CREATE VIEW bench_extra AS SELECT 1")
    assert read_bench_quietly(results) is None


@pytest.mark.parametrize(
    "sql, said",
    [
        ("UPDATE metrics SET value = 1.7 WHERE name = 'accuracy' AND run_key = (SELECT min(run_key) FROM runs)",
         "expected from 0 to 1"),
        ("UPDATE metrics SET value = 'NaN'::DOUBLE WHERE run_key = (SELECT min(run_key) FROM runs)",
         "not a finite number"),
        ("UPDATE runs SET model = '' WHERE run_key = (SELECT min(run_key) FROM runs)", "run.model"),
        ("UPDATE runs SET hparams = '[1, 2]' WHERE run_key = (SELECT min(run_key) FROM runs)", "run.hparams"),
    ],
)  # fmt: skip
@pytest.mark.parametrize("view", VIEWS)
def test_item2_a_database_row_out_of_range_is_left_out_as_a_shard_would_be(cli, three_runs, tmp_path, sql, said, view):
    results = received(three_runs, tmp_path, sql)  # no shard behind it: the database is all there is
    code, printed = viewed(cli, view, results)
    assert code == 0 and "170.00" not in printed and "Traceback" not in printed, printed[-2000:]
    if view != "api":  # (the API's warning goes to its logger)
        assert said in printed and "left out of every view" in printed, printed[-2000:]
    assert len(vitbench.results(results).drop_duplicates("run_key")) == 2


def test_item2_a_shard_with_a_fraction_out_of_range_is_quarantined(tmp_path):
    import json

    results = tmp_path / "results"
    (path, *_) = write_shards(results, 2)
    record = json.loads(path.read_text())
    record["metrics"]["accuracy"] = 1.7
    path.write_text(json.dumps(record))
    assert len(vitbench.results(results).drop_duplicates("run_key")) == 1
    assert [p.name for p in (results / "quarantine").glob("*.json")] == [path.name]


@pytest.mark.parametrize("entry", ["vitbench.cli.app", "vitbench.api"])
def test_item2_every_way_in_knows_which_metrics_are_fractions(entry):
    """The store learns a protocol's fractions from the protocols' registry, a layer above it: the CLI and
    the library API each load it before they read or store a number (a fresh process, as a user's)."""
    import subprocess

    probe = (
        f"import {entry}; from vitbench.store.row_checks import fractions, metric_problem; "
        "assert 'accuracy' in fractions('fewshot'), fractions('fewshot'); "
        "print(metric_problem('accuracy', 1.7, fractions('fewshot')))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "expected from 0 to 1" in done.stdout, done.stderr[-1500:]

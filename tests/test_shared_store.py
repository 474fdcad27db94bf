"""A results folder a lab shares (issue 97): a database received from someone else is data, never
code; a row read from it is checked as a shard is."""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

import duckdb
import pandas as pd
import pytest
from held_store import hold_the_store

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


RUN = ("run", "--model", "vit-ti/16", "--weights", "random", "--dataset", "digits", "--res", "32", "--workers", "0")
RUN += ("--shots", "1", "--seeds", "0")


def finished_at(results: Path) -> dict[str, pd.Timestamp]:
    """When each shard of `results` says its run finished."""
    import json

    return {
        path.stem: pd.Timestamp(json.loads(path.read_text())["run"]["finished_at"]).tz_convert(None)
        for path in (results / "runs").glob("*.json")
    }


def stored_finished_at(store: Path | duckdb.DuckDBPyConnection) -> dict[str, pd.Timestamp]:
    """When the database (a results folder's, read as any DuckDB would, or one open) says each run finished."""
    con = duckdb.connect(str(store / DB_NAME), read_only=True) if isinstance(store, Path) else store
    try:
        rows = con.execute("SELECT run_key, finished_at FROM runs").fetchall()
    finally:
        if con is not store:
            con.close()
    return {key: pd.Timestamp(at) for key, at in rows}


@pytest.mark.parametrize("how", ["cli", "api"])
def test_item3_a_rerun_written_while_another_process_held_the_database_wins_in_every_view(cli, one_run, tmp_path, how):
    """Before: the rerun's shard replaced the old one, but the database already held its run key, so
    no later merge took it: table and export showed the old row until `ingest --rebuild`."""
    results = tmp_path / "results"
    shutil.copytree(one_run, results)
    old = finished_at(results)
    holder = hold_the_store(results)
    try:
        if how == "cli":
            code, _, err = cli(*RUN, "--rerun", "--results", results)
            assert code == 0 and "stores its results as shards" in err, err[-2000:]
        else:
            vitbench.run(model="vit-ti/16", weights="random", datasets="digits", res=32, workers=0, shots=(1,),
                         seeds=(0,), rerun=True, results=results)  # fmt: skip
    finally:
        holder.kill()
        holder.wait()
    new = finished_at(results)
    assert new.keys() == old.keys() and all(new[k] > old[k] for k in new)
    code, out, err = cli("table", "--results", results)  # the first reader merges it
    assert code == 0, err
    assert stored_finished_at(results) == new
    assert vitbench.results(results).drop_duplicates("run_key").set_index("run_key")["finished_at"].to_dict() == new
    exported = tmp_path / "out.csv"
    assert cli("export", "--format", "csv", "--out", exported, "--results", results)[0] == 0
    assert pd.to_datetime(pd.read_csv(exported)["finished_at"]).tolist() == list(new.values())
    assert not list((results / "runs").glob("*.unmerged")), "merged: no mark left"


def test_item3_a_merge_that_read_the_old_shard_leaves_the_rerun_marked(three_runs, tmp_path, monkeypatch):
    """The race the marks guard: a merge takes a run's mark and reads its shard while a rerun rewrites
    it; the rerun marks it again once written, so the next merge takes the new shard."""
    import json

    from vitbench.store import merge, shards

    results = tmp_path / "results"
    shutil.copytree(three_runs, results)
    key = sorted(finished_at(results))[0]
    path = shards.shard_path(results, key)
    shards.mark(results, key)  # the rerun, before its write
    con = vitbench.store.connect(results)
    try:
        real_ingest = merge.ingest

        def rewritten_as_it_is_read(con, paths):  # the rerun's write and its second mark, mid-merge
            merged = real_ingest(con, paths)
            record = json.loads(path.read_text())
            record["run"]["finished_at"] = "2030-01-01T00:00:00+00:00"
            path.write_text(json.dumps(record))
            shards.mark(results, key)
            return merged

        with monkeypatch.context() as patched:
            patched.setattr(merge, "ingest", rewritten_as_it_is_read)
            merge.ingest_pending(con, results)
        assert stored_finished_at(con)[key] != pd.Timestamp("2030-01-01")
        merge.ingest_pending(con, results)
        assert stored_finished_at(con)[key] == pd.Timestamp("2030-01-01")
        assert not shards.marked_keys(results)
    finally:
        con.close()


KILLED_MID_WRITE = """
import os, sys, time
from pathlib import Path
from vitbench.files.atomic import write_atomic

def half_written(tmp):
    tmp.write_bytes(b"x" * 4096)  # a feature-cache entry, an export, a shard: half of it on disk
    print("writing", flush=True)
    time.sleep(120)

write_atomic(Path(sys.argv[1]), half_written)
"""


def killed_mid_write(target: Path) -> Path:
    """The temp file a writer of `target` leaves when SIGKILLed mid-write (as the OOM killer or a pre-empted
    job does), in a real process of its own."""
    import subprocess

    writer = subprocess.Popen([sys.executable, "-c", KILLED_MID_WRITE, str(target)], stdout=subprocess.PIPE, text=True)
    assert writer.stdout is not None and writer.stdout.readline().strip() == "writing"
    writer.kill()
    writer.wait()
    (left,) = target.parent.glob(f".{target.name}.*.tmp")
    return left


@pytest.mark.parametrize("writer", ["run", "export", "an audit's write"])
def test_item7_a_dead_writers_temp_file_is_removed_by_the_next_writer(cli, one_run, tmp_path, writer, monkeypatch):
    """Before: every kill during an atomic write left its temp file for good (a whole feature-cache entry
    each). The next writer into that folder removes those of dead processes of this host; a live
    writer's and another host's are left alone (on shared storage their writer may still run)."""
    import os

    from vitbench.files import atomic

    results = tmp_path / "results"
    shutil.copytree(one_run, results)
    monkeypatch.setattr(atomic, "_SWEPT", set())  # this test's process is the next writer, as a new one would be
    folders = {
        "run": [results / "runs", results / "cache" / "features"],  # a new resolution: a shard and features
        "export": [tmp_path / "exports"],
        "an audit's write": [results / "audits"],
    }[writer]
    left = []
    for folder in folders:
        folder.mkdir(parents=True, exist_ok=True)
        dead = killed_mid_write(folder / "entry.npz")
        live = folder / f".other.npz.{atomic.HOST}.{os.getpid()}.1.tmp"  # this very process: it runs
        elsewhere = folder / f".other.npz.another-host.{2**22 + 7}.1.tmp"  # a pid no process here has
        for kept in (live, elsewhere):
            kept.write_bytes(b"y")
        left.append((dead, live, elsewhere))
    if writer == "run":
        code, _, err = cli(*[("48" if a == "32" else a) for a in RUN], "--results", results)
    elif writer == "export":
        code, _, err = cli("export", "--format", "csv", "--out", folders[0] / "runs.csv", "--results", results)
    else:  # the folder's next write, through the function every writer of vitbench's uses
        atomic.write_atomic(folders[0] / "next.json", "{}")
        code, err = 0, ""
    assert code == 0, err[-2000:]
    for dead, live, elsewhere in left:
        assert not dead.exists() and live.exists() and elsewhere.exists(), (dead, sorted(dead.parent.iterdir()))


def test_item4_submit_rerun_reruns_and_counts_only_what_it_stored(cli, one_run, tmp_path):
    """Before: `submit --cluster local --rerun` of a stored run: the job skipped it (rerun was not passed
    to the workers), yet the command printed "1 of 1 runs now stored"."""
    results = tmp_path / "results"
    shutil.copytree(one_run, results)
    old = finished_at(results)
    code, out, err = cli("submit", "--cluster", "local", *RUN[1:], "--rerun", "--results", results)
    assert code == 0, err[-2000:]
    assert "1 of 1 runs now stored" in err
    new = finished_at(results)
    assert all(new[k] > old[k] for k in old) and stored_finished_at(results) == new


def test_item4_submit_ends_0_only_when_every_planned_run_is_stored(cli, one_run, tmp_path):
    """Before: a submitted run its job skipped (leased by another process) ended rc 0 with "0 of 1 runs
    now stored": `vitbench submit … && vitbench table` went on without it."""
    from vitbench.execution.lease import Lease

    results = tmp_path / "results"
    shutil.copytree(one_run, results)
    (key,) = finished_at(results)
    held = Lease(results, key)
    assert held.acquire()  # this live test process runs it, as far as the job can tell
    try:
        code, out, err = cli("submit", "--cluster", "local", *RUN[1:], "--rerun", "--results", results)
    finally:
        held.release()
    assert code == 2 and "0 of 1 runs now stored" in err, err[-2000:]
    assert "1 of 1 submitted run(s) have no result yet" in err and "Traceback" not in err


KILLED_REBUILD = """
import os, signal, sys
from pathlib import Path
from vitbench.store import rebuilding

def die(*_):
    os.kill(os.getpid(), signal.SIGKILL)

point, real_connect, real_ingest, real_replace = sys.argv[2], rebuilding.connect, rebuilding.ingest, os.replace
if point == "the new database's first commit":  # its tables made, nothing copied yet
    rebuilding.connect = lambda results, file=None: die() if file is not None and real_connect(results, file) else None
elif point == "the shards merged":
    rebuilding.ingest = lambda con, paths: die(real_ingest(con, paths))
elif point == "the swap":
    rebuilding.os.replace = lambda src, dst: die() if Path(dst).name == "vitbench.duckdb" else real_replace(src, dst)
rebuilding.rebuild(Path(sys.argv[1]))
"""
BENCH_ROWS = 36


@pytest.mark.parametrize("point", ["the new database's first commit", "the shards merged", "the swap"])
def test_item5_a_rebuild_killed_anywhere_leaves_the_old_database_whole(cli, three_runs, tmp_path, point):
    """Before: SIGKILL at the new database's first commit lost the old one's 36 `inspect`/`bench` rows
    without a word, and a second `--rebuild` said rows were "copied over" (0 were). The new database is
    built beside the old and swapped in last; the next rebuild removes the half-built one."""
    import subprocess

    from vitbench import store

    results = tmp_path / "results"
    shutil.copytree(three_runs, results)
    con = store.connect(results)
    for i in range(BENCH_ROWS):
        con.execute(
            "INSERT INTO bench (bench_id, created_at, model, res, mode, runner, data, batch, precision, compile, "
            f"images_per_second) VALUES ('b{i}', now(), 'vit-ti/16', 64, 'train', 'vitbench', 'synthetic', 16, "
            f"'fp32', false, {100 + i})"
        )
    con.close()
    killed = subprocess.run([sys.executable, "-c", KILLED_REBUILD, str(results), point], timeout=120)
    assert killed.returncode == -9
    assert [p.name for p in results.iterdir() if p.name.endswith(".tmp")], "the half-built database, left"
    assert len(store.read_bench(results)) == BENCH_ROWS  # the old database, in place and whole
    assert len(vitbench.results(results)) == 3
    code, out, err = cli("ingest", "--rebuild", "--results", results)
    assert code == 0 and f"{BENCH_ROWS} inspect, bench and dedup row(s) copied over" in out, out + err
    assert len(store.read_bench(results)) == BENCH_ROWS and len(vitbench.results(results)) == 3
    assert not [p.name for p in results.iterdir() if p.name.endswith((".tmp", ".tmp.wal"))]


def test_item6_submits_in_the_same_second_each_keep_their_own_jobs_record(tmp_path):
    """Before: two `vitbench submit`s started in the same second into one results folder shared one
    `jobs/<timestamp>/` folder, and its ledger kept only the last writer's job. Three at once here (real
    processes, the local executor's real jobs), each a seed of its own: each its own folder and ledger,
    every run stored, each command ending 0."""
    import json
    import subprocess

    from vitbench.execution.cluster import new_jobs_folder

    results = tmp_path / "results"
    same_second = [new_jobs_folder(results) for _ in range(3)]
    assert len(set(same_second)) == 3
    submits = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "vitbench",
                "submit",
                "--cluster",
                "local",
                *RUN[1:-1],
                str(seed),
                "--results",
                str(results),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for seed in range(3)
    ]
    ended = [(p.wait(timeout=300), p.stderr.read()) for p in submits if p.stderr is not None]
    assert [code for code, _ in ended] == [0, 0, 0], [err[-1500:] for _, err in ended]
    ledgers = [json.loads(p.read_text()) for p in (results / "jobs").glob("*/vitbench-jobs.json")]
    assert len(ledgers) == 3 and all(len(ledger["jobs"]) == 1 for ledger in ledgers)
    assert sorted(vitbench.results(results)["seed"]) == [0, 1, 2]


def test_item8_a_submit_waits_for_a_held_database_and_says_so(cli, tmp_path):
    """Before: of two submits into a fresh folder at once, one ended rc 2 "held by another process (PID …)"
    without waiting or saying to retry."""
    import subprocess

    results = tmp_path / "results"
    code = (
        "import sys, time; from pathlib import Path; from vitbench import store; "
        "con = store.connect(Path(sys.argv[1])); print('held', flush=True); time.sleep(4); con.close()"
    )
    holder = subprocess.Popen([sys.executable, "-c", code, str(results)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        code, out, err = cli("submit", "--cluster", "local", *RUN[1:], "--results", results)
    finally:
        holder.wait(timeout=60)
    assert code == 0, err[-2000:]
    assert f"held by another process (PID {holder.pid}" in err and "waiting for it (up to 60 s)" in err
    assert len(vitbench.results(results)) == 1


@pytest.mark.parametrize("command", ["table", "export", "ingest", "run"])
def test_item10_a_results_folder_named_in_bytes_that_are_not_utf8_is_one_line(cli, three_runs, tmp_path, command):
    """Before: `RuntimeError: std::bad_cast` (DuckDB names its files in UTF-8 only)."""
    import os

    results = tmp_path / os.fsdecode(b"lab\xff")
    shutil.copytree(three_runs, results)
    args = {"export": ("--format", "csv", "--out", tmp_path / "out.csv"), "run": RUN[1:]}.get(command, ())
    code, out, err = cli(*(RUN[:1] if command == "run" else (command,)), *args, "--results", results)
    assert code == 2 and "Traceback" not in err and "bad_cast" not in err, err[-2000:]
    assert "byte ff of its name is not UTF-8" in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("where", ["the folder", "a class folder"])
def test_item10_a_folder_dataset_named_in_bytes_that_are_not_utf8_is_one_line(cli, tmp_path, where):
    """Before: a `folder:` dataset whose path held a byte that is not UTF-8 was a UnicodeEncodeError."""
    import os

    from PIL import Image

    root = tmp_path / (os.fsdecode(b"pics\xfe") if where == "the folder" else "pics")
    for split in ("train", "test"):
        for name in ("cat", os.fsdecode(b"dog\xfe") if where == "a class folder" else "dog"):
            (root / split / name).mkdir(parents=True)
            Image.new("RGB", (16, 16)).save(root / split / name / "0.png")
    code, out, err = cli(*RUN[:6], f"folder:{root}", *RUN[7:], "--results", tmp_path / "results")
    assert code == 2 and "Traceback" not in err and "byte fe of" in err and "not UTF-8" in err, err[-2000:]
    assert len(err.strip().splitlines()) == 1, err


API_WRITER = """
import sys
import vitbench
vitbench.run(model="vit-ti/16", weights="random", datasets="digits", res=32, workers=0, shots=(1,), seeds=(4, 5),
             rerun=True, results=sys.argv[1])
"""


def test_a_shared_folder_written_by_three_processes_while_a_fourth_reads_it(cli, one_run, tmp_path):
    """Issue 97's shared folder: `run`, `submit --cluster local` and the API write one results folder at once,
    each rerunning a stored run beside a new one, while this process tables and reports it in a loop. Every
    number once in every read, the newest in the end, in every view; no temp file, mark or lease left."""
    import subprocess

    results = tmp_path / "results"
    shutil.copytree(one_run, results)
    vitbench.run(model="vit-ti/16", weights="random", datasets="digits", res=32, workers=0, shots=(1,),
                 seeds=(0, 2, 4), results=results)  # fmt: skip  # (seed 0 is one_run's; features cached)
    before = {run.seed: run.finished_at for run in vitbench.results(results).itertuples()}
    vitbench_cli = [sys.executable, "-m", "vitbench"]
    writers = [
        subprocess.Popen([*vitbench_cli, *RUN[:-1], "0,1", "--rerun", "--results", str(results)],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True),
        subprocess.Popen([*vitbench_cli, "submit", "--cluster", "local", *RUN[1:-1], "2,3", "--rerun", "--results",
                          str(results)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True),
        subprocess.Popen([sys.executable, "-c", API_WRITER, str(results)], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True),
    ]  # fmt: skip
    reads = 0
    while any(w.poll() is None for w in writers) or reads < 2:
        code, out, err = cli("table", "--results", results)
        assert code == 0 and "Traceback" not in err, err[-2000:]
        code, _, err = cli("report", "--out", tmp_path / "report.html", "--results", results)
        assert code == 0 and "Traceback" not in err, err[-2000:]
        frame = vitbench.results(results)
        assert frame["run_key"].is_unique and set(frame["seed"]) <= set(range(6)), frame[["run_key", "seed"]]
        reads += 1
    said = [w.stdout.read() for w in writers if w.stdout is not None]
    assert [w.returncode for w in writers] == [0, 0, 0], [text[-1500:] for text in said]
    frame = vitbench.results(results)
    assert sorted(frame["seed"]) == [0, 1, 2, 3, 4, 5] and frame["run_key"].is_unique
    assert all(run.finished_at > before[run.seed] for run in frame.itertuples() if run.seed in before)
    assert stored_finished_at(results) == finished_at(results)  # the database holds every newest shard
    exported = tmp_path / "runs.csv"
    assert cli("export", "--format", "csv", "--out", exported, "--results", results)[0] == 0
    csv = pd.read_csv(exported)
    assert sorted(csv["seed"]) == [0, 1, 2, 3, 4, 5]
    assert dict(zip(csv["run_key"], pd.to_datetime(csv["finished_at"]), strict=True)) == finished_at(results)
    left = [p.name for p in results.rglob("*") if p.name.endswith((".tmp", ".tmp.wal", ".unmerged", ".lease"))]
    assert left == [] and reads >= 2

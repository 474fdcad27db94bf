"""One bad file never takes the store down: bad shards are quarantined, a damaged database is set
aside and rebuilt from the shards, a second `vitbench run` on a held store writes shards that the
next command merges, and readers say when they read shards they could not merge. Each test
reproduces the failure it guards against first (the issue's reproductions)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import warm_launcher
from held_store import hold_the_store

from vitbench import store
from vitbench.store.shards import SHARD_SCHEMA, read_shard

BAD = "deadbeef" * 8  # a run key's form (64 hex digits): vitbench's own name for a shard
RUN = ("run", "--model", "vit-ti/16", "--weights", "random", "--dataset", "digits", "--res", "32", "--workers", "0")


@pytest.fixture
def stored(one_run, results) -> Path:
    """A copy of `one_run` for a test to damage."""
    shutil.copytree(one_run, results)
    return results


def only_shard(results: Path) -> Path:
    (path,) = sorted((results / "runs").glob("*.json"))
    return path


def as_shard_named(results: Path, name: str, record: dict) -> Path:
    """`record` written as the shard of run key `name` (its own name: what vitbench reads as its own)."""
    record = json.loads(json.dumps(record))
    record["run"]["run_key"] = name
    path = results / "runs" / f"{name}.json"
    path.write_text(json.dumps(record))
    return path


def accuracy(results: Path) -> float:
    rows = store.read_results(results)
    return float(rows[rows["metric"] == "accuracy"]["value"].iloc[0])


def test_shards_carry_their_schema_version_and_an_older_one_still_reads(stored):
    path = only_shard(stored)
    record = json.loads(path.read_text())
    assert record["schema"] == SHARD_SCHEMA
    del record["schema"]  # as written before shards had a version
    path.write_text(json.dumps(record))
    assert read_shard(path)["schema"] == SHARD_SCHEMA


@pytest.mark.parametrize(
    "content, reason",
    [
        ("{}", "'run' is missing"),
        ('{"run": {"run_key": "x"', "not JSON"),
        (b"\x89\x00\xffrandom bytes", "not JSON"),
        ("[1, 2]", "not a JSON object"),
    ],
)
def test_a_bad_shard_is_quarantined_and_every_command_goes_on(cli, stored, content, reason):
    """Before: `echo '{}' > runs/deadbeef.json` made every command fail (KeyError: 'run')."""
    before = accuracy(stored)
    bad = stored / "runs" / f"{BAD}.json"
    bad.write_bytes(content if isinstance(content, bytes) else content.encode())
    for args in (("table",), ("export", "--out", str(stored.parent / "x.csv"), "-f", "csv"), ("ingest",)):
        code, _, err = cli(*args, "--results", stored)
        assert code == 0, err
    assert not bad.exists() and (stored / "quarantine" / f"{BAD}.json").exists()
    code, _, err = cli(*RUN, "--shots", "1", "--seeds", "0", "--results", stored)
    assert code == 0 and "0 to run" in err
    assert accuracy(stored) == before


def test_quarantine_says_why_in_one_line(stored, caplog):
    (stored / "runs" / f"{BAD}.json").write_text("{}")
    store.sync(stored)
    lines = [r.getMessage() for r in caplog.records if BAD in r.getMessage()]
    assert len(lines) == 1 and "'run' is missing or not an object; moved to" in lines[0] and "\n" not in lines[0]


def test_a_quarantine_folder_that_is_a_link_moves_nothing_out_of_the_results(cli, stored, tmp_path, caplog):
    """Before: quarantine/ as a symbolic link moved bad shards wherever it pointed."""
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (stored / "quarantine").symlink_to(outside, target_is_directory=True)
    bad = stored / "runs" / f"{BAD}.json"
    bad.write_text("{}")
    code, _, err = cli("table", "--results", stored)
    assert code == 0, err
    assert bad.exists() and not list(outside.iterdir())
    assert "left out (" in caplog.text and "quarantine is a symbolic link: nothing is moved through it)" in caplog.text


def test_a_shard_missing_a_field_or_out_of_range_is_quarantined(cli, stored):
    """Before: a shard missing `model`, or with a seed of 2^31 (INT64 into INT32), failed every command."""
    good = json.loads(only_shard(stored).read_text())
    changes = [("nomodel", {"model": None}), ("bigseed", {"seed": 2**31})]
    # before: a NaN in hparams was merged, then `table` and `export -f json` failed on it (issue 49, item 2)
    changes += [("nanres", {"hparams": {**good["run"]["hparams"], "res": float("nan")}})]
    changes += [("infnote", {"notes": {"sweep": [1.0, float("inf")]}})]
    for name, change in changes:
        record = json.loads(json.dumps(good))
        record["run"].update(change)
        as_shard_named(stored, name, record)
    code, _, err = cli("table", "--results", stored)
    assert code == 0, err
    quarantined = {"nomodel.json", "bigseed.json", "nanres.json", "infnote.json"}
    assert {p.name for p in (stored / "quarantine").iterdir()} == quarantined
    assert "run.hparams.res = nan is not a finite number" in err
    for fmt in ("json", "csv"):
        code, _, err = cli("export", "-f", fmt, "--out", str(stored.parent / f"all.{fmt}"), "--results", stored)
        assert code == 0, err


def test_a_copy_under_another_name_is_not_merged(cli, stored):
    """Before: runs/zz-stray.json holding another accuracy was merged on every read and changed the
    table. Under a run key's name it is quarantined; under another it is not vitbench's: left alone."""
    before = accuracy(stored)
    record = json.loads(only_shard(stored).read_text())
    record["metrics"]["accuracy"] = 0.5
    (stored / "runs" / "zz-stray.json").write_text(json.dumps(record))
    (stored / "runs" / f"{BAD}.json").write_text(json.dumps(record))
    code, _, err = cli("table", "--results", stored)
    assert code == 0 and accuracy(stored) == before
    assert (stored / "quarantine" / f"{BAD}.json").exists() and "is not its file name" in err
    assert (stored / "runs" / "zz-stray.json").read_text() == json.dumps(record)


def test_another_tools_runs_folder_is_left_as_it_is(cli, tmp_path):
    """Issue 71, item 3: TensorBoard and Hydra call their folders runs/ too. Before: `table` and
    `ingest` moved their JSON into quarantine/ (through a symlinked runs/ too) and a read command
    made vitbench.duckdb. Now a read changes nothing there, and says there are no results."""
    project = tmp_path / "proj"
    (project / "runs" / "2026-11-27").mkdir(parents=True)
    files = {"runs/hparams.json": '{"lr": 0.1}', "runs/events.json": "[1, 2]", "runs/broken.json": "{",
             "runs/2026-11-27/config.json": "{}"}  # fmt: skip
    for name, text in files.items():
        (project / name).write_text(text)
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "runs").symlink_to(project / "runs", target_is_directory=True)
    before = {str(p): p.read_text() for p in (project / "runs").rglob("*.json")}
    for folder in (project, linked):
        for args in (("table",), ("export", "--out", str(tmp_path / "x.csv"), "-f", "csv"), ("report", "--out",
                     str(tmp_path / "r.html"))):  # fmt: skip
            code, _, err = cli(*args, "--results", folder)
            assert code in (0, 2) and "Traceback" not in err, err
        assert sorted(p.name for p in folder.iterdir()) == ["runs"]  # no quarantine/, no vitbench.duckdb
    assert {str(p): p.read_text() for p in (project / "runs").rglob("*.json")} == before
    code, _, err = cli("ingest", "--results", project)
    assert code == 0 and "Traceback" not in err, err
    assert {str(p): p.read_text() for p in (project / "runs").rglob("*.json")} == before
    assert not (project / "quarantine").exists()


def test_a_shard_from_a_newer_vitbench_is_left_alone_and_never_overwritten(cli, stored):
    path = only_shard(stored)
    record = json.loads(path.read_text())
    record["schema"] = SHARD_SCHEMA + 1
    path.write_text(json.dumps(record))
    os.remove(stored / store.DB_NAME)
    code, _, err = cli(*RUN, "--shots", "1", "--seeds", "0", "--results", stored)
    assert code == 0 and "written by a newer vitbench" in err and "0 to run" in err
    assert json.loads(path.read_text())["schema"] == SHARD_SCHEMA + 1  # not replaced by a re-run
    assert not (stored / "quarantine").exists()


def test_a_damaged_database_is_read_around_and_rebuilt_from_the_shards(cli, stored):
    """Before: a database truncated to half gave a traceback in `table`, `run` and `--dry-run`."""
    db = stored / store.DB_NAME
    before, damaged = accuracy(stored), db.read_bytes()[: db.stat().st_size // 2]
    db.write_bytes(damaged)
    code, out, err = cli("table", "--results", stored)
    assert code == 0 and "damaged" in err and "ingest --rebuild" in err and "one run each" in " ".join(out.split())
    code, _, err = cli(*RUN, "--shots", "1", "--seeds", "0", "--results", stored)
    assert code == 2 and "ingest --rebuild" in err and len(err.strip().splitlines()) == 1
    code, _, err = cli(*RUN, "--shots", "1", "--seeds", "0", "--results", stored, "--dry-run")
    assert code == 0, err
    assert db.read_bytes() == damaged  # never modified in place
    code, out, err = cli("ingest", "--rebuild", "--results", stored)
    assert code == 0 and "merged 1 new run(s)" in out
    (aside,) = stored.glob(f"{store.DB_NAME}.damaged-*")
    assert aside.read_bytes() == damaged and accuracy(stored) == before


def test_a_damaged_page_is_called_damaged_and_rebuilt_not_held(cli, stored):
    """Before: DuckDB's "checksum ... in block" contains "lock", so `ingest --rebuild` answered
    "held by another process" for a file nobody held (issue 49, item 3)."""
    db = stored / store.DB_NAME
    before, pages = accuracy(stored), bytearray(db.read_bytes())
    pages[12288 : 12288 + 64] = bytes(b ^ 0xFF for b in pages[12288 : 12288 + 64])  # a block's bytes flipped
    db.write_bytes(bytes(pages))
    code, _, err = cli("ingest", "--results", stored)
    assert code == 2 and "damaged" in err and "held" not in err
    code, out, err = cli("ingest", "--rebuild", "--results", stored)
    assert code == 0 and "merged 1 new run(s)" in out, err
    assert len(list(stored.glob(f"{store.DB_NAME}.damaged-*"))) == 1 and accuracy(stored) == before


def test_rebuilding_a_readable_database_keeps_its_bench_rows_and_calls_it_previous(cli, stored):
    """Before: `--rebuild` on a healthy database set it aside as "damaged", and its inspect/bench
    rows stayed behind in the set-aside file (issue 49, item 3)."""
    con = store.connect(stored)
    con.execute(
        "INSERT INTO bench (bench_id, created_at, model, res, mode, runner, data, batch, precision, compile, "
        "images_per_second) VALUES ('b1', now(), 'vit-ti/16', 64, 'train', 'vitbench', 'synthetic', 16, 'fp32', "
        "false, 123.5)"
    )
    con.close()
    code, out, err = cli("ingest", "--rebuild", "--results", stored)
    assert code == 0 and "1 inspect, bench and dedup row(s) copied over" in out and "merged 1 new run(s)" in out, err
    assert len(list(stored.glob(f"{store.DB_NAME}.previous-*"))) == 1 and not list(stored.glob("*.damaged-*"))
    assert store.read_bench(stored)["images_per_second"].tolist() == [123.5]


def test_rebuild_refuses_a_newer_database_and_a_folder_it_cannot_write(cli, stored, monkeypatch):
    """A database of a newer vitbench is left as it is (a rebuild here would drop what this version
    does not know); a folder where the file cannot be renamed (EROFS) is one line, not a traceback."""
    con = store.connect(stored)
    con.execute("UPDATE schema_version SET version = 99")
    con.close()
    before = (stored / store.DB_NAME).read_bytes()
    code, _, err = cli("ingest", "--rebuild", "--results", stored)
    assert code == 2 and "written by a newer vitbench (schema 99" in err
    assert (stored / store.DB_NAME).read_bytes() == before and not list(stored.glob(f"{store.DB_NAME}.*-*"))
    (stored / store.DB_NAME).unlink()
    (stored / store.DB_NAME).write_bytes(b"not a database")

    def read_only(*_):
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr("vitbench.store.rebuilding.os.replace", read_only)
    code, _, err = cli("ingest", "--rebuild", "--results", stored)
    assert code == 2 and "cannot set it aside (Read-only file system); is" in err and "Traceback" not in err


def test_a_database_on_a_read_only_mount_is_not_called_damaged(cli, stored, monkeypatch):
    """Before: `ingest` on a read-only folder called the database "damaged" (issue 49, item 3). Tests
    run as root, for whom no folder is read-only: DuckDB's error on such a mount is raised instead."""
    as_shard_named(stored, BAD, json.loads(only_shard(stored).read_text()))  # a shard to merge
    real = store.database.duckdb.connect

    def on_a_read_only_mount(database, read_only=False, **kw):
        if not read_only:
            raise store.database.duckdb.IOException(f'IO Error: Cannot open file "{database}": Read-only file system')
        return real(database, read_only=read_only, **kw)

    monkeypatch.setattr(store.database.duckdb, "connect", on_a_read_only_mount)
    code, _, err = cli("ingest", "--results", stored)
    assert code == 2 and "cannot be opened for writing" in err and "read-only?" in err and "damaged" not in err


def test_a_second_run_on_a_held_store_writes_shards_and_the_next_command_merges_them(cli, stored):
    """Before: a second `vitbench run` failed at once on DuckDB's lock; `ingest` printed "merged 0"."""
    holder = hold_the_store(stored)
    try:
        code, _, err = cli(*RUN, "--shots", "1", "--seeds", "1", "--results", stored)
        assert code == 0 and "this run stores its results as shards" in err
        code, out, err = cli("table", "--results", stored)
        assert code == 0 and "over 2 runs (seeds) each" in " ".join(out.split())  # the held store is read as its shards
        code, _, err = cli("ingest", "--results", stored)
        # the holder's whole PID (a message cut at 160 characters once named PID 2038 for 20386)
        assert code == 2 and f"held by another process (PID {holder.pid}, " in err
        code, _, err = cli("ingest", "--rebuild", "--results", stored)  # never from under a running process
        assert code == 2 and "rebuild it once that one ends" in err and (stored / store.DB_NAME).exists()
    finally:
        holder.kill()
        holder.wait()
    code, out, err = cli("ingest", "--results", stored)
    assert code == 0 and "merged 1 new run(s)" in out
    assert sorted(store.read_results(stored).drop_duplicates("run_key")["seed"]) == [0, 1]


def test_readers_say_what_they_cannot_merge_and_read_it_anyway(cli, stored, monkeypatch):
    """Before: on a read-only folder `table` and `export` left pending shards out without a word.
    (Tests run as root, for whom no folder is read-only: `connect` is made to fail as it does
    there, with the UserError naming the file; everything else is real.)"""
    code, _, err = cli(*RUN, "--shots", "1", "--seeds", "1", "--results", stored)
    assert code == 0, err
    con = store.connect(stored)  # take the seed-1 run out of the database, as if a worker had written it
    con.execute("DELETE FROM metrics WHERE run_key IN (SELECT run_key FROM runs WHERE seed = 1)")
    con.execute("DELETE FROM runs WHERE seed = 1")
    con.close()

    def read_only(results):
        raise store.database.UserError(f"{results / store.DB_NAME}: cannot write there (Read-only file system)")

    monkeypatch.setattr(store.database, "connect", read_only)
    code, out, err = cli("table", "--results", stored)
    assert code == 0 and "over 2 runs (seeds) each" in " ".join(out.split())
    assert "1 result shard(s) not merged yet" in err  # issue 71, item 19: the one it lacks, not every shard
    assert "lacks 1 shard(s) it could not merge; reading the shards instead" in err
    code, _, err = cli("ingest", "--results", stored)
    assert code == 2 and "Read-only file system" in err


@pytest.mark.slow
def test_two_runs_at_once_on_one_folder_both_reach_the_database(one_run, results):
    """Two real `vitbench run` processes started together on one results folder (the feature cache
    is shared, so both go straight to their solve): both finish, and both results are stored."""
    shutil.copytree(one_run, results)
    runs = [
        subprocess.Popen(
            [sys.executable, "-m", "vitbench", *RUN, "--shots", "1", "--seeds", str(seed), "--results", str(results)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for seed in (1, 2)
    ]
    for process in runs:
        output, _ = process.communicate(timeout=300)
        assert process.returncode == 0, output
    store.sync(results)
    assert sorted(store.read_results(results).drop_duplicates("run_key")["seed"]) == [0, 1, 2]


def _vitbench(*args: str, timeout: float = 120, preexec_fn=None) -> subprocess.CompletedProcess:
    # warm (tests/warm_launcher.py), but cold where a test limits the process itself (preexec_fn)
    return warm_launcher.run([sys.executable, "-m", "vitbench", *map(str, args)], capture_output=True, text=True,
                             timeout=timeout, preexec_fn=preexec_fn)  # fmt: skip


def test_a_fifo_among_the_shards_blocks_no_command(stored, tmp_path):
    """Before: a FIFO named runs/fifo.json blocked table, report, export and run forever. Under a run
    key's name it is quarantined; under another (not vitbench's) it is left where it is."""
    for i, args in enumerate(
        (("table",), ("report", "--out", tmp_path / "r.html"), ("export", "--out", tmp_path / "e.csv"))
    ):
        key = f"{i:064x}"
        os.mkfifo(stored / "runs" / f"{key}.json")
        os.mkfifo(stored / "runs" / f"fifo{i}.json")
        done = _vitbench(*args, "--results", stored, timeout=60)  # a hang fails here, not the whole suite
        assert done.returncode == 0, done.stderr
        assert f"{key}.json: cannot be read (not a regular file); moved to" in done.stderr
        assert (stored / "quarantine" / f"{key}.json").exists() and (stored / "runs" / f"fifo{i}.json").exists()
    assert accuracy(stored) > 0  # the stored run is still there
    os.mkfifo(stored / "runs" / f"{BAD}.json")
    done = _vitbench(*RUN, "--shots", "1", "--seeds", "0", "--results", stored, timeout=120)
    assert done.returncode == 0 and f"{BAD}.json: cannot be read (not a regular file)" in done.stderr, done.stderr


def _file_size_limit(limit: int):
    """In the child: writes past `limit` bytes fail (EFBIG, as ENOSPC would on a full disk) instead
    of killing the process with SIGXFSZ."""
    import resource
    import signal

    def apply() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


def test_a_write_that_fails_is_one_line_and_leaves_no_partial_file(tmp_path):
    """Before: a full disk gave ENOSPC tracebacks and left a .tmp.npz in the cache. The feature cache
    of the digits (1.4 MB) cannot be written under a 500 kB file-size limit."""
    results = tmp_path / "results"
    done = _vitbench(*RUN, "--shots", "1", "--seeds", "0", "--results", results, preexec_fn=_file_size_limit(500_000))
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    (line,) = [e for e in done.stderr.splitlines() if e.startswith("error:")]
    assert re.search(r"cache/features/\w+\.npz: cannot write it \(File too large\); nothing was written$", line), line
    assert not [p for p in results.rglob("*") if p.is_file() and ".tmp" in p.name]
    assert not list(results.glob("runs/*.json"))


def test_a_results_folder_named_like_a_duckdb_url_is_a_local_folder(cli, tmp_path, monkeypatch):
    """Issue 71, items 4 and 17. Before: `--results md:foo` made DuckDB fetch the MotherDuck extension
    from the network (and fail offline); a `?` in the path sent DuckDB's log elsewhere and the store
    was called "damaged". Now md:foo is a folder here, and a `?` is refused before anything is made."""
    monkeypatch.chdir(tmp_path)
    for name in ("md:foo", "motherduck:bar"):
        code, _, err = cli(*RUN, "--shots", "1", "--seeds", "0", "--results", name)
        assert code == 0 and (tmp_path / name / store.DB_NAME).is_file(), err
        assert accuracy(tmp_path / name) > 0
    code, _, err = cli(*RUN, "--shots", "1", "--seeds", "0", "--results", "a?b")
    assert code == 2 and "'?'" in err and len(err.strip().splitlines()) == 1 and not (tmp_path / "a?b").exists(), err


def test_two_threads_running_on_a_fresh_folder_both_store_their_runs(tmp_path):
    """Issue 71, item 17. Before: two threads calling `vitbench.run` on a fresh folder: one failed
    ("cannot write there": both used one probe file's name; then "damaged … Catalog write-write
    conflict": both created the tables), its runs never done, though the database was healthy."""
    import threading

    import vitbench

    results, errors = tmp_path / "fresh", []

    def run(seed: int) -> None:
        try:
            vitbench.run(model="vit-ti/16", weights="random", datasets="digits", res=32, workers=0, shots=(1,),
                         seeds=(seed,), results=results)  # fmt: skip
        except Exception as e:  # noqa: BLE001 - what the other thread raised is the failure shown
            errors.append(f"{type(e).__name__}: {e}")

    threads = [threading.Thread(target=run, args=(seed,)) for seed in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == [] and sorted(vitbench.results(results)["seed"]) == [0, 1]


def test_two_threads_writing_one_file_at_once_both_succeed(tmp_path):
    """CI, stop 76: the two-thread run above failed now and then ("features/….npz: cannot write
    it (No such file or directory)"): both threads extracted the same features and wrote them
    through one temp file named by the process alone, so one moved the other's away. Here the two
    writes are made to overlap every time: each writes its temp file, then waits for the other."""
    import threading

    from vitbench.files.atomic import write_atomic

    both_written, errors = threading.Barrier(2, timeout=10), []
    target = tmp_path / "features.bin"

    def write(content: bytes) -> None:
        def fill(tmp: Path) -> None:
            tmp.write_bytes(content)
            both_written.wait()  # both temp files exist before either is moved into place

        try:
            write_atomic(target, fill)
        except Exception as e:  # noqa: BLE001 - the failure shown is what the thread raised
            errors.append(f"{type(e).__name__}: {e}")

    threads = [threading.Thread(target=write, args=(bytes([n]) * 64,)) for n in (1, 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == [] and target.read_bytes() in (b"\x01" * 64, b"\x02" * 64)
    assert [p.name for p in tmp_path.iterdir()] == ["features.bin"]  # no temp file left behind

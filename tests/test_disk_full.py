"""A full disk at every write point (issue 63) — the run's lease, the feature cache, the predictions,
the shard, the database; the dedup checkpoint, the audit and the database again — on a real small
file system (a tmpfs filled to a few kB): one line naming what could not be written, a non-zero
exit, nothing finished lost (no shard quarantined, the results before unchanged, no temp file
left), and once space is freed the same command completes. Needs `mount -t tmpfs` (root, as CI
runs); elsewhere these tests skip and say so."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from vitbench import store

RUN = ("run", "--model", "vit-ti/16", "--weights", "random", "--dataset", "digits", "--res", "32", "--workers", "0",
       "--shots", "1")  # fmt: skip
PAGE = 4096  # tmpfs allocates whole pages: each small file takes one


class Disk:
    def __init__(self, root: Path):
        self.root, self.filler = root, root / "filler"

    def fill(self, free: int) -> None:
        """Leave `free` bytes free."""
        self.empty()
        stat = os.statvfs(self.root)
        fd = os.open(self.filler, os.O_CREAT | os.O_WRONLY)
        try:
            os.posix_fallocate(fd, 0, stat.f_bavail * stat.f_frsize - free)
        finally:
            os.close(fd)

    def empty(self) -> None:
        self.filler.unlink(missing_ok=True)


@pytest.fixture
def disk(tmp_path):
    root = tmp_path / "disk"
    root.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", str(root)], capture_output=True,
                             text=True)  # fmt: skip
    if mounted.returncode != 0:
        why = mounted.stderr.strip()[:80]
        pytest.skip(f"a small tmpfs cannot be mounted here ({why}): the disk-full tests need one")
    try:
        yield Disk(root)
    finally:
        subprocess.run(["umount", "-l", str(root)], check=False)


@pytest.fixture(scope="module")
def seed_one_cached(tmp_path_factory) -> Path:
    """A store holding seed 0's run, with seed 1's features in the cache but not its result: seed
    1's run then writes a lease, its predictions, its shard and the database, and nothing else."""
    import vitbench

    results = tmp_path_factory.mktemp("cached") / "results"
    vitbench.run(model="vit-ti/16", weights="random", datasets="digits", res=32, workers=0, shots=(1,), seeds=(0, 1),
                 results=results)  # fmt: skip
    for shard in (results / "runs").glob("*.json"):
        if json.loads(shard.read_text())["run"]["seed"] == 1:
            for path in (results / "runs").glob(f"{shard.stem}*"):
                path.unlink()
    (results / store.DB_NAME).unlink()
    store.sync(results)
    return results


def _seeds(results: Path) -> list[int]:
    return sorted(store.read_results(results).drop_duplicates("run_key")["seed"])


def _error_line(err: str) -> str:
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize(
    "free, seed, fails_at",
    [
        (0, 1, r"leases/\w+\.lease: cannot take the run's lease \(No space left on device\); nothing was run"),
        (PAGE, 2, r"cache/features/\w+\.npz: cannot write it \(No space left on device\)"),
        (PAGE, 1, r"runs/\w+\.predictions\.parquet: cannot write it \(.*No space left on device.*\)"),
        (3 * PAGE, 1, r"runs/\w+\.json: cannot write it \(No space left on device\)"),
        (4 * PAGE, 1, r"vitbench\.duckdb: could not take 1 result shard\(s\) \(.*No space left on device.*\); they "
                      r"stay in .*runs and the next command that opens the store merges them"),
    ],
    ids=["lease", "cache", "predictions", "shard", "database"],
)  # fmt: skip
def test_a_full_disk_at_each_write_of_a_run_loses_nothing_and_the_rerun_completes(
    cli, disk, seed_one_cached, free, seed, fails_at
):
    results = disk.root / "results"
    shutil.copytree(seed_one_cached, results)
    before = _seeds(results)
    disk.fill(free)
    command = (*RUN, "--seeds", str(seed), "--results", results)
    code, _, err = cli(*command)
    assert code == 2, err
    line = _error_line(err)
    assert re.search(fails_at, line), line
    assert not (results / "quarantine").exists()  # a valid shard is never blamed for the disk
    assert not [p for p in results.rglob("*") if ".tmp" in p.name]  # no half-written file left
    assert not list((results / "leases").glob("*.lease"))  # no lease left to block the rerun
    if "duckdb" in fails_at:  # the result is on disk as its shard, read by every table meanwhile
        assert _seeds(results) == sorted({*before, seed})
    disk.empty()
    code, _, err = cli(*command)
    assert code == 0, err
    assert _seeds(results) == sorted({*before, seed})
    con = store.connect(results)  # in the database itself, not only in the shards' snapshot
    try:
        assert sorted(r[0] for r in con.execute("SELECT seed FROM runs").fetchall()) == sorted({*before, seed})
    finally:
        con.close()


def _checkpoint_size(tmp_path: Path) -> int:
    """The bytes of the digits audit's checkpoint (written after its one block of train images)."""
    from vitbench.catalog.registry import get_dataset
    from vitbench.engine import dedup
    from vitbench.store.dedup_method import Method

    digits = get_dataset("digits")
    test, train = digits.load_split(None, "test"), digits.load_split(None, "train")

    def stop(blocks, total):
        yield from blocks
        raise KeyboardInterrupt  # after the block and its checkpoint, before the pairs

    with pytest.raises(KeyboardInterrupt):
        dedup.audit(test, train, Method(), progress=stop, checkpoint=tmp_path / "size.pt")
    return (tmp_path / "size.pt").stat().st_size


def test_a_full_disk_at_each_write_of_an_audit_loses_nothing_and_the_rerun_completes(
    cli, disk, seed_one_cached, tmp_path
):
    """dedup takes the audit's lease (issue 71: two dedups of one pair both searched it), writes its
    checkpoint after each block, then the audit's shard, then the database (issue 63: the audit
    was lost with its checkpoint when the database could not take it). The
    checkpoint goes once the shard is written, which frees the disk before the database is asked:
    the database's side is tested held by another process (test_reliability_round4.py), the
    same path a full disk takes there (merge.StoreUnavailable), as the runs' test above fills it."""
    reference = tmp_path / "reference"
    shutil.copytree(seed_one_cached, reference)
    code, out, err = cli("dedup", "--dataset", "digits", "--workers", "0", "--results", reference)
    assert code == 0, err
    expected = store.read_audits(reference)[["audit_key", "n_pairs", "n_test_flagged"]].to_dict("records")
    checkpoint = -(-_checkpoint_size(tmp_path) // PAGE) * PAGE
    results = disk.root / "results"
    command = ("dedup", "--dataset", "digits", "--workers", "0", "--results", results)
    failures = []
    for free in (0, PAGE, PAGE + checkpoint):  # the lease (a page), the checkpoint, the audit's shard
        shutil.rmtree(results, ignore_errors=True)
        shutil.copytree(seed_one_cached, results)  # a store with its database: the audit is the only write
        disk.fill(free)
        code, _, err = cli(*command)
        failures.append((code, _error_line(err) if code else err))
        disk.empty()
        code, _, err = cli(*command)
        assert code == 0, err
        assert store.read_audits(results)[["audit_key", "n_pairs", "n_test_flagged"]].to_dict("records") == expected
        assert not list((results / "dedup").glob("*.pt"))  # the checkpoint went once the audit was on disk
        assert not (results / "quarantine").exists()
    assert [code for code, _ in failures] == [2, 2, 2], failures
    lease = "cannot take the audit's lease (No space left on device); nothing was searched"
    assert "leases/audit-" in failures[0][1] and lease in failures[0][1]
    assert "dedup/" in failures[1][1] and ".pt: cannot write it (No space left on device)" in failures[1][1]
    assert "audits/" in failures[2][1] and ".json: cannot write it (No space left on device)" in failures[2][1]


def test_a_full_tmpdir_ends_the_report_in_one_line_never_without_its_figure(cli, disk, one_run, tmp_path, monkeypatch):
    """Issue 97, item 9. Before: with TMPDIR nearly full, `vitbench report` exited 0 without its few-shot
    figure (a failed write was taken as "nothing to draw")."""
    import tempfile

    import vitbench

    results = tmp_path / "results"
    shutil.copytree(one_run, results)
    vitbench.run(model="vit-ti/16", weights="random", datasets="digits", res=32, workers=0, shots=(1, 5), seeds=(0,),
                 results=results)  # fmt: skip  # (its features cached) two shot counts: the few-shot figure
    out = tmp_path / "report.html"
    code, _, err = cli("report", "--out", out, "--results", results)
    assert code == 0 and 'id="figure-' in out.read_text(), err  # with room, the report has its figure
    out.unlink()
    monkeypatch.setattr(tempfile, "tempdir", str(disk.root))  # TMPDIR, as tempfile read it
    for free in (0, PAGE):
        disk.fill(free)
        code, _, err = cli("report", "--out", out, "--results", results)
        line = _error_line(err)
        assert code == 2 and "No space left on device" in line and "TMPDIR" in line and str(disk.root) in line, err
        assert not out.exists() and not [p for p in disk.root.rglob("*") if p != disk.filler]

"""Issue 63's reproductions, each seen failing before its fix: a held database at the end of an
audit, empty leases, plugin protocols that fail or report out-of-range metrics, CIFAR pickles out
of range, FIFOs in a dataset folder, `dedup --out` to a folder, a killed rank of `--devices 2`, and
the smaller one-line rules. (The full disk at every write point: test_disk_full.py; the fuzzed
file formats: test_file_fuzz.py.)"""

from __future__ import annotations

import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
import time
import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import write_image
from held_store import hold_the_store
from test_protocol_plugin import PACKAGE

from vitbench import store
from vitbench.errors import UserError

DIGITS = ("--model", "vit-ti/16", "--weights", "random", "--dataset", "digits", "--res", "32", "--workers", "0")


def _errors(err: str) -> list[str]:
    assert "Traceback" not in err, err
    return [line for line in err.splitlines() if line.startswith("error:")]


def test_an_audit_finished_while_the_database_is_held_is_kept_and_merged_later(cli, one_run, tmp_path):
    """Before: all blocks searched, then "held by another process", the checkpoint deleted and
    nothing stored."""
    results = tmp_path / "results"
    shutil.copytree(one_run, results)
    holder = hold_the_store(results)
    try:
        code, out, err = cli("dedup", "--dataset", "digits", "--workers", "0", "--results", results)
        assert code == 0 and "the audit is kept in" in err and "searched now" in out, err
        (shard,) = (results / "audits").glob("*.json")
        assert not list((results / "dedup").glob("*.pt"))  # gone only once the audit was on disk
        assert len(store.read_audits(results)) == 1  # readers read the shard meanwhile
    finally:
        holder.kill()
        holder.wait()
    code, out, err = cli("dedup", "--dataset", "digits", "--workers", "0", "--results", results)
    assert code == 0 and "stored before" in out, err  # merged by the next command, not searched again
    con = store.connect(results)
    try:
        assert con.execute("SELECT audit_key FROM dedup_audits").fetchall() == [(shard.stem,)]
    finally:
        con.close()


def test_ingest_rebuild_builds_the_audits_back_from_their_shards(cli, one_run, tmp_path):
    """Before: a rebuilt database had no audits, and `ingest --rebuild` did not say so."""
    results = tmp_path / "results"
    shutil.copytree(one_run, results)
    assert cli("dedup", "--dataset", "digits", "--workers", "0", "--results", results)[0] == 0
    (results / store.DB_NAME).write_bytes(b"not a database" * 100)
    code, out, err = cli("ingest", "--rebuild", "--results", results)
    assert code == 0 and "the dedup audits stored before audits had shards, stay there" in out, err
    assert len(store.read_audits(results)) == 1 and len(store.read_results(results)) > 0


def test_an_empty_lease_left_by_a_full_disk_does_not_block_its_run(cli, one_run, tmp_path):
    """Before: "skipped, running elsewhere (? pid ?)" for 600 s, exit 0."""
    results = tmp_path / "results"
    shutil.copytree(one_run, results)
    from vitbench.api import plan

    (spec,) = [s for g in plan(model="vit-ti/16", weights="random", datasets="digits", res=32, shots=(1,),
                               seeds=(3,), results=results) for s in g.specs]  # fmt: skip
    lease = results / "leases" / f"{spec.run_key}.lease"
    lease.write_bytes(b"")
    old = time.time() - 10
    os.utime(lease, (old, old))
    code, _, err = cli("run", *DIGITS, "--shots", "1", "--seeds", "3", "--results", results)
    assert code == 0 and "taking over a stale lease" in err and "running elsewhere" not in err, err
    assert 3 in set(store.read_results(results)["seed"])


@pytest.fixture
def plugin_protocols():
    """Three protocols as a plugin would write them, registered in this process: one that raises,
    one whose accuracy is 1.5, one whose accuracy is not a number."""
    from vitbench.protocols import registry

    namespace: dict = {}
    exec(PACKAGE, namespace)
    base = namespace["NearestClassMean"]

    def with_metrics(value):
        def run(self, group, todo, req, runtime, recorder):
            for result in base.run(self, group, todo, req, runtime, recorder):
                yield replace(result, metrics={"accuracy": value})

        return run

    def raises(self, group, todo, req, runtime, recorder):
        raise RuntimeError("the plugin's own bug")
        yield

    made = [
        type("Broken", (base,), {"name": "broken", "version": "broken/1", "run": raises})(),
        type("Overshoot", (base,), {"name": "overshoot", "version": "overshoot/1", "run": with_metrics(1.5)})(),
        type("Wordy", (base,), {"name": "wordy", "version": "wordy/1", "run": with_metrics("high")})(),
    ]
    for protocol in made:
        registry.register(protocol)
    yield
    for protocol in made:
        registry.protocols().unregister(protocol.name)


def test_a_failing_plugin_protocol_costs_only_its_own_runs(cli, results, plugin_protocols):
    """Before: `--protocol nanacc,knn` stopped at the plugin's traceback (k-NN never ran), 1.5 was
    stored and tabled as 150.00, and a non-numeric metric crashed the progress printer."""
    code, out, err = cli("run", *DIGITS, "--protocol", "broken,overshoot,wordy,knn", "--knn-k", "5",
                         "--results", results)  # fmt: skip
    assert code == 2, err
    failed = [line for line in err.splitlines() if line.startswith("failed:")]
    assert len(failed) == 3 and all("(registered in this process) on vit-ti/16, digits" in f for f in failed), err
    assert "broken (registered in this process)" in failed[0] and "RuntimeError: the plugin's own bug" in failed[0]
    assert "metric 'accuracy' = 1.5 is declared a fraction (shown as %), expected from 0 to 1" in failed[1]
    assert "metric 'accuracy' = 'high' is not a number" in failed[2]
    (line,) = _errors(err)
    assert "3 protocol(s) failed" in line and "the other runs are stored" in line
    stored = store.read_results(results)
    assert set(stored["protocol"]) == {"knn"}  # k-NN ran after them; nothing of theirs was stored
    assert not list((results / "leases").glob("*.lease"))


@pytest.mark.parametrize(
    "data, says",
    [
        (np.full((2, 3072), 300, dtype=np.int64), "'data' holds values from 300 to 300, expected integers from 0 to"),
        ([[300] * 3072, [0] * 3072], "'data' holds values from 0 to 300, expected integers from 0 to 255"),
    ],
    ids=["int64-above-255", "list-with-300"],
)  # fmt: skip
def test_cifar_pixels_out_of_range_are_refused_naming_the_file(cli, tmp_path, data, says):
    """Before: int64 above 255 wrapped into uint8 in silence (k-NN scored 14.50 %); a list holding
    300 was an OverflowError traceback."""
    folder = tmp_path / "data" / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    for name in ("data_batch_1", "test_batch"):
        with open(folder / name, "wb") as f:
            pickle.dump({"data": data, "labels": [1, 2]}, f)
    code, _, err = cli("run", "--model", "vit-ti/16", "--weights", "random", "--dataset", "cifar10", "--protocol",
                       "knn", "--res", "32", "--workers", "0", "--data-dir", tmp_path / "data",
                       "--results", tmp_path / "results")  # fmt: skip
    (line,) = _errors(err)
    assert code == 2 and re.fullmatch(rf"error: {re.escape(str(folder))}/\w+: {re.escape(says)}.*", line), line


def test_a_fifo_named_like_a_cifar_batch_hangs_no_command(tmp_path, cifar10_dir):
    """Before: `run`, `dedup` and `doctor` waited on the FIFO forever."""
    batch = cifar10_dir / "cifar-10-batches-py" / "data_batch_1"
    batch.unlink()
    os.mkfifo(batch)
    where = ("--data-dir", str(cifar10_dir))
    for args in (
        ("run", "--model", "vit-ti/16", "--weights", "random", "--dataset", "cifar10", "--res", "32", "--workers", "0",
         "--results", str(tmp_path / "r")),
        ("dedup", "--dataset", "cifar10", "--workers", "0", "--results", str(tmp_path / "r")),
        ("doctor",),
    ):  # fmt: skip
        done = subprocess.run([sys.executable, "-m", "vitbench", *args, *where], capture_output=True, text=True,
                              timeout=120, env={**os.environ, "COLUMNS": "400"})  # fmt: skip
        said = done.stdout + done.stderr  # (doctor names the file from the dataset's folder)
        assert "Traceback" not in said and "data_batch_1: cannot be read (not a regular file)" in said, said
        assert done.returncode == (0 if args[0] == "doctor" else 2), done.stderr


def test_dedup_out_paths_it_cannot_write_are_one_line(cli, tmp_path):
    """Before: a traceback after the audit was stored, for a folder, /sys/x.csv or a path below a file."""
    (tmp_path / "a-file").write_text("")
    for out, says in (
        (tmp_path, "is a folder, expected a file name"),
        (tmp_path / "a-file" / "x.csv", "a-file is a file, not a folder"),
    ):
        code, _, err = cli("dedup", "--dataset", "digits", "--out", out, "--results", tmp_path / "results")
        (line,) = _errors(err)
        assert code == 2 and says in line, err
    assert not (tmp_path / "results").exists()  # refused before any work
    code, _, err = cli("dedup", "--dataset", "digits", "--against", ",,", "--results", tmp_path / "results")
    assert code == 2 and "--against ',,': expected a comma list of dataset names" in _errors(err)[0]


@pytest.mark.slow
def test_a_killed_rank_is_named_in_one_line_and_its_checkpoint_kept(tmp_path):
    """Before: 130 lines of gloo and ChildFailedError tracebacks, and no vitbench line. Rank 1 is
    killed once the run's first checkpoint is on disk; the same command then resumes from it (the
    resume itself: test_finetune_cli's killed run, the same checkpoint under the same run key)."""
    results = tmp_path / "results"
    command = [sys.executable, "-m", "vitbench", "run", *DIGITS, "--protocol", "finetune", "--batch", "16", "--steps",
               "40", "--lr", "0.03", "--seeds", "0", "--checkpoint-every", "10", "--devices", "2",
               "--results", str(results)]  # fmt: skip
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, start_new_session=True)
    assert process.stderr is not None
    try:
        seen = []
        for line in process.stderr:  # the first progress line: both ranks are training
            seen.append(line)
            if "step " in line:
                break
        deadline = time.monotonic() + 60
        while not list(results.glob("runs/*/checkpoint.pt")) and time.monotonic() < deadline:
            time.sleep(0.05)  # the checkpoint of step 10 is written after its progress line
        rank = [pid for pid in _descendants(process.pid) if b"\0LOCAL_RANK=1\0" in b"\0" + _environ(pid)]
        assert len(rank) == 1, seen
        os.kill(rank[0], signal.SIGKILL)
        err = "".join(seen) + process.stderr.read()
        process.wait(timeout=120)
    finally:
        if process.poll() is None:  # a failed assertion leaves no training behind
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == 2, err
    (line,) = _errors(err)
    assert re.search(rf"rank 1 of 2 \(pid {rank[0]}\) was killed by SIGKILL", line), line
    assert "the same command resumes (torchrun's log: " in line and "[rank0]" not in err, err
    assert len(err.splitlines()) < 15, err
    log = Path(line.rsplit("torchrun's log: ", 1)[1].rstrip(")"))
    assert "ChildFailedError" in log.read_text()  # the whole story is kept, out of the way
    (checkpoint,) = results.glob("runs/*/checkpoint.pt")  # what the same command resumes from
    assert torch.load(checkpoint, map_location="cpu", weights_only=False)["step"] >= 10
    assert store.read_results(results).empty and not list(results.glob("leases/*.lease"))


def test_how_a_rank_ended_is_read_from_torchruns_report():
    """The other endings of torchrun's root cause: an exception in a rank (its last error line is
    named), and a rank's own one-line error (it printed it itself: nothing is added)."""
    from vitbench.execution.supervise import died

    report = (
        '[rank1]: Traceback (most recent call last):\n[rank1]:   File "x.py", line 1, in <module>\n'
        "[rank1]: RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
        "Root Cause (first observed failure):\n[0]:\n  time      : 2026-11-27_06:53:47\n  host      : localhost\n"
        "  rank      : 1 (local_rank: 1)\n  exitcode  : {code} (pid: 4242)\n  error_file: <N/A>\n"
    )
    assert died(report.format(code=1), 2) == (
        "rank 1 of 2 (pid 4242) failed (exit code 1): RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB"
    )
    assert died(report.format(code=2), 2) is None  # a UserError: the rank's own `error:` line says it
    assert (
        died(report.format(code=-6), 4) == "rank 1 of 4 (pid 4242) was killed by SIGABRT, and the other rank(s) "
        "stopped with it"
    )
    assert died("no report at all", 2) is None


def _descendants(pid: int) -> list[int]:
    found = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    return [d for child in map(int, found) for d in (child, *_descendants(child))]


def _environ(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:  # gone meanwhile, or not ours
        return b""


def test_the_api_refuses_what_it_would_have_ignored(tmp_path):
    """Before: AttributeErrors for run(123) and datasets=123; `run(request(res=32), res=64)` ran at
    32 and `shots=[]` planned nothing, both in silence."""
    import vitbench

    req = vitbench.request(model="vit-ti/16", weights="random", datasets="digits", res=32, results=tmp_path)
    for call, says in (
        (lambda: vitbench.run(123), "vitbench.run(123): expected a Request"),
        (lambda: vitbench.plan(123), "vitbench.plan(123): expected a Request"),
        (lambda: vitbench.run(req, res=64), "a Request and keyword options (res) at once"),
        (lambda: vitbench.plan(model="vit-ti/16", weights="random", datasets=123), "datasets=123: expected a name"),
        (lambda: vitbench.plan(model="vit-ti/16", weights="random", datasets="digits", shots=[]),
         "--shots: an empty list; expected at least one"),
        (lambda: vitbench.results(123), "expected a results folder"),
    ):  # fmt: skip
        with pytest.raises(UserError, match=re.escape(says)):
            call()
    assert not list(tmp_path.iterdir())


def test_smaller_rules_each_one_line(cli, one_run, tmp_path):
    """`--weights /dev/zero` said "no such file"; `ingest` on a newer vitbench's database said
    "merged 0" with exit 0."""
    code, _, err = cli("run", *DIGITS[:2], "--weights", "/dev/zero", *DIGITS[4:], "--results", tmp_path / "r")
    assert code == 2 and "/dev/zero: not a regular file (a device or FIFO), expected a weights file" in err, err
    results = tmp_path / "newer"
    shutil.copytree(one_run, results)
    con = store.connect(results)
    con.execute("INSERT INTO schema_version VALUES (99, NULL, NULL)")
    con.close()
    code, out, err = cli("ingest", "--results", results)
    assert code == 2 and "written by a newer vitbench (schema 99" in err and "merged" not in out, (out, err)


def test_images_it_does_not_read_are_counted_and_big_ones_skipped_in_one_line(cli, tmp_path, caplog):
    """An animated GIF copy was left out without a count, a TIFF copy too (TIFF is read now, as
    torchvision's ImageFolder reads it); a 12,000² PNG raised PIL's DecompressionBombWarning raw."""
    from PIL import Image

    from vitbench.catalog.registry import get_dataset
    from vitbench.datasets.base import CorruptImage, decode

    root = tmp_path / "photos"
    for split in ("train", "test"):
        for label in ("a", "b"):
            for i in range(3):
                write_image(root / split / label / f"{i}.png", seed=i + 7 * (label == "b") + 13 * (split == "test"))
    first = Image.open(root / "test" / "a" / "0.png")
    first.save(root / "train" / "a" / "copy.gif", save_all=True, append_images=[first.rotate(90)])
    first.save(root / "train" / "b" / "copy.tif")
    with caplog.at_level("WARNING", logger="vitbench"):
        split = get_dataset(f"folder:{root}").load_split(None, "train")
    assert any(p.endswith("copy.tif") for p in split.paths) and not any(p.endswith(".gif") for p in split.paths)
    assert "left out 1 file(s) that are not images vitbench reads (.gif ×1" in caplog.text
    big = tmp_path / "big.png"
    Image.new("L", (12_000, 12_000)).save(big)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing reaches the terminal raw: the image is skipped, counted, named
        with pytest.raises(CorruptImage, match=re.escape(f"{big}: ") + ".*exceeds limit"):
            decode(big)


def test_an_audit_that_read_no_test_image_does_not_read_as_clean(cli, tmp_path):
    """Before: every test image unreadable reported "0 (0.00 %)", as a clean split does."""
    root = tmp_path / "photos"
    for split in ("train", "test"):
        for label in ("a", "b"):
            for i in range(2):
                write_image(root / split / label / f"{i}.png", seed=i)
    for path in (root / "test").rglob("*.png"):
        path.write_bytes(b"not a png")
    code, out, err = cli("dedup", "--dataset", f"folder:{root}", "--workers", "0", "--results", tmp_path / "r")
    assert code == 0, err
    assert "4 (4 unreadable)" in out and "— (no test image could be read)" in out and "0 (0.00 %)" not in out

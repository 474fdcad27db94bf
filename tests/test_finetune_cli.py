"""`vitbench run --protocol finetune` end to end, as a user runs it: the dev sweep then the final
runs, a run killed with SIGKILL and resumed, two data-parallel processes, and the smoke check that
fine-tuning a pretrained ViT beats its own few-shot accuracy."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest
import torch
import warm_launcher
from conftest import DEIT_WEIGHTS, needs_shared_data

from vitbench.store import read_curves, read_results

# a random-init ViT-Ti at 32 px (2x2 patches) on the embedded digits: seconds per run on a CPU
TINY = ["--model", "vit-ti/16", "--weights", "random", "--dataset", "digits", "--protocol", "finetune"]
TINY += ["--res", "32", "--batch", "16", "--workers", "0", "--device", "cpu"]


def finetune_runs(results: Path, stage: str | None = None):
    df = read_results(results)
    df = df[df["protocol"] == "finetune"].copy()
    df["stage"] = df["hparams"].map(lambda h: json.loads(h)["stage"])
    return df if stage is None else df[df["stage"] == stage]


def vitbench(*args: str, results: Path, **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "200"}
    # warm (tests/warm_launcher.py): what these runs check is what they store and print, not their start
    return warm_launcher.run(
        [sys.executable, "-m", "vitbench", "run", *args, "--results", str(results)],
        env=env,
        capture_output=True,
        text=True,
        **kw,
    )


@pytest.mark.slow
def test_sweep_picks_the_best_dev_lr_and_the_final_runs_use_it(cli, results):
    code, out, err = cli("run", *TINY, "--smoke", "--steps", "4", "--seeds", "0,1", "--results", results)
    assert code == 0, err
    sweep = finetune_runs(results, "sweep")
    dev = sweep[sweep["metric"] == "dev_accuracy"]
    assert len(dev) == 4  # Table's grid for a dataset of 1,000 images: 0.001, 0.003, 0.01, 0.03
    by_lr = {json.loads(h)["lr"]: v for h, v in zip(dev["hparams"], dev["value"], strict=True)}
    assert sorted(by_lr) == [0.001, 0.003, 0.01, 0.03]
    assert set(dev["n_test"]) == {100} and set(dev["n_train"]) == {900}  # 10 % of train held out as dev
    best = max(by_lr, key=lambda lr: (by_lr[lr], -lr))
    final = finetune_runs(results, "final")
    assert set(final["seed"]) == {0, 1} and set(final["n_train"]) == {1000} and set(final["n_test"]) == {797}
    for metric, expected in [("lr", best), ("dev_accuracy", by_lr[best])]:
        assert final.loc[final["metric"] == metric, "value"].tolist() == pytest.approx([expected, expected])
    notes = json.loads(final["notes"].iloc[0])
    assert notes["sweep"] == {f"{lr:g}": acc for lr, acc in by_lr.items()} and notes["restarts"] == 0
    run = final.iloc[0]
    assert run["device_seconds"] > 0 and run["flops"] > 3 * run["flops_per_image"] * 4 * 16  # 3 x forward per image
    assert set(final["metric"]) >= {"accuracy", "train_images_per_second", "final_train_loss"}
    assert "mfu" not in set(final["metric"])  # a CPU has no known peak: throughput only
    curves = read_curves(results, list(final["run_key"].unique()))
    assert set(curves["name"]) == {"train_loss", "lr", "grad_norm"} and curves["step"].max() == 4
    assert "Digits (8x8, scikit-learn)" in " ".join(out.split()) and "§" in out  # the smoke column, marked
    # nothing left to do the second time; the plan shows each stage and LR
    code, out, _ = cli("run", *TINY, "--smoke", "--steps", "4", "--seeds", "0,1", "--results", results, "--dry-run")
    assert code == 0 and out.count("done") == 6 and "sweep lr=0.03 steps=4 batch=16 res=32" in out
    assert not any((results / "runs").glob("*/checkpoint.pt"))  # checkpoints go once the result is stored


def test_finetune_option_errors_are_one_line(cli, results):
    code, _, err = cli("run", *TINY, "--batch", "10", "--micro-batch", "4", "--lr", "0.01", "--results", results)
    assert code == 2 and "--batch 10: must split evenly over 1 process(es) and into micro-batches of 4" in err
    assert "Traceback" not in err
    code, _, err = cli("run", *TINY, "--precision", "fp16", "--results", results)
    assert code == 2 and "--precision fp16: expected auto, bf16 or fp32" in err


def test_devices_mistakes_stop_before_torchrun_starts(cli, results):
    # planned in the launching process: one line, not one per torchrun child plus torchrun's report
    code, _, err = cli("run", *TINY, "--smoke", "--batch", "16", "--devices", "3", "--results", results)
    assert code == 2 and err.strip() == "error: --batch 16: must split evenly over the 3 processes (--devices)"
    code, _, err = cli("run", *TINY, "--dataset", "cifar10", "--devices", "2", "--results", results)
    assert code == 2 and err.count("\n") == 1 and "cifar10 (no cifar-10-batches-py)" in err


@pytest.mark.slow
def test_a_run_killed_with_sigkill_resumes_and_ends_as_an_uninterrupted_one(tmp_path):
    steps = 80  # 70 steps after the first checkpoint: the kill lands mid-run however fast the machine
    args = [*TINY, "--steps", str(steps), "--lr", "0.03", "--seeds", "0", "--checkpoint-every", "10"]
    killed = tmp_path / "killed"
    # the uninterrupted run, meanwhile, in a process of its own (the same trajectory whatever the load)
    log = (tmp_path / "straight.log").open("w")
    command = [sys.executable, "-m", "vitbench", "run", *args, "--results", str(tmp_path / "straight")]
    straight = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log)
    proc = subprocess.Popen(
        [sys.executable, "-m", "vitbench", "run", *args, "--results", str(killed)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    while not list((killed / "runs").glob("*/checkpoint.pt")) and time.monotonic() < deadline:
        assert proc.poll() is None, "the run ended before its first checkpoint"
        time.sleep(0.05)
    time.sleep(0.3)  # let it run past the checkpoint: that work is lost and done again
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not list((killed / "runs").glob("*.json"))  # killed mid-run: no result yet
    (checkpoint,) = (killed / "runs").glob("*/checkpoint.pt")
    saved = torch.load(checkpoint, weights_only=True)
    assert saved["seconds"] > 0 and saved["step"] < steps
    # mark the first process's clock: 1000 device-seconds more than it counted, so the total shows
    # whether the resumed process went on from the checkpoint's clock or started again from 0
    torch.save({**saved, "seconds": saved["seconds"] + 1000.0}, checkpoint)
    resumed = vitbench(*args, results=killed)
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed at step" in resumed.stderr
    assert straight.wait(timeout=600) == 0, (tmp_path / "straight.log").read_text()

    runs = {name: finetune_runs(tmp_path / name) for name in ("killed", "straight")}
    curves = {name: read_curves(tmp_path / name) for name in runs}
    for curve in ("train_loss", "lr", "grad_norm"):
        a, b = (curves[n][curves[n]["name"] == curve]["value"].tolist() for n in runs)
        assert len(a) == steps and a == b  # the same trajectory, step for step
    accuracy = {n: r.loc[r["metric"] == "accuracy", "value"].item() for n, r in runs.items()}
    assert accuracy["killed"] == accuracy["straight"]
    notes = json.loads(runs["killed"]["notes"].iloc[0])
    assert notes["restarts"] == 1 and notes["train_images"] >= steps * 16
    # the clock kept counting across the restart (big_vision's Chrono): the checkpoint's seconds are in the total
    assert notes["train_device_seconds"] > saved["seconds"] + 1000.0
    assert runs["killed"]["device_seconds"].iloc[0] > notes["train_device_seconds"]


@pytest.mark.slow
def test_two_data_parallel_processes_follow_the_single_process_trajectory(cli, tmp_path):
    args = [*TINY, "--steps", "6", "--lr", "0.03", "--seeds", "0"]
    # the single process in this one (what it proves is the two processes' trajectory, not its own start)
    code, _, err = cli("run", *args, "--results", tmp_path / "one")
    assert code == 0, err
    two = vitbench(*args, "--devices", "2", results=tmp_path / "two")
    assert two.returncode == 0, two.stderr
    curves = {n: read_curves(tmp_path / n) for n in ("one", "two")}
    for curve in ("train_loss", "grad_norm", "lr"):
        a, b = (curves[n][curves[n]["name"] == curve]["value"].to_numpy() for n in curves)
        assert len(a) == 6
        assert a == pytest.approx(b, rel=1e-5, abs=1e-6)  # gloo's all-reduce sums in another order
    with duckdb.connect(str(tmp_path / "two" / "vitbench.duckdb"), read_only=True) as con:
        (count,) = con.execute("SELECT device_count FROM runs").fetchone()
    assert count == 2


@pytest.mark.slow
@needs_shared_data
def test_a_smoke_finetune_of_deit_on_digits_beats_its_own_fewshot_accuracy(cli, results):
    common = ["--model", "deit-ti/16", "--weights", DEIT_WEIGHTS, "--dataset", "digits", "--seeds", "0"]
    common += ["--workers", "0", "--results", results]
    code, _, err = cli("run", *common, "--res", "64", "--shots", "25")
    assert code == 0, err
    code, _, err = cli("run", *common, "--protocol", "finetune", "--smoke", "--steps", "50", "--lr", "0.03")
    assert code == 0, err
    df = read_results(results)
    acc = df[df["metric"] == "accuracy"].set_index("protocol")["value"]
    assert acc["finetune"] > 0.5  # chance is 0.1
    assert acc["finetune"] > acc["fewshot"]  # 25-shot linear probe on the same features at the same 64 px


@pytest.mark.slow
def test_polyak_warmup_lets_the_average_follow_a_short_run(cli, results):
    """Polyak at a constant 0.9999 starts from the pre-trained weights: after 30 steps they still
    weigh 0.9999^30 ≈ 99.7 %, so the averaged model is nearly the starting one (a faint trace of the
    trained head on the initial backbone). With --polyak-warmup (timm's ModelEmaV3 decay warm-up)
    the average follows the run. (Measured: 18.6 % against 49.3 %.)"""
    common = ["run", *TINY, "--smoke", "--steps", "30", "--lr", "0.03", "--seeds", "0", "--polyak", "0.9999"]
    code, _, err = cli(*common, "--results", results / "constant")
    assert code == 0, err
    code, _, err = cli(*common, "--polyak-warmup", "--results", results / "warm")
    assert code == 0, err
    runs = {name: read_results(results / name) for name in ("constant", "warm")}
    acc = {name: float(df[df["metric"] == "accuracy"]["value"].iloc[0]) for name, df in runs.items()}
    assert acc["warm"] > acc["constant"] + 0.2
    assert json.loads(runs["warm"]["hparams"].iloc[0])["polyak_warmup"].startswith("timm ModelEmaV3")
    assert json.loads(runs["constant"]["hparams"].iloc[0])["polyak_warmup"] == "none"  # the default, a value too
    code, _, err = cli("run", *TINY, "--smoke", "--polyak-warmup", "--results", results / "x", "--dry-run")
    assert code == 2 and "--polyak-warmup: warms up the decay of --polyak" in err


def test_tensorboard_event_files_hold_the_curves_and_scores(cli, results, tmp_path):
    """`--tensorboard DIR`: each fine-tune's loss, LR, gradient norm and test accuracy as event
    files, read back with TensorBoard's own EventAccumulator."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    board = tmp_path / "tb"
    code, _, err = cli("run", "--model", "vit-ti/16", "--weights", "random", "--dataset", "digits", "--protocol",
                       "finetune", "--smoke", "--steps", "4", "--batch", "8", "--lr", "0.01", "--res", "32",
                       "--seeds", "0", "--workers", "0", "--tensorboard", board, "--results", results)  # fmt: skip
    assert code == 0, err
    (run_dir,) = list(board.iterdir())
    assert run_dir.name.endswith("-vit-ti_16-digits-final-seed0")
    events = EventAccumulator(str(run_dir))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"train/loss", "train/lr", "train/grad_norm", "test/accuracy"} <= tags
    assert [e.step for e in events.Scalars("train/loss")] == [1, 2, 3, 4]
    stored = read_results(results).set_index("metric")["value"]["accuracy"]
    assert events.Scalars("test/accuracy")[0].value == pytest.approx(stored)


def test_a_run_whose_loss_diverges_stops_and_leaves_nothing(cli, results):
    """Before: `--lr nan` trained for 149 s, printed 9.91 %, quarantined its own shard and left its
    predictions file behind. A loss that turns non-finite now ends the run at the next read-back."""
    code, _, err = cli("run", *TINY, "--steps", "20", "--lr", "1e30", "--seeds", "0", "--checkpoint-every", "5",
                       "--results", results)  # fmt: skip
    assert code == 2 and "Traceback" not in err
    (line,) = [e for e in err.splitlines() if e.startswith("error:")]
    assert re.search(r"seed=0: the (training loss|gradient norm) is (nan|inf) at step \d+; the run stopped and stored "
                     r"nothing \(.*try a lower --lr\)$", line), line  # fmt: skip
    left = [p.relative_to(results) for p in results.rglob("*") if p.is_file() and "runs" in p.parts]
    assert left == [], left  # no shard, no predictions, no checkpoint
    assert read_results(results).empty

"""`vitbench submit` against a real Slurm: Debian's slurm-wlm, one node on 127.0.0.1, no
accounting daemon, started by `nox -s slurm` (tests/slurm_cluster.py). Each test runs the
`vitbench` command as a cluster user types it, with the default options where the issue asks for
them (DataLoader workers included), and acts on its jobs as Slurm and its users do: `scancel`,
`scancel -s USR2`, `scontrol requeue`, a node set DOWN, a time limit reached.

Slurm holds a requeued batch job for two minutes before it may start again; where that wait is not
what a test is about, the test lets it start at once (`scontrol update StartTime=now`, what an
admin does), which changes nothing vitbench sees but the time.

Without a Slurm these tests skip and say why (`nox -s tests` has none: `nox -s slurm` starts one)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import vitbench
from vitbench.devices import DEFAULT_WORKERS

_WHY = os.environ.get("VITBENCH_TEST_SLURM")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        _WHY is None or _WHY.startswith("skip:"),
        reason=(_WHY or "skip: no Slurm started for these tests (`nox -s slurm` starts one)").removeprefix("skip: "),
    ),
]

VITBENCH = str(Path(sys.executable).with_name("vitbench"))
JOB_CPUS = 1 + DEFAULT_WORKERS  # what a job asks for by default: one CPU for itself, one per DataLoader worker
FINETUNE = (
    "--model", "vit-ti/16", "--weights", "random", "--dataset", "digits", "--protocol", "finetune",
    "--lr", "0.01", "--seeds", "0", "--res", "32", "--batch", "16", "--steps", "300",
)  # fmt: skip
FEWSHOT = ("--model", "vit-ti/16", "--weights", "random", "--dataset", "digits", "--res", "32", "--shots", "1,5")


def slurm(*args: str, check: bool = True) -> str:
    return subprocess.run(args, capture_output=True, text=True, check=check, timeout=60).stdout


def job_state(job: str) -> dict[str, str]:
    """`scontrol show job`'s fields of one job (by its own id or `array_task`), {} once forgotten."""
    text = slurm("scontrol", "show", "job", "-o", job.split("_")[0], check=False)
    for line in text.splitlines():
        fields = dict(re.findall(r"(\w+)=(\S*)", line))
        ids = {fields.get("JobId"), f"{fields.get('ArrayJobId')}_{fields.get('ArrayTaskId')}"}
        if job in ids:
            return fields
    return {}


def wait_for(what: str, condition, timeout: float = 240, every: float = 0.5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


class Submitted:
    """`vitbench submit …` running in the background as a user started it, its output in files."""

    def __init__(self, folder: Path, *args: str, env: dict | None = None):
        self.folder = folder
        self.stdout, self.stderr = folder / "submit.out", folder / "submit.err"
        with open(self.stdout, "w") as out, open(self.stderr, "w") as err:
            self.process = subprocess.Popen([VITBENCH, "submit", "--cluster", "slurm", *args], stdout=out, stderr=err,
                                            cwd=folder, env={**os.environ, **(env or {})})  # fmt: skip

    def job(self, number: int = 0, timeout: float = 120) -> str:
        """The id of the `number`th job it submitted (as its ledger names it)."""

        def listed():
            jobs = [j["job_id"] for f in sorted(self.folder.glob("results/jobs/*/vitbench-jobs.json"))
                    for j in json.loads(f.read_text())["jobs"]]  # fmt: skip
            return jobs[number] if len(jobs) > number else None

        return wait_for("the job to be submitted", listed, timeout)

    def ended(self, timeout: float = 600) -> tuple[int, str, str]:
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise AssertionError(f"vitbench submit still waiting after {timeout} s:\n{self.stderr.read_text()}") from None
        return code, self.stdout.read_text(), self.stderr.read_text()


@pytest.fixture
def no_requeue_hold():
    """Requeued jobs of this test start again at once instead of after Slurm's two-minute hold."""
    stop = threading.Event()

    def release() -> None:
        while not stop.wait(1):
            for line in slurm("squeue", "-h", "-o", "%i %r", check=False).splitlines():
                job, _, reason = line.partition(" ")
                if reason.strip() == "BeginTime":
                    slurm("scontrol", "update", f"JobId={job}", "StartTime=now", check=False)

    thread = threading.Thread(target=release, daemon=True)
    thread.start()
    yield
    stop.set()
    thread.join()


@pytest.fixture(autouse=True)
def no_jobs_left():
    """Every test starts on an empty queue and leaves none of its jobs behind."""
    yield
    for job in slurm("squeue", "-h", "-o", "%A", check=False).split():
        slurm("scancel", job, check=False)


@pytest.fixture(scope="module")
def finetune_alone(tmp_path_factory) -> dict:
    """The test fine-tune run here, uninterrupted, on as many threads as a job has CPUs: the
    numbers each interrupted job must end with."""
    folder = tmp_path_factory.mktemp("alone")
    env = {**os.environ, "OMP_NUM_THREADS": str(JOB_CPUS)}
    subprocess.run([VITBENCH, "run", *FINETUNE, "--results", "results"], cwd=folder, env=env, check=True,
                   capture_output=True, timeout=600)  # fmt: skip
    return _only_run(folder / "results")


def _only_run(results: Path) -> dict:
    (shard,) = (results / "runs").glob("*.json")
    return json.loads(shard.read_text())


def _same_numbers(run: dict, alone: dict) -> None:
    assert run["run"]["run_key"] == alone["run"]["run_key"]
    assert run["run"]["notes"]["cpu_threads"] == alone["run"]["notes"]["cpu_threads"] == JOB_CPUS
    timing = {"train_images_per_second"}  # a measurement of the machine, not a result
    assert {k: v for k, v in run["metrics"].items() if k not in timing} == {
        k: v for k, v in alone["metrics"].items() if k not in timing
    }
    assert run["curves"]["train_loss"] == alone["curves"]["train_loss"]
    assert len(run["curves"]["train_loss"]) == 300


def _checkpointed(folder: Path):
    return lambda: next((folder / "results" / "runs").glob("*/checkpoint.pt"), None)


def test_a_few_shot_plan_runs_as_jobs_with_what_it_needs_and_says_where_it_is(tmp_path):
    """The happy path, with the default options: the local run's numbers; the command the user typed
    and the job's id stored with each run; the CPUs and memory the plan needs, torch on those CPUs;
    each run's progress line in the job's log; plain progress lines while waiting; no warning from
    submitit or sacct at each poll (there is no accounting here)."""
    local = tmp_path / "local"
    local.mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": str(JOB_CPUS)}
    subprocess.run([VITBENCH, "run", *FEWSHOT, "--results", "results"], cwd=local, env=env, check=True,
                   capture_output=True, timeout=300)  # fmt: skip
    submitted = Submitted(tmp_path, *FEWSHOT, "--results", "results")
    code, out, err = submitted.ended()
    assert code == 0, err
    ours, theirs = (vitbench.results(f / "results").sort_values("run_key") for f in (tmp_path, local))
    assert list(ours["run_key"]) == list(theirs["run_key"]) and len(ours) == 6
    assert list(ours["accuracy"]) == list(theirs["accuracy"])
    job = submitted.job()
    for _, run in ours.iterrows():
        assert run["command"] == f"vitbench submit --cluster slurm {' '.join(FEWSHOT)} --results results"
        assert run["notes"]["slurm_job"] == job
        assert run["notes"]["cpu_threads"] == JOB_CPUS
    script = next((tmp_path / "results" / "jobs").glob("*/*_submission.sh")).read_text()
    assert f"#SBATCH --cpus-per-task={JOB_CPUS}" in script
    memory = int(re.search(r"#SBATCH --mem=(\d+)GB", script).group(1))
    assert 1 <= memory <= 4  # ViT-Ti at 32 px on 1,797 digits and a DataLoader worker: not the node's 20+ GB
    log = next((tmp_path / "results" / "jobs").glob("*/*_log.err")).read_text()
    assert re.search(r"\[1/6\] vit-ti/16 digits fewshot shots=1 seed 0: accuracy \d", log), log
    assert re.search(r"1 job\(s\): 0 pending, 1 running, 0 done · runs stored 0/6 · 00:00:\d\d", err), err
    assert "1 job(s): 0 pending, 0 running, 1 done · runs stored 6/6" in err
    assert "sacct" not in err + out and "submitit" not in err + out and "accounting" not in err + out


def test_a_fine_tune_preempted_with_usr2_is_requeued_once_and_resumes(tmp_path, finetune_alone, no_requeue_hold):
    """`scancel -s USR2` (what Slurm sends before a time limit, and on pre-emption) during a fine-tune
    with DataLoader workers: the job checkpoints where it is, is requeued once, resumes there and ends
    with the uninterrupted run's numbers; `vitbench submit` waits through it and exits 0."""
    submitted = Submitted(tmp_path, *FINETUNE, "--results", "results")
    job = submitted.job()
    wait_for("the first checkpoint", _checkpointed(tmp_path))
    slurm("scancel", "-s", "USR2", job)
    code, out, err = submitted.ended()
    assert code == 0, err
    run = _only_run(tmp_path / "results")
    _same_numbers(run, finetune_alone)
    assert run["run"]["notes"]["restarts"] == 1
    assert job_state(job)["Restarts"] == "1"
    assert f"job {job} requeued (restart 1)" in err
    log = next((tmp_path / "results" / "jobs").glob("*/*_log.err")).read_text()
    stopped = re.findall(r"stopped: .* at step (\d+) of 300, checkpointed", log)
    resumed = re.findall(r"resumed at step (\d+) of 300 \(restart 1\)", log)
    assert len(stopped) == 1 and resumed == stopped  # resumed where it stopped, not at a periodic checkpoint
    assert "DataLoader worker" not in log and "Caught signal" in log

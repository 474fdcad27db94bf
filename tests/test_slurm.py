"""`vitbench submit` against a real Slurm: Debian's slurm-wlm, one node on 127.0.0.1, no
accounting daemon, started by each test worker for its own tests (tests/slurm_cluster.py) where
`nox -s tests` found or installed Slurm. The tests run in lanes (tests/conftest.py), each on a
worker and a cluster of its own, beside the rest of the suite: most of a test's time is a job's
wait in Slurm (a requeue, a time limit), which another lane or test uses. Each test runs the
`vitbench` command as a cluster user types it, with the default options where the issue asks for
them (DataLoader workers included), and acts on its jobs as Slurm and its users do: `scancel`,
`scancel -s USR2`, `scontrol requeue`, a node set DOWN, a time limit reached.

Slurm holds a requeued batch job for two minutes before it may start again; where that wait is not
what a test is about, the test lets it start at once (`scontrol update StartTime=now`, what an
admin does), which changes nothing vitbench sees but the time.

Without a Slurm these tests skip and say why."""

from __future__ import annotations

import contextlib
import datetime
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import slurm_cluster

import vitbench
from vitbench.host.devices import DEFAULT_WORKERS

# "" where `nox -s tests` found Slurm and root (each worker then starts a cluster), else "skip: why"
_WHY = os.environ.get("VITBENCH_TEST_SLURM")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        _WHY is None or _WHY.startswith("skip:"),
        reason=(_WHY or "skip: no Slurm here (`nox -s tests` starts one where it can)").removeprefix("skip: "),
    ),
]


@pytest.fixture(scope="session", autouse=True)
def a_cluster_of_this_workers_own(worker_id):
    """This test worker's own Slurm, started for its first Slurm test and stopped when the session
    ends: SLURM_CONF points this process, and the commands it starts, at it. Its job ids start at
    100,000 × (the worker's number + 1), unique on the machine (slurm_cluster.lose_node)."""
    import tempfile

    number = int(worker_id.removeprefix("gw")) if worker_id.startswith("gw") else 0
    folder = Path(tempfile.mkdtemp(prefix=f"vitbench-slurm-{worker_id}-"))
    before = os.environ.get("SLURM_CONF")
    try:
        os.environ.update(slurm_cluster.start(folder, first_job=slurm_cluster.JOBS_PER_CLUSTER * (number + 1)))
        yield folder
    finally:
        slurm_cluster.stop(folder)
        if before is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = before
        shutil.rmtree(folder, ignore_errors=True)


VITBENCH = str(Path(sys.executable).with_name("vitbench"))
WAIT = float(os.environ.get("VITBENCH_TEST_SLURM_WAIT", "600"))  # the longest a test waits for `vitbench submit`
JOB_CPUS = 1 + DEFAULT_WORKERS  # what a job asks for by default: one CPU for itself, one per DataLoader worker
FINETUNE = (
    "--model", "vit-ti/16", "--weights", "random", "--dataset", "digits", "--protocol", "finetune",
    "--lr", "0.01", "--seeds", "0", "--res", "32", "--batch", "16", "--steps", "300",
)  # fmt: skip
FEWSHOT = ("--model", "vit-ti/16", "--weights", "random", "--dataset", "digits", "--res", "32", "--shots", "1,5")


def slurm(*args: str, check: bool = True) -> str:
    return subprocess.run(args, capture_output=True, text=True, check=check, timeout=60).stdout


def job_state(job: str) -> dict[str, str]:
    """`scontrol show job`'s fields of one job (by its own id, or `array_task` even while the array's
    pending tasks are one record, `ArrayTaskId=0-1%2`), {} once Slurm has forgotten it."""
    text = slurm("scontrol", "show", "job", "-o", job.split("_")[0], check=False)
    for line in text.splitlines():
        fields = dict(re.findall(r"(\w+)=(\S*)", line))
        tasks = fields.get("ArrayTaskId", "").split("%")[0]
        low, _, high = tasks.partition("-")
        ids = {fields.get("JobId")}
        if low.isdigit():
            ids |= {f"{fields['ArrayJobId']}_{task}" for task in range(int(low), int(high or low) + 1)}
        if job in ids:
            return fields
    return {}


def _sigint_at_its_default() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


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
        # SIGINT at its default, as a terminal starts the command: a test process started in the background
        # of a shell (CI's may be) ignores it, and so would the command, which a Ctrl-C test then waits on
        with open(self.stdout, "w") as out, open(self.stderr, "w") as err:
            self.process = subprocess.Popen([VITBENCH, "submit", "--cluster", "slurm", *args], stdout=out, stderr=err,
                                            cwd=folder, env={**os.environ, **(env or {})},
                                            preexec_fn=_sigint_at_its_default)  # fmt: skip
        STARTED.append(self.process)

    def job(self, number: int = 0, timeout: float = 120) -> str:
        """The id of the `number`th job it submitted, as submitit names its files (`7`, `5_1`)."""

        def listed():
            found = (f.name.removesuffix("_submitted.pkl") for f in self.folder.glob("results/jobs/*/*_submitted.pkl"))
            jobs = sorted(found, key=lambda job: [int(part) for part in job.split("_")])
            return jobs[number] if len(jobs) > number else None

        return wait_for("the job to be submitted", listed, timeout)

    def ended(self, timeout: float = WAIT) -> tuple[int, str, str]:
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            waited = self.stderr.read_text()
            raise AssertionError(f"vitbench submit still waiting after {timeout} s:\n{waited}") from None
        return code, self.stdout.read_text(), self.stderr.read_text()


def _still_ending() -> bool:
    """Whether the cluster may still be ending a job's earlier attempt: slurmctld has messages to send
    to the node (`sdiag`: its agent queue and agents), or the node's slurmd started under 45 s ago
    (a lost node back: what was under way on it when it was lost came to it 30 s later)."""
    said = dict(re.findall(r"^(Agent queue size|Agent count):\s+(\d+)", slurm("sdiag", check=False), re.M))
    if not said or any(int(count) for count in said.values()):
        return True
    started = re.search(r"SlurmdStartTime=(\S+)", slurm("scontrol", "show", "node", "-o", check=False))
    if started is None or not started.group(1)[:1].isdigit():
        return True
    return (datetime.datetime.now() - datetime.datetime.fromisoformat(started.group(1))).total_seconds() < 45


@pytest.fixture
def no_requeue_hold():
    """Requeued jobs of this test start again at once instead of after Slurm's two-minute hold, once the
    cluster has ended their first attempts: no job is still completing (released while its first
    attempt's steps were still being ended, a job was started on the node and failed at once, "Job
    credential revoked"), and a node lost and back has had time to end what was under way on it (its
    lost attempt's end reached the next attempt of the same job id, 30 s into it, and cancelled it:
    `_still_ending`). Slurm's two-minute hold is what gives both time on a cluster. Yields the
    fields a test wants set on a requeued job before it starts again (`{"TimeLimit": "30"}`), in the
    same `scontrol update`."""
    stop = threading.Event()
    before_start: dict[str, str] = {}

    def release() -> None:
        while not stop.wait(1):
            if slurm("squeue", "-h", "-t", "completing", "-o", "%A", check=False).strip() or _still_ending():
                continue
            for line in slurm("squeue", "-h", "-t", "pending", "-o", "%i %r", check=False).splitlines():
                job, _, reason = line.partition(" ")
                if reason.strip() == "BeginTime":
                    fields = [f"{name}={value}" for name, value in before_start.items()]
                    slurm("scontrol", "update", f"JobId={job}", *fields, "StartTime=now", check=False)

    thread = threading.Thread(target=release, daemon=True)
    thread.start()
    yield before_start
    stop.set()
    thread.join()


STARTED: list[subprocess.Popen] = []  # every `vitbench submit` a test started


@pytest.fixture(autouse=True)
def no_jobs_left():
    """Every test starts on an empty queue and leaves none of its jobs behind, nor a `vitbench submit`
    still waiting (a test that failed before its command ended left one waiting on a cluster stopped
    under it, for ever)."""
    yield
    while STARTED:
        process = STARTED.pop()
        if process.poll() is None:
            process.kill()
            process.wait(30)
    for job in slurm("squeue", "-h", "-o", "%A", check=False).split():
        slurm("scancel", job, check=False)


def run_here(folder: Path, *args: str) -> Path:
    """`vitbench run ARGS` in `folder`, uninterrupted, on as many threads as the job has CPUs (a trained
    number on a CPU depends on them): the numbers a job must end with. Returns its results folder."""
    folder.mkdir(exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(JOB_CPUS)}
    done = subprocess.run([VITBENCH, "run", *args, "--results", "results"], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=900)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return folder / "results"


def same_results(*results: Path) -> tuple:
    """The runs of each results folder, a row each, in one order; their keys and accuracies equal (a
    pre-training's `val_accuracy`, its transfer's `accuracy`: NaN where a run has not that one)."""
    ours, theirs = (vitbench.results(r).sort_values("run_key") for r in results)
    assert list(ours["run_key"]) == list(theirs["run_key"]) and len(ours)
    for name in (c for c in ours.columns if c.endswith("accuracy")):
        assert np.array_equal(ours[name].to_numpy(float), theirs[name].to_numpy(float), equal_nan=True), name
    return ours, theirs


@pytest.fixture(scope="module")
def finetune_alone(tmp_path_factory) -> dict:
    """The test fine-tune, uninterrupted: the numbers each interrupted job must end with."""
    return _only_run(run_here(tmp_path_factory.mktemp("alone"), *FINETUNE))


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


def interrupted_once(folder: Path, args: tuple, *command: str) -> tuple[str, str, str]:
    """`vitbench submit ARGS`, and the Slurm `command` (`JOB`: its job) once the run's first checkpoint
    exists; (the job, what the command printed, the job's log) once it ended well."""
    submitted = Submitted(folder, *args, "--results", "results")
    job = submitted.job()
    wait_for("the first checkpoint", _checkpointed(folder))
    slurm(*(job if part == "JOB" else part for part in command))
    code, out, err = submitted.ended()
    assert code == 0, err
    return job, err, next((folder / "results" / "jobs").glob(f"*/{job}_0_log.err")).read_text()


def resumed_where_it_stopped(log: str, steps: int) -> None:
    """The job's log: one stop, with a checkpoint at that step, and the next attempt resumed there."""
    stopped = re.findall(rf"stopped: .* at step (\d+) of {steps}, checkpointed", log)
    assert len(stopped) == 1 and re.findall(rf"resumed at step (\d+) of {steps} \(restart 1\)", log) == stopped, log


def test_a_few_shot_plan_runs_as_jobs_with_what_it_needs_and_says_where_it_is(tmp_path):
    """The happy path, with the default options: the local run's numbers; the command the user typed
    and the job's id stored with each run; the CPUs and memory the plan needs, torch on those CPUs;
    each run's progress line in the job's log; plain progress lines while waiting; no warning from
    submitit or sacct at each poll (there is no accounting here)."""
    local = run_here(tmp_path / "local", *FEWSHOT)
    submitted = Submitted(tmp_path, *FEWSHOT, "--results", "results")
    code, out, err = submitted.ended()
    assert code == 0, err
    ours, _ = same_results(tmp_path / "results", local)
    assert len(ours) == 6
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
    assert re.search(r"\[1/6\] vit-ti/16 \(random init\) digits fewshot shots=1 seed 0: accuracy \d", log), log
    assert re.search(r"1 job\(s\): 0 pending, 1 running, 0 done · runs stored 0/6 · 00:00:\d\d", err), err
    assert "1 job(s): 0 pending, 0 running, 1 done · runs stored 6/6" in err
    assert "sacct" not in err + out and "submitit" not in err + out and "accounting" not in err + out


@pytest.mark.parametrize(
    "asked, said",
    [(("--mem-gb", "100000"), "memory specification can not be satisfied"), (("--partition", "nope"), "partition")],
    ids=["memory", "partition"],
)
def test_a_request_sbatch_refuses_ends_in_one_line_naming_what_sbatch_said(tmp_path, asked, said):
    """Issue 97, item 10. Before: sbatch refusing the request (more memory than the node has, a partition
    that does not exist) was an 84-line traceback ending in submitit's FailedJobError, rc 1, after
    sbatch's own lines printed raw."""
    code, out, err = Submitted(tmp_path, *FEWSHOT, *asked, "--results", "results").ended(timeout=120)
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and "Traceback" not in err and "sbatch: error" not in err, err
    assert errors[0].startswith("error: sbatch refused the job(s): ") and said in errors[0].lower(), err
    assert vitbench.results(tmp_path / "results").empty


def dry_run(folder: Path, *args: str) -> str:
    """What `vitbench submit --cluster slurm --dry-run ARGS` printed (it ended 0)."""
    done = subprocess.run([VITBENCH, "submit", "--cluster", "slurm", "--dry-run", *args, "--results", "results"],
                          cwd=folder, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_dry_run_says_the_jobs_what_each_asks_and_how_many_the_node_runs_at_once(tmp_path):
    """Issue 97, item 13. Before: `submit --dry-run` said neither how many jobs nor what each asks for,
    and priced a 4-job plan as one process's 1.8 min; its 2-CPU jobs ran one at a time on the 2-CPU node
    (384 s). The node is read from this cluster's `sinfo`; each job pays its own start-up."""
    out = dry_run(tmp_path, *FINETUNE, "--seeds", "0,1,2,3")  # the tests' fine-tune, four seeds: four jobs
    (line,) = [line for line in out.splitlines() if line.startswith("as jobs:")]
    cpus = os.cpu_count() or 1
    at_once = "all at once" if cpus // JOB_CPUS >= 4 else f"{cpus // JOB_CPUS} at a time"
    said = (
        rf"as jobs: 4 job\(s\), each asking {JOB_CPUS} CPUs, \d+ GB, no GPU, a time limit of 240 min; the default "
        rf"partition \(1 node up, the largest {cpus} CPUs, \d+ GB\): {at_once}, ≈ .+ in all \(the longest job ≈ .+ "
        r"with its own start-up\)"
    )
    assert re.fullmatch(said, line), line
    assert not (tmp_path / "results" / "jobs").exists() and not slurm("squeue", "-h", "-o", "%i").strip()


def test_a_request_slurm_can_never_start_ends_the_wait_in_one_line_and_leaves_no_job(tmp_path):
    """Issue 97, item 9b. Before: `--cpus-per-job 4` on a 2-CPU node (Slurm's reason: PartitionConfig) was
    shown as "1 pending" for 11.5 min until Ctrl-C. Slurm's reason is said, the job cancelled; the dry
    run says it first."""
    asked = ("--cpus-per-job", str(4 * os.cpu_count()))
    (line,) = [line for line in dry_run(tmp_path, *FEWSHOT, *asked).splitlines() if line.startswith("as jobs:")]
    never = "none of its nodes can take one as asked, so Slurm would never start them (--cpus-per-job, "
    assert line.endswith(never + "--mem-gb, --gpus-per-job, --partition; `sinfo -l` lists the nodes)"), line
    code, out, err = Submitted(tmp_path, *FEWSHOT, *asked, "--results", "results").ended(timeout=180)
    failed = [line for line in err.splitlines() if line.startswith("failed:")]
    assert code == 2 and len(failed) == 1 and "Traceback" not in err, err
    assert "PENDING (PartitionConfig): Slurm can never start it as asked (cancelled)" in failed[0], err
    assert not slurm("squeue", "-h", "-o", "%i").strip()


def test_a_folders_jobs_are_named_listed_and_cancelled_from_vitbench(tmp_path):
    """Issue 97, item 14. Before: every job was named "vitbench" in `squeue`, the wave line printed no job
    ids, and no command listed or cancelled a plan's jobs. Two jobs wait behind another user's job."""
    blocker = slurm("sbatch", "--parsable", "-c", str(os.cpu_count()), "-o", "/dev/null", "--wrap", "sleep 600").strip()
    try:
        args = ("--model", "vit-ti/16", "--weights", "random", "--res", "32", "--shots", "1", "--seeds", "0,1",
                "--dataset", "digits", "--no-wait", "--results", "results")  # fmt: skip
        code, out, err = Submitted(tmp_path, *args).ended(timeout=120)
        assert code == 0, err
        (wave,) = re.findall(r"wave 1: 1 job\(s\) submitted \((\S+)\)", err)
        assert slurm("squeue", "-h", "-j", wave.split("_")[0], "-o", "%j").split() == ["vitbench-results"]
        listed = subprocess.run([VITBENCH, "jobs", "--results", "results"], cwd=tmp_path, capture_output=True,
                                text=True, timeout=60)  # fmt: skip
        assert listed.returncode == 0, listed.stderr
        assert re.search(rf"job {wave}: PENDING \((Resources|Priority)\) · 0/2 runs stored · ", listed.stdout), listed
        assert "1 still queued or running; `vitbench jobs --cancel --results results` cancels them" in listed.stdout
        cancelled = subprocess.run([VITBENCH, "jobs", "--cancel", "--results", "results"], cwd=tmp_path,
                                   capture_output=True, text=True, timeout=60)  # fmt: skip
        assert cancelled.returncode == 0 and "cancelled 1 job(s)" in cancelled.stdout, cancelled
        wait_for("the job to leave the queue", lambda: slurm("squeue", "-h", "-o", "%i").split() == [blocker])
    finally:
        slurm("scancel", blocker)


def test_a_fine_tune_preempted_with_usr2_is_requeued_once_and_resumes(tmp_path, finetune_alone, no_requeue_hold):
    """`scancel -s USR2` (what Slurm sends before a time limit, and on pre-emption) during a fine-tune
    with DataLoader workers: the job checkpoints where it is, is requeued once, resumes there and ends
    with the uninterrupted run's numbers; `vitbench submit` waits through it and exits 0."""
    job, err, log = interrupted_once(tmp_path, FINETUNE, "scancel", "-s", "USR2", "JOB")
    run = _only_run(tmp_path / "results")
    _same_numbers(run, finetune_alone)
    assert run["run"]["notes"]["restarts"] == 1
    assert job_state(job)["Restarts"] == "1"
    assert f"job {job} requeued (restart 1)" in err
    resumed_where_it_stopped(log, 300)  # where it stopped, not at the last periodic checkpoint
    assert "DataLoader worker" not in log and "Caught signal" in log


def test_a_fine_tune_requeued_by_scontrol_resumes_where_sigterm_stopped_it(tmp_path, finetune_alone, no_requeue_hold):
    """`scontrol requeue` (an admin's, or a pre-emption's): Slurm sends SIGTERM to every process of the
    job, then SIGKILL after KillWait. The workers ignore it, the main process checkpoints at its next
    step and exits; the job starts again, resumes there and ends with the uninterrupted numbers."""
    job, err, log = interrupted_once(tmp_path, FINETUNE, "scontrol", "requeue", "JOB")
    run = _only_run(tmp_path / "results")
    _same_numbers(run, finetune_alone)
    assert run["run"]["notes"]["restarts"] == 1
    resumed_where_it_stopped(log, 300)
    assert "SIGTERM: the job stops at its next checkpoint" in log and "DataLoader worker" not in log


def test_a_fine_tune_whose_node_is_lost_is_requeued_by_slurm_and_resumes(tmp_path, finetune_alone, no_requeue_hold):
    """The node lost under a running fine-tune (its slurmd and the job's processes killed at once, as a
    power cut does; nothing checkpoints): Slurm finds it not responding, sets it DOWN and requeues
    the job (its default for batch jobs); vitbench says so and waits; once the node is back the job
    resumes from its last periodic checkpoint and ends with the uninterrupted numbers."""
    folder = Path(os.environ["SLURM_CONF"]).parent
    submitted = Submitted(tmp_path, *FINETUNE, "--results", "results")
    job = submitted.job()
    wait_for("the first checkpoint", _checkpointed(tmp_path))
    slurm_cluster.lose_node(folder)
    try:
        wait_for("Slurm to requeue the job", lambda: job_state(job).get("Restarts") == "1", timeout=120)
    finally:
        slurm_cluster.start_slurmd(folder)  # the node back, whatever the test found
    code, out, err = submitted.ended()
    assert code == 0, err
    run = _only_run(tmp_path / "results")
    _same_numbers(run, finetune_alone)
    assert run["run"]["notes"]["restarts"] == 1
    assert f"job {job} requeued (restart 1)" in err
    log = next((tmp_path / "results" / "jobs").glob("*/*_log.err")).read_text()
    assert "resumed at step 50 of 300 (restart 1)" in log or "resumed at step 100 of 300 (restart 1)" in log


def test_a_cancelled_running_job_ends_the_wait_in_one_line_and_the_rerun_resumes_it(tmp_path, finetune_alone):
    """`scancel` of a running fine-tune: `vitbench submit` ends at once with one line naming the job,
    Slurm's state and the log; nothing is half-stored; the same command again submits it again, and
    it resumes from the checkpoint the cancelled job wrote on its way out."""
    submitted = Submitted(tmp_path, *FINETUNE, "--results", "results")
    job = submitted.job()
    wait_for("the first checkpoint", _checkpointed(tmp_path))
    slurm("scancel", job)
    cancelled = time.monotonic()
    code, out, err = submitted.ended(timeout=120)
    assert time.monotonic() - cancelled < 60
    assert code == 2
    failed = [line for line in err.splitlines() if line.startswith("failed:")]
    log = next((tmp_path / "results" / "jobs").glob("*/*_log.err"))
    assert len(failed) == 1 and failed[0].startswith(f"failed: job {job}: CANCELLED"), err
    assert failed[0].endswith(f", no result · {_said_last(log)} (log: {log})"), err
    assert "error: 1 job(s) failed; run the same command again" in err
    assert not list((tmp_path / "results" / "runs").glob("*.json")) and vitbench.results(tmp_path / "results").empty
    assert next((tmp_path / "results" / "runs").glob("*/checkpoint.pt"))
    again = Submitted(tmp_path, *FINETUNE, "--results", "results")
    code, out, err = again.ended()
    assert code == 0, err
    assert "1 runs planned, 0 already stored, 1 without a result" in err
    run = _only_run(tmp_path / "results")
    _same_numbers(run, finetune_alone)
    assert run["run"]["notes"]["restarts"] == 1


def _said_last(log: Path) -> str:
    """What the job's log says last about why it ended (slurmstepd's line for a cancelled job)."""
    lines = [line for line in log.read_text().splitlines() if "error:" in line and "CANCELLED" in line]
    return lines[-1].strip()


def test_a_cancelled_pending_job_and_a_failing_job_end_the_wait_each_in_one_line(tmp_path):
    """Two jobs wait behind another user's job that holds the node: one is cancelled while pending;
    the data of the other is removed before it starts, so it fails. `vitbench submit` ends within a
    bounded time, a line per job with its id, Slurm's state and the exception's last line."""
    data = tmp_path / "data"
    write_digit_folders(data)
    blocker = slurm("sbatch", "--parsable", "-c", str(os.cpu_count()), "-o", "/dev/null", "--wrap", "sleep 600").strip()
    args = ("--model", "vit-ti/16", "--weights", "random", "--res", "32", "--shots", "1", "--seeds", "0",
            "--dataset", f"folder:{data},digits")  # fmt: skip
    submitted = Submitted(tmp_path, *args, "--results", "results")
    first, second = submitted.job(0), submitted.job(1)
    wait_for("both jobs pending", lambda: {job_state(j).get("JobState") for j in (first, second)} == {"PENDING"})
    shutil.rmtree(data)
    slurm("scancel", second)
    # said as it happens, while the other job still waits (issue 97, item 13: a cancelled task was said
    # only once its whole wave had ended)
    wait_for("the cancelled job said", lambda: f"job {second}: left the queue" in submitted.stderr.read_text(), 60)
    assert job_state(first).get("JobState") == "PENDING" and submitted.process.poll() is None
    slurm("scancel", blocker)
    code, out, err = submitted.ended(timeout=240)
    assert code == 2, err
    failed = sorted(line for line in err.splitlines() if line.startswith("failed:"))
    folder = next((tmp_path / "results" / "jobs").glob("*"))
    assert failed[0].startswith(f"failed: job {first}: FAILED · UserError: ") and str(data) in failed[0], err
    assert failed[0].endswith(f"(log: {folder / (first + '_0_log.err')})")
    assert failed[1] == (
        f"failed: job {second}: left the queue before it started (cancelled while pending), no result "
        "(no log: it never started)"
    ), err
    assert vitbench.results(tmp_path / "results").empty


def write_digit_folders(root: Path) -> None:
    """A tiny image-folder dataset (train/ and test/, a folder per class) of real PNGs."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, n in (("train", 4), ("test", 2)):
        for label in ("a", "b"):
            (root / split / label).mkdir(parents=True)
            for i in range(n):
                pixels = rng.integers(0, 255, (16, 16, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(root / split / label / f"{i}.png")


def test_a_job_over_its_memory_is_said_as_slurm_killed_it(tmp_path):
    """A fine-tune at 224 px in a job given 1 GB: Slurm kills it for its memory, and the line says so."""
    args = ("--model", "vit-ti/16", "--weights", "random", "--dataset", "digits", "--protocol", "finetune",
            "--lr", "0.01", "--seeds", "0", "--res", "224", "--batch", "64", "--steps", "20")  # fmt: skip
    submitted = Submitted(tmp_path, *args, "--mem-gb", "1", "--results", "results")
    job = submitted.job()
    code, out, err = submitted.ended(timeout=300)
    assert code == 2, err
    (failed,) = [line for line in err.splitlines() if line.startswith("failed:")]
    # Slurm's words for it: "Exceeded job memory limit" when the job's cgroup ran out, "StepId=… exceeded
    # memory limit (… > …), being killed" when its accounting's poll saw the step over it first
    assert failed.startswith(f"failed: job {job}: FAILED") and re.search(r"xceeded (job )?memory limit", failed), err
    assert vitbench.results(tmp_path / "results").empty


def test_a_job_killed_outside_slurm_ends_without_a_result_and_says_so(tmp_path, finetune_alone):
    """The job's process SIGKILLed (no handler runs, no result is written): `vitbench submit` says the
    job ended without a result, with Slurm's state; the rerun resumes from the last checkpoint."""
    submitted = Submitted(tmp_path, *FINETUNE, "--results", "results")
    job = submitted.job()
    wait_for("the first checkpoint", _checkpointed(tmp_path))
    lease = next((tmp_path / "results" / "leases").glob("*.lease"))
    os.kill(json.loads(lease.read_text())["pid"], signal.SIGKILL)
    code, out, err = submitted.ended(timeout=120)
    assert code == 2
    (failed,) = [line for line in err.splitlines() if line.startswith("failed:")]
    said = f"failed: job {job}: FAILED (exit 137), no result · srun: error: localhost: task 0: Killed (log: "
    assert failed.startswith(said), err
    again = Submitted(tmp_path, *FINETUNE, "--results", "results")
    code, out, err = again.ended()
    assert code == 0, err
    run = _only_run(tmp_path / "results")
    _same_numbers(run, finetune_alone)
    assert run["run"]["notes"]["restarts"] == 1


def test_a_run_still_queued_in_slurm_is_never_run_twice(tmp_path, finetune_alone, no_requeue_hold):
    """A fine-tune's job requeued and held in the queue, the waiting command interrupted: a local
    `vitbench run` skips the run (its lease is the queued job's), and `vitbench submit` again waits
    for that job instead of submitting the run a second time."""
    submitted = Submitted(tmp_path, *FINETUNE, "--results", "results")
    job = submitted.job()
    wait_for("the first checkpoint", _checkpointed(tmp_path))
    slurm("scontrol", "requeuehold", job)
    wait_for("the job held", lambda: job_state(job).get("JobState") in {"PENDING", "REQUEUE_HOLD"}
             and job_state(job).get("Restarts") == "1")  # fmt: skip
    submitted.process.send_signal(signal.SIGINT)
    code, out, err = submitted.ended(timeout=60)
    assert code == 130 and "the submitted jobs go on in the queue" in err
    local = subprocess.run([VITBENCH, "run", *FINETUNE, "--results", "results"], cwd=tmp_path, capture_output=True,
                           text=True, timeout=300)  # fmt: skip
    assert local.returncode == 0, local.stderr
    assert "skipped, running elsewhere" in local.stderr and f"SLURM job {job_state(job)['JobId']}" in local.stderr
    assert vitbench.results(tmp_path / "results").empty
    again = Submitted(tmp_path, *FINETUNE, "--results", "results")
    wait_for("the rerun to find the queued job", lambda: "already queued" in again.stderr.read_text(), timeout=120)
    slurm("scontrol", "release", job)
    code, out, err = again.ended()
    assert code == 0, err
    assert f"1 run(s) already queued in 1 job(s) of an earlier submission ({job})" in err
    (first_wave,) = (tmp_path / "results" / "jobs").glob("*")  # issue 97, item 14: where its log is
    assert re.search(rf"not submitting them again; logs under \S*{first_wave.name}", err), err
    assert "wave 1" not in err  # nothing submitted again
    assert len(list((tmp_path / "results" / "jobs").glob("*/vitbench-jobs.json"))) == 1
    run = _only_run(tmp_path / "results")
    _same_numbers(run, finetune_alone)


PRETRAIN = ("--model", "vit-ti/16", "--dataset", "digits", "--protocol", "pretrain", "--res", "32", "--batch", "16",
            "--steps", "300", "--seeds", "0")  # fmt: skip


def test_a_pre_training_preempted_with_usr2_resumes_and_makes_the_same_weights(tmp_path, no_requeue_hold):
    """Pre-training, pre-empted: the same requeue and resume as a fine-tune, the same weights and the
    same transfer numbers as the pre-training run here without a stop."""
    local = run_here(tmp_path / "local", *PRETRAIN)
    job, err, log = interrupted_once(tmp_path, PRETRAIN, "scancel", "-s", "USR2", "JOB")
    ours, _ = same_results(tmp_path / "results", local)  # the pre-training's own accuracy, and its transfer's
    pretrained = ours[ours["protocol"] == "pretrain"].iloc[0]
    assert pretrained["notes"]["restarts"] == 1
    resumed_where_it_stopped(log, 300)


def test_a_few_shot_plan_preempted_while_extracting_keeps_its_features(tmp_path, no_requeue_hold):
    """The default few-shot plan (4 shot counts x 3 seeds) pre-empted during its extraction: the job
    stops once the split it was extracting is kept, is requeued, reads it back instead of extracting
    it again, and stores the local run's 12 numbers. At 96 px: the test split's 13 batches take 4 s on
    an idle machine, 15 s on CI's busy one, inside USR2's 60 s grace (at 224 px they took 80 s there)."""
    args = ("--model", "vit-ti/16", "--weights", "random", "--dataset", "digits", "--res", "96")
    local = run_here(tmp_path / "local", *args)
    submitted = Submitted(tmp_path, *args, "--results", "results")
    job = submitted.job()
    log = tmp_path / "results" / "jobs"
    wait_for("the extraction", lambda: any("digits test:" in f.read_text() for f in log.glob("*/*_log.err")), every=0.1)
    slurm("scancel", "-s", "USR2", job)
    code, out, err = submitted.ended()
    assert code == 0, err
    ours, _ = same_results(tmp_path / "results", local)
    assert len(ours) == 12
    text = next(log.glob("*/*_log.err")).read_text()
    before, _, after = text.partition("stopped: extracting digits test")
    assert after, text
    assert "digits test:" in before and "digits test:" not in after  # read back, not extracted again
    assert f"job {job} requeued (restart 1)" in err


def test_data_parallel_under_slurm_follows_the_single_process_run(tmp_path):
    """A fine-tune as 2 processes of one job on the node's CPUs (gloo), started as a multi-GPU job is
    (torchrun in the job's task): the single-process loss curve to docs/finetune.md's tolerance."""
    args = ("--model", "vit-ti/16", "--weights", "random", "--dataset", "digits", "--protocol", "finetune",
            "--lr", "0.03", "--seeds", "0", "--res", "32", "--batch", "16", "--steps", "6",
            "--workers", "0")  # fmt: skip
    local = run_here(tmp_path / "local", *args)
    submitted = Submitted(tmp_path, *args, "--devices", "2", "--gpus-per-job", "0", "--results", "results")
    code, out, err = submitted.ended()
    assert code == 0, err
    two, one = _only_run(tmp_path / "results"), _only_run(local)
    assert two["run"]["device_count"] == 2 and one["run"]["device_count"] == 1
    for curve in ("train_loss", "grad_norm", "lr"):
        assert len(two["curves"][curve]) == 6
        assert two["curves"][curve] == pytest.approx(one["curves"][curve], rel=1e-5, abs=1e-6)
    script = next((tmp_path / "results" / "jobs").glob("*/*_submission.sh")).read_text()
    assert "#SBATCH --cpus-per-task=2" in script and "#SBATCH --ntasks-per-node=1" in script


def test_on_a_terminal_the_wait_is_one_line_that_updates(tmp_path):
    """`vitbench submit` in a terminal: the jobs' line is redrawn in place, not printed at each poll."""
    import pty

    args = ("--model", "vit-ti/16", "--weights", "random", "--dataset", "digits", "--res", "32", "--shots", "1",
            "--seeds", "0", "--results", "results")  # fmt: skip
    leader, follower = pty.openpty()
    process = subprocess.Popen([VITBENCH, "submit", "--cluster", "slurm", *args], cwd=tmp_path, stdin=follower,
                               stdout=follower, stderr=follower, env={**os.environ, "COLUMNS": "200"})  # fmt: skip
    os.close(follower)
    shown = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the terminal's other end closed: the command has ended
            break
        if not chunk:
            break
        shown += chunk
    assert process.wait(timeout=60) == 0
    text = shown.decode("utf-8", "replace")
    assert "\x1b[2K" in text  # rich redraws the line in place
    assert "1 job(s): 0 pending, 0 running, 1 done · runs stored 1/1" in text
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)
    assert plain.count("1 job(s): 0 pending, 0 running, 1 done") == 1


def test_a_fine_tune_that_reaches_its_time_limit_is_requeued_once_and_resumes(
    tmp_path, finetune_alone, no_requeue_hold
):
    """`--time-limit 4`, the shortest vitbench takes: Slurm sends submitit's USR2 90 s before the limit
    (up to a minute early); the job checkpoints, is requeued as timed out and finishes in its second
    attempt with the uninterrupted run's numbers.

    The limit comes on Slurm's clock, whatever this machine's pace (a run sized by the pace to outlast
    the warning ended first when CI's load eased): once the job has its first checkpoint, the test
    stops the job's process (SIGSTOP, as a machine too busy to run it would) and moves the job's limit
    as an admin may (`scontrol update TimeLimit`) to end 60 to 120 s later, inside the warning, which
    Slurm sends at its next check of the limits (every 30 s), with a SIGCONT of its own that lets the
    process go on (the test sends one too, once the USR2 is pending): it takes the signal at its next
    step, with steps still to do. A stopped job holds no CPU while Slurm's clock runs, and the fine-tune
    is the other tests' (300 steps, their uninterrupted run its reference). Before the requeued job
    starts again the test gives it 30 minutes, so that its second attempt is not cut short at any pace."""
    submitted = Submitted(tmp_path, *FINETUNE, "--time-limit", "4", "--results", "results")
    job = submitted.job()
    script = next((tmp_path / "results" / "jobs").glob("*/*_submission.sh")).read_text()
    assert "#SBATCH --time=4" in script and "#SBATCH --signal=USR2@90" in script, script
    wait_for("the first checkpoint", _checkpointed(tmp_path))
    lease = next((tmp_path / "results" / "leases").glob("*.lease"))
    process = json.loads(lease.read_text())["pid"]  # the job's task: the process Slurm signals
    os.kill(process, signal.SIGSTOP)
    try:
        no_requeue_hold["TimeLimit"] = "30"
        ran = _seconds(job_state(job)["RunTime"])
        slurm("scontrol", "update", f"JobId={job}", f"TimeLimit={math.ceil((ran + 60) / 60)}")
        wait_for("Slurm's USR2 at the stopped job", lambda: _warned(process), timeout=150)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process, signal.SIGCONT)
    code, out, err = submitted.ended(timeout=600)
    assert code == 0, err
    run = _only_run(tmp_path / "results")
    _same_numbers(run, finetune_alone)
    assert run["run"]["notes"]["restarts"] == 1
    log = next((tmp_path / "results" / "jobs").glob("*/*_log.err")).read_text()
    assert "this job is timed-out" in log
    resumed_where_it_stopped(log, 300)
    assert f"job {job} requeued (restart 1)" in err


def test_a_fine_tune_timed_out_at_every_requeue_says_the_limit_is_too_short_and_how_far_it_got(tmp_path):
    """Issue 97, item 13. Before: a fine-tune timed out a 4th time ended "UncompletedJobError: Job not requeued
    because: timed-out too many times", saying neither that --time-limit is too short nor how far it got;
    and a requeued job's line did not say when Slurm lets it start again.

    Under a 4-minute limit submitit takes every USR2 for a time-out (it counts one from 80 % of the limit
    or 10 minutes before it, whichever is earlier); it requeues a timed-out job three times. The test
    sends the USR2 four times, each once the attempt trains, and lets each requeued job start once the
    waiting line has said Slurm's start time."""
    submitted = Submitted(tmp_path, *FINETUNE, "--time-limit", "4", "--results", "results")
    job = submitted.job()
    log = tmp_path / "results" / "jobs"
    for attempt in range(4):
        if attempt == 0:
            wait_for("the first checkpoint", _checkpointed(tmp_path))
        else:
            resumed = f"resumed at step \\d+ of 300 \\(restart {attempt}\\)"
            wait_for(f"attempt {attempt + 1} to train", lambda r=resumed: re.search(r, _job_log(log)), timeout=180)
        slurm("scancel", "-s", "USR2", job)
        if attempt == 3:
            break
        wait_for(f"requeue {attempt + 1}", lambda n=attempt + 1: job_state(job).get("Restarts") == str(n), timeout=120)
        if attempt == 0:  # the waiting line says when Slurm lets the requeued job start again
            held = wait_for("Slurm's hold", lambda: (state := job_state(job)).get("Reason") == "BeginTime" and state)
            starts = datetime.datetime.fromisoformat(held["StartTime"]).strftime("%H:%M:%S")
            said = f"1 requeued (BeginTime, starts {starts})"
            wait_for("the requeued line", lambda s=said: s in submitted.stderr.read_text(), timeout=60)
        wait_for("the attempt ended", lambda: not slurm("squeue", "-h", "-t", "completing", "-o", "%A").strip()
                 and not _still_ending())  # fmt: skip
        slurm("scontrol", "update", f"JobId={job}", "StartTime=now")
    code, out, err = submitted.ended(timeout=300)
    assert code == 2, err
    (failed,) = [line for line in err.splitlines() if line.startswith("failed:")]
    stopped = re.findall(r"stopped: (.* at step \d+ of 300, checkpointed)", _job_log(log))
    assert len(stopped) == 4, _job_log(log)
    assert (f"timed out at every requeue: --time-limit is too short for it; its last attempt stopped {stopped[-1]}; "
            "a longer one resumes it (log: ") in failed and "Traceback" not in err, err  # fmt: skip
    assert next((tmp_path / "results" / "runs").glob("*/checkpoint.pt"))  # kept for that longer one


def _job_log(jobs: Path) -> str:
    logs = list(jobs.glob("*/*_log.err"))
    return logs[0].read_text() if logs else ""


def _warned(pid: int) -> bool:
    """Whether Slurm's USR2 has come to the stopped process `pid`: pending there, or taken up (Slurm
    sends a SIGCONT with it, which lets the process go on, as here it did)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True  # taken up, and the job has ended its process
    status = {name: value.strip() for name, _, value in (line.partition(":") for line in text.splitlines())}
    pending = any(int(status[field], 16) & (1 << (signal.SIGUSR2 - 1)) for field in ("ShdPnd", "SigPnd"))
    return pending or not status["State"].startswith("T")


def _seconds(slurm_time: str) -> int:
    """Slurm's `[D-]HH:MM:SS` (or `MM:SS`) in seconds."""
    days, _, clock = slurm_time.rpartition("-")
    seconds = 0
    for part in clock.split(":"):
        seconds = seconds * 60 + int(part)
    return seconds + int(days or 0) * 86400

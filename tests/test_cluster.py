"""Past one machine, tested on this one: submitit's local executor runs the jobs as real
subprocesses (no SLURM), leases keep a run from executing twice, shards are merged by `ingest`
(or any reading command), and a killed worker's fine-tune resumes when the command is run again."""

import datetime
import json
import os
import pickle
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vitbench import store
from vitbench.api import request, work
from vitbench.execution import cluster, launch
from vitbench.execution.lease import Lease
from vitbench.execution.plan import plan
from vitbench.views.measured.axes import with_axes

pytestmark = pytest.mark.slow
FEWSHOT = (
    "--dataset",
    "digits",
    "--model",
    "vit-ti/16",
    "--weights",
    "random",
    "--res",
    "32",
    "--workers",
    "0",
    "--shots",
    "1,5",
    "--seeds",
    "0",
)
FINETUNE = (
    "--model", "vit-ti/16", "--weights", "random", "--dataset", "digits", "--protocol", "finetune",
    "--lr", "0.01", "--seeds", "0", "--res", "32", "--batch", "8", "--workers", "0",
)  # fmt: skip
LOCAL = ("--cluster", "local")  # `vitbench submit` with submitit's local executor: real subprocesses


def test_a_lease_is_exclusive_until_released_or_stale(tmp_path):
    first, second = Lease(tmp_path, "k"), Lease(tmp_path, "k")
    assert first.acquire() and not second.acquire()
    first.release()
    assert second.acquire()
    second.release()
    stale = Lease(tmp_path, "s", seconds=0.2)
    assert stale.acquire()
    stale._stop.set()  # its holder stops beating (as a killed worker does)
    time.sleep(0.5)
    taker = Lease(tmp_path, "s", seconds=0.2)
    assert taker.acquire() and taker.holder()["token"] == taker.token
    stale.release()  # the old holder's release must not remove the new holder's lease
    assert taker.path.exists()
    taker.release()


def test_a_lease_of_a_dead_process_on_this_host_is_taken_at_once(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    path = tmp_path / "leases" / "k.lease"
    path.parent.mkdir()
    path.write_text(json.dumps({"token": "x", "host": os.uname().nodename, "pid": dead.pid}))
    lease = Lease(tmp_path, "k")
    assert lease.acquire()
    lease.release()


def test_a_run_leased_elsewhere_is_skipped_then_run_when_free(cli, results):
    req = request(model="vit-ti/16", weights="random", datasets=("digits",), shots=(1,), seeds=(0,),
                         res=32, workers=0, results=results)  # fmt: skip
    key = plan(req)[0].specs[0].run_key
    held = Lease(results, key)
    assert held.acquire()  # this (live) test process holds it
    code, _, err = cli("run", "--model", "vit-ti/16", "--weights", "random", "--dataset", "digits", "--shots", "1",
                       "--seeds", "0", "--res", "32", "--workers", "0", "--results", results)  # fmt: skip
    assert code == 0 and "running elsewhere" in err
    assert store.read_results(results).empty
    held.release()
    code, _, _ = cli("run", "--model", "vit-ti/16", "--weights", "random", "--dataset", "digits", "--shots", "1",
                     "--seeds", "0", "--res", "32", "--workers", "0", "--results", results)  # fmt: skip
    assert code == 0 and set(store.read_results(results)["run_key"]) == {key}
    assert not list((results / "leases").glob("*.lease"))  # released once the result was stored


def test_submitit_local_jobs_write_shards_that_are_merged(cli, results):
    code, out, err = cli("submit", *LOCAL, *FEWSHOT, "--results", results)
    assert code == 0, err
    df = with_axes(store.read_results(results))
    assert len(df) == 2 and set(df["shots"]) == {1, 5}
    assert "wave 1: 1 job(s) submitted" in err  # one few-shot group: one job (one extraction)
    # the runs were executed by the job's own process: submitit pickled its return value there
    (result_file,) = (results / "jobs").rglob("*_result.pkl")
    outcome, value = pickle.loads(result_file.read_bytes())
    assert outcome == "success" and value["ran"] == 2


def test_no_wait_then_ingest_merges_the_shards(cli, results):
    code, out, err = cli("submit", *LOCAL, *FEWSHOT, "--no-wait", "--results", results)
    assert code == 0 and "vitbench ingest" in out
    deadline = time.time() + 120
    while len(list((results / "runs").glob("*.json"))) < 2 and time.time() < deadline:
        time.sleep(1)
    assert len(list((results / "runs").glob("*.json"))) == 2
    code, out, _ = cli("ingest", "--results", results)
    assert code == 0 and "merged 2 new run(s)" in out
    assert len(store.read_results(results)) == 2
    code, out, _ = cli("ingest", "--results", results)
    assert "merged 0 new run(s)" in out


def test_reading_commands_merge_new_shards_themselves(cli, results):
    assert cli("run", *FEWSHOT, "--results", results)[0] == 0
    shard = next((results / "runs").glob("*.json"))
    record = json.loads(shard.read_text())
    record["run"]["run_key"] = "f" * 64  # a shard a worker elsewhere wrote
    (results / "runs" / f"{'f' * 64}.json").write_text(json.dumps(record))
    code, md, _ = cli("table", "--protocol", "fewshot", "--format", "csv", "--results", results)
    assert code == 0
    con = store.connect(results)
    assert "f" * 64 in store.done_keys(con)
    con.close()


def test_a_killed_worker_resumes_from_its_checkpoint_when_resubmitted(cli, results):
    """SIGKILL the job's process mid fine-tune (after a checkpoint), then run the command again:
    the resubmitted job takes over the dead worker's lease and resumes at the checkpoint."""
    req = request(model="vit-ti/16", weights="random", datasets=("digits",), protocol="finetune", lr=0.01,
                         seeds=(0,), res=32, batch=8, workers=0, steps=100, checkpoint_every=10,
                         results=results)  # fmt: skip
    groups = plan(req)
    key = groups[0].specs[0].run_key
    (job,) = cluster.submit(work, req, [[key]], cluster.ClusterOptions(cluster="local"))
    checkpoint = results / "runs" / key / "checkpoint.pt"
    deadline = time.time() + 180
    while not checkpoint.exists() and time.time() < deadline:
        time.sleep(0.05)  # then killed at once: 90 steps (seconds) before the run could end
    assert checkpoint.exists(), job.stderr()
    lease = results / "leases" / f"{key}.lease"
    worker = json.loads(lease.read_text())["pid"]  # submitit's local job runs the function in a child
    for pid in (worker, job._process.pid):  # SIGKILL: no handler runs, as when a node dies
        os.kill(pid, signal.SIGKILL)
    job._process.wait()
    assert lease.exists()  # left behind by the killed worker
    assert not (results / "runs" / f"{key}.json").exists()

    code, _, err = cli("submit", *LOCAL, *FINETUNE, "--steps", "100", "--checkpoint-every", "10", "--results", results)
    assert code == 0, err
    df = store.read_results(results)
    assert set(df["run_key"]) == {key}
    notes = json.loads(df["notes"].iloc[0])
    assert notes["restarts"] == 1  # resumed, not started over
    curves = store.read_curves(results, [key])
    assert curves[curves["name"] == "train_loss"]["step"].max() == 100


def test_torchrun_gets_the_rendezvous_options_across_nodes():
    one = launch.torchrun_command(2, ["-m", "vitbench"])
    assert "--standalone" in one and "--nproc_per_node=2" in one
    many = launch.torchrun_command(4, ["-m", "vitbench"], nnodes=2, node_rank=1, rdzv_endpoint="n1:29500", rdzv_id="7")
    assert "--standalone" not in many
    assert {"--nnodes=2", "--node_rank=1", "--rdzv_endpoint=n1:29500", "--rdzv_id=7", "--rdzv_backend=c10d"} <= set(
        many
    )


def test_units_group_fewshot_runs_and_hold_back_final_finetunes(tmp_path):
    req = request(model="vit-ti/16", weights="random", datasets=("digits",), protocol="finetune",
                         seeds=(0, 1), res=32, batch=8, steps=2, results=tmp_path)  # fmt: skip
    groups = plan(req)
    first, second = cluster.units(groups, {s.run_key for g in groups for s in g.specs})
    assert len(first) == 4 and len(second) == 2  # the 4-LR dev sweep, then the 2 seeds on its best LR
    few = plan(request(model="vit-ti/16", weights="random", datasets=("digits",), results=tmp_path))
    first, second = cluster.units(few, {s.run_key for g in few for s in g.specs})
    assert len(first) == 1 and len(first[0]) == 12 and second == []


@pytest.mark.parametrize(
    "args,message",
    [
        (("submit", "--cluster", "k8s"), "--cluster k8s: expected auto, slurm or local"),
        (("run", "--nnodes", "2", "--protocol", "finetune", "--smoke"), "--nnodes 2: give --rdzv-endpoint HOST:PORT"),
        # the options that moved to `vitbench submit` say where they are now (not "possible: --precision")
        (("run", "--partition", "gpu"), "--partition: an option of the cluster jobs, which `vitbench submit` starts"),
        (("run", "--executor", "submitit"), "--executor: cluster jobs are `vitbench submit` now"),
        (("submit", "--nnodes", "2"), "No such option: --nnodes"),
    ],
)
def test_cluster_mistakes_are_one_line_errors(cli, results, args, message):
    code, _, err = cli(*args, "--model", "vit-ti/16", "--weights", "random", "--dataset", "digits",
                       "--results", results)  # fmt: skip
    assert code != 0 and message in err and len(err.strip().splitlines()) == 1


def test_pretraining_on_a_cluster_then_its_transfer_stage(cli, results):
    """The session's stages on a cluster (issue 30.3): the pre-training job's weights are found once
    it has finished, and the transfer stage (few-shot on them, beside random init) goes out as jobs
    of its own, into the same store."""
    code, _, err = cli(
        "submit", *LOCAL, "--model", "vit-ti/16", "--dataset", "digits", "--protocol", "pretrain", "--smoke",
        "--steps", "2", "--transfer", "digits", "--transfer-shots", "1", "--seeds", "0", "--workers", "0",
        "--results", results,
    )  # fmt: skip
    assert code == 0, err
    df = store.read_results(results)
    assert set(df["protocol"]) == {"pretrain", "fewshot"}
    few = df[(df["protocol"] == "fewshot") & (df["metric"] == "accuracy")]
    # the weights it wrote, and random init: 3 seeds each (the transfer's own default)
    assert len(few) == 6 and few["random_init"].sum() == 3
    assert "then: fewshot of vit-ti/16 on digits" in err


def test_a_time_limit_too_short_for_a_checkpoint_is_refused_before_anything_is_submitted(cli, results):
    """submitit's warning comes 90 s before the limit, and Slurm may send it a minute early: a job of
    `--time-limit 1` was signalled before its first checkpoint, requeued, and signalled again."""
    for minutes in ("1", "3"):
        code, out, err = cli("submit", "--cluster", "slurm", "--time-limit", minutes, *FEWSHOT, "--results", results)
        assert code == 2 and err.strip() == (
            f"error: --time-limit {minutes}: too short for a job to reach a checkpoint before submitit's warning, "
            "which Slurm sends 90 s before the limit (up to 60 s earlier); give 4 minutes or more"
        )
        assert not (results / "jobs").exists()


def test_slurm_states_are_read_from_scontrol_as_it_prints_them():
    """Lines `scontrol show job -o` printed on the test cluster (tests/slurm_cluster.py): an array with
    a pending range, a requeued job, a job whose node failed; read without accounting."""
    from vitbench.execution import slurm_jobs

    text = (
        "JobId=4 ArrayJobId=4 ArrayTaskId=1-3%1 ArrayTaskThrottle=1 JobName=arr.sh UserId=root(0) "
        "JobState=PENDING Reason=JobArrayTaskLimit Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 "
        "ExitCode=0:0 RunTime=00:00:00 StdErr=/tmp/arr_4_4294967294.out\n"
        "JobId=5 ArrayJobId=4 ArrayTaskId=0 ArrayTaskThrottle=1 JobName=arr.sh JobState=RUNNING Reason=None "
        "Requeue=1 Restarts=0 ExitCode=0:0\n"
        "JobId=9 JobName=wrap JobState=PENDING Reason=BeginTime Dependency=(null) Requeue=1 Restarts=1 ExitCode=0:0 "
        "StartTime=2026-12-03T10:05:56 EndTime=2026-12-03T14:05:56\n"
        "JobId=10 JobName=wrap JobState=NODE_FAIL Reason=NodeDown Dependency=(null) Requeue=0 Restarts=0 "
        "ExitCode=143:0\n"
        "JobId=12 JobName=wrap JobState=PENDING Reason=(ReqNodeNotAvail, UnavailableNodes:localhost) Restarts=0\n"
    )
    states = {s.job_id: s for s in slurm_jobs.parse_show_job(text)}
    assert set(states) == {"4_0", "4_1", "4_2", "4_3", "9", "10", "12"}
    assert states["4_2"].state == "PENDING" and states["4_0"].own_id == "5" and states["4_0"].state == "RUNNING"
    assert states["9"].restarts == 1 and not states["9"].ended and states["9"].said() == "PENDING (BeginTime)"
    assert states["9"].starts_at() == datetime.datetime(2026, 12, 3, 10, 5, 56)
    assert states["4_2"].starts_at() is None  # `StartTime=Unknown`, or none said
    assert states["10"].ended and states["10"].said() == "NODE_FAIL (exit 143)"
    assert states["12"].reason == "(ReqNodeNotAvail, UnavailableNodes:localhost)"


def test_the_documented_single_node_slurm_is_the_one_the_tests_start():
    """docs/cluster.md's slurm.conf is tests/slurm_cluster.py's, line for line (its folder `DIR`, the
    default ports; the node's CPUs and memory are the machine's)."""
    import slurm_cluster

    page = (Path(__file__).parents[1] / "docs" / "cluster.md").read_text()
    block = page.split("<!-- the lines tests/test_cluster.py holds to tests/slurm_cluster.py's config -->")[1]
    documented = block.split("```text\n", 1)[1].split("```", 1)[0].splitlines()
    written = slurm_cluster.config(Path("DIR"), 6817, 6818).splitlines()
    machine = re.compile(r"CPUs=\d+ RealMemory=\d+")
    assert [machine.sub("", line) for line in documented] == [machine.sub("", line) for line in written if line]


def test_a_stop_request_checkpoints_a_job_at_its_next_step_and_keeps_its_lease(tmp_path):
    """What a cluster job does on the scheduler's USR2 or SIGTERM (engine/stopping.py), in this process:
    the fine-tune saves a checkpoint after the step it is on and stops, its run's lease stays (the job
    is coming back); the next attempt resumes there and ends as a run that never stopped."""
    import signal as signals

    from vitbench.engine import stopping

    def finetune(results):
        return request(model="vit-ti/16", weights="random", datasets=("digits",), protocol="finetune", lr=0.01,
                       seeds=(0,), res=32, batch=8, workers=0, steps=20, results=results)  # fmt: skip

    alone = finetune(tmp_path / "alone")
    work(alone, [plan(alone)[0].specs[0].run_key])
    req = finetune(tmp_path / "stopped")
    key = plan(req)[0].specs[0].run_key
    stopping.arm(True)
    try:
        stopping.request(signals.SIGTERM)
        with pytest.raises(stopping.JobStopping, match=r"SIGTERM: stopped .* at step 1 of 20, checkpointed"):
            work(req, [key])
    finally:
        stopping.arm(False)
    runs = req.results / "runs"
    assert (runs / key / "checkpoint.pt").exists() and not (runs / f"{key}.json").exists()
    lease = req.results / "leases" / f"{key}.lease"
    assert json.loads(lease.read_text())["pid"] == os.getpid()  # kept: the job's next attempt takes it back
    lease.unlink()  # (that attempt is another process: this one's lease would stay its own)
    work(req, [key])
    ours, theirs = (json.loads((r.results / "runs" / f"{key}.json").read_text()) for r in (req, alone))
    assert ours["run"]["notes"]["restarts"] == 1
    assert ours["curves"]["train_loss"] == theirs["curves"]["train_loss"] and len(ours["curves"]["train_loss"]) == 20
    assert ours["metrics"]["accuracy"] == theirs["metrics"]["accuracy"]


def test_submitits_warnings_reach_stderr_once_while_jobs_are_waited_on(capsys):
    """submitit logs each poll's warning to stdout and stderr (`Bypassing sacct error …` every few
    seconds on a cluster without accounting): while vitbench submits and waits, each distinct one
    is said once on stderr, as vitbench's own, and nothing of submitit's reaches stdout."""
    import logging

    from vitbench.host.logs import configure_logging

    configure_logging()
    submitit_log = logging.getLogger("submitit")
    # submitit's own handlers, as `import submitit` sets them up: every record to stdout, warnings to stderr too
    ours = [logging.StreamHandler(sys.stdout), logging.StreamHandler(sys.stderr)]
    ours[1].setLevel(logging.WARNING)
    level = submitit_log.level
    submitit_log.setLevel(logging.INFO)
    for handler in ours:
        submitit_log.addHandler(handler)
    try:
        with cluster.submitit_warnings_once():
            for call in (1, 2, 1):
                submitit_log.warning("Bypassing sacct error (call %d)", call)
            submitit_log.info("Starting with JobEnvironment(…)")
        submitit_log.info("after the session")  # the filter is gone with it
    finally:
        for handler in ours:
            submitit_log.removeHandler(handler)
        submitit_log.setLevel(level)
    out, err = capsys.readouterr()
    assert out == "after the session\n"
    assert err.splitlines() == ["submitit: Bypassing sacct error (call 1)", "submitit: Bypassing sacct error (call 2)"]


def test_a_stop_request_no_checkpoint_takes_up_acts_where_the_job_is_once_its_grace_is_over(monkeypatch):
    """A signal that finds no stop point within its grace (a job loading a large dataset) stops the
    job where it is, as submitit's own handler would, before Slurm's SIGKILL: here SIGTERM with a
    grace of 0.3 s, in a loop with no stop point; the job then exits as SIGTERM ends a process."""
    import signal as signals

    from vitbench.engine import stopping
    from vitbench.execution import job_process

    monkeypatch.setitem(stopping.GRACE, signals.SIGTERM, 0.3)
    began = time.monotonic()
    with job_process.arranged(None) as handler, pytest.raises(SystemExit) as exit_info:
        try:
            os.kill(os.getpid(), signals.SIGTERM)
            while time.monotonic() - began < 10:  # no stop point here
                time.sleep(0.01)
        except stopping.JobStopping as stop:
            assert "no checkpoint came in time" in str(stop)
            handler.stop(stop)
    assert exit_info.value.code == 143 and time.monotonic() - began < 3
    assert signals.getsignal(signals.SIGTERM) is not handler and stopping.requested() is None

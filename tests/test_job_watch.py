"""Waiting for cluster jobs (execution/job_watch.py) on submitit's real job folders: what a job's
ending is said as when Slurm's last word on it is older than its result."""

from __future__ import annotations

from pathlib import Path

import submitit

from vitbench.errors import UserError
from vitbench.execution import slurm_jobs
from vitbench.execution.job_watch import Watch, Watched


def _failing_job(folder: Path):
    """A real submitit job (a process of this machine) that raised a UserError, ended."""

    def fails() -> None:  # local: pickled by value, as the job's process cannot import this test file
        raise UserError("missing ImageFolder tree: /data")

    job = submitit.LocalExecutor(folder=folder).submit(fails)
    job.wait()
    return job


def test_a_job_that_failed_between_two_polls_is_said_failed_not_pending(tmp_path: Path):
    """A job Slurm said PENDING at the last poll, that started and raised before the next: its result
    holds the exception, and its line says FAILED with it (CI printed `PENDING · UserError: …`)."""
    job = _failing_job(tmp_path / "jobs")
    watched = Watched(job, ["key"], state=slurm_jobs.JobState(job.job_id, "PENDING", "Resources"))
    (failed,) = Watch([watched], tmp_path / "results", slurm=True, poll_seconds=0).until_done(lambda: None, None)
    assert failed.startswith(f"job {job.job_id}: FAILED · UserError: missing ImageFolder tree: /data (log: "), failed


def test_a_job_slurm_ended_in_its_own_word_keeps_that_word(tmp_path: Path):
    """A job whose last state is one Slurm ends jobs with (TIMEOUT here) is said in Slurm's word."""
    job = _failing_job(tmp_path / "jobs")
    watched = Watched(job, ["key"], state=slurm_jobs.JobState(job.job_id, "TIMEOUT"))
    (failed,) = Watch([watched], tmp_path / "results", slurm=True, poll_seconds=0).until_done(lambda: None, None)
    assert failed.startswith(f"job {job.job_id}: TIMEOUT · UserError: "), failed


def test_the_waiting_line_says_why_slurm_keeps_jobs_waiting():
    """Issue 97, items 9b and 13: "1 pending" said nothing of why (a drained node, a requeued job Slurm holds
    back for two minutes: BeginTime)."""
    from vitbench.execution.job_watch import Tally

    tally = Tally(4, pending=3, requeued=1, waiting_for={"Resources": 2, "ReqNodeNotAvail": 1},
                  requeued_for={"BeginTime": 1})  # fmt: skip
    assert tally.line().startswith("4 job(s): 3 pending (1 ReqNodeNotAvail, 2 Resources), 0 running, "
                                   "1 requeued (BeginTime), 0 done")  # fmt: skip
    # and when Slurm lets a requeued job start again (its StartTime), the date too where it is not today
    import datetime

    today = datetime.datetime.now().replace(hour=10, minute=5, second=56, microsecond=0)
    tally.requeued_until = today
    assert "1 requeued (BeginTime, starts 10:05:56), 0 done" in tally.line()
    tally.requeued_until = today + datetime.timedelta(days=1)
    assert f"1 requeued (BeginTime, starts {tally.requeued_until:%Y-%m-%d} 10:05:56)" in tally.line()
    assert Tally(1, pending=1).line().startswith("1 job(s): 1 pending, 0 running")
    assert slurm_jobs.JobState("7", "PENDING", "PartitionConfig").never_starts
    assert not slurm_jobs.JobState("7", "PENDING", "ReqNodeNotAvail").never_starts  # clears when the node is back

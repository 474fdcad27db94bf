"""Which Slurm job was given which runs: `<results>/jobs/<date>/vitbench-jobs.json`, written when a
wave is submitted, read when the command is run again.

A job Slurm requeued (pre-empted, timed out) waits in the queue with no process behind it; its
runs have no result yet. Running the command again must not submit them a second time beside it:
the runs a job of an earlier submission still holds in the queue are waited on as that job, not
resubmitted (a cluster user's `squeue` shows one job per run, as before)."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from vitbench.execution import slurm_jobs
from vitbench.execution.job_watch import Watched
from vitbench.files.atomic import read_regular, write_atomic

log = logging.getLogger("vitbench")

LEDGER = "vitbench-jobs.json"


def note(folder: Path, kind: str, jobs: list[tuple[str, list[str]]]) -> None:
    """Record a wave's jobs and the runs each was given."""
    entries = [{"job_id": job_id, "run_keys": keys} for job_id, keys in jobs]
    write_atomic(folder / LEDGER, json.dumps({"cluster": kind, "jobs": entries}, indent=1))


def queued(results: Path, wanted: set[str]) -> list[Watched]:
    """The jobs of earlier submissions that Slurm still holds (pending, running, requeued) and that
    were given runs of `wanted`, each with those runs, as jobs to wait on."""
    import submitit

    candidates = []
    for ledger in sorted((results / "jobs").glob(f"*/{LEDGER}")):
        try:
            found = json.loads(read_regular(ledger))
        except (OSError, ValueError):
            continue  # not one vitbench wrote whole: nothing to wait on
        if not isinstance(found, dict) or found.get("cluster") != "slurm":
            continue
        for entry in found.get("jobs", []):
            keys = [k for k in entry.get("run_keys", []) if k in wanted]
            if keys and isinstance(entry.get("job_id"), str):
                job: submitit.SlurmJob = submitit.SlurmJob(folder=ledger.parent, job_id=entry["job_id"])
                if not job.paths.result_pickle.exists():
                    candidates.append(Watched(job, keys))
    if not candidates:
        return []
    try:
        states = slurm_jobs.show([w.job.job_id for w in candidates])
    except slurm_jobs.Unanswered as e:
        log.warning("Slurm did not say which earlier jobs are still queued (%s): their runs are submitted again", e)
        return []
    alive = []
    for w in candidates:
        state = states.get(w.job.job_id)
        if state is not None and not state.ended:
            w.state = state
            alive.append(w)
    return alive


@dataclass(frozen=True)
class Noted:
    """A job a `submit` from this results folder sent, as its ledger recorded it."""

    job_id: str
    cluster: str  # "slurm" or "local"
    run_keys: tuple[str, ...]
    folder: Path  # the wave's folder: its scripts and logs

    @property
    def has_result(self) -> bool:
        """Whether it left its result (submitit's pickle): it ended, its runs stored or its failure said."""
        from submitit.core.utils import JobPaths

        return JobPaths(self.folder, job_id=self.job_id, task_id=0).result_pickle.exists()


def noted(results: Path) -> list[Noted]:
    """Every job the ledgers of `results/jobs/` name, oldest wave first."""
    found = []
    for ledger in sorted((results / "jobs").glob(f"*/{LEDGER}")):
        try:
            record = json.loads(read_regular(ledger))
        except (OSError, ValueError):
            continue  # not one vitbench wrote whole
        if not isinstance(record, dict):
            continue
        for entry in record.get("jobs", []) if isinstance(record.get("jobs"), list) else []:
            keys = entry.get("run_keys") if isinstance(entry, dict) else None
            if isinstance(entry, dict) and isinstance(entry.get("job_id"), str) and isinstance(keys, list):
                found.append(Noted(entry["job_id"], str(record.get("cluster")), tuple(map(str, keys)), ledger.parent))
    return found

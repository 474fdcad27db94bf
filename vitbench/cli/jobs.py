"""`vitbench jobs`: the cluster jobs `vitbench submit` sent from a results folder, as Slurm shows them,
and `--cancel` to end those still queued or running (`squeue`'s and `scancel`'s work, for the jobs of
this folder only: their ids come from its ledgers, execution/job_ledger.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from vitbench.cli.app import app, out
from vitbench.cli.options import Results, option
from vitbench.errors import UserError
from vitbench.execution import job_ledger, slurm_jobs
from vitbench.store.shards import shard_path


@app.command("jobs")
def jobs_cmd(
    cancel: Annotated[
        bool, option("--cancel", help="Cancel (scancel) this folder's jobs that are still queued or running.")
    ] = False,
    results: Results = Path("results"),
) -> None:
    """The cluster jobs `vitbench submit` sent from this results folder: each one's id, Slurm's state
    (and why it waits), its runs and how many are stored, and where its log is."""
    noted = job_ledger.noted(results)
    if not noted:
        ledgers = results / "jobs"
        out.print(f"no jobs submitted from {results} (`vitbench submit` records them in {ledgers})", soft_wrap=True)
        return
    open_ids = [j.job_id for j in noted if j.cluster == "slurm" and not j.has_result]
    try:
        states = slurm_jobs.show(open_ids) if open_ids and slurm_jobs.available() else {}
    except slurm_jobs.Unanswered as e:
        raise UserError(f"Slurm did not answer ({e}); `squeue` shows the jobs too") from None
    alive = []
    for job in noted:
        state = states.get(job.job_id)
        if job.has_result:
            said = "ended (its result is in)"
        elif state is not None:
            said = state.said()
            if not state.ended:
                alive.append(job.job_id)
        else:
            gone = "not in the queue (ended without a result)"
            said = gone if job.cluster == "slurm" else "a local job: it ends with its command"
        stored = sum(shard_path(results, key).exists() for key in job.run_keys)
        out.print(f"job {job.job_id}: {said} · {stored}/{len(job.run_keys)} runs stored · {job.folder}",
                  markup=False, highlight=False, soft_wrap=True)  # fmt: skip
    if not cancel:
        if alive:
            cancels = f"`vitbench jobs --cancel --results {results}` cancels them"
            out.print(f"{len(alive)} still queued or running; {cancels}", soft_wrap=True)
        return
    refused = [job_id for job_id in alive if not slurm_jobs.cancel(job_id)]
    out.print(f"cancelled {len(alive) - len(refused)} job(s)")
    if refused:
        raise UserError(f"{len(refused)} job(s) not cancelled: {', '.join(refused)} (`scancel` says why)")

"""Past one machine: the planned runs fanned out as submitit jobs (SLURM array jobs, or local
subprocesses with `--cluster local`), each worker writing its shards to the shared results folder.

- Units: a few-shot or eval group is one job (its runs share one feature extraction); each
  fine-tune run is one job. Final fine-tunes that choose their LR on the dev split go in a second
  wave, once the sweep's shards exist.
- Workers never open the database: they write shards; this process (or `vitbench ingest`, or any
  reading command) merges them.
- A run is leased (lease.py) while it executes: a resubmitted or concurrent job skips it.
- A job that dies (pre-empted, timed out, killed) resumes its fine-tune from the last checkpoint
  when resubmitted: submitit requeues pre-empted and timed-out jobs itself (`Checkpointable`),
  and running the same command again resubmits whatever has no result.
- A job with more than one process per node, or more than one node, runs the unit under torchrun
  (DDP), its rendezvous on the job's first node.
"""

from __future__ import annotations

import logging
import os
import pickle
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from vitbench.atomic import write_atomic
from vitbench.errors import UserError
from vitbench.execution.launch import torchrun_command
from vitbench.logs import configure_logging
from vitbench.protocols.registry import get_protocol

log = logging.getLogger("vitbench")

RDZV_PORT = 29500
# a job's body: run these run_keys of the request's plan in this process (api.work); passed in so
# that this module needs nothing above it
Worker = Callable[[Any, list[str]], dict]


@dataclass(frozen=True)
class ClusterOptions:
    cluster: str = "auto"  # submitit's: auto (SLURM if sbatch is found, else local), slurm, local
    partition: str | None = None
    gpus_per_job: int = 0
    processes_per_node: int = 1  # DDP processes per node (the GPUs per job on a GPU cluster)
    nodes: int = 1
    time_limit_min: int = 240
    cpus_per_task: int | None = None
    mem_gb: int | None = None
    array_parallelism: int = 64
    account: str | None = None
    qos: str | None = None
    wait: bool = True
    poll_seconds: float = 5.0


def units(groups, todo_keys: set[str]) -> tuple[list[list[str]], list[list[str]]]:
    """(first wave, second wave) of jobs, each a list of run_keys, as each group's protocol splits them."""
    waves: tuple[list[list[str]], list[list[str]]] = ([], [])
    for group in groups:
        for number, jobs in enumerate(get_protocol(group.protocol).work(group).of(todo_keys)):
            waves[min(number, 1)].extend([s.run_key for s in job] for job in jobs if job)
    return waves


class RunUnit:
    """The job: a picklable callable that runs its unit's run_keys. As a submitit `Checkpointable`,
    a pre-empted or timed-out job is requeued with the same unit and resumes from its checkpoints."""

    def __init__(self, worker: Worker, request, run_keys: list[str], opts: ClusterOptions):
        self.worker, self.request, self.run_keys, self.opts = worker, request, run_keys, opts

    def __call__(self) -> dict:
        if self.opts.processes_per_node > 1 or self.opts.nodes > 1:
            return self._under_torchrun()
        return self.worker(self.request, self.run_keys)

    def checkpoint(self, *args, **kwargs):
        import submitit

        return submitit.helpers.DelayedSubmission(RunUnit(self.worker, self.request, self.run_keys, self.opts))

    def _under_torchrun(self) -> dict:
        """One torchrun per node; node 0's host is the rendezvous endpoint (c10d)."""
        import subprocess

        import submitit

        env = submitit.JobEnvironment()
        payload = Path(self.request.results) / "jobs" / f"unit-{env.job_id}.pkl"
        if env.node == 0 or not payload.exists():
            _write_payload(payload, self.worker, self.request, self.run_keys)
        command = torchrun_command(
            self.opts.processes_per_node,
            ["-m", "vitbench.execution.cluster", str(payload)],
            nnodes=self.opts.nodes,
            node_rank=env.node,
            rdzv_endpoint=f"{env.hostnames[0]}:{RDZV_PORT}",
            rdzv_id=str(env.job_id),
        )
        code = subprocess.call(command)
        if code:
            raise RuntimeError(f"torchrun exited with {code}")
        return {"ran": self.run_keys}


def _write_payload(path: Path, worker: Worker, request, run_keys: list[str]) -> None:
    write_atomic(path, lambda tmp: tmp.write_bytes(pickle.dumps((worker, request, run_keys))))


def make_executor(folder: Path, opts: ClusterOptions):
    """submitit's SLURM executor (`--cluster slurm`, or auto where `sbatch` is on the PATH) or its
    local one (real subprocesses on this machine). Not AutoExecutor: it needs pkg_resources."""
    import shutil

    try:
        import submitit
    except ImportError:
        raise UserError("vitbench submit needs submitit: pip install 'vitbench[cluster]'") from None
    kind = opts.cluster if opts.cluster != "auto" else ("slurm" if shutil.which("sbatch") else "local")
    if kind == "local":
        if opts.nodes > 1:
            raise UserError(f"--nodes {opts.nodes}: the local cluster is this one machine; use --cluster slurm")
        executor = submitit.LocalExecutor(folder=str(folder))
        executor.update_parameters(timeout_min=opts.time_limit_min, gpus_per_node=opts.gpus_per_job, tasks_per_node=1)
        return executor
    slurm = submitit.SlurmExecutor(folder=str(folder))
    params: dict = {
        "job_name": "vitbench",
        "time": opts.time_limit_min,
        "nodes": opts.nodes,
        "ntasks_per_node": 1,  # one worker per node; it starts torchrun's processes itself
        "array_parallelism": opts.array_parallelism,
    }
    optional = {
        "partition": opts.partition,
        "gpus_per_node": opts.gpus_per_job or None,
        "cpus_per_task": opts.cpus_per_task,
        "mem": f"{opts.mem_gb}GB" if opts.mem_gb else None,
        "account": opts.account,
        "qos": opts.qos,
    }
    slurm.update_parameters(**params, **{k: v for k, v in optional.items() if v is not None})
    return slurm


def submit_and_wait(
    worker: Worker, request, groups, todo_keys: set[str], opts: ClusterOptions, on_ingest
) -> tuple[int, list[str]]:
    """Submit the waves, merge shards as they land (`on_ingest()`), and return (jobs submitted,
    one line per failed job). With `wait=False` only the first wave is submitted."""
    first, second = units(groups, todo_keys)
    failed: list[str] = []
    submitted = 0
    for number, wave in enumerate((first, second), start=1):
        if not wave:
            continue
        if number == 2 and not opts.wait:
            log.info("%d final fine-tune job(s) wait for their LR sweep: run the command again once done", len(wave))
            break
        jobs = submit(worker, request, wave, opts)
        submitted += len(jobs)
        log.info("wave %d: %d job(s) submitted, logs under %s", number, len(jobs), jobs[0].paths.folder)
        if not opts.wait:
            break
        failed += _wait(jobs, opts, on_ingest)
    return submitted, failed


def submit(worker: Worker, request, wave: list[list[str]], opts: ClusterOptions) -> list:
    """One job per unit of `wave`, as one SLURM array (submitit's batch)."""
    executor = make_executor(Path(request.results) / "jobs" / time.strftime("%Y%m%d-%H%M%S"), opts)
    # the workers re-plan the request: its paths made absolute (a SLURM job starts elsewhere)
    request = replace(
        request,
        results=Path(request.results).resolve(),
        data_dir=Path(request.data_dir).resolve() if request.data_dir else None,
    )
    with executor.batch():
        jobs = [executor.submit(RunUnit(worker, request, keys, opts)) for keys in wave]
    return jobs


def _wait(jobs, opts: ClusterOptions, on_ingest) -> list[str]:
    pending = list(jobs)
    failed = []
    while pending:
        time.sleep(opts.poll_seconds)
        still = []
        for job in pending:
            if not job.done():
                still.append(job)
                continue
            try:
                job.result()
            except Exception as e:  # the worker's error, as submitit re-raises it here
                last = " ".join(str(e).strip().splitlines()[-1:]) or type(e).__name__
                failed.append(f"job {job.job_id}: {last[:300]} (log: {job.paths.stderr})")
        if len(still) != len(pending):
            on_ingest()
        pending = still
    return failed


def main(argv: list[str]) -> int:
    """`python -m vitbench.execution.cluster PAYLOAD`: one torchrun process of a multi-process job."""
    configure_logging()
    worker, request, run_keys = pickle.loads(Path(argv[0]).read_bytes())
    worker(request, run_keys)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("VITBENCH_TORCHRUN", "1")
    sys.exit(main(sys.argv[1:]))

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

import io
import logging
import math
import os
import pickle
import re
import signal
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, redirect_stderr
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from vitbench.engine import stopping
from vitbench.errors import UserError, one_line
from vitbench.execution import job_ledger, job_process, job_resources, job_watch
from vitbench.execution.job_watch import Tally  # noqa: F401  (what `on_progress` is given)
from vitbench.execution.launch import torchrun_command
from vitbench.files.atomic import write_atomic
from vitbench.protocols.registry import get_protocol
from vitbench.provenance import command_line

log = logging.getLogger("vitbench")

RDZV_PORT = 29500
SIGNAL_DELAY_S = 90  # submitit's warning before the time limit (sbatch --signal=USR2@90), its default
SIGNAL_EARLY_S = 60  # Slurm may send it up to a minute early (sbatch's --signal: its event resolution)
MIN_WORK_S = 60  # what a job needs between its start and that warning: start-up, then a first checkpoint
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
    a pre-empted or timed-out job checkpoints its run where it is (job_process.py), is requeued with
    the same unit and resumes from that checkpoint. `command`: what was typed to submit it, which
    its runs record."""

    def __init__(self, worker: Worker, request, run_keys: list[str], opts: ClusterOptions, command: str | None = None):
        self.worker, self.request, self.run_keys, self.opts = worker, request, run_keys, opts
        self.command = command

    def __call__(self) -> dict:
        ranks = self.opts.processes_per_node
        with job_process.arranged(self.command, ranks) as signals:
            try:
                if ranks > 1 or self.opts.nodes > 1:
                    return self._under_torchrun()
                return self.worker(self.request, self.run_keys)
            except stopping.JobStopping as stop:
                signals.stop(stop)
                raise

    def checkpoint(self, *args, **kwargs):
        import submitit

        unit = RunUnit(self.worker, self.request, self.run_keys, self.opts, self.command)
        return submitit.helpers.DelayedSubmission(unit)

    def _under_torchrun(self) -> dict:
        """One torchrun per node, its ranks this job's processes; on one node it is standalone (a
        free port of its own: two jobs on one node do not meet), across nodes node 0's host is the
        rendezvous endpoint (c10d). Slurm signals every process of the job: torchrun's agent and its
        ranks ignore USR2 (this process requeues the job), and the ranks checkpoint on SIGTERM."""
        import subprocess

        import submitit

        env = submitit.JobEnvironment()
        payload = Path(self.request.results) / "jobs" / f"unit-{env.job_id}.pkl"
        if env.node == 0 or not payload.exists():
            _write_payload(payload, self.worker, self.request, self.run_keys, self.command)
        across = self.opts.nodes > 1
        command = torchrun_command(
            self.opts.processes_per_node,
            ["-m", "vitbench.execution.cluster", str(payload)],
            nnodes=self.opts.nodes,
            node_rank=env.node,
            rdzv_endpoint=f"{env.hostnames[0]}:{RDZV_PORT}" if across else None,
            rdzv_id=str(env.job_id) if across else None,
        )
        handler = signal.signal(signal.SIGUSR2, signal.SIG_IGN)  # ignored across exec: torchrun's too
        try:
            process = subprocess.Popen(command)
        finally:
            signal.signal(signal.SIGUSR2, handler)
        code = process.wait()
        if code:
            raise RuntimeError(f"torchrun exited with {code}")
        return {"ran": self.run_keys}


def _write_payload(path: Path, worker: Worker, request, run_keys: list[str], command: str | None) -> None:
    write_atomic(path, lambda tmp: tmp.write_bytes(pickle.dumps((worker, request, run_keys, command))))


def with_default_resources(opts: ClusterOptions, req, groups) -> ClusterOptions:
    """`opts` with the CPUs and memory the plan needs where the command gave none (job_resources.py)."""
    return job_resources.with_defaults(opts, req, groups) if kind_of(opts) == "slurm" else opts


def kind_of(opts: ClusterOptions) -> str:
    """`slurm` or `local`: what `--cluster auto` means here (SLURM where `sbatch` is on the PATH)."""
    import shutil

    return opts.cluster if opts.cluster != "auto" else ("slurm" if shutil.which("sbatch") else "local")


def check_time_limit(opts: ClusterOptions) -> None:
    """A time limit in which a job cannot get to work before submitit's warning is refused before
    anything is submitted: each attempt would be signalled before its first checkpoint, requeued,
    and signalled again (`--time-limit 1`: 245 s of attempts, then a failure, nothing done)."""
    usable = opts.time_limit_min * 60 - SIGNAL_DELAY_S - SIGNAL_EARLY_S
    if kind_of(opts) == "slurm" and usable < MIN_WORK_S:
        need = math.ceil((SIGNAL_DELAY_S + SIGNAL_EARLY_S + MIN_WORK_S) / 60)
        raise UserError(
            f"--time-limit {opts.time_limit_min}: too short for a job to reach a checkpoint before submitit's "
            f"warning, which Slurm sends {SIGNAL_DELAY_S} s before the limit (up to {SIGNAL_EARLY_S} s earlier); "
            f"give {need} minutes or more"
        )


def make_executor(folder: Path, opts: ClusterOptions):
    """submitit's SLURM executor (`--cluster slurm`, or auto where `sbatch` is on the PATH) or its
    local one (real subprocesses on this machine). Not AutoExecutor: it needs pkg_resources."""
    try:
        import submitit
    except ImportError:
        raise UserError("vitbench submit needs submitit: pip install 'vitbench[cluster]'") from None
    if kind_of(opts) == "local":
        if opts.nodes > 1:
            raise UserError(f"--nodes {opts.nodes}: the local cluster is this one machine; use --cluster slurm")
        executor = submitit.LocalExecutor(folder=str(folder))
        executor.update_parameters(timeout_min=opts.time_limit_min, gpus_per_node=opts.gpus_per_job, tasks_per_node=1)
        return executor
    slurm = submitit.SlurmExecutor(folder=str(folder))
    params: dict = {
        "job_name": job_name(folder),
        "time": opts.time_limit_min,
        "nodes": opts.nodes,
        "ntasks_per_node": 1,  # one worker per node; it starts torchrun's processes itself
        "array_parallelism": opts.array_parallelism,
        "signal_delay_s": SIGNAL_DELAY_S,
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
    worker: Worker,
    request,
    groups,
    todo_keys: set[str],
    opts: ClusterOptions,
    on_ingest,
    on_progress=None,
    rerun_since: float | None = None,
) -> tuple[int, list[str]]:
    """Submit the waves, merge shards as they land (`on_ingest()`), and return (jobs submitted,
    one line per failed job). With `wait=False` only the first wave is submitted. Runs a job of an
    earlier submission still holds in Slurm's queue (requeued, or still pending) are not submitted
    again: that job is waited on with the first wave. `on_progress(Tally)`: after each poll.
    `rerun_since`: a rerun's, counted stored once its shard is newer than that."""
    check_time_limit(opts)
    slurm = kind_of(opts) == "slurm"
    queued = job_ledger.queued(Path(request.results), todo_keys) if slurm else []
    if queued:
        keys = sum(len(w.run_keys) for w in queued)
        folders = ", ".join(sorted({str(w.job.paths.folder) for w in queued})[:3])
        log.info("%d run(s) already queued in %d job(s) of an earlier submission (%s): waiting for them, not "
                 "submitting them again; logs under %s", keys, len(queued), ", ".join(w.job.job_id for w in queued[:5]),
                 folders)  # fmt: skip
        todo_keys = todo_keys - {k for w in queued for k in w.run_keys}
    first, second = units(groups, todo_keys)
    failed: list[str] = []
    submitted = 0
    with submitit_warnings_once():
        for number, wave in enumerate((first, second), start=1):
            if number == 2 and wave and not opts.wait:
                log.info("%d final fine-tune job(s) wait for their LR sweep: run the command again once done",
                         len(wave))  # fmt: skip
                break
            watched = list(queued) if number == 1 else []
            if wave:
                jobs = submit(worker, request, wave, opts)
                submitted += len(jobs)
                asks = f", {opts.cpus_per_task} CPU(s) and {opts.mem_gb} GB each" if slurm and opts.mem_gb else ""
                ids = ", ".join(job.job_id for job in jobs[:4]) + (f" … {jobs[-1].job_id}" if len(jobs) > 4 else "")
                log.info("wave %d: %d job(s) submitted (%s)%s, logs under %s", number, len(jobs), ids, asks,
                         jobs[0].paths.folder)  # fmt: skip
                watched += [job_watch.Watched(job, keys) for job, keys in zip(jobs, wave, strict=True)]
            if not opts.wait:
                break
            if watched:
                watch = job_watch.Watch(watched, Path(request.results), slurm, opts.poll_seconds, rerun_since)
                failed += watch.until_done(on_ingest, on_progress)
    return submitted, failed


class _OnceOnStderr(logging.Filter):
    """submitit's logger prints each record to stdout, and its warnings to stderr as well, at every
    poll (`Bypassing sacct error …`): here each distinct warning goes to stderr once, as vitbench's,
    and the rest is dropped (the jobs' own logs keep submitit's lines)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if record.levelno >= logging.WARNING and message not in self.seen:
            self.seen.add(message)
            log.warning("submitit: %s", message)
        return False


@contextmanager
def submitit_warnings_once() -> Iterator[None]:
    quiet = _OnceOnStderr()
    logger = logging.getLogger("submitit")
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)


def job_name(folder: Path) -> str:
    """What `squeue` calls a job: vitbench's, and of which results folder (every job was "vitbench")."""
    results = folder.parent.parent.resolve()  # <results>/jobs/<wave>
    return "vitbench-" + re.sub(r"[^A-Za-z0-9._-]", "_", results.name)[:40]


@contextmanager
def refused_in_one_line(folder: Path) -> Iterator[None]:
    """A request sbatch refuses (`--mem-gb 64` on a 16 GB node, an unknown `--partition`) as one line
    saying what sbatch said, where it was submitit's FailedJobError in an 84-line traceback, after
    sbatch's own lines printed raw (held back here; printed as they were where nothing failed)."""
    from submitit.core.utils import FailedJobError

    held = io.StringIO()
    try:
        with redirect_stderr(held):
            yield
    except FailedJobError as e:
        said = [line.split("error:", 1)[-1].strip() for line in str(e).splitlines() if "error:" in line]
        raise UserError(
            f"sbatch refused the job(s): {'; '.join(said) or one_line(e, 200)}; ask for what the cluster has "
            f"(--mem-gb, --cpus-per-job, --partition, --time-limit; `sinfo` lists it). None of them was submitted "
            f"({folder} holds the script)"
        ) from None
    sys.stderr.write(held.getvalue())


def new_jobs_folder(results: Path) -> Path:
    """A wave's own folder under `jobs/`, named for when it was submitted: two `submit`s in the same
    second once shared one, and its ledger kept only the last one's jobs (the other's pending runs were
    then submitted a second time)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for attempt in range(1, 1000):
        folder = results / "jobs" / (stamp if attempt == 1 else f"{stamp}-{attempt}")
        try:
            folder.mkdir(parents=True)
            return folder
        except FileExistsError:
            continue
    raise UserError(f"{results / 'jobs'}: 999 job folders named {stamp}; remove some of them")


def submit(worker: Worker, request, wave: list[list[str]], opts: ClusterOptions) -> list:
    """One job per unit of `wave`, as one SLURM array (submitit's batch), noted in the folder's
    ledger (job_ledger.py) with the runs each was given."""
    folder = new_jobs_folder(Path(request.results))
    executor = make_executor(folder, opts)
    # the workers re-plan the request: its paths made absolute (a SLURM job starts elsewhere)
    request = replace(
        request,
        results=Path(request.results).resolve(),
        data_dir=Path(request.data_dir).resolve() if request.data_dir else None,
    )
    command = command_line()
    with refused_in_one_line(folder), executor.batch():
        jobs = [executor.submit(RunUnit(worker, request, keys, opts, command)) for keys in wave]
    job_ledger.note(folder, kind_of(opts), [(job.job_id, keys) for job, keys in zip(jobs, wave, strict=True)])
    return jobs


def main(argv: list[str]) -> int:
    """`python -m vitbench.execution.cluster PAYLOAD`: one torchrun process of a multi-process job."""
    worker, request, run_keys, command = pickle.loads(Path(argv[0]).read_bytes())
    processes = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    with job_process.arranged(command, processes, requeue=False):
        try:
            worker(request, run_keys)
        except stopping.JobStopping as stop:
            log.warning("stopped: %s", stop.where)
            return job_process.EXIT_TERMINATED
    return 0


if __name__ == "__main__":
    os.environ.setdefault("VITBENCH_TORCHRUN", "1")
    sys.exit(main(sys.argv[1:]))

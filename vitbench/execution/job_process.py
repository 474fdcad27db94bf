"""A cluster job's process, arranged as a cluster user expects it: its runs' progress lines in the
job's log, torch's threads the CPUs Slurm gave it, the command that was typed recorded with its
runs, and the scheduler's signals turned into a checkpoint and a clean stop (engine/stopping.py).

Slurm signals every process of the job's step: the DataLoader workers too. They ignore USR2 and
SIGTERM (engine/loader_workers.py), so only the main process decides; before, each worker ran
submitit's handler itself (a second requeue, then `exit 255`) and the main process failed on the
dead worker while Slurm requeued the job, which then ran on with nobody waiting for it.

On USR2 (submitit's warning before the time limit, or a pre-emption) the job checkpoints at its
next step, chunk or stored run, then hands over to submitit's own handler, which saves the job and
requeues it (`scontrol requeue`) or, timed out too often, ends it. On SIGTERM (Slurm requeues,
cancels or pre-empts it) it checkpoints the same way and exits: Slurm decides what comes next.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from vitbench import provenance
from vitbench.engine import stopping
from vitbench.host.logs import configure_logging
from vitbench.protocols.base import RunSpec
from vitbench.protocols.measures import progress_text, weights_label
from vitbench.protocols.registry import get_protocol

log = logging.getLogger("vitbench")

SIGNALS = (signal.SIGUSR2, signal.SIGTERM)
EXIT_TERMINATED = 128 + signal.SIGTERM  # what a process ended by SIGTERM reports: schedulers record it


def job_cpus() -> int | None:
    """The CPUs Slurm gave this job's task (`--cpus-per-task`), or None outside Slurm."""
    text = os.environ.get("SLURM_CPUS_PER_TASK", "")
    return int(text) if text.isdigit() and int(text) > 0 else None


def job_label() -> str | None:
    """This process's Slurm job as `squeue` names it: `5_2` for an array's task 2, else its id."""
    array, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    if array and task:
        return f"{array}_{task}"
    return os.environ.get("SLURM_JOB_ID")


class JobSignals:
    """The job's handler of USR2 and SIGTERM while `arranged` holds: a stop request, taken up at the
    next checkpoint, or at once when none came within its grace (the same signal, sent again by a
    timer, finds the request overdue)."""

    def __init__(self, requeues: Callable | None, requeue: bool):
        self.requeues, self.requeue = requeues, requeue  # submitit's USR2 handler: it requeues the job
        self.timers: list[threading.Timer] = []
        self.acting = False

    def __call__(self, signum: int, frame) -> None:
        if self.acting or (signum == signal.SIGUSR2 and not self.requeue):
            return  # already ending; or a torchrun rank (the job's own process requeues it)
        if stopping.requested() is not None and stopping.overdue():
            raise stopping.JobStopping(stopping.requested() or signum, "where it was: no checkpoint came in time")
        first = stopping.requested() is None
        stopping.request(signum)
        if first:
            log.warning("%s: the job stops at its next checkpoint", signal.Signals(signum).name)
            grace = stopping.GRACE.get(signum, 20.0)
            timer = threading.Timer(grace + 0.5, signal.pthread_kill, (threading.main_thread().ident, signum))
            timer.daemon = True
            self.timers.append(timer)
            timer.start()

    def stop(self, stop: stopping.JobStopping) -> None:
        """End the job as the scheduler asked: requeued through submitit after USR2 (its handler
        exits the process), else exit as a process ended by SIGTERM does; never a result."""
        self.acting = True
        for timer in self.timers:
            timer.cancel()
        log.warning("stopped: %s", stop.where)
        sys.stderr.flush()
        if stop.signum == signal.SIGUSR2 and self.requeues is not None:
            self.requeues(signal.SIGUSR2, None)  # submitit: saves the job, `scontrol requeue`, exits
        raise SystemExit(EXIT_TERMINATED)


@contextmanager
def arranged(command: str | None, processes: int = 1, requeue: bool = True) -> Iterator[JobSignals]:
    """The job's process set up for the block. `command`: what was typed where the job was submitted;
    `processes`: how many share the job's CPUs (torchrun's ranks); `requeue`: whether this process
    requeues the job on USR2 (submitit's handler does), not a rank under it."""
    import torch

    configure_logging()
    cpus = job_cpus()
    threads_before = torch.get_num_threads()
    if cpus is not None:
        torch.set_num_threads(max(1, cpus // max(1, processes)))
    provenance.submitted_as(command)
    before = {s: signal.getsignal(s) for s in SIGNALS}
    usr2 = before[signal.SIGUSR2]
    handler = JobSignals(usr2 if requeue and callable(usr2) else None, requeue)
    for s in SIGNALS:
        signal.signal(s, handler)
    stopping.arm(True)
    try:
        yield handler
    finally:
        for timer in handler.timers:
            timer.cancel()
        for s, previous in before.items():
            signal.signal(s, previous)
        stopping.arm(False)
        provenance.submitted_as(None)
        torch.set_num_threads(threads_before)


def said_in_the_log(total: int) -> Callable[[RunSpec, dict], None]:
    """A cluster job's line per stored run, in its log, as `vitbench run` says it (its weights named: a
    random-init run and a pretrained one read alike): `[1/4] vit-ti/16 (random init) digits fewshot
    shots=5 seed 0: accuracy 71.2%`."""
    count = [0]

    def said(spec: RunSpec, metrics: dict) -> None:
        count[0] += 1
        protocol = get_protocol(spec.protocol)
        what = " ".join(part for part in (spec.protocol, protocol.describe(spec), f"seed {spec.seed}") if part)
        log.info("[%d/%d] %s (%s) %s %s: %s", count[0], total, spec.model, weights_label(spec), spec.dataset, what,
                 progress_text(protocol.metrics, metrics))  # fmt: skip

    return said

"""A scheduler's request to stop, honoured where the work can resume: after a training step (its
checkpoint written first), after a chunk of extracted features (the cache entry already saved), or
after a stored run.

A Slurm job is told to stop by signals sent to every process of its step: USR2 before its time
limit or on pre-emption (submitit's `--signal=USR2@90`), SIGTERM when it is requeued, cancelled or
pre-empted (SIGKILL follows after Slurm's KillWait, 30 s by default). A signal lands wherever the
main thread is; submitit's own handler requeues and exits there, so a fine-tune lost the steps since
its last periodic checkpoint (up to 500) and a process mid-backward was torn down. Here the job's
handler only records the request (`request`), and the work raises `JobStopping` at its next stop
point (`reached`), after writing what it would otherwise lose. A request that no stop point takes up
within its grace acts at once (`overdue`), as submitit's handler would.

Only a cluster job arms this (execution/cluster.py); a program that imports vitbench, and the
`vitbench` command, never see a request, and `reached` is a read of one global."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable

# seconds from a request to acting at once, by signal: USR2 comes 90 s before the limit (Slurm may send
# it up to 60 s early: never late), SIGTERM KillWait seconds before SIGKILL (30 s by default)
GRACE: dict[int, float] = {signal.SIGUSR2: 60.0, signal.SIGTERM: 20.0}


class JobStopping(BaseException):
    """The job stops here because the scheduler asked it to; what it had done is saved. A
    BaseException: no `except Exception` on the way up takes it for the run's failure."""

    def __init__(self, signum: int, where: str):
        self.signum, self.where = signum, where
        super().__init__(f"{signal.Signals(signum).name}: stopped {where}")


_request: tuple[int, float] | None = None  # (signal, when) of the first request not yet acted on
armed = False  # a cluster job's process: its DataLoader workers leave the scheduler's signals to it


def arm(on: bool) -> None:
    """This process is a cluster job's (on) or no longer (off: any request is forgotten)."""
    global armed
    armed = on
    if not on:
        clear()


def request(signum: int) -> None:
    """The scheduler asked this process to stop (called from the job's signal handler); a USR2 after
    a SIGTERM keeps the USR2, which asks for a requeue."""
    global _request
    if _request is None or signum == signal.SIGUSR2:
        _request = (signum, time.monotonic() if _request is None else _request[1])


def requested() -> int | None:
    """The signal that asked this process to stop, or None."""
    return None if _request is None else _request[0]


def overdue() -> bool:
    """Whether a request has waited past its grace for a stop point (its handler then acts at once)."""
    return _request is not None and time.monotonic() - _request[1] > GRACE.get(_request[0], 20.0)


def reached(where: str, save: Callable[[], None] | None = None) -> None:
    """A stop point: where a request is pending, `save()` what would be lost, then raise JobStopping."""
    if _request is None:
        return
    if save is not None:
        save()
    raise JobStopping(_request[0], where)


def clear() -> None:
    """Forget a request (a job process that goes on after acting on one: the tests)."""
    global _request
    _request = None

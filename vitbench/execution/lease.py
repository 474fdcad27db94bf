"""One run at a time: a lease per run_key on the (possibly shared, NFS) results directory.

`results/leases/<run_key>.lease` is created with O_CREAT|O_EXCL (atomic on local disks and NFSv3+),
holds who took it, and is kept fresh by a heartbeat thread touching its mtime. A lease whose
heartbeat stopped longer than `seconds` ago (a killed worker, a lost node) is stale: the next
taker renames it away (only one rename of a name can succeed) and creates its own.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from pathlib import Path

from vitbench.engine import stopping
from vitbench.errors import UserError
from vitbench.execution import slurm_jobs
from vitbench.files.atomic import read_regular

log = logging.getLogger("vitbench")

LEASE_ENV = "VITBENCH_LEASE_SECONDS"
DEFAULT_SECONDS = 600.0  # a heartbeat every tenth of it; a dead holder is taken over after it
# a lease that names no holder this long after its creation was never finished (its taker's write
# failed: a full disk left one empty, which blocked its run for the whole lease time); the taker
# writes its name microseconds after creating the file, so a younger one may still be filled in
UNREADABLE_GRACE = 5.0


def lease_seconds() -> float:
    text = os.environ.get(LEASE_ENV)
    if text is None:
        return DEFAULT_SECONDS
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value < float("inf"):
        raise UserError(f"{LEASE_ENV}={text}: expected a positive number of seconds (default {DEFAULT_SECONDS:g})")
    return value


def lease_dir(results: Path) -> Path:
    return results / "leases"


class Lease:
    def __init__(self, results: Path, run_key: str, seconds: float | None = None, what: str = "run"):
        self.what = what  # what the lease is for, in its error: a run, or a dedup audit
        self.path = lease_dir(results) / f"{run_key}.lease"
        self.run_key = run_key
        self.seconds = seconds if seconds is not None else lease_seconds()
        self.token = uuid.uuid4().hex
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def holder(self) -> dict:
        """Who holds the lease, as its file says; {} when it says nothing readable."""
        try:
            found = json.loads(read_regular(self.path))
        except (OSError, ValueError):
            return {}
        return found if isinstance(found, dict) else {}

    def _create(self) -> bool:
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        self._created = True  # ours, even before it names us (an interruption may come in between)
        owner = {
            "token": self.token,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "slurm_job": os.environ.get("SLURM_JOB_ID"),
            "taken_at": time.time(),
        }
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(owner, f)
        except OSError:  # a full disk: a lease that names nobody would block the run (acquire says so)
            self.path.unlink(missing_ok=True)
            raise
        return True

    def _stale(self) -> bool:
        """No heartbeat for `seconds`, a file that names no holder a few seconds after it was made
        (empty or damaged: its taker's write failed), or a holder on this host whose process is gone
        (a killed run resumed at once, not after the lease runs out). A lease taken in a Slurm job is
        held while Slurm holds that job, heartbeat or not (a requeued job waits in the queue with its
        runs leased), and free once Slurm has ended it, wherever it ran."""
        try:
            age = time.time() - self.path.stat().st_mtime
        except FileNotFoundError:
            return True
        holder = self.holder()
        queued = _slurm_holds(holder) if holder.get("token") else None
        if queued is not None:
            return not queued
        if age > self.seconds:
            return True
        if not holder.get("token"):
            return age > UNREADABLE_GRACE
        if holder.get("host") != socket.gethostname() or not isinstance(holder.get("pid"), int):
            return False
        try:
            os.kill(holder["pid"], 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False  # alive, someone else's
        return False

    def acquire(self) -> bool:
        """Take the lease (True), or find it held by a live holder (False); a lease that cannot be
        written (a full disk) is a UserError naming it."""
        try:
            return self._acquire()
        except OSError as e:
            reason, done = e.strerror or e, "searched" if self.what == "audit" else "run"
            raise UserError(
                f"{self.path}: cannot take the {self.what}'s lease ({reason}); nothing was {done}"
            ) from None

    def _acquire(self) -> bool:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if not self._create():
            if not self._stale():
                return False
            holder = self.holder()
            if holder.get("slurm_job") and holder.get("slurm_job") == slurm_jobs.this_job():
                log.info("%s: taken back by its own Slurm job, requeued (%s)", self.run_key[:12],
                         describe_holder(holder))  # fmt: skip
            else:
                log.warning("%s: taking over a stale lease (%s)", self.run_key[:12], describe_holder(holder))
            self._remove_stale()
            if not self._create():
                return False
        self._thread = threading.Thread(target=self._beat, daemon=True, name=f"lease-{self.run_key[:8]}")
        self._thread.start()
        return True

    def _remove_stale(self) -> None:
        """Rename the stale lease away, then remove it: only one rename of a name succeeds, so of
        two takers (or a taker and a sweep) one alone removes it."""
        moved = self.path.with_name(f"{self.path.name}.stale-{self.token}")
        try:
            os.rename(self.path, moved)
        except FileNotFoundError:
            return  # another taker renamed it first; it may hold a fresh lease by now
        moved.unlink(missing_ok=True)

    def _beat(self) -> None:
        while not self._stop.wait(self.seconds / 10):
            try:
                os.utime(self.path)
            except FileNotFoundError:
                return

    def keep(self) -> None:
        """Stop the heartbeat and leave the file: a cluster job the scheduler stops keeps its runs
        leased while Slurm holds it (it is requeued), and frees them when Slurm no longer does."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        holder = self.holder()
        # never remove a lease someone else took over; one this process made and had not yet written
        # its name into (interrupted in between) is its own
        if holder.get("token") == self.token or (getattr(self, "_created", False) and not holder):
            self.path.unlink(missing_ok=True)


class Leases:
    """The leases a process holds for the runs it is about to execute; released on exit."""

    def __init__(self, results: Path):
        self.results = results
        self.held: dict[str, Lease] = {}

    def take(self, run_keys: list[str]) -> tuple[list[str], list[str]]:
        """(taken, held elsewhere) among `run_keys`."""
        taken, busy = [], []
        for key in run_keys:
            lease = Lease(self.results, key)
            self.held[key] = lease  # held before it is taken: a signal mid-acquire still releases it on exit
            if lease.acquire():
                taken.append(key)
            else:
                del self.held[key]
                busy.append(key)
        return taken, busy

    def clear_stored(self, stored: set[str]) -> None:
        """Remove the stale leases of runs already stored: a process killed (SIGKILL, a lost node)
        between storing a run and releasing its lease left one that no later command took, since
        none runs it again (issue 89: it outlived the rerun that stored the rest)."""
        try:
            names = os.listdir(lease_dir(self.results))
        except OSError:
            return
        for name in names:
            key = name.removesuffix(".lease")
            if name.endswith(".lease") and key in stored and key not in self.held:
                lease = Lease(self.results, key)
                if lease._stale():
                    holder = describe_holder(lease.holder())
                    log.info("%s: removed the lease its killed run left (%s)", key[:12], holder)
                    lease._remove_stale()

    def release(self, run_key: str) -> None:
        lease = self.held.pop(run_key, None)
        if lease is not None:
            lease.release()

    def __enter__(self) -> Leases:
        return self

    def __exit__(self, *exc) -> None:
        # a cluster job the scheduler stops (pre-empted, timed out, requeued) keeps its runs leased:
        # a command meanwhile would run them beside the requeued job
        keep = stopping.requested() is not None
        for key in list(self.held):
            if keep:
                self.held.pop(key).keep()
            else:
                self.release(key)


def _slurm_holds(holder: dict) -> bool | None:
    """For a lease taken inside a Slurm job: whether that job still holds it (Slurm has it waiting,
    running or requeued, and it is not this very job started again), or None where the lease was
    taken outside Slurm or Slurm cannot be asked here (the host and heartbeat rules decide). A
    requeued job's process is gone while Slurm holds it pending; its lease is not stale."""
    job = holder.get("slurm_job")
    if not isinstance(job, str) or not job:
        return None
    if job == slurm_jobs.this_job():
        return False  # this job, requeued: its runs are its own again
    return slurm_jobs.still_queued(job)


def describe_holder(holder: dict) -> str:
    """A lease's holder as a person reads it: `process 4123 on node7, taken 2026-11-28 15:02 UTC`."""
    if not holder.get("token"):
        return "its file names no holder"
    where = f"process {holder.get('pid', '?')} on {holder.get('host', '?')}"
    if holder.get("slurm_job"):
        where += f" (SLURM job {holder['slurm_job']})"
    taken = holder.get("taken_at")
    if isinstance(taken, int | float):
        where += ", taken " + time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(taken))
    return where

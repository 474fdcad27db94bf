"""What Slurm says of a job, read the way its users read it, with or without accounting.

submitit asks `sacct` for its jobs' states. Without Slurm's accounting daemon (a common small
cluster, and the one the tests start) `sacct` fails: submitit then knows no state ("UNKNOWN" for
ever), printed its warning at every poll, and never saw a cancelled job end. `scontrol show job`
needs no accounting: it knows every job in the queue and each finished one for MinJobAge (300 s by
default), with its state, the reason, its exit code and how often it was requeued. A job it no
longer knows is asked of `sacct` once, where accounting is there, for its final state.
"""

from __future__ import annotations

import datetime
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, replace

# the states a job never leaves (a requeued one goes back to PENDING: Slurm says REQUEUED only in passing)
ENDED = {
    "COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE",
    "OUT_OF_MEMORY", "REVOKED",
}  # fmt: skip
HELD = {"REQUEUE_HOLD", "SPECIAL_EXIT"}  # requeued and held: runs again only when someone releases it
# why a pending job waits, where the wait never ends: the request is more than the partition, the QOS or the
# association lets one job have (`--cpus-per-job 4` on a 2-CPU node: PartitionConfig), or an account or QOS
# that does not exist. Only an administrator's change clears them; a drained node (ReqNodeNotAvail) or a
# busy one (Resources, Priority) clears by itself.
NEVER_STARTS = {
    "PartitionConfig", "PartitionNodeLimit", "PartitionTimeLimit", "BadConstraints", "InvalidAccount",
    "InvalidQOS", "DependencyNeverSatisfied", "QOSMaxCpuPerJobLimit", "QOSMaxMemoryPerJob",
    "QOSMaxNodePerJobLimit", "QOSMaxWallDurationPerJobLimit", "AssocMaxCpuPerJobLimit",
    "AssocMaxNodesPerJobLimit", "AssocMaxWallDurationPerJobLimit", "AssocMaxMemPerJob",
}  # fmt: skip
_FIELD = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z/:_]*)=")


@dataclass(frozen=True)
class JobState:
    """One job (or array task) as Slurm shows it."""

    job_id: str  # as submitit names it: `7`, or `5_2` for an array's task 2
    state: str  # Slurm's JobState: PENDING, RUNNING, CANCELLED, TIMEOUT, …
    reason: str = "None"
    exit_code: str = "0:0"  # `code:signal`
    restarts: int = 0  # how often it was requeued
    own_id: str = ""  # the task's own job id (SLURM_JOB_ID inside it)
    # when Slurm starts a pending job: the end of a requeued job's hold (BeginTime), or the scheduler's
    # expected start; "" where Slurm says none (`Unknown`)
    start_time: str = ""

    def starts_at(self) -> datetime.datetime | None:
        """`start_time` as a time (the controller's clock, local time as `scontrol` prints it), or None."""
        try:
            return datetime.datetime.fromisoformat(self.start_time)
        except ValueError:
            return None

    @property
    def ended(self) -> bool:
        return self.state in ENDED

    @property
    def never_starts(self) -> bool:
        """Pending for a reason that does not clear by itself (NEVER_STARTS)."""
        return self.state == "PENDING" and self.reason in NEVER_STARTS

    @property
    def held(self) -> bool:
        return self.state in HELD or (self.state == "PENDING" and "held" in self.reason.lower())

    def said(self) -> str:
        """The state as one reads it in `squeue`/`sacct`: `CANCELLED`, `FAILED (exit 1)`, `PENDING (BeginTime)`."""
        code, _, signal = self.exit_code.partition(":")
        parts = []
        if self.state in {"FAILED", "NODE_FAIL", "OUT_OF_MEMORY"} and code not in {"", "0"}:
            parts.append(f"exit {code}")
        if signal not in {"", "0"}:
            parts.append(f"signal {signal}")
        if not self.ended and self.reason not in {"None", ""}:
            parts.append(self.reason)
        return self.state + (f" ({', '.join(parts)})" if parts else "")


def available() -> bool:
    return shutil.which("scontrol") is not None


def parse_show_job(text: str) -> list[JobState]:
    """`scontrol show job -o`'s lines as JobStates, an array's pending range (`ArrayTaskId=2-5%2`)
    as one per task."""
    found = []
    for line in text.splitlines():
        fields = _fields(line)
        if "JobId" not in fields or "JobState" not in fields:
            continue
        restarts = fields.get("Restarts", "0")
        state = JobState(
            fields["JobId"],
            fields["JobState"].split()[0],
            fields.get("Reason", "None"),
            fields.get("ExitCode", "0:0"),
            int(restarts) if restarts.isdigit() else 0,
            fields["JobId"],
            fields.get("StartTime", "") if fields.get("StartTime", "")[:1].isdigit() else "",
        )
        array, tasks = fields.get("ArrayJobId"), fields.get("ArrayTaskId")
        if array and tasks:
            found += [replace(state, job_id=f"{array}_{task}") for task in _task_ids(tasks)]
        else:
            found.append(state)
    return found


def _fields(line: str) -> dict[str, str]:
    """`Key=Value Key=Value …`, a value running to the next key (a reason may hold spaces)."""
    keys = list(_FIELD.finditer(line))
    return {
        m.group(1): line[m.end() : keys[i + 1].start() if i + 1 < len(keys) else len(line)].strip()
        for i, m in enumerate(keys)
    }


def _task_ids(text: str) -> list[str]:
    ids = []
    for part in text.split("%")[0].split(","):
        low, _, high = part.partition("-")
        if low.isdigit() and (not high or high.isdigit()):
            ids += [str(i) for i in range(int(low), int(high or low) + 1)]
    return ids


class Unanswered(Exception):
    """Slurm's controller did not answer (down, or not reachable from here)."""


def show(ids: list[str], timeout: float = 30) -> dict[str, JobState]:
    """{job_id: state} of the jobs Slurm still knows among `ids` (job ids, or array job ids for
    all their tasks); a job it has forgotten is absent. Unanswered when the controller is not."""
    known: dict[str, JobState] = {}
    for job in dict.fromkeys(i.split("_")[0] for i in ids):
        try:
            done = subprocess.run(
                ["scontrol", "show", "job", "-o", job], capture_output=True, text=True, timeout=timeout, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            raise Unanswered(f"scontrol show job {job}: {e}") from None
        if done.returncode:
            if "invalid job id" in done.stderr.lower():
                continue  # ended longer ago than MinJobAge: forgotten
            raise Unanswered(" ".join(done.stderr.split())[:200] or f"scontrol exited with {done.returncode}")
        for state in parse_show_job(done.stdout):
            known[state.job_id] = state
            known.setdefault(state.own_id, state)
    return known


def cancel(job_id: str, timeout: float = 30) -> bool:
    """`scancel JOB`; whether Slurm took it."""
    try:
        done = subprocess.run(["scancel", job_id], capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def accounted(job_id: str, timeout: float = 30) -> JobState | None:
    """A job `scontrol` has forgotten, as accounting (`sacct`) remembers it; None where there is no
    accounting or it does not know the job either."""
    if shutil.which("sacct") is None:
        return None
    try:
        done = subprocess.run(
            ["sacct", "-n", "-P", "-X", "-j", job_id, "-o", "JobID,State,ExitCode,Reason"],
            capture_output=True, text=True, timeout=timeout, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in done.stdout.splitlines() if done.returncode == 0 else []:
        jid, state, code, reason = (line.split("|") + ["", "", "", ""])[:4]
        if jid == job_id:
            return JobState(job_id, state.split()[0], reason or "None", code or "0:0")
    return None


def still_queued(job_id: str) -> bool | None:
    """Whether Slurm holds the job (by its own id) as waiting, running or requeued, not ended;
    None where this cannot be told here (no Slurm client, no answer)."""
    if not available():
        return None
    try:
        state = show([job_id]).get(job_id)
    except Unanswered:
        return None
    return state is not None and not state.ended


def this_job() -> str | None:
    """The Slurm job id of this process (an array task's own id), or None outside a job."""
    return os.environ.get("SLURM_JOB_ID")

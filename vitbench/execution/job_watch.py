"""Waiting for a wave of cluster jobs as a cluster user watches them: each job's state as Slurm
says it (slurm_jobs.py: no accounting needed), a requeued job waited through, an ended one said in
one line with its cause, progress as counts, and the shards merged as they land.

submitit's own wait (`job.done()`) asks `sacct`; without accounting it never learnt that a job was
cancelled (a cancelled pending job was waited on for ever), and it took a requeued job's crash for
its end (a job Slurm had put back in the queue was reported failed, and its rerun advice would have
submitted a duplicate). Here a job has ended when it left its result (submitit's pickle), or when
Slurm says it ended and no result came.
"""

from __future__ import annotations

import datetime
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vitbench.execution import slurm_jobs
from vitbench.store.shards import shard_path, stored_before

log = logging.getLogger("vitbench")

# a result pickle can land on a shared disk after Slurm has said the job ended: polls to wait for it
RESULT_GRACE_POLLS = 2
# what says why a job ended, in its log, most telling first: Slurm's memory kill, the exception a
# traceback ends with, slurmstepd's and srun's own errors
_CAUSES = (
    re.compile(r".*(memory limit|oom[-_ ]kill|out of memory).*", re.IGNORECASE),
    re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b.*"),
    re.compile(r"^slurmstepd(-[\w.-]+)?: error: .*"),
    re.compile(r"^srun: error: .*"),
)


@dataclass
class Watched:
    """A submitted job and the runs it was given."""

    job: Any  # a submitit Job
    run_keys: list[str]
    state: slurm_jobs.JobState | None = None  # as Slurm said it at the last poll
    ended_polls: int = 0  # polls since Slurm said it ended, no result seen


@dataclass
class Tally:
    """What the waiting line shows: the jobs by state, the runs stored, the time waited."""

    jobs: int
    pending: int = 0
    running: int = 0
    requeued: int = 0  # waiting again after a requeue (pre-emption, time limit, `scontrol requeue`)
    held: int = 0
    done: int = 0
    failed: int = 0
    runs: int = 0
    stored: int = 0
    elapsed: float = 0.0
    unanswered: str | None = None  # why Slurm gave no states at the last poll
    events: list[str] = field(default_factory=list)  # what happened since the last tally (a requeue)
    waiting_for: dict[str, int] = field(default_factory=dict)  # Slurm's reasons the pending jobs wait: count
    requeued_for: dict[str, int] = field(default_factory=dict)  # and the requeued ones
    # the earliest a job Slurm holds back after a requeue (BeginTime) may start again, as Slurm said it
    requeued_until: datetime.datetime | None = None

    def line(self) -> str:
        parts = [f"{self.pending} pending{_why(self.waiting_for, self.pending)}", f"{self.running} running"]
        until = f", starts {_clock(self.requeued_until)}" if self.requeued_until is not None else ""
        parts += [f"{self.requeued} requeued{_why(self.requeued_for, self.requeued, until)}"] if self.requeued else []
        parts += [f"{self.held} held"] if self.held else []
        parts += [f"{self.done} done"] + ([f"{self.failed} failed"] if self.failed else [])
        waited = time.strftime("%H:%M:%S", time.gmtime(self.elapsed))
        slurm = f" · Slurm not answering: {self.unanswered}" if self.unanswered else ""
        return f"{self.jobs} job(s): {', '.join(parts)} · runs stored {self.stored}/{self.runs} · {waited}{slurm}"


def _why(reasons: dict[str, int], jobs: int, until: str = "") -> str:
    """` (Resources)`, or ` (1 Resources, 2 Priority)`: why Slurm keeps those jobs waiting; `until`
    follows Slurm's hold of a requeued job (` (BeginTime, starts 10:05:56)`)."""
    said = ", ".join(
        (r if n == jobs else f"{n} {r}") + (until if r == "BeginTime" else "") for r, n in sorted(reasons.items())
    )
    return f" ({said})" if said else ""


def _clock(when: datetime.datetime) -> str:
    """A start time as a user reads it beside the waiting line: the time of day, the date too if not today."""
    return when.strftime("%H:%M:%S" if when.date() == datetime.datetime.now().date() else "%Y-%m-%d %H:%M:%S")


class Watch:
    """Wait until every job of `watched` has ended (`until_done`, which returns a line for each one
    that failed). `slurm`: states from Slurm (else submitit's local executor's own)."""

    def __init__(
        self, watched: list[Watched], results: Path, slurm: bool, poll_seconds: float, since: float | None = None
    ):
        self.watched, self.results, self.slurm, self.poll = watched, results, slurm, poll_seconds
        self.since = since  # a rerun's: a shard written before it is not this submission's result
        self.started = time.monotonic()
        self.failed: list[str] = []
        # requeues seen: a job of an earlier submission comes with its own
        self.restarts = {w.job.job_id: w.state.restarts for w in watched if w.state is not None}

    def until_done(self, on_ingest: Callable[[], None], on_progress: Callable[[Tally], None] | None) -> list[str]:
        pending = list(self.watched)
        unanswered = None
        while pending:
            states: dict[str, slurm_jobs.JobState] = {}
            if self.slurm:
                try:
                    states = slurm_jobs.show([w.job.job_id for w in pending])
                    unanswered = None
                except slurm_jobs.Unanswered as e:
                    unanswered = str(e)
            events: list[str] = []
            still = [w for w in pending if not self._ended(w, states, unanswered is not None, events)]
            if len(still) != len(pending):
                on_ingest()
            pending = still
            if on_progress is not None:
                on_progress(self._tally(pending, unanswered, events))
            if pending:
                time.sleep(self.poll)
        return self.failed

    def _ended(self, w: Watched, states: dict, blind: bool, events: list[str]) -> bool:
        """Whether `w` has ended (its failure, if any, noted); `events`: a requeue seen now."""
        if w.job.paths.result_pickle.exists():
            self._outcome(w)
            return True
        if not self.slurm:
            if not w.job.done():
                return False
            self._outcome(w)
            return True
        if blind:
            return False
        state = states.get(w.job.job_id)
        if state is None:  # Slurm no longer knows it (ended longer ago than MinJobAge): accounting may
            state = slurm_jobs.accounted(w.job.job_id) or slurm_jobs.JobState(w.job.job_id, "UNKNOWN")
        if state.restarts > self.restarts.get(w.job.job_id, 0):
            self.restarts[w.job.job_id] = state.restarts
            events.append(f"job {w.job.job_id} requeued (restart {state.restarts}); it resumes from its checkpoint")
        w.state = state
        if state.never_starts:  # waited on for 11.5 min until Ctrl-C, as "1 pending"
            cancelled = "cancelled" if slurm_jobs.cancel(w.job.job_id) else f"`scancel {w.job.job_id}` it"
            asked = "--cpus-per-job, --mem-gb, --time-limit, --partition; `sinfo -l` lists them"
            cause = f"PENDING ({state.reason}): Slurm can never start it as asked ({cancelled})"
            self._fail(w, f"{cause}; ask for what the partition has ({asked})", None)
            return True
        if not state.ended and state.state != "UNKNOWN":
            return False
        w.ended_polls += 1
        if w.ended_polls <= RESULT_GRACE_POLLS:  # its result may still be landing
            return False
        if state.state != "UNKNOWN":
            cause = state.said()
        elif w.job.paths.stderr.exists():
            cause = "ended, and Slurm no longer knows it"
        else:  # an array's pending task cancelled: Slurm drops it and keeps no record (accounting would)
            cause = "left the queue before it started (cancelled while pending)"
        self._fail(w, f"{cause}, no result", _last_error(w.job.paths.stderr))
        return True

    def _outcome(self, w: Watched) -> None:
        """A job that left its result: success, or the exception it raised (its traceback's last line)."""
        error = w.job.exception()
        if error is None:
            return
        # Slurm's own word where it has one for the end (TIMEOUT, CANCELLED, …); else FAILED: the state seen
        # at the last poll may be older than the result (a job that started and failed between two polls
        # was said "PENDING"), and a raised exception is a COMPLETED job to Slurm
        ended = w.state is not None and w.state.ended and w.state.state != "COMPLETED"
        trace = [line for line in str(error).splitlines() if line.strip() and not line.startswith(("-----", "You can"))]
        lines = [line.strip() for line in trace if not line.startswith(("  ", "Traceback", "Job (task"))]
        self._fail(w, w.state.said() if ended else "FAILED",
                   _exception_line(lines) or _last_error(w.job.paths.stderr))  # fmt: skip

    def _fail(self, w: Watched, cause: str, detail: str | None) -> None:
        log_path = w.job.paths.stderr
        where = f"log: {log_path}" if log_path.exists() else "no log: it never started"
        own = w.state.own_id if w.state is not None else ""
        if detail and own and own != w.job.job_id:  # slurmstepd's "*** JOB 44 …" is array task 43_0
            detail = detail.replace(f"JOB {own} ", f"JOB {own} (= {w.job.job_id}) ")
        if detail and "timed-out too many times" in detail:  # submitit's words for a job out of requeues
            # how far it got: the job's own last words on stopping (job_process.py: `stopped: … at step 225 of
            # 300, checkpointed`)
            stops = [line.removeprefix("stopped: ") for line in _log_tail(log_path) if line.startswith("stopped: ")]
            got = f"; its last attempt stopped {stops[-1]}" if stops else ""
            detail = f"timed out at every requeue: --time-limit is too short for it{got}; a longer one resumes it"
        said = f"job {w.job.job_id}: {cause}" + (f" · {detail}" if detail else "") + f" ({where})"
        self.failed.append(said)
        log.warning("%s", said)  # as it happens (a cancelled task was said only when its whole wave ended)

    def _tally(self, pending: list[Watched], unanswered: str | None, events: list[str]) -> Tally:
        tally = Tally(len(self.watched), unanswered=unanswered, events=events)
        tally.failed = len(self.failed)
        tally.done = len(self.watched) - len(pending) - tally.failed
        for w in pending:
            if not self.slurm:  # submitit's local jobs start at once, each a process of this machine
                tally.running += 1
                continue
            state = w.state.state if w.state is not None else "PENDING"
            if w.state is not None and (w.state.ended or state == "UNKNOWN"):  # ended, its result (if any) landing
                if state == "COMPLETED":
                    tally.done += 1
                else:
                    tally.failed += 1
            elif w.state is not None and w.state.held:
                tally.held += 1
            elif state in {"RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED", "SIGNALING", "STAGE_OUT"}:
                tally.running += 1
            elif w.state is not None and w.state.restarts:
                tally.requeued += 1
                _count_reason(tally.requeued_for, w.state)  # BeginTime: Slurm holds it back a while
                starts = w.state.starts_at() if w.state.reason == "BeginTime" else None
                if starts is not None and (tally.requeued_until is None or starts < tally.requeued_until):
                    tally.requeued_until = starts
            else:
                tally.pending += 1
                _count_reason(tally.waiting_for, w.state)
        keys = [k for w in self.watched for k in w.run_keys]
        tally.runs = len(keys)
        tally.stored = sum(
            shard_path(self.results, k).exists() and not stored_before(self.results, k, self.since) for k in keys
        )
        tally.elapsed = time.monotonic() - self.started
        return tally


def _count_reason(counts: dict[str, int], state: slurm_jobs.JobState | None) -> None:
    if state is not None and state.reason not in {"None", ""}:
        counts[state.reason] = counts.get(state.reason, 0) + 1


def _exception_line(lines: list[str]) -> str | None:
    """The exception a traceback ends with (`UserError: …`, its module path dropped)."""
    for line in reversed(lines):
        if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b", line):
            name, _, message = line.partition(":")
            return f"{name.rsplit('.', 1)[-1]}:{message}"[:300]
    return lines[-1][:300] if lines else None


def _last_error(path: Path) -> str | None:
    """What a job's log says went wrong, or None: the last line of the most telling kind (_CAUSES)."""
    lines = _log_tail(path)
    for cause in _CAUSES:
        found = [line for line in lines if cause.match(line)]
        if found:
            return _exception_line(found[-1:])
    return None


def _log_tail(path: Path) -> list[str]:
    """The last 64 kB of a job's log as stripped lines ([] where it cannot be read)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - 65536))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return []
    return [line.strip() for line in text.splitlines()]

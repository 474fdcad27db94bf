"""`vitbench submit`: the cluster options from the command line, and what a cluster session
reports at its end."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from rich.live import Live
from rich.text import Text

from vitbench.cli.app import err, out
from vitbench.cli.output import print_summary_table
from vitbench.errors import UserError

if TYPE_CHECKING:  # the API and the executors load when a run starts, not for `--help`
    from vitbench import api
    from vitbench.execution.cluster import ClusterOptions
    from vitbench.execution.job_watch import Tally

log = logging.getLogger("vitbench")


def cluster_options(given: dict) -> ClusterOptions:
    from vitbench.execution.cluster import ClusterOptions

    return ClusterOptions(
        cluster=given["cluster"],
        partition=given["partition"],
        gpus_per_job=given["gpus_per_job"],
        processes_per_node=max(given["gpus_per_job"], given["devices"]),
        nodes=given["nodes"],
        time_limit_min=given["time_limit"],
        cpus_per_task=given["cpus_per_job"],
        mem_gb=given["mem_gb"],
        array_parallelism=given["array_parallelism"],
        account=given["slurm_account"],
        qos=given["slurm_qos"],
        wait=not given["no_wait"],
    )


class JobsProgress:
    """While `vitbench submit` waits: on a terminal one line that updates in place (the jobs by
    state, the runs stored, the time waited); in a log or a pipe a plain line each time the counts
    change. A requeue is said on a line of its own either way."""

    def __init__(self) -> None:
        self.live: Live | None = None
        self.last = ""

    def __call__(self, tally: Tally) -> None:
        for event in tally.events:
            self._say(event)
        line = tally.line()
        waiting = tally.pending + tally.running + tally.requeued + tally.held
        if err.is_terminal:
            if self.live is None and waiting:
                self.live = Live(Text(line), console=err, refresh_per_second=1, transient=False)
                self.live.start()
            if self.live is not None:
                self.live.update(Text(line))
                if not waiting:
                    self.close()
            return
        counts = line.rsplit(" · ", 1)[0] if not tally.unanswered else line
        if counts != self.last:
            self.last = counts
            log.info("%s", line)

    def _say(self, line: str) -> None:
        if self.live is not None:
            self.live.console.print(line, markup=False, highlight=False)
        else:
            log.info("%s", line)

    def close(self) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None


def report(summary: api.Summary, waited: bool) -> None:
    """What a cluster session left: failures, runs without a result yet, or the summary table."""
    if summary.failed:
        for line in summary.failed:
            err.print(f"failed: {line}", markup=False, highlight=False, soft_wrap=True)
        raise UserError(
            f"{len(summary.failed)} job(s) failed; run the same command again to resubmit what has no result "
            "(fine-tunes resume from their last checkpoint)"
        )
    if waited and summary.waiting:  # exit 0 only once every planned run is stored: `submit … && table` sees them
        print_summary_table(summary.results, {s.run_key for s in summary.specs})
        raise UserError(
            f"{summary.waiting} of {len(summary.todo)} submitted run(s) have no result yet: leased by another job "
            "(see the job logs); run the same command again to pick them up"
        )
    if not waited and summary.todo:
        out.print(
            f"submitted; `vitbench ingest --results {summary.results}` (or any `vitbench table`) merges the results"
        )
        return
    print_summary_table(summary.results, {s.run_key for s in summary.specs})

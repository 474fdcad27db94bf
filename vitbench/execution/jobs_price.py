"""`vitbench submit --dry-run`: the plan as the jobs it becomes (cluster.units), what each job asks
the cluster for, how many of them its nodes run at once, and the wait that makes: each job's
estimated time (its runs, and its own start-up) laid out over those places, a second wave after
the first (issue 97: a 4-job plan priced as one process's 1.8 min; 2-CPU jobs on a 2-CPU node run
one at a time, and each pays its own start-up).

How many run at once: on Slurm, `sinfo`'s nodes of the partition (the default one where none is
named) that are up, each holding as many jobs as its CPUs, memory and GPUs take (Slurm's
`--cpus-per-task`, `--mem` and `--gpus` each a floor), capped by `--array-parallelism`; on the local
cluster, submitit starts every job at once on this machine, where they share its CPUs (as if in
turn) or take its GPUs `--gpus-per-job` at a time.

A CPU job runs torch on the CPUs Slurm gives it (job_process.py); priced at this machine's rate,
which used all of this machine's threads, it is slowed by that ratio where it has fewer.
"""

from __future__ import annotations

import math
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass

from vitbench.execution import estimate

# `sinfo`'s compact states (`%t`) of a node that takes no new job
_UNUSABLE = ("down", "drain", "drng", "fail", "failg", "maint", "inval", "unk", "npc", "futr", "boot", "powered")
# submitit requeues a job that timed out this often before it gives up (SlurmExecutor's max_num_timeout)
TIMEOUT_REQUEUES = 3


@dataclass(frozen=True)
class Asks:
    """What one job asks the cluster for (None: nothing asked; the cluster's default)."""

    cpus: int | None
    mem_gb: int | None
    gpus: int
    nodes: int
    time_limit_min: int
    local: bool = False  # submitit's local jobs: processes of this machine, asking nothing of a scheduler

    def said(self) -> str:
        if self.local:
            gpus = f" with {self.gpus} GPU{'s' if self.gpus != 1 else ''}" if self.gpus else ""
            return f"a process of this machine{gpus}, a time limit of {self.time_limit_min} min"
        cpus = f"{self.cpus} CPU{'s' if self.cpus != 1 else ''}" if self.cpus else "the cluster's default CPUs"
        memory = f"{self.mem_gb} GB" if self.mem_gb else "the cluster's default memory"
        gpus = f"{self.gpus} GPU{'s' if self.gpus != 1 else ''}" if self.gpus else "no GPU"
        nodes = f" on each of {self.nodes} nodes" if self.nodes > 1 else ""
        return f"{cpus}, {memory}, {gpus}{nodes}, a time limit of {self.time_limit_min} min"


@dataclass(frozen=True)
class Capacity:
    """How many such jobs the cluster runs at once (None: not known here), and where, in words."""

    at_once: int | None
    where: str
    shared: bool = False  # all start at once and share the CPUs: they end as if run in turn (`at_once` 1)


@dataclass(frozen=True)
class Node:
    name: str
    cpus: int
    memory_mb: int
    gpus: int

    def holds(self, asks: Asks) -> int:
        """How many jobs asking `asks` this node runs at once."""
        fits = [self.cpus // max(1, asks.cpus or 1)]
        if asks.mem_gb:
            fits.append(self.memory_mb // (asks.mem_gb * 1024))  # Slurm's `--mem 3GB`: 3072 MB
        if asks.gpus:
            fits.append(self.gpus // asks.gpus)
        return max(0, min(fits))


def parse_sinfo(text: str, partition: str | None) -> list[Node]:
    """`sinfo -h -N -o '%N|%P|%c|%m|%G|%t'`'s nodes that take jobs in `partition` (Slurm's default,
    marked `*`, where None), each once."""
    wanted = set(partition.split(",")) if partition else None
    nodes: dict[str, Node] = {}
    for line in text.splitlines():
        fields = line.strip().split("|")
        if len(fields) != 6:
            continue
        name, part, cpus, memory, gres, state = fields
        in_it = part.rstrip("*") in wanted if wanted is not None else part.endswith("*")
        if not in_it or state.rstrip("*~#!%$@^-").startswith(_UNUSABLE) or not cpus.isdigit():
            continue
        nodes[name] = Node(name, int(cpus), int(memory) if memory.isdigit() else 0, _gpus(gres))
    return list(nodes.values())


def _gpus(gres: str) -> int:
    """The GPUs of `sinfo`'s %G (`gpu:4`, `gpu:a100:8(S:0-1)`, `(null)`)."""
    count = 0
    for item in gres.split(","):
        parts = item.split("(")[0].split(":")
        if parts[0] == "gpu" and len(parts) > 1 and parts[-1].isdigit():
            count += int(parts[-1])
    return count


def slurm_capacity(
    asks: Asks, partition: str | None, array_parallelism: int, run: Callable = subprocess.run
) -> Capacity:
    """Capacity from `sinfo` (as `run` calls it), or unknown with the reason."""
    named = f"partition {partition}" if partition else "the default partition"
    if shutil.which("sinfo") is None and run is subprocess.run:
        return Capacity(None, f"{named} (no `sinfo` here to ask how many run at once)")
    command = ["sinfo", "-h", "-N", "-o", "%N|%P|%c|%m|%G|%t", *(["-p", partition] if partition else [])]
    try:
        done = run(command, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return Capacity(None, f"{named} (sinfo did not answer: {e})")
    if done.returncode:
        return Capacity(None, f"{named} (sinfo: {' '.join(done.stderr.split())[:160]})")
    nodes = parse_sinfo(done.stdout, partition)
    if not nodes:
        return Capacity(0, f"{named} has no node up to take them")
    cpus, memory, gpus = (max(getattr(n, part) for n in nodes) for part in ("cpus", "memory_mb", "gpus"))
    largest = f"{cpus} CPUs, {memory / 1024:.0f} GB" + (f", {gpus} GPUs" if gpus else "")
    shape = f"{len(nodes)} node{'s' if len(nodes) > 1 else ''} up, the largest {largest}"
    at_once = min(sum(n.holds(asks) for n in nodes) // max(1, asks.nodes), array_parallelism)
    return Capacity(at_once, f"{named} ({shape})")


def local_capacity(asks: Asks, cpus_here: int, gpus_here: int) -> Capacity:
    """submitit's local jobs all start at once on this machine: sharing its CPUs they finish as if in
    turn; GPU jobs take `asks.gpus` each."""
    if asks.gpus:
        return Capacity(gpus_here // asks.gpus, f"this machine ({gpus_here} GPUs)")
    return Capacity(1, f"this machine's {cpus_here} CPUs", shared=True)


def makespan(seconds: list[float], at_once: int) -> float:
    """When the last of jobs taking `seconds` ends, each started on the first free place of `at_once`,
    longest first (as a queue of equal jobs fills the nodes)."""
    places = [0.0] * max(1, min(at_once, len(seconds) or 1))
    for job in sorted(seconds, reverse=True):
        first = places.index(min(places))
        places[first] += job
    return max(places, default=0.0)


@dataclass
class JobsPlan:
    """The plan as jobs and, where priced, the wait as jobs."""

    waves: tuple[list[list[str]], list[list[str]]]
    asks: Asks
    capacity: Capacity
    job_seconds: list[list[float]] | None = None  # per wave, per job; None: not priced
    slowdown: float = 1.0  # a CPU job's fewer threads than this machine's

    def wall(self) -> float | None:
        if self.job_seconds is None or not self.capacity.at_once:
            return None
        return sum(makespan(wave, self.capacity.at_once) for wave in self.job_seconds if wave)

    def lines(self) -> list[str]:
        first, second = (len(w) for w in self.waves)
        count = f"{first} job(s)" if not second else f"{first} job(s), then {second} once their LR sweeps end"
        head = f"as jobs: {count}, each {'' if self.asks.local else 'asking '}{self.asks.said()}; {self.capacity.where}"
        at_once = self.capacity.at_once
        if at_once == 0:
            return [f"{head}: none of its nodes can take one as asked, so Slurm would never start them "
                    "(--cpus-per-job, --mem-gb, --gpus-per-job, --partition; `sinfo -l` lists the nodes)"]  # fmt: skip
        if at_once is None:
            return [head]
        if self.capacity.shared:
            head += ": all start at once and share them"
        else:
            head += f": {at_once} at a time" if at_once < first + second else ": all at once"
        wall = self.wall()
        if wall is None or self.job_seconds is None:
            return [f"{head} (not priced)"]
        longest = max(s for wave in self.job_seconds for s in wave)
        slower = f", {self.slowdown:.1f}x this machine's time on its fewer threads" if self.slowdown > 1 else ""
        lines = [f"{head}, ≈ {estimate.duration(wall)} in all (the longest job ≈ {estimate.duration(longest)} "
                 f"with its own start-up{slower})"]  # fmt: skip
        limit = self.asks.time_limit_min * 60
        if longest > limit:
            attempts = math.ceil(longest / limit)
            fate = (
                f"is requeued from its checkpoint {attempts - 1} time(s)"
                if attempts <= TIMEOUT_REQUEUES + 1
                else f"cannot finish in the {TIMEOUT_REQUEUES + 1} attempts submitit gives a timed-out job"
            )
            lines.append(f"the longest job is over --time-limit {self.asks.time_limit_min}: it {fate}; "
                         "a longer --time-limit spares the restarts")  # fmt: skip
        return lines


def job_seconds(
    waves: tuple[list[list[str]], list[list[str]]], found: estimate.Estimate, startup: float, slowdown: float
) -> list[list[float]] | None:
    """Each job's seconds: its runs' (at this machine's rate, times `slowdown`) and its own start-up;
    None where a run of it was not priced."""
    if any(key not in found.seconds for wave in waves for job in wave for key in job):
        return None
    return [[sum(found.run_seconds(k) for k in job) * slowdown + startup for job in wave] for wave in waves]


def as_jobs(groups, todo: set[str], req, opts, found: estimate.Estimate | None, startup: float) -> JobsPlan:
    """The planned runs `todo` as `vitbench submit` with `opts` would submit them, priced with
    `found` (None: not priced) and each job's `startup` (this command's own, as a job pays it too)."""
    import torch

    from vitbench.execution import cluster

    waves = cluster.units(groups, todo)
    opts = cluster.with_default_resources(opts, req, [g for g in groups if any(s.run_key in todo for s in g.specs)])
    slurm = cluster.kind_of(opts) == "slurm"
    asks = Asks(
        opts.cpus_per_task if slurm else None, opts.mem_gb if slurm else None, opts.gpus_per_job, opts.nodes,
        opts.time_limit_min, not slurm,
    )  # fmt: skip
    if slurm:
        capacity = slurm_capacity(asks, opts.partition, opts.array_parallelism)
    else:
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        capacity = local_capacity(asks, torch.get_num_threads(), gpus)
    slowdown = 1.0
    if slurm and not asks.gpus and asks.cpus:  # torch's threads in the job: its CPUs over its processes
        slowdown = max(1.0, torch.get_num_threads() / max(1, asks.cpus // max(1, opts.processes_per_node)))
    seconds = job_seconds(waves, found, startup, slowdown) if found is not None else None
    return JobsPlan(waves, asks, capacity, seconds, slowdown)

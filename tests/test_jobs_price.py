"""`vitbench submit --dry-run` says the plan as jobs (execution/jobs_price.py): how many, what each
asks for, how many the cluster runs at once, and the wait that makes (issue 97, item 13: a 4-job
plan priced as one process's 1.8 min took 384 s, its 2-CPU jobs running one at a time on a 2-CPU
node). The real Slurm's own `sinfo` is read in tests/test_slurm.py."""

from __future__ import annotations

import re
import subprocess

import pytest

from vitbench.execution import jobs_price
from vitbench.execution.jobs_price import Asks, Capacity, JobsPlan, makespan, parse_sinfo

# `sinfo -h -N -o '%N|%P|%c|%m|%G|%t'` as a cluster of two partitions prints it: a node in both, a
# drained one, GPU nodes with typed GRES
SINFO = """\
cpu01|cpu*|32|128000|(null)|idle
cpu02|cpu*|32|128000|(null)|mix
cpu03|cpu*|32|128000|(null)|drain
cpu01|all|32|128000|(null)|idle
gpu01|gpu|64|512000|gpu:a100:8(S:0-1)|idle
gpu02|gpu|64|512000|gpu:a100:8(S:0-1)|down*
gpu02|all|64|512000|gpu:a100:8(S:0-1)|down*
"""


def test_sinfo_gives_the_partitions_nodes_that_take_jobs():
    default = parse_sinfo(SINFO, None)
    assert [n.name for n in default] == ["cpu01", "cpu02"]  # the drained node takes no job
    gpu = parse_sinfo(SINFO, "gpu")
    assert [(n.name, n.cpus, n.memory_mb, n.gpus) for n in gpu] == [("gpu01", 64, 512000, 8)]
    both = parse_sinfo(SINFO, "cpu,gpu")
    assert [n.name for n in both] == ["cpu01", "cpu02", "gpu01"]


def test_a_node_holds_as_many_jobs_as_its_scarcest_resource_takes():
    (node,) = parse_sinfo(SINFO, "gpu")
    assert node.holds(Asks(cpus=8, mem_gb=40, gpus=1, nodes=1, time_limit_min=60)) == 8  # GPUs and CPUs: 8
    assert node.holds(Asks(cpus=8, mem_gb=100, gpus=1, nodes=1, time_limit_min=60)) == 5  # memory: 5 x 102,400 MB
    assert node.holds(Asks(cpus=48, mem_gb=4, gpus=0, nodes=1, time_limit_min=60)) == 1
    assert node.holds(Asks(cpus=4, mem_gb=4, gpus=16, nodes=1, time_limit_min=60)) == 0


def _sinfo(text: str, returncode: int = 0, stderr: str = ""):
    def run(command, **kwargs):
        assert command[:3] == ["sinfo", "-h", "-N"]
        return subprocess.CompletedProcess(command, returncode, text, stderr)

    return run


def test_capacity_counts_every_node_and_is_capped_by_the_array_parallelism():
    asks = Asks(cpus=8, mem_gb=16, gpus=0, nodes=1, time_limit_min=60)
    found = jobs_price.slurm_capacity(asks, None, 64, run=_sinfo(SINFO))
    assert found.at_once == 8 and found.where == "the default partition (2 nodes up, the largest 32 CPUs, 125 GB)"
    assert jobs_price.slurm_capacity(asks, None, 3, run=_sinfo(SINFO)).at_once == 3
    refused = jobs_price.slurm_capacity(asks, "nope", 64, run=_sinfo("", 1, "sinfo: error: invalid partition"))
    assert refused.at_once is None and refused.where == "partition nope (sinfo: sinfo: error: invalid partition)"


def test_jobs_fill_the_places_longest_first():
    assert makespan([30.0] * 4, 1) == 120.0
    assert makespan([30.0] * 4, 2) == 60.0
    assert makespan([50.0, 10.0, 10.0, 10.0, 10.0, 10.0], 2) == 50.0
    assert makespan([5.0], 64) == 5.0


def test_the_plan_as_jobs_says_the_wait_waves_and_a_time_limit_too_short():
    asks = Asks(cpus=2, mem_gb=3, gpus=0, nodes=1, time_limit_min=4)
    plan = JobsPlan(([["a"], ["b"], ["c"]], [["d"]]), asks, Capacity(2, "partition cpu (1 node up)"),
                    [[100.0, 100.0, 100.0], [300.0]])  # fmt: skip
    first, second = plan.lines()
    assert first == (
        "as jobs: 3 job(s), then 1 once their LR sweeps end, each asking 2 CPUs, 3 GB, no GPU, a time limit of "
        "4 min; partition cpu (1 node up): 2 at a time, ≈ 8.3 min in all (the longest job ≈ 5.0 min with its own "
        "start-up)"
    )
    assert second.startswith("the longest job is over --time-limit 4: it is requeued from its checkpoint 1 time(s)")
    never = JobsPlan(([["a"]], []), asks, Capacity(0, "partition cpu (1 node up)"), [[1.0]])
    assert "none of its nodes can take one as asked, so Slurm would never start them" in never.lines()[0]


@pytest.mark.slow
def test_submit_dry_run_says_the_plan_as_jobs_of_this_machine(cli, tmp_path):
    """`--cluster local`: the jobs are processes of this machine; four fine-tunes start at once and
    share its CPUs, so the wait is the four jobs' sum, each with its own start-up."""
    args = ("--model", "vit-ti/16", "--weights", "random", "--dataset", "digits", "--protocol", "finetune",
            "--lr", "0.01", "--seeds", "0,1,2,3", "--res", "32", "--batch", "16", "--steps", "300")  # fmt: skip
    code, out, err = cli("submit", "--cluster", "local", "--dry-run", *args, "--results", tmp_path / "r")
    assert code == 0, err
    (line,) = [line for line in out.splitlines() if line.startswith("as jobs:")]
    said = re.fullmatch(
        r"as jobs: 4 job\(s\), each a process of this machine, a time limit of 240 min; this machine's \d+ CPUs: "
        r"all start at once and share them, ≈ (.+) in all \(the longest job ≈ (.+) with its own start-up\)",
        line,
    )
    assert said, line
    assert not (tmp_path / "r" / "jobs").exists()  # a dry run submits nothing


def test_a_job_pays_its_runs_slowed_to_its_threads_and_its_own_start_up():
    from vitbench.execution.estimate import Estimate
    from vitbench.execution.overheads import Beside

    found = Estimate({"a": 10.0, "b": 20.0, "c": 5.0}, "test", beside=Beside(decode={"a": 1.0}, startup=8.0))
    assert jobs_price.job_seconds(([["a", "b"]], [["c"]]), found, 8.0, 2.0) == [[70.0], [18.0]]
    assert jobs_price.job_seconds(([["a", "x"]], []), found, 8.0, 1.0) is None  # a run not priced

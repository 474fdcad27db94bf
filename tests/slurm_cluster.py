"""A real single-node Slurm on 127.0.0.1, started from Debian's `slurm-wlm` and `munge` for the
cluster tests (tests/test_slurm.py: each test worker starts one of its own), and stopped again by
the pids it started.

    python tests/slurm_cluster.py start FOLDER   # prints `export SLURM_CONF=FOLDER/slurm.conf`
    python tests/slurm_cluster.py stop FOLDER

Everything lives in FOLDER: munge's key, socket and seed, slurm.conf, the daemons' state, spool,
pid and log files. Nothing is written under /etc or /run, and nothing already running is touched:
the daemons listen on ports picked free now, so a Slurm of the machine's own keeps running beside it,
and so do the clusters of the other test workers. Each cluster numbers its jobs from its own
`first_job` (a job id names one job on this machine), so a lost node kills its own jobs only.

The cluster: one node named `localhost` (submitit's torchrun rendezvous resolves it), every CPU
and most of the memory of this machine, one partition `cpu`, no accounting daemon (`sacct` says
"accounting storage is disabled", as on a cluster whose admins never set up slurmdbd), process
tracking through /proc (no cgroups in a container), a KillWait of 10 s (30 s is Slurm's default;
the tests wait through it on every requeue) and finished jobs kept for 300 s (Slurm's default
MinJobAge). Root runs all of it: slurmd must, to start jobs as their user."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd")
JOBS_PER_CLUSTER = 100_000  # the ids a cluster numbers its jobs with, from its first_job (tests/test_slurm.py)
NODE = "localhost"
# The jobs run at the same nice as the tests. Where the kernel groups processes by session
# (sched_autogroup_enabled=1, as on CI's machines), slurmstepd starts each job in a session of its own,
# and that session's group shares the CPU equally with the test session's whatever the nice inside it
# (/proc/PID/autogroup): slurmd at nice -5 changed nothing. With three lanes' jobs at once, each job has
# a quarter of the 2 cores, and a test that needs its job to finish something within a grace (keep the
# split it was extracting within USR2's 60 s) can miss it.


def missing() -> str | None:
    """Why a Slurm cannot be started here, or None."""
    for program in (*DAEMONS, "sbatch", "squeue", "scontrol", "srun", "mungekey"):
        if shutil.which(program) is None and not Path("/usr/sbin", program).exists():
            return f"{program} not found (Debian's slurm-wlm and munge packages)"
    if os.geteuid() != 0:
        return "not root: slurmd starts jobs as their user, and munged and slurmd must run as root"
    return None


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _program(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


def config(folder: Path, ctld_port: int, slurmd_port: int, first_job: int = 1) -> str:
    cpus = os.cpu_count() or 1
    memory_mb = int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20 * 0.9)
    return "\n".join(
        [
            "ClusterName=vitbench-test",
            f"SlurmctldHost={NODE}(127.0.0.1)",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"SlurmctldPort={ctld_port}",
            f"SlurmdPort={slurmd_port}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={folder / 'munge.socket'}",
            f"StateSaveLocation={folder / 'state'}",
            f"SlurmdSpoolDir={folder / 'spool'}",
            f"SlurmctldPidFile={folder / 'slurmctld.pid'}",
            f"SlurmdPidFile={folder / 'slurmd.pid'}",
            f"SlurmctldLogFile={folder / 'slurmctld.log'}",
            f"SlurmdLogFile={folder / 'slurmd.log'}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "MpiDefault=none",
            "SwitchType=switch/none",
            "SchedulerType=sched/backfill",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core_Memory",
            "AccountingStorageType=accounting_storage/none",
            # memory enforced by polling /proc each second (no cgroups here): a job over its --mem is
            # killed, and Slurm says OUT_OF_MEMORY
            "JobAcctGatherType=jobacct_gather/linux",
            "JobAcctGatherFrequency=task=1",
            "JobAcctGatherParams=OverMemoryKill",
            "JobCompType=jobcomp/none",
            "ReturnToService=2",
            "KillWait=10",
            # a node whose slurmd stops answering is DOWN after 10 s (300 s by default): a lost node's test
            "SlurmdTimeout=10",
            "MinJobAge=300",
            "SchedulerParameters=batch_sched_delay=0",
            f"FirstJobId={first_job}",
            f"NodeName={NODE} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={memory_mb} State=UNKNOWN",
            "PartitionName=cpu Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
            "",
        ]
    )


def start(folder: Path, timeout: float = 60, first_job: int = 1) -> dict[str, str]:
    """Start munged, slurmctld and slurmd with a config written into `folder`, its jobs numbered from
    `first_job`; the environment a client needs (SLURM_CONF). Raises RuntimeError saying which
    daemon did not come up."""
    folder = folder.resolve()
    for sub in ("state", "spool"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    os.chmod(folder, 0o755)
    key = folder / "munge.key"
    if not key.exists():
        subprocess.run([_program("mungekey"), "--create", f"--keyfile={key}"], check=True, capture_output=True)
    os.chmod(key, 0o600)
    ctld_port, slurmd_port = _free_ports(2)
    conf = folder / "slurm.conf"
    conf.write_text(config(folder, ctld_port, slurmd_port, first_job))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    subprocess.run(
        [
            _program("munged"),
            "--force",
            f"--socket={folder / 'munge.socket'}",
            f"--key-file={key}",
            f"--pid-file={folder / 'munged.pid'}",
            f"--log-file={folder / 'munged.log'}",
            f"--seed-file={folder / 'munged.seed'}",
        ],
        check=True,
        capture_output=True,
    )
    # -i: a fresh controller (no state from a previous start of this folder)
    subprocess.run([_program("slurmctld"), "-f", str(conf), "-i"], check=True, capture_output=True, env=env)
    subprocess.run([_program("slurmd"), "-f", str(conf), "-N", NODE], check=True, capture_output=True, env=env)
    deadline = time.monotonic() + timeout
    state = ""
    while time.monotonic() < deadline:
        probe = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], capture_output=True, text=True, env=env, check=False)
        state = probe.stdout.strip() or probe.stderr.strip()
        if probe.returncode == 0 and state.rstrip("*") in {"idle", "mixed", "allocated"}:
            return {"SLURM_CONF": str(conf)}
        time.sleep(0.5)
    stop(folder)
    raise RuntimeError(f"the Slurm node did not come up within {timeout:.0f} s (sinfo: {state!r}); see {folder}/*.log")


def start_slurmd(folder: Path) -> None:
    """slurmd again (a lost node coming back): it registers, and the node returns to service."""
    conf = folder / "slurm.conf"
    env = {**os.environ, "SLURM_CONF": str(conf)}
    subprocess.run([_program("slurmd"), "-f", str(conf), "-N", NODE], check=True, capture_output=True, env=env)


def lose_node(folder: Path) -> None:
    """The node lost as a power cut loses it: every process of every job on it and its slurmd killed
    at once (SIGKILL: nothing runs a handler), so that slurmctld hears no more from it. Only this
    cluster's: another test worker's cluster on the same machine runs on.

    Every process under the jobs' slurmstepd goes, the batch script's `srun` included: `scontrol
    listpids` missed it once, and that srun, alive after the requeue, cancelled the job's next attempt
    (the same step id, 100002.0) 30 s into it. Each is stopped first (a stopped process starts no other),
    then all are killed."""
    env = {**os.environ, "SLURM_CONF": str(folder / "slurm.conf")}
    jobs = subprocess.run(["squeue", "-h", "-t", "running", "-o", "%A"], capture_output=True, text=True, env=env)
    _kill_jobs(lambda job: job in set(jobs.stdout.split()), also={int((folder / "slurmd.pid").read_text().split()[0])})


def _kill_jobs(ours: Callable[[str], bool], also: frozenset[int] | set[int] = frozenset()) -> None:
    """SIGKILL the slurmstepd of every job id `ours` accepts, every process under them, and `also`:
    each stopped first (a stopped process starts no other), until no new one appears; then all killed."""
    doomed: set[int] = set()
    while True:
        found = {pid for pid in _job_processes(ours) if pid not in doomed}
        if not found:
            break
        for pid in found:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        doomed |= found
    for pid in doomed | set(also):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _job_processes(ours: Callable[[str], bool]) -> set[int]:
    """The slurmstepd of the jobs `ours` accepts (`slurmstepd: [JOB.batch]`, `[JOB.0]`) and every
    process under them."""
    parents: dict[int, int] = {}
    roots: set[int] = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            parents[int(proc.name)] = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if (proc / "comm").read_text().strip() == "slurmstepd":
                step = (proc / "cmdline").read_text().replace("\0", " ")
                job = step.partition("[")[2].partition(".")[0]
                if job and ours(job):
                    roots.add(int(proc.name))
        except (OSError, IndexError, ValueError):
            continue
    found = set(roots)
    grew = True
    while grew:
        below = {pid for pid, parent in parents.items() if parent in found and pid not in found}
        found |= below
        grew = bool(below)
    return found


def stop(folder: Path) -> None:
    """End every job of this cluster, then stop the daemons this module started in `folder` (by their
    pid files), slurmd first. A job's slurmstepd outlives its slurmd: a job still running when a test
    session ended ran on beside the next phase (CI's paced tests, alone, measured a dry run's pace while
    "other work used 28 % of the CPUs", and its next run quiet, 138 s against 90 s)."""
    first = _first_job(folder)
    if first is not None:  # this cluster's ids only: another worker's cluster runs on
        _kill_jobs(lambda job: job.isdigit() and first <= int(job) < first + JOBS_PER_CLUSTER)
    for name in reversed(DAEMONS):
        pid_file = folder / f"{name}.pid"
        try:
            pid = int(pid_file.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            continue
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and _alive(pid):
            time.sleep(0.1)
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)


def _first_job(folder: Path) -> int | None:
    """The FirstJobId of the cluster in `folder`, from its slurm.conf; None where there is none."""
    try:
        lines = (folder / "slurm.conf").read_text().splitlines()
    except OSError:
        return None
    return next((int(line.split("=", 1)[1]) for line in lines if line.startswith("FirstJobId=")), None)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie of ours is gone too
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (OSError, IndexError):
        return True


if __name__ == "__main__":
    what, where = sys.argv[1], Path(sys.argv[2])
    if what == "start":
        for name, value in start(where).items():
            print(f"export {name}={value}")
    else:
        stop(where)

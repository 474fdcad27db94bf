"""Developer sessions. `nox -s tests` is what CI runs (.ci/run)."""

import os
import subprocess
import sys
from pathlib import Path

import nox

nox.options.sessions = ["tests", "lint", "typing"]
# torch/torchvision pins: they resolve quickly from the mirror; an unpinned torch pulls GBs of CUDA wheels
INSTALL = ["-c", ".ci/constraints.txt", "-e", ".[dev]"]
# the tests also run the real TFDS reader (the optional `tfds` extra), the Hugging Face, WebDataset and
# object-store readers (`hf`, `wds`, `remote`) and the W&B and MLflow trackers (W&B offline, MLflow's
# local file store), so CI skips nothing
TEST_INSTALL = ["-c", ".ci/constraints.txt", "-e", ".[dev,tfds,hf,wds,remote,wandb,mlflow]"]
SOURCES = ["vitbench", "plugins", "tests", "benchmarks", "noxfile.py"]


@nox.session
def tests(session: nox.Session) -> None:
    session.install(*TEST_INSTALL)
    # Two workers (tests/conftest.py groups the files that share a costly fixture): many tests wait on
    # subprocesses they start, so one process leaves a core idle. OpenMP threads that wait sleep
    # instead of spinning on the core the other worker needs; it changes no number (the thread count
    # stays the same).
    parallel = ["-n", str(min(4, os.cpu_count() or 1)), "--no-loadscope-reorder"]
    # what a test keeps for a person to look at (the report's screenshot in Chromium): .ci/artifacts
    artefacts = os.environ.get("VITBENCH_TEST_ARTIFACTS", str(Path(__file__).parent / ".ci" / "artifacts"))
    env = {"OMP_WAIT_POLICY": "PASSIVE", "VITBENCH_TEST_ARTIFACTS": artefacts}
    # the benchmarks run once each (no timing, no ratio: they must keep working), on the same two
    # workers as the tests (one after the other, they left a core idle for a minute and a half)
    suite = [*parallel, "tests", "benchmarks", "--benchmark-disable"]
    # the slowest tests, named at the end: what to look at first when CI nears its 15 minutes
    if session.posargs:
        session.run("pytest", "-q", "-ra", "--durations=15", *session.posargs, env=env)
        return
    session.run("pytest", "-q", "-ra", "--durations=15", "-m", "not alone", *suite, env=env)
    # then the tests that compare paces they measure, one at a time: beside the other worker's test a
    # dry run's micro-benchmark is measured busy and again by the next (two dry runs of one plan priced
    # 102 s and 114 s on CI, their model passes 64 s and 1.7 min here)
    session.run("pytest", "-q", "-ra", "-m", "alone", "tests", "benchmarks", "--benchmark-disable", env=env)


@nox.session
def slurm(session: nox.Session) -> None:
    """The cluster tests (tests/test_slurm.py) against a real Slurm: Debian's slurm-wlm and munge,
    installed with apt-get where it can (root, or sudo without a password), started for one node on
    127.0.0.1 with a config this session writes into a temporary folder (tests/slurm_cluster.py),
    and stopped again by the pids it started. Where it cannot, those tests skip and say why."""
    import tempfile

    sys.path.insert(0, str(Path(__file__).parent / "tests"))
    import slurm_cluster

    session.install(*TEST_INSTALL)
    why = slurm_cluster.missing()
    if why is not None and _apt_install(session, ["slurm-wlm", "munge"]):
        why = slurm_cluster.missing()
    folder = Path(tempfile.mkdtemp(prefix="vitbench-slurm-"))
    env = {"OMP_WAIT_POLICY": "PASSIVE"}
    try:
        if why is None:
            try:
                env |= slurm_cluster.start(folder)
            except (RuntimeError, OSError, subprocess.CalledProcessError) as e:
                why = f"the Slurm daemons did not start: {e}"
        env["VITBENCH_TEST_SLURM"] = "" if why is None else f"skip: {why}"
        # the jobs' workers share the node's CPUs with the test processes: one test at a time
        session.run("pytest", "-q", "-ra", "--durations=10", *(session.posargs or ["tests/test_slurm.py"]), env=env)
    finally:
        slurm_cluster.stop(folder)


def _apt_install(session: nox.Session, packages: list[str]) -> bool:
    """Debian's `packages`, where apt-get can install them here (as root, or with sudo -n)."""
    import shutil

    if shutil.which("apt-get") is None:
        return False
    root = [] if os.geteuid() == 0 else ["sudo", "-n"]
    quiet = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    try:
        subprocess.run([*root, "apt-get", "update", "-qq"], check=True, capture_output=True, env=quiet)
        subprocess.run([*root, "apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages], check=True,
                       capture_output=True, env=quiet)  # fmt: skip
    except (OSError, subprocess.CalledProcessError) as e:
        session.log(f"apt-get could not install {' '.join(packages)}: {e}")
        return False
    return True


@nox.session
def lint(session: nox.Session) -> None:
    """ruff, and the architecture's import contract (pyproject's [tool.importlinter]): layers point
    down, no cycles. import-linter reads the source only, so vitbench need not be installed."""
    session.install("ruff", "import-linter>=2.1")
    session.run("ruff", "check", *SOURCES)
    session.run("lint-imports", "--no-cache", env={"PYTHONPATH": "."})


@nox.session
def typing(session: nox.Session) -> None:
    session.install(*INSTALL)
    session.run("mypy", "vitbench")


@nox.session
def bench(session: nox.Session) -> None:
    """Throughput of vitbench's loops against bare baselines on this machine (pytest-benchmark)."""
    session.install(*INSTALL)
    session.run(
        "pytest",
        "benchmarks",
        "-q",
        "--benchmark-only",
        "--benchmark-columns=mean,stddev,ops,rounds",
        "-p",
        "no:cacheprovider",
        *session.posargs,
    )


@nox.session(venv_backend="none")
def gpu(session: nox.Session) -> None:
    """Every GPU figure of docs/performance.md, re-measured into a folder: `nox -s gpu -- OUT
    [--timm-benchmark benchmark.py]` (benchmarks/gpu.py --help: the steps). It runs in the Python
    nox runs under, where vitbench is installed with the GPU machine's own torch: a lent machine
    has no package index to build a virtualenv from."""
    session.run("python", "benchmarks/gpu.py", *(session.posargs or ["gpu-results"]))


@nox.session(venv_backend="none")
def conformance(session: nox.Session) -> None:
    """The cross-device conformance suite (tests/conformance.py): eval, few-shot, k-NN and the linear
    probe through every input pipeline and precision this machine offers, each image's prediction
    against the CPU reference, a Markdown table printed and written: `nox -s conformance -- OUT
    [--device cuda]`. Like `gpu`, it runs in the Python nox runs under (a GPU machine has no package
    index); CI checks its CPU half in `nox -s tests` (tests/test_conformance.py)."""
    device = [] if any(a.startswith("--device") for a in session.posargs) else ["--device", _default_device()]
    session.run("python", "tests/conformance.py", *(session.posargs or ["conformance-results"]), *device)


def _default_device() -> str:
    try:
        import torch
    except ImportError:
        return "cpu"
    return "cuda" if torch.cuda.is_available() else "cpu"


@nox.session
def demo(session: nox.Session) -> None:
    """The embedded default, end to end: pre-training on digits, few-shot beside random init, stored and tabled."""
    session.install(*INSTALL)
    session.run("vitbench", "run", *session.posargs)
    session.run("vitbench", "table", "--view", "pretrain", "--results", "results/demo")  # the demo keeps its own folder

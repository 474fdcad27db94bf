"""Developer sessions. `nox -s tests` is what CI runs (.ci/run)."""

import contextlib
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
# uv, unlike pip, installs no bytecode unless asked. Where PYTHONDONTWRITEBYTECODE is set (CI's machines
# set it) no process then writes any either, and each one that imports torch and timm compiled them
# from source again: 12-13 s of a core against 4-5 s (measured here), in every test worker, test
# subprocess and Slurm job
COMPILED = {"UV_COMPILE_BYTECODE": "1"}


# uv builds a session's environment where it is installed (.ci/run installs it beside nox: 109 s against
# pip's 3 min for the test extras), pip elsewhere; the same pins either way
@nox.session(venv_backend="uv|virtualenv")
def tests(session: nox.Session) -> None:
    """Every test, as CI runs it: the suite and the benchmarks (run once each, untimed) on pytest-xdist
    workers, the real-Slurm tests among them in lanes of their own (each worker that takes one starts
    a Slurm of its own); then the tests that compare paces they measure, alone.
    `nox -s tests -- ARGS` runs pytest ARGS instead (`-- tests/test_cli.py`, `-- tests/test_slurm.py`)."""
    with _phase(session, "install the test environment"):
        # pip too: uv makes an environment without it, and the plugin and packaging tests pip-install wheels
        session.install("pip", *TEST_INSTALL, env=COMPILED)
    with _phase(session, "find or install Slurm"):
        slurm = _slurm_for_the_tests(session)
    # what a test keeps for a person to look at (the report's screenshot in Chromium): .ci/artifacts
    artefacts = os.environ.get("VITBENCH_TEST_ARTIFACTS", str(Path(__file__).parent / ".ci" / "artifacts"))
    # OpenMP threads that wait sleep instead of spinning on the core another worker needs; it changes no
    # number (the thread count stays the same)
    env = {"OMP_WAIT_POLICY": "PASSIVE", "VITBENCH_TEST_ARTIFACTS": artefacts, "VITBENCH_TEST_SLURM": slurm}
    if session.posargs:
        session.run("pytest", "-q", "-ra", "--durations=15", *session.posargs, env=env)
        return
    # Workers: one more than the cores, since many tests wait on processes they start and the Slurm
    # lanes on their jobs (tests/conftest.py: the units of work)
    workers = ["-n", str(WORKERS), "--no-loadscope-reorder"]
    # the slowest tests named at the end, and each file's total (tests/conftest.py): what to look at
    # first when CI nears its 15 minutes
    with _phase(session, "pytest: the suite, the benchmarks and the Slurm lanes"):
        session.run("pytest", "-q", "-ra", "--durations=25", "-m", "not alone", *workers, "tests", "benchmarks",
                    "--benchmark-disable", env=env)  # fmt: skip
    # then the tests that compare paces they measure, one at a time: beside the other worker's test a
    # dry run's micro-benchmark is measured busy and again by the next (two dry runs of one plan priced
    # 102 s and 114 s on CI, their model passes 64 s and 1.7 min here)
    with _phase(session, "pytest: the paced tests, alone"):
        session.run("pytest", "-q", "-ra", "-m", "alone", "tests", "benchmarks", "--benchmark-disable", env=env)


@nox.session(venv_backend="uv|virtualenv")
def fast(session: nox.Session) -> None:
    """The edit-test loop: the tests of the core path (plan -> protocol -> store -> table), under two
    minutes on 2 cores. CI still runs everything (`nox -s tests`)."""
    session.install("pip", *TEST_INSTALL, env=COMPILED)
    env = {"OMP_WAIT_POLICY": "PASSIVE"}
    session.run("pytest", "-q", "-n", "2", *FAST_LANE, *session.posargs, env=env)


# the fast lane's files: the real path, in the test process, on digits at 32 px (tests/test_one_number.py,
# the same number in every view, runs DeiT-Ti at 224 px: CI's)
FAST_LANE = [
    "tests/test_config.py",  # options, config files, the plan they make
    "tests/test_validation.py",  # the one-line errors of bad input
    "tests/test_fewshot.py",  # the few-shot protocol, run
    "tests/test_knn.py",
    "tests/test_store.py",  # shards, the database, their merge
    "tests/test_legacy_store.py",
    "tests/test_predictions.py",
    "tests/test_tables.py",  # the views of what is stored
    "tests/test_stats.py",
    "tests/test_api.py",  # the same path as a library call
]
# three: the Slurm lanes' jobs and the tests' own processes fill what a waiting worker leaves of 2 cores.
# Five (a worker per lane beside two) loaded 2 cores 7-fold and every test ran 2-4x slower: 49.5 min
WORKERS = 3


def _slurm_for_the_tests(session: nox.Session) -> str:
    """VITBENCH_TEST_SLURM for tests/test_slurm.py: "" where Slurm's daemons are here, or installed now
    with apt-get (Debian's slurm-wlm and munge, as root or with sudo -n), and this is root (each worker
    starts a single-node Slurm of its own, tests/slurm_cluster.py); else "skip: why"."""
    sys.path.insert(0, str(Path(__file__).parent / "tests"))
    import slurm_cluster

    _wait_for_the_ci_packages(session)
    why = slurm_cluster.missing()
    if why is not None and _apt_install(session, ["slurm-wlm", "munge"]):
        why = slurm_cluster.missing()
    return "" if why is None else f"skip: {why}"


def _wait_for_the_ci_packages(session: nox.Session) -> None:
    """.ci/run installs Debian's packages (Chromium, Slurm) in the background while the test environment
    is built; it names a file that holds apt-get's exit status once it is done."""
    import time

    done = os.environ.get("VITBENCH_CI_APT_DONE")
    if not done:
        return
    deadline = time.monotonic() + 900
    while not Path(done).exists() and time.monotonic() < deadline:
        time.sleep(1)
    if Path(done).exists():
        session.log(f"Debian's packages for the tests: apt-get ended {Path(done).read_text().strip()}")
    else:
        session.log("Debian's packages for the tests: apt-get still running after 15 min")


@contextlib.contextmanager
def _phase(session: nox.Session, name: str):
    """Time one phase of the session: logged, and appended to VITBENCH_PHASE_LOG (.ci/run prints it)."""
    import time

    start = time.monotonic()
    try:
        yield
    finally:
        line = f"{name}: {time.monotonic() - start:.0f} s"
        session.log(line)
        if os.environ.get("VITBENCH_PHASE_LOG"):
            with open(os.environ["VITBENCH_PHASE_LOG"], "a") as log:
                log.write(line + "\n")


def _apt_install(session: nox.Session, packages: list[str]) -> bool:
    """Debian's `packages`, where apt-get can install them here (as root, or with sudo -n)."""
    import shutil

    if shutil.which("apt-get") is None:
        return False
    root = [] if os.geteuid() == 0 else ["sudo", "-n"]
    quiet = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    try:
        subprocess.run([*root, "apt-get", "update", "-qq"], check=True, capture_output=True, env=quiet)
        # another apt-get (.ci/run's, or a person's) may hold dpkg's lock: wait for it
        subprocess.run([*root, "apt-get", "install", "-y", "-qq", "--no-install-recommends", "-o",
                        "DPkg::Lock::Timeout=600", *packages], check=True, capture_output=True, env=quiet)  # fmt: skip
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

"""Shared fixtures: small real data written in the datasets' own on-disk formats, and the CLI."""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import pickle
import resource
import subprocess
import sys
import tempfile
import time
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

# what vitbench keeps per machine (downloads, FLOP counts) goes to a folder of the test session's,
# shared by the processes the tests start, never to the user's ~/.cache
os.environ.setdefault("VITBENCH_CACHE", tempfile.mkdtemp(prefix="vitbench-test-cache-"))

# submitit, once imported, logs to the sys.stdout of that moment: under pytest a capture that a
# later test finds closed ("I/O operation on closed file"). vitbench's own log lines say what ran.
os.environ.setdefault("SUBMITIT_LOG_LEVEL", "NOCONFIG")

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
DEIT_WEIGHTS = SHARED_DATA / "weights" / "deit_tiny_patch16_224.safetensors"
needs_shared_data = pytest.mark.skipif(not DEIT_WEIGHTS.exists(), reason="../shared/data is not present")

# `nox -s tests` runs the suite on xdist workers. A test file is one unit of work, except that the
# files sharing a costly session fixture are one unit together (the fixture is built once, on one
# worker), and that the real-Slurm tests are split in lanes, each a unit: a worker that takes one
# starts a Slurm of its own (tests/test_slurm.py). The longest units are handed out first (FIRST).
SHARED_FIXTURE_GROUPS = {
    "test_cli.py": "deit-cifar10",  # deit_cifar10_linear
    "test_linear_probe.py": "deit-cifar10",
    "test_data_cli.py": "deit-imagenet",  # deit_imagenet_eval
    "test_npz.py": "deit-imagenet",
    "test_robustness.py": "deit-imagenet",
    "test_conformance.py": "deit-imagenet",
}
# the Slurm tests' lanes, about equally long, each of three tests or more (a worker whose unit has two
# tests or fewer left is handed the next unit, queued behind them); a test not named here runs in lane 0.
# Lanes 0 and 1 each hold fine-tunes that share a `finetune_alone` (built once per worker). Their times
# in CI (3 workers, 2026-12-02, before the time-limit and extraction tests were cut down): lane 0 649 s,
# lane 1 450 s, lane 2 474 s
SLURM_LANES = {
    "test_a_cancelled_running_job_ends_the_wait_in_one_line_and_the_rerun_resumes_it": 1,
    "test_a_job_killed_outside_slurm_ends_without_a_result_and_says_so": 1,
    "test_a_run_still_queued_in_slurm_is_never_run_twice": 1,
    "test_a_job_over_its_memory_is_said_as_slurm_killed_it": 1,
    "test_on_a_terminal_the_wait_is_one_line_that_updates": 2,
    "test_a_cancelled_pending_job_and_a_failing_job_end_the_wait_each_in_one_line": 2,
    "test_a_few_shot_plan_runs_as_jobs_with_what_it_needs_and_says_where_it_is": 2,
    "test_a_pre_training_preempted_with_usr2_resumes_and_makes_the_same_weights": 2,
    "test_a_few_shot_plan_preempted_while_extracting_keeps_its_features": 2,
    "test_data_parallel_under_slurm_follows_the_single_process_run": 2,
}
# the longest units, handed out first (every other unit keeps the order it is collected in). Handing
# out the next nine longest first too (deit-imagenet, the pre-training and fine-tuning CLI tests,
# rounds 6 and 7, ...) was tried on 2026-12-02: that run took 35.2 min against 31.1 before
# (its cores 84 % busy, before 95 %), so the order stays as it was
FIRST = (
    "tests/test_slurm.py::lane0",
    "tests/test_readme.py",
    "tests/test_docs_walk.py",
    "tests/test_slurm.py::lane2",
    "tests/test_slurm.py::lane1",
)


def pytest_collection_modifyitems(config, items) -> None:
    def first(item) -> int:
        unit = unit_of_work(item.nodeid)
        return FIRST.index(unit) if unit in FIRST else len(FIRST)

    items.sort(key=first)  # stable: the rest keep their order


def unit_of_work(nodeid: str) -> str:
    """The unit of work a test belongs to (see above): its file, its files' group, or its Slurm lane."""
    file, _, test = nodeid.partition("::")
    name = Path(file).name
    if name == "test_slurm.py":
        return f"{file}::lane{SLURM_LANES.get(test.split('[')[0], 0)}"
    return SHARED_FIXTURE_GROUPS.get(name, file)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """xdist's per-file scheduling with the groups above. (Its own `xdist_group` marks renamed the
    test ids, which pytest 9.2 no longer lets a plugin do: they would group nothing.)"""
    from xdist.scheduler import LoadScopeScheduling

    class FileGroups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit_of_work(nodeid)

    return FileGroups(config, log)


_PHASE_CPU = pytest.StashKey[float]()


def _cpu_seconds() -> float:
    """CPU time of this process (every thread) and of its children that have been waited for: what a
    test costs the machine, beside its wall time (the jobs of the Slurm daemons are not its children)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    yield from _timed_phase(item)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    yield from _timed_phase(item)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item):
    yield from _timed_phase(item)


def _timed_phase(item):
    began = _cpu_seconds()
    yield
    item.stash[_PHASE_CPU] = _cpu_seconds() - began


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Each phase's report carries its CPU seconds (to the xdist controller, which sums them)."""
    outcome = yield
    outcome.get_result().user_properties.append(("cpu_seconds", item.stash.get(_PHASE_CPU, 0.0)))


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    """The wall time and the CPU time each unit of work took, summed over its tests (setup, call and
    teardown), the longest first: where CI's minutes go, printed by every run of more than a few tests.
    On 2 cores CI is as fast as its CPU seconds allow: the CPU column is the one to cut."""
    took: dict[str, float] = {}
    cpu: dict[str, float] = {}
    for reports in terminalreporter.stats.values():
        for report in reports:
            if getattr(report, "when", None) in ("setup", "call", "teardown") and hasattr(report, "duration"):
                unit = unit_of_work(report.nodeid)
                took[unit] = took.get(unit, 0.0) + report.duration
                cpu[unit] = cpu.get(unit, 0.0) + sum(v for k, v in report.user_properties if k == "cpu_seconds")
    if len(took) < 5:
        return
    total = sum(took.values())
    terminalreporter.write_sep("=", f"time by unit of work: {total / 60:.1f} min in all, the 15 longest")
    for unit, seconds in sorted(took.items(), key=lambda kv: -kv[1])[:15]:
        terminalreporter.write_line(f"{seconds:8.1f}s  {unit}")
    spent = sum(cpu.values()) / 60  # the tests' processes and the children they waited for; not Slurm's jobs
    terminalreporter.write_sep("=", f"CPU by unit of work: {spent:.1f} CPU-min in all, the 25 costliest")
    for unit, seconds in sorted(cpu.items(), key=lambda kv: -kv[1])[:25]:
        terminalreporter.write_line(f"{seconds:8.1f}s  {unit}")


QUIET_BELOW = 0.1  # the share of the CPUs other work may use while an `alone` test starts
QUIET_WAIT = 60.0  # seconds an `alone` test waits at most for it


@pytest.fixture(autouse=True)
def a_quiet_machine_for_the_paced_tests(request):
    """An `alone` test (it compares paces it measures) starts once other work has left the machine, up
    to a minute: what the phase before it started may still be ending (CI: a Slurm job that outlived its
    test cluster used 28 % of the CPUs while a dry run measured its pace, 138 s, and the next, quiet, 90 s)."""
    if request.node.get_closest_marker("alone") is None:
        yield
        return
    from vitbench.execution.machine_load import others_busy

    deadline = time.monotonic() + QUIET_WAIT
    busy = others_busy(1.0)
    while busy is not None and busy > QUIET_BELOW and time.monotonic() < deadline:
        busy = others_busy(1.0)
    if busy is not None and busy > QUIET_BELOW:
        said = f"other work still used {busy:.0%} of the CPUs after {QUIET_WAIT:.0f} s: paces may be slow"
        warnings.warn(said, stacklevel=2)
    yield


@pytest.fixture(scope="session")
def tf():
    """TensorFlow, imported here (not when tests are collected: absl then adds a handler to the
    root logger, which would double every log line of every later test and outlive their stderr)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    root = logging.getLogger()
    before = list(root.handlers)
    try:
        return pytest.importorskip("tensorflow", reason="TensorFlow (the tfds extra) is the reference")
    finally:
        for handler in [h for h in root.handlers if h not in before]:
            root.removeHandler(handler)


def write_cifar_batch(path: Path, n: int, num_classes: int, label_key: str, seed: int = 0) -> None:
    """One batch in the original CIFAR pickle layout: N x 3072 uint8 rows (CHW), labels list."""
    rng = np.random.default_rng(seed)
    labels = [int(i % num_classes) for i in range(n)]
    # class-dependent colour so a linear probe has something to find
    data = rng.integers(0, 60, size=(n, 3072), dtype=np.uint8)
    for i, y in enumerate(labels):
        data[i, (y % 3) * 1024 : (y % 3 + 1) * 1024] += np.uint8(40 + 15 * (y % 10))
    batch = {
        "batch_label": "testing batch",
        label_key: labels,
        "data": data,
        "filenames": [f"img_{i}.png" for i in range(n)],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        pickle.dump(batch, f, protocol=2)


def write_image(path: Path, mode: str = "RGB", size=(40, 30), seed: int = 0) -> None:
    """A real image file; greyscale, CMYK and palette modes exercise the RGB conversion."""
    rng = np.random.default_rng(seed)
    img = Image.fromarray(rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8))
    if mode != "RGB":
        img = img.convert(mode)
    path.parent.mkdir(parents=True, exist_ok=True)
    img.save(path, format="JPEG" if mode in ("RGB", "L", "CMYK") else "PNG")


@pytest.fixture
def cifar10_dir(tmp_path: Path) -> Path:
    root = tmp_path / "data"
    write_cifar_batch(root / "cifar-10-batches-py" / "data_batch_1", 60, 10, "labels", seed=1)
    write_cifar_batch(root / "cifar-10-batches-py" / "test_batch", 40, 10, "labels", seed=2)
    return root


@pytest.fixture
def imagenet_dir(tmp_path: Path) -> Path:
    """val/<synset>/ILSVRC2012_val_*.JPEG for two real synsets, as JPEG files."""
    root = tmp_path / "data"
    rng = np.random.default_rng(0)
    for synset, n in [("n01440764", 3), ("n15075141", 2)]:  # first and last of the canonical order
        folder = root / "imagenet" / "val" / synset
        folder.mkdir(parents=True)
        for i in range(n):
            Image.fromarray(rng.integers(0, 255, (40, 48, 3), dtype=np.uint8)).save(
                folder / f"ILSVRC2012_val_{i:08d}.JPEG"
            )
    return root


@pytest.fixture
def results(tmp_path: Path) -> Path:
    """A results folder that does not exist yet (vitbench creates it)."""
    return tmp_path / "results"


@pytest.fixture(scope="session")
def one_run(tmp_path_factory) -> Path:
    """A results folder holding one real few-shot run (shard, database, feature cache), made once:
    tests copy it (never change it) to damage or extend."""
    import vitbench

    results = tmp_path_factory.mktemp("one-run") / "results"
    vitbench.run(model="vit-ti/16", weights="random", datasets="digits", res=32, workers=0, shots=(1,), seeds=(0,),
                 results=results)  # fmt: skip
    return results


def _deit_run(tmp_path_factory, name: str, **options) -> Path:
    """A results folder holding one DeiT-Ti run on shared data, made once per session."""
    if not DEIT_WEIGHTS.exists():
        pytest.skip("../shared/data is not present")
    import vitbench

    results = tmp_path_factory.mktemp(name) / "results"
    vitbench.run(model="deit-ti/16", weights=str(DEIT_WEIGHTS), data_dir=SHARED_DATA, results=results, **options)
    return results


def first_of_shared_cifar10(root: Path, n_train: int, n_test: int) -> Path:
    """The shared CIFAR-10 subset cut to its first `n_train` train and `n_test` test images, in the
    same pickle layout (real images, fewer of them: DeiT-Ti's extraction at 224 px is what costs)."""
    from conformance import cut_cifar10

    return cut_cifar10(SHARED_DATA / "cifar-10-batches-py", root, n_train, n_test)


@pytest.fixture(scope="session")
def deit_cifar10_linear(tmp_path_factory) -> Path:
    """DeiT-Ti's linear probe of the first 600 train and 500 test images of the shared CIFAR-10
    subset (in `<fixture>/../data`), and with it the features of every one of them in the feature
    cache: extracted once (the costliest step of several tests), copied by the tests that read
    them, never changed."""
    if not DEIT_WEIGHTS.exists():
        pytest.skip("../shared/data is not present")
    import vitbench

    folder = tmp_path_factory.mktemp("deit-cifar10")
    data = first_of_shared_cifar10(folder / "data", 600, 500)
    vitbench.run(model="deit-ti/16", weights=str(DEIT_WEIGHTS), datasets="cifar10", protocol="linear", workers=0,
                 data_dir=data, results=folder / "results")  # fmt: skip
    return folder / "results"


@pytest.fixture(scope="session")
def deit_imagenet_eval(tmp_path_factory) -> Path:
    """DeiT-Ti's eval on the shared ImageNet val subset (500 images at 224 px), made once and copied
    by the tests that build on it, never changed."""
    return _deit_run(tmp_path_factory, "deit-imagenet", datasets="imagenet", protocol="eval", workers=2)


@pytest.fixture
def cli(capsys, monkeypatch):
    """Run `vitbench ARGS` in-process; returns (exit code, stdout, stderr)."""
    from vitbench import cli as cli_module

    # rich wraps to the terminal width, read once when the console is made: widen both consoles
    # so that a table cell holding a long path (CI's checkout may be deep) stays on one line.
    for console in (cli_module.out, cli_module.err):
        monkeypatch.setattr(console, "width", 1000)
    monkeypatch.delenv("COLUMNS", raising=False)  # pytest-xdist sets 80 in its workers: tables would split to fit

    def run(*args: str) -> tuple[int, str, str]:
        from vitbench.cli import main

        monkeypatch.setattr(sys, "argv", ["vitbench", *map(str, args)])
        with pytest.raises(SystemExit) as exit_info:
            main()
        captured = capsys.readouterr()
        return int(exit_info.value.code or 0), captured.out, captured.err

    return run


def install_wheel(folder: Path, name: str, modules: dict[str, str], entry_points: str) -> Path:
    """Build a minimal but real wheel (a zip with dist-info and RECORD) holding `modules` and
    `entry_points`, and pip-install it into `folder/site`, as a user installs a third-party
    package; returns the site folder to put on PYTHONPATH."""
    base = name.replace("-", "_")
    dist = f"{base}-1.0.dist-info"
    files = {
        **modules,
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n",
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        f"{dist}/entry_points.txt": entry_points,
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    files[f"{dist}/RECORD"] = "\n".join(record + [f"{dist}/RECORD,,"]) + "\n"
    wheel = folder / f"{base}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for path, text in files.items():
            zf.writestr(path, text)
    target = folder / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(target), str(wheel)],
        check=True,
    )
    return target


@pytest.fixture(autouse=True, scope="session")
def _a_quiet_machine():
    """The micro-benchmark's rate is kept as the machine's pace only where other work did not hold the
    CPU when it was measured (execution/machine_load.py). Tests run two at a time on two cores, so every
    measurement here would read as busy, be said so and be measured again at each dry run: the machine
    reads as quiet, for the session's fixtures too (the README's walk), unless a test says otherwise
    (tests/test_estimate.py's busy-machine test does)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("vitbench.execution.estimate.others_while", lambda work: (work(), 0.0))
        patch.setattr("vitbench.execution.solve_price.others_while", lambda work: (work(), 0.0))  # solves alike
        yield


@pytest.fixture
def s3(monkeypatch):
    """An S3-compatible server (moto's) that the test starts on 127.0.0.1; s3fs is pointed at it the
    way a user points it at MinIO or Ceph (AWS_ENDPOINT_URL). Nothing else is contacted."""
    server_module = pytest.importorskip("moto.server")
    pytest.importorskip("s3fs")
    server = server_module.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    assert host == "127.0.0.1"
    # moto keeps its buckets in this process, across servers: an earlier test's `data` bucket (and its
    # shards) would still be there. Its own reset endpoint empties it.
    import urllib.request

    urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}/moto-api/reset", method="POST"), timeout=30)
    for name, value in {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "test",
                        "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"}.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    import s3fs

    from vitbench.datasets import store_clients

    # filesystems made before the variables were set (an earlier test's server): s3fs's and vitbench's own
    s3fs.S3FileSystem.clear_instance_cache()
    store_clients.close()
    fs = s3fs.S3FileSystem()
    fs.mkdir("data")
    yield fs
    s3fs.S3FileSystem.clear_instance_cache()
    store_clients.close()
    server.stop()

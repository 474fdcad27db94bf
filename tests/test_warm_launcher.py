"""The warm launcher's child is a `vitbench` process as a cold one is (tests/warm_launcher.py, issue 105):
on a sample of commands, the same exit codes, output and stored results, a run stopped by SIGTERM and
one killed by SIGKILL included. These tests start cold processes on purpose: they are the reference."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import warm_launcher
from warm_launcher import LAUNCHER, MODULE_COMMAND, SCRIPT

from vitbench import store

RUN = ("run", "--model", "vit-ti/16", "--weights", "random", "--dataset", "digits", "--workers", "0", "--shots", "1",
       "--seeds", "0", "--res", "32")  # fmt: skip
LONGER = (*RUN[:-1], "64")  # a run long enough to be stopped while it extracts
# what differs between two runs of one command, whichever launched it: its pace
PACE = re.compile(r"\d[\d,.]* images/s|\(\d+s\)|\d+(\.\d+)? ?s\b")


def _shown(text: str) -> list[str]:
    """What a command printed, less its pace: the measured accelerator-days and rates, and the column
    widths they set."""
    lines = [PACE.sub("", line) for line in text.splitlines() if "accelerator-days" not in line]
    return [" ".join(re.sub(r"[━┏┓┳┡┩╇┗┛┻└┘┴─]+", "", line).split()) for line in lines]


def _env() -> dict[str, str]:
    # the tests' own environment sets the OpenMP wait policy (noxfile.py); the launcher serves that
    return {**os.environ, "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE"), "COLUMNS": "200"}


def _both(args, cwd: Path, **kwargs) -> tuple[subprocess.CompletedProcess, subprocess.CompletedProcess]:
    """`args` run warm in `cwd`/warm and cold in `cwd`/cold (folders of the same depth and name length)."""
    env = _env()
    assert LAUNCHER.serves(args, env, kwargs)
    done = []
    for name, launch in (("warm", warm_launcher.run), ("cold", subprocess.run)):
        (cwd / name).mkdir(exist_ok=True)
        done.append(launch(args, capture_output=True, text=True, env=env, cwd=cwd / name, timeout=600, **kwargs))
    return done[0], done[1]


def test_help_listings_and_a_bad_option_print_the_same_and_end_alike(tmp_path):
    for args in ([*MODULE_COMMAND, "--help"], [str(SCRIPT), "ls", "models"], [str(SCRIPT), "run", "--model", "nope"],
                 [str(SCRIPT), "table", "--results", "none"]):  # fmt: skip
        warm, cold = _both(args, tmp_path)
        assert (warm.returncode, warm.stdout, warm.stderr) == (cold.returncode, cold.stdout, cold.stderr), args
    assert cold.returncode == 0 and "no results" in (cold.stdout + cold.stderr)


def test_a_run_prints_and_stores_the_same_as_a_cold_process(tmp_path):
    args = [*MODULE_COMMAND, *RUN]
    warm, cold = _both([*args, "--results", "results"], tmp_path)
    assert warm.returncode == cold.returncode == 0, warm.stderr + cold.stderr
    assert _shown(warm.stdout) == _shown(cold.stdout)
    assert _shown(warm.stderr) == _shown(cold.stderr)
    rows = [store.read_results(tmp_path / name / "results") for name in ("warm", "cold")]
    assert len(rows[0]) == 1 and rows[0]["value"].tolist() == rows[1]["value"].tolist()
    assert rows[0]["run_key"].tolist() == rows[1]["run_key"].tolist()


def _stopped(launch, results: Path, sig: int) -> tuple[int, str]:
    """Start the run, send `sig` once it extracts, and return its exit code and stderr."""
    process = launch([*MODULE_COMMAND, *LONGER, "--results", str(results)], stdout=subprocess.DEVNULL,
                     stderr=subprocess.PIPE, text=True, env=_env())  # fmt: skip
    seen = []
    for line in process.stderr:
        seen.append(line)
        if "batches (" in line:
            process.send_signal(sig)
            break
    _, rest = process.communicate(timeout=300)
    return process.returncode, "".join(seen) + (rest or "")


def test_sigterm_and_sigkill_end_a_warm_child_as_they_end_a_cold_process(tmp_path):
    (warm_code, warm_err), (cold_code, cold_err) = (
        _stopped(launch, tmp_path / name, signal.SIGTERM)
        for launch, name in ((warm_launcher.Popen, "warm"), (subprocess.Popen, "cold"))
    )
    assert warm_code == cold_code != 0
    said = [err.strip().splitlines()[-1] for err in (warm_err, cold_err)]
    assert said[0] == said[1] and said[0].startswith("interrupted: 0 of 1 runs stored")
    for name in ("warm", "cold"):
        assert len(store.read_results(tmp_path / name)) == 0  # nothing half-stored
    killed = [_stopped(launch, tmp_path / f"killed-{name}", signal.SIGKILL)[0]
              for launch, name in ((warm_launcher.Popen, "warm"), (subprocess.Popen, "cold"))]  # fmt: skip
    assert killed == [-signal.SIGKILL, -signal.SIGKILL]
    # each folder a killed run left is resumed by the next run to the same stored number
    for name in ("warm", "cold"):
        done = warm_launcher.run([*MODULE_COMMAND, *LONGER, "--results", str(tmp_path / f"killed-{name}")],
                                 capture_output=True, text=True, env=_env(), timeout=600)  # fmt: skip
        assert done.returncode == 0, done.stderr
    values = [store.read_results(tmp_path / f"killed-{name}")["value"].tolist() for name in ("warm", "cold")]
    assert values[0] == values[1] and len(values[0]) == 1


def test_a_child_has_its_own_pid_process_group_cwd_and_environment(tmp_path):
    probe = warm_launcher.Popen([str(SCRIPT), "--help"], stdout=subprocess.DEVNULL, cwd=tmp_path, env=_env(),
                                start_new_session=True)  # fmt: skip
    assert probe.pid not in (os.getpid(), LAUNCHER.server(_env()).process.pid)
    try:
        session = os.getsid(probe.pid)
        assert session == probe.pid  # start_new_session: a session (and group) of its own
        assert Path(os.readlink(f"/proc/{probe.pid}/cwd")) == tmp_path.resolve()
    except ProcessLookupError:
        pass  # ended already: its exit status still says how
    assert probe.wait(timeout=120) == 0


def test_what_the_launcher_cannot_give_runs_cold():
    env = _env()
    assert not LAUNCHER.serves([sys.executable, "-c", "pass"], env, {})  # not vitbench
    assert not LAUNCHER.serves([*MODULE_COMMAND, "--help"], env, {"preexec_fn": os.getpid})
    no_spin = {k: v for k, v in env.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    assert not LAUNCHER.serves([*MODULE_COMMAND, "--help"], no_spin, {})  # chosen as a cold command starts
    assert LAUNCHER.serves([*MODULE_COMMAND, "--help"], {**env, "PYTHONPATH": "/elsewhere"}, {"preexec_fn": None})
    # a variable the imports read is another server's (never this one's); past MOST servers, cold
    key = warm_launcher.import_time_environment
    assert key({**env, "OMP_NUM_THREADS": "7"}) != key(env) == key({**env, "PYTHONPATH": "/elsewhere"})
    full = warm_launcher.Launcher()
    full.MOST = 0
    assert not full.serves([*MODULE_COMMAND, "--help"], env, {})

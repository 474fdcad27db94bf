"""How long torch's OpenMP threads spin (vitbench/host/cpu_waiting.py): chosen for the machine as a process
starts, a short spin where other processes are runnable; a wait policy or spin count the user set
holds. The speed it buys is measured in benchmarks/test_busy_machine.py."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from vitbench.host import cpu_waiting


@pytest.mark.parametrize("busy, spin", [(False, cpu_waiting.QUIET), (True, cpu_waiting.SHORT)])
def test_the_spin_follows_the_machine(monkeypatch, busy, spin):
    for name in cpu_waiting.USER_SET:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(cpu_waiting, "busy", lambda: busy)
    cpu_waiting.choose()
    assert os.environ["GOMP_SPINCOUNT"] == str(spin)


@pytest.mark.parametrize("name, value", [("OMP_WAIT_POLICY", "PASSIVE"), ("GOMP_SPINCOUNT", "5")])
def test_a_setting_of_the_users_holds(monkeypatch, name, value):
    for other in cpu_waiting.USER_SET:
        monkeypatch.delenv(other, raising=False)
    monkeypatch.setenv(name, value)
    monkeypatch.setattr(cpu_waiting, "busy", lambda: True)
    cpu_waiting.choose()
    assert os.environ[name] == value and ("GOMP_SPINCOUNT" not in os.environ or name == "GOMP_SPINCOUNT")


def test_busy_reads_the_runnable_processes_now():
    """Beside spinning processes (half this machine's CPUs' worth, and one), the count sees them at once."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    spinning = [subprocess.Popen([sys.executable, "-c", "while True:\n    pass"]) for _ in range(cpus // 2 + 1)]
    try:
        import time

        time.sleep(0.3)
        seen = [cpu_waiting.busy() for _ in range(5)]
    finally:
        for process in spinning:
            process.kill()
            process.wait()
    assert any(seen)  # runnable now: not a minute's average


@pytest.mark.parametrize("looks, busy", [([1, 0, 1, 1, 1], False), ([1, 1, 1, 1, 0], False), ([2, 1, 1, 3, 1], True)])
def test_a_process_runnable_for_a_moment_is_not_a_busy_machine(monkeypatch, looks, busy):
    """One look that sees another process runnable (a shell starting this one, a process ending)
    is not enough: busy only when every look over 0.1 s sees one (here on a 2-CPU affinity)."""
    seen = iter(looks)
    monkeypatch.setattr(cpu_waiting, "_others_runnable", lambda: next(seen))
    monkeypatch.setattr(cpu_waiting, "LOOK_EVERY", 0.0)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert cpu_waiting.busy() is busy


def test_the_vitbench_command_sets_it_before_torch_loads_and_import_vitbench_does_not():
    """The command's own entry (the console script, `python -m vitbench`) chooses the spin count
    before torch is imported (libgomp reads it once, as torch loads it); a process that only imports
    vitbench keeps its environment as it was (tests/test_guest.py holds the rest of that)."""
    env = {k: v for k, v in os.environ.items() if k not in cpu_waiting.USER_SET}
    code = (
        "import os, sys, vitbench, vitbench.cli\n"
        "assert 'GOMP_SPINCOUNT' not in os.environ and 'torch' not in sys.modules\n"
        "from vitbench.host import cpu_waiting\n"
        "chosen = cpu_waiting.choose\n"
        "def choose():\n"
        "    chosen()\n"
        "    print('torch loaded' if 'torch' in sys.modules else 'before torch', os.environ['GOMP_SPINCOUNT'])\n"
        "cpu_waiting.choose = choose\n"
        "sys.argv = ['vitbench', 'ls', 'suites']\n"
        "try:\n"
        "    vitbench.cli.entry()\n"
        "except SystemExit as e:\n"
        "    assert not e.code\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    first = done.stdout.splitlines()[0]
    assert first in (f"before torch {cpu_waiting.QUIET}", f"before torch {cpu_waiting.SHORT}")

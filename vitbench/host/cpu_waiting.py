"""How long torch's OpenMP threads spin before they sleep, chosen for the machine as the process
starts (before torch is imported: libgomp reads it once, when it loads).

A thread that reaches the end of a parallel region before the others waits for them: libgomp's
default spins for 300,000 iterations first. On a quiet machine that is what makes many small
regions fast; beside other work it holds a core that another process, or this process's own
descheduled thread, needs: the demo (2 threads) took over 15 minutes beside two busy processes on
2 cores instead of 39 s. Measured on that machine (docs/performance.md, "A busy machine"): a spin
of 10,000 is as fast as the default when the machine is quiet (38.8 s, 65 s of CPU instead of 69),
and beside two busy processes a spin of 1,000 finished in 98 s on 74 s of CPU (passive waiting: 109
s; 10,000: 115 s on 104 s of CPU) but costs 1.5x when the machine is quiet. So: SHORT where other
processes are runnable as this one starts and stay so for 0.1 s (Linux counts them in
/proc/loadavg, now, not as a minute's average), else QUIET. A wait policy or spin count of the
user's own (OMP_WAIT_POLICY, GOMP_SPINCOUNT) holds. `choose()` runs in the `vitbench` command's own
entry (vitbench/cli/__init__.py: entry), never on `import vitbench`: a library leaves its host's
environment as it found it.
"""

from __future__ import annotations

import os
import time

QUIET = 10_000
SHORT = 1_000
USER_SET = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
LOOKS, LOOK_EVERY = 5, 0.025  # busy only when every look over 0.1 s finds the others runnable


def busy() -> bool:
    """Whether other processes are runnable, at least half this process's CPUs' worth, and stay so
    for a tenth of a second. One look is not enough: a process starting or ending (the shell that
    started this one) is runnable for a moment, on a quiet machine about one look in thirty here,
    for up to 60 ms; on one such look a quiet run chose the short spin (the demo: 85 s instead of
    69 s; a ViT-Ti step at 32 px 182 ms instead of 109). A quiet first look, the usual case, waits
    for nothing."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    wanted = max(1, cpus // 2)
    for look in range(LOOKS):
        if look:
            time.sleep(LOOK_EVERY)
        if _others_runnable() < wanted:
            return False
    return True


def _others_runnable() -> int:
    try:
        with open("/proc/loadavg") as f:  # "0.52 0.58 0.59 3/251 12345": runnable now / all
            return int(f.read().split()[3].split("/")[0]) - 1
    except (OSError, ValueError, IndexError):  # not Linux: the last minute's average instead
        return int(os.getloadavg()[0]) if hasattr(os, "getloadavg") else 0


def choose() -> None:
    """Set libgomp's spin count for this process (and the processes it starts), unless the user did."""
    if any(name in os.environ for name in USER_SET):
        return
    os.environ["GOMP_SPINCOUNT"] = str(SHORT if busy() else QUIET)

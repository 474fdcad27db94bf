"""How much of this machine's CPU other work is using, right now: what a micro-benchmark's rate is
worth. A rate measured beside other work (load 5 on 2 cores) priced a later plan on the quiet
machine at 2.0x its run; such a rate is kept as busy, and measured again once the machine is quiet
(execution/estimate.micro_rate)."""

from __future__ import annotations

import os
import time

BUSY_ABOVE = 0.25  # others using more than this fraction of the CPUs: the machine is busy
SAMPLE_SECONDS = 0.2


def others_busy(seconds: float = SAMPLE_SECONDS) -> float | None:
    """The fraction of the machine's CPU time (0 to 1) used over `seconds` while this process sleeps
    (Linux's /proc/stat: so all of it is other work); elsewhere the 1-minute load average per CPU,
    capped at 1; None where neither can be read."""
    first = _cpu_times()
    if first is not None:
        time.sleep(seconds)
        second = _cpu_times()
        if second is not None and second[1] > first[1]:
            return max(0.0, min(1.0, (second[0] - first[0]) / (second[1] - first[1])))
    try:
        return min(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))
    except (OSError, AttributeError):
        return None


def _cpu_times() -> tuple[int, int] | None:
    """(busy, total) jiffies of all CPUs since boot, from /proc/stat's first line."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    if len(fields) < 5:
        return None
    idle = fields[3] + fields[4]  # idle and iowait
    return sum(fields[:8]) - idle, sum(fields[:8])


def busy_text(fraction: float | None) -> str:
    """`other work used 80 % of the CPUs` where the machine was busy, else ""."""
    if fraction is None or fraction <= BUSY_ABOVE:
        return ""
    return f"other work used {fraction:.0%} of the CPUs"

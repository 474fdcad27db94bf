"""How much of this machine's CPU other work used while a micro-benchmark ran: what its rate is
worth. A rate measured beside other work (load 5 on 2 cores) priced a later plan on the quiet
machine at 2.0x its run; such a rate is kept as busy, and measured again once the machine is quiet
(execution/estimate.micro_rate, execution/solve_price.py).

Other work is read over the measurement itself: the CPU time all processes used (Linux's /proc/stat)
less this process's own. A 0.2 s look before it read "quiet" in a lull of a fluctuating load and
kept a pace measured beside it."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")

BUSY_ABOVE = 0.25  # others using more than this fraction of the CPUs: the machine is busy
SAMPLE_SECONDS = 0.2
SHORTEST = 0.1  # a measurement shorter than this (in seconds of wall time) is too few clock ticks to read


@dataclass(frozen=True)
class Stopwatch:
    """A moment in wall time (perf_counter) and in this process's CPU time (all its threads, as
    time.process_time counts them). `seconds()` since then is what the work would take on a quiet
    machine, the lesser of the two: waiting for a core that other work holds adds wall time only (on
    CI, the other test worker moved two dry runs' start-up and decoding of one plan 102 s and 114 s);
    threads that overlap add CPU time only; and a first start's cold file cache, waiting on the disk,
    is warm for the run that follows it."""

    wall: float
    cpu: float

    @classmethod
    def start(cls) -> Stopwatch:
        return cls(time.perf_counter(), time.process_time())

    def seconds(self) -> float:
        return max(0.0, min(time.perf_counter() - self.wall, time.process_time() - self.cpu))


def others_while(work: Callable[[], T]) -> tuple[T, float | None]:
    """`work()`'s result, and the fraction of the machine's CPU time (0 to 1) that other processes used
    while it ran; where /proc/stat cannot be read or `work` was too short to tell, a look just after."""
    first, own = _cpu_times(), _own_seconds()
    start = time.perf_counter()
    result = work()
    second, used, wall = _cpu_times(), _own_seconds() - own, time.perf_counter() - start
    if first is None or second is None or wall < SHORTEST:
        return result, others_busy()
    return result, others_fraction(second[0] - first[0], second[1] - first[1], used * _ticks_per_second())


def others_fraction(busy_ticks: float, total_ticks: float, own_ticks: float) -> float | None:
    """Of all CPUs' ticks over a span, the share that busy ticks not this process's own took."""
    if total_ticks <= 0:
        return None
    return max(0.0, min(1.0, (busy_ticks - own_ticks) / total_ticks))


def _own_seconds() -> float:
    """CPU seconds this process (all its threads) and the children it waited for have used."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _ticks_per_second() -> float:
    try:
        return float(os.sysconf("SC_CLK_TCK"))
    except (ValueError, OSError, AttributeError):
        return 100.0  # Linux's USER_HZ


def others_busy(seconds: float = SAMPLE_SECONDS) -> float | None:
    """The fraction of the machine's CPU time (0 to 1) used over `seconds` while this process sleeps
    (Linux's /proc/stat: so all of it is other work); elsewhere the 1-minute load average per CPU,
    capped at 1; None where neither can be read."""
    first = _cpu_times()
    if first is not None:
        time.sleep(seconds)
        second = _cpu_times()
        found = others_fraction(second[0] - first[0], second[1] - first[1], 0.0) if second is not None else None
        if found is not None:
            return found
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

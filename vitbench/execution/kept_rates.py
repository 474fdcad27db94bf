"""The micro-benchmark rates a dry run keeps in the user's cache (`micro-rates.json`): which kept
entries are measurements, recent ones, and which were taken on a busy machine (execution/estimate.py
`micro_rate` reads and writes them); execution/solve_price.py keeps the solve paces alike."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from pathlib import Path

from vitbench.execution.machine_load import BUSY_ABOVE
from vitbench.files.atomic import read_json_object

MAX_RATES_BYTES = 2_000_000  # some thousands of (device, model, resolution) entries; 250 MB took 2.1 GB
KEEP_DAYS = 30  # a measurement this old is measured again (a machine's drivers and load change)
MEASURED_FORMAT = "%Y-%m-%d %H:%M UTC"  # when a kept entry was measured (strings in this form sort by time)


def kept_rates(path: Path | None) -> dict:
    """The kept measurements that are measurements, and recent: {} where there is no file, it is
    past its size bound, or is not one (each is measured again, and the file rewritten)."""
    return kept_entries(path, is_measurement, MAX_RATES_BYTES)


def kept_entries(path: Path | None, is_entry: Callable[[object], bool], max_bytes: int) -> dict:
    """A kept file's entries that `is_entry` accepts (each with a "measured" moment) and measured within
    KEEP_DAYS; the file read within `max_bytes` (past it, or not a JSON object: {})."""
    from datetime import UTC, datetime, timedelta

    if path is None:
        return {}
    found = read_json_object(path, max_bytes)
    oldest = (datetime.now(UTC) - timedelta(days=KEEP_DAYS)).strftime(MEASURED_FORMAT)
    return {key: entry for key, entry in found.items() if is_entry(entry) and entry["measured"] >= oldest}


def stamped(entry: dict, busy: float | None) -> dict:
    """A measurement as it is kept: with the moment it was taken and how busy other work kept the CPU."""
    from datetime import UTC, datetime

    return {**entry, "measured": datetime.now(UTC).strftime(MEASURED_FORMAT), "busy": round(busy or 0.0, 3)}


def is_measurement(entry: object) -> bool:
    """{"median", "slowest", "fastest": FLOP/s, finite, positive, slowest ≤ median ≤ fastest;
    "build": the seconds making the model took, finite, not negative (an entry kept before it was
    measured is measured again); "passes": a count; "measured": "YYYY-MM-DD HH:MM UTC"}."""
    if not isinstance(entry, dict):
        return False
    found = [entry.get(k) for k in ("slowest", "median", "fastest", "build")]
    if not all(isinstance(r, int | float) and not isinstance(r, bool) for r in found):
        return False
    rates = [float(r) for r in found]  # type: ignore[arg-type]
    passes, measured, busy = entry.get("passes"), entry.get("measured"), entry.get("busy", 0.0)
    if not (isinstance(busy, int | float) and not isinstance(busy, bool) and 0 <= busy <= 1):
        return False
    return (
        all(math.isfinite(r) and r > 0 for r in rates[:3])
        and math.isfinite(rates[3])
        and rates[3] >= 0
        and rates[0] <= rates[1] <= rates[2]
        and type(passes) is int
        and passes > 0
        and is_moment(measured)
    )


def is_moment(measured: object) -> bool:
    """A kept entry's "measured": a string in MEASURED_FORMAT."""
    return isinstance(measured, str) and re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC", measured) is not None


def busy_entry(entry: dict) -> bool:
    """Whether a kept measurement was taken while other work held the CPU (a GPU's is never)."""
    return float(entry.get("busy", 0.0)) > BUSY_ABOVE

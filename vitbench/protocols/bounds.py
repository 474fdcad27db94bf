"""Numeric options, checked once: type, finiteness and range (and the choices of the device
options, which a word would otherwise pass until used).

The command line, a `--config` file and the Python API all build a `Request`, which checks its
shared values here before any work, and each protocol's options dataclass checks its own with a
`Bound` from its declaration (a `--lr nan` would train for minutes and store nothing, a
`--polyak 2` would store a number that means nothing). The command line's own options carry no
second copy of these ranges.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from vitbench.devices import PIPELINES, PRECISIONS
from vitbench.errors import listed

INT32_MAX = 2**31 - 1  # seeds, shots and sizes are INTEGER columns in the store
MAX_VALUES = 10_000  # values in one list option: more is a typo (10^6 seeds would plan for minutes)


@dataclass(frozen=True)
class Bound:
    option: str
    kind: type  # int or float
    low: float
    high: float = math.inf
    low_open: bool = False  # the low end itself is not allowed
    high_open: bool = False

    def expected(self) -> str:
        what, low = ("an integer", int(self.low)) if self.kind is int else ("a number", self.low)
        if self.high == math.inf:
            return f"{what} {'>' if self.low_open else '≥'} {low}"
        high = int(self.high) if self.kind is int else self.high
        return f"{what} {'above' if self.low_open else 'from'} {low} to {'below ' if self.high_open else ''}{high}"

    def holds(self, value: float) -> bool:
        above = value > self.low if self.low_open else value >= self.low
        below = value < self.high if self.high_open else value <= self.high
        return above and below


# Request field -> its bound (None values mean "the protocol's default" and are not checked); each
# protocol's own options carry theirs in their declarations (protocols/options.py)
SCALARS = {
    "res": Bound("--res", int, 1, INT32_MAX),
    "extraction_batch": Bound("--extraction-batch", int, 1),
    "workers": Bound("--workers", int, 0),
}
# Request field -> (option, its values): where a misspelt word would otherwise pass until it is used
CHOICES = {
    "precision": ("--precision", PRECISIONS),
    "input_pipeline": ("--input-pipeline", PIPELINES),
}


def problem(bound: Bound, value: object) -> str | None:
    """Why `value` is not a valid value of the option, or None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"{bound.option} {value!r}: expected {bound.expected()}"
    if bound.kind is int and not isinstance(value, int):
        return f"{bound.option} {value!r}: expected {bound.expected()}"
    if not math.isfinite(value):
        return f"{bound.option} {value}: expected a finite number"
    if not bound.holds(value):
        return f"{bound.option} {value}: expected {bound.expected()}"
    return None


def problems(values: dict[str, object]) -> list[str]:
    """What is wrong with a Request's numeric fields (given as field -> value), in field order."""
    found = []
    for name, (option, choices) in CHOICES.items():
        if name in values and values[name] not in choices:
            found.append(f"{option} {values[name]}: expected {listed(choices)}")
    for name, bound in SCALARS.items():
        value = values.get(name)
        if value is not None and (why := problem(bound, value)):
            found.append(why)
    return found

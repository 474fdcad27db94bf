"""Numeric options, checked once: type, finiteness and range (and the choices of the device
options, which a word would otherwise pass until used).

The command line, a `--config` file and the Python API all build a `Request`, whose fields
declare their checks beside their defaults (`checked(64, Bound("--extraction-batch", int, 1))`)
and are checked here before any work; each protocol's options dataclass checks its own with a
`Bound` from its declaration (a `--lr nan` would train for minutes and store nothing, a
`--polyak 2` would store a number that means nothing). The command line's own options carry no
second copy of these ranges.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any

from vitbench.errors import listed

INT32_MAX = 2**31 - 1  # seeds, shots and sizes are INTEGER columns in the store
MAX_BATCH = 65_536  # images per step or pass: the paper's largest global batch is 4,096 (JFT pre-training)
MAX_RES = 1_024  # pixels a side: the paper's largest is 518 (ViT-H/14); 100,000 asked for 30 GB and failed
MAX_EPOCHS = 10_000  # ImageNet pre-training is 300 epochs at most in the paper
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


@dataclass(frozen=True)
class Choices:
    """The words an option takes (a misspelt one would otherwise pass until it is used)."""

    option: str
    values: tuple[str, ...]


_CHECK = "vitbench.check"


def checked(default: Any, check: Bound | Choices) -> Any:
    """A Request field with its default and the check its values pass: the field's one declaration
    of both (None values mean "the protocol's default" and are not checked)."""
    return field(default=default, metadata={_CHECK: check})


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


def problems(values: Any) -> list[str]:
    """What is wrong with a dataclass's `checked` fields (a Request's), in field order."""
    found = []
    for f in fields(values):
        check, value = f.metadata.get(_CHECK), getattr(values, f.name)
        if check is None or value is None:
            continue
        if isinstance(check, Choices):
            if value not in check.values:
                found.append(f"{check.option} {value}: expected {listed(check.values)}")
        elif why := problem(check, value):
            found.append(why)
    return found

"""Every numeric option of `vitbench run`, checked once: type, finiteness and range (and the
choices of the device options, which a word would otherwise pass until used).

The command line, a `--config` file and the Python API all build a `Request`, which checks its
values here before any work (a `--lr nan` would train for minutes and store nothing, a `--polyak 2`
would store a number that means nothing). The command line's own options carry no second copy of
these ranges: this table is the one place they are written.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from vitbench.devices import PIPELINES, PRECISIONS

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


# Request field -> its bound (None values mean "the protocol's default" and are not checked)
SCALARS = {
    "res": Bound("--res", int, 1, INT32_MAX),
    "extraction_batch": Bound("--batch-size", int, 1),
    "workers": Bound("--workers", int, 0),
    "steps": Bound("--steps", int, 1, INT32_MAX),
    "batch": Bound("--batch", int, 1),
    "micro_batch": Bound("--micro-batch", int, 1),
    "checkpoint_every": Bound("--checkpoint-every", int, 1),
    "warmup": Bound("--warmup", int, 0),
    "lr": Bound("--lr", float, 0, low_open=True),
    "polyak": Bound("--polyak", float, 0, 1, high_open=True),  # 0: off; 1 would never move the average
    "mpp_rate": Bound("--mpp-rate", float, 0, 1, low_open=True),  # 0 corrupts nothing: nothing to predict
    "epochs": Bound("--epochs", float, 0, low_open=True),
    "weight_decay": Bound("--weight-decay", float, 0),
    "dropout": Bound("--dropout", float, 0, 1, high_open=True),
    "label_smoothing": Bound("--label-smoothing", float, 0, 1, high_open=True),
}
LISTS = {
    "seeds": Bound("--seeds", int, 0, INT32_MAX),
    "shots": Bound("--shots", int, 1, INT32_MAX),
    "knn_k": Bound("--knn-k", int, 1, INT32_MAX),
    "transfer_shots": Bound("--transfer-shots", int, 1, INT32_MAX),
}


# Request field -> (option, its values): where a misspelt word would otherwise pass until it is used
LINEAR_FEATURES = ("raw", "standardized")  # the linear probe's input: CLIP's raw features, or z-scored
# ObjectNet under --protocol eval: the head's logits restricted to the 113 overlapping classes (wise-ft's
# project_logits), or the top-k over all 1,000 with a non-overlapping prediction a miss (ObjectNet's own code)
OBJECTNET_SCORING = ("restricted", "all")
CHOICES = {
    "precision": ("--precision", PRECISIONS),
    "input_pipeline": ("--input-pipeline", PIPELINES),
    "linear_features": ("--linear-features", LINEAR_FEATURES),
    "objectnet_scoring": ("--objectnet-scoring", OBJECTNET_SCORING),
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
            found.append(f"{option} {values[name]}: expected {', '.join(choices[:-1])} or {choices[-1]}")
    for name, bound in SCALARS.items():
        value = values.get(name)
        if value is not None and (why := problem(bound, value)):
            found.append(why)
    for name, bound in LISTS.items():
        items = values.get(name) or ()
        if not isinstance(items, tuple | list | range):
            found.append(f"{bound.option}: expected a list of integers, got {items!r}")
            continue
        if len(items) > MAX_VALUES:
            found.append(f"{bound.option}: {len(items):,} values; expected at most {MAX_VALUES:,}")
            continue
        found += [why for v in items if (why := problem(bound, v))][:1]
    return found

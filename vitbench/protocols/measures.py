"""What a protocol measures, and how its numbers are shown: its metrics and the axis its runs vary
along. The views, the progress lines and the report read these declarations; none of them asks
which protocol produced a number (lm-evaluation-harness's metrics carry `higher_is_better` and
their aggregation the same way, so that its `make_table` knows no task).

    K = Axis("knn_k", "neighbours (k)", headline=20, symbol="k")
    metrics = (Metric("accuracy", "top-1 accuracy", axis=K), Metric("accuracy_top5", "top-5 accuracy", axis=K))
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vitbench.weights.names import RANDOM
from vitbench.weights.resolved import ABSENT

ACCURACY_VIEW = "accuracy"  # views/registry.TABLES: the Table 2-layout view of transfer results


@dataclass(frozen=True)
class Metric:
    """One number a protocol's runs store under `name`."""

    name: str
    label: str  # how a progress line and a caption speak of it: "top-1 accuracy"
    unit: str = "%"  # "%": stored as a fraction, shown × 100; "": shown as stored
    higher_is_better: bool = True  # which end of a column is bold, and which way a Δ is good
    # the table its values are shown in (views/registry.TABLES): "accuracy", Table 2's layout, holds
    # transfer results; a number that measures training itself (a dev accuracy during
    # pre-training) has a view of its own
    view: str = ACCURACY_VIEW
    paper: bool = False  # it stands beside the paper's fine-tuned Table 2 cells (a Δ is shown)
    progress: bool = True  # shown on the run's progress line, when the run stores it
    # the setting its value varies along within one (model, weights, dataset), if any: a table
    # column per value, the x of its figure; a protocol's runs vary along one (Protocol.axis)
    axis: Axis | None = None

    @property
    def transfer(self) -> bool:
        return self.view == ACCURACY_VIEW

    def text(self, value: float) -> str:
        return f"{value * 100:.2f}%" if self.unit == "%" else f"{value:g}{self.unit}"


@dataclass(frozen=True)
class Axis:
    """The setting a protocol's runs vary along within one (model, weights, dataset): a column of
    tables per value, the x of its figure (`vitbench plot NAME`, and in the report)."""

    name: str  # the hparam its runs store it under ("shots", "knn_k", "subset")
    label: str  # the figure's x label: "shots per class"
    headline: float | None = None  # the value the report's summary shows, where stored (else the most)
    log: bool = True  # drawn on a log scale
    shown: str = ""  # how a value is written in a table's column ("{}-shot"); default `symbol=value`
    symbol: str = ""  # how a setting names it ("k" in `k=20`); default its name
    # the protocol whose cell of the same backbone, dataset and input settings the figure draws beside
    # its lines, as a reference (k-NN and few-shot: the linear probe of the same features)
    reference: str | None = None
    # how the protocol decides, as the figure's caption says it; `{name}` is the runs' stored hparam
    # (k-NN: `T = {temperature}`), its distinct values joined
    rule: str = ""

    def rule_text(self, hparams: list[dict]) -> str:
        """The rule with each `{name}` filled from the runs' stored hparams (their distinct values)."""
        names = re.findall(r"{(\w+)}", self.rule)
        values = {n: ", ".join(f"{_plain(v):g}" if isinstance(v, int | float) else str(v) for v in
                               sorted({h[n] for h in hparams if h.get(n) is not None}, key=str)) or "as stored"
                  for n in names}  # fmt: skip
        return self.rule.format(**values)

    def text(self, value: Any) -> str:
        return self.shown.format(_plain(value)) if self.shown else self.setting(value)

    def setting(self, value: Any) -> str:
        """`k=20`: the run's value as its progress line and `--dry-run` write it."""
        return f"{self.symbol or self.name}={_plain(value)}"


def _plain(value: Any) -> Any:
    return int(value) if isinstance(value, float) and value.is_integer() else value


def progress_text(metrics: tuple[Metric, ...], values: Mapping[str, float]) -> str:
    """A finished run's line: each declared metric it stored, in declaration order, with the images
    behind an accuracy where the run stored them (` (353/500)`); else how many numbers it stored."""
    shown = []
    for m in metrics:
        if m.progress and m.name in values:
            suffix = m.name.removeprefix("accuracy")
            shown.append(f"{m.label} {m.text(values[m.name])}" + _counts(values, f"n_correct{suffix}",
                                                                           f"n_scored{suffix}"))  # fmt: skip
    return ", ".join(shown) or f"{len(values)} values"


def _counts(values: Mapping[str, float], correct: str, scored: str) -> str:
    if correct not in values or scored not in values:
        return ""
    return f" ({int(values[correct])}/{int(values[scored])})"


def weights_label(spec: Any) -> str:
    """Which weights a progress line's run (a RunSpec) used: `random init`, or the start of the file's
    sha256 (as the tables show it)."""
    if spec.weights_sha256.startswith(ABSENT):  # a dry run's weights not fetched yet: by the name given
        return f"{spec.weights_sha256.removeprefix(ABSENT)} (not here)"
    return "random init" if spec.weights_sha256 == RANDOM else f"weights {spec.weights_sha256[:8]}"

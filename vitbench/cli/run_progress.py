"""`vitbench run`'s progress: the `[k/n] model (weights) dataset what: result · images/s` line after
each stored run, the estimated device time still to go, and a setting much slower on this device
said before its runs."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from vitbench.execution import estimate
from vitbench.files.atomic import read_regular
from vitbench.files.downloads import cache_root
from vitbench.protocols.base import RunSpec
from vitbench.protocols.measures import progress_text, weights_label
from vitbench.protocols.registry import get_protocol
from vitbench.store.shards import shard_path

if TYPE_CHECKING:
    from vitbench import api

log = logging.getLogger("vitbench")


class Progress:
    """The `[k/n] model (weights) dataset what: result` line after each stored run, with the
    estimated device time still to go where a rate is known (the one `--dry-run` estimates with).
    Each plan counts on its own: a session's follow-up (few-shot after pre-training) is planned
    only once its weights exist, so `[1/1]` for the pre-training, then `[1/24]` … `[24/24]`."""

    def __init__(self, rate: estimate.Rate | None = None, results: Path | None = None, here: str | None = None):
        self.results = results  # where each finished run's shard says what it achieved
        self.here = here  # this device's name: the key of its kept micro-benchmarks
        self.finished = 0  # in the whole session (what an interruption reports)
        self.todo: list[RunSpec] = []
        self.shard_times: dict[str, int | None] = {}  # run_key -> its shard's mtime when planned (None: none)
        self.step, self.steps = 0, 0  # in the plan now running
        self.rate = rate
        self.left: dict[str, float] = {}  # run_key -> estimated device-seconds, of the runs not yet finished

    def planned(self, summary: api.Summary) -> None:
        if summary.todo and self.here is not None:  # a setting much slower on this device, said before it runs
            warning = estimate.slower_setting(summary.groups, self.here, cache_root())
            if warning:
                log.warning("%s", warning)
        self.todo += summary.todo  # a session's follow-up runs join the count
        if self.results is not None:
            self.shard_times |= {s.run_key: self._shard_time(s.run_key) for s in summary.todo}
        self.step, self.steps = 0, len(summary.todo)
        if self.rate is not None and summary.todo:
            found = estimate.estimate(summary.groups, self.rate, {s.run_key for s in summary.todo})
            self.left |= {s.run_key: found.seconds.get(s.run_key, 0.0) for s in summary.todo}

    def stored(self) -> int:
        """How many of the planned runs have written their shard since they were planned: what an
        interruption reports. Not `finished`: a signal that lands after a run's shard is written and
        before its progress line counts it would say one run fewer than the folder holds. (A shard's
        modification time against the one seen at planning: `--rerun` plans runs already stored.)"""
        if self.results is None:
            return self.finished
        return sum(self._shard_time(key) != before for key, before in self.shard_times.items())

    def _shard_time(self, run_key: str) -> int | None:
        try:
            return shard_path(self.results, run_key).stat().st_mtime_ns
        except OSError:
            return None

    def __call__(self, spec: RunSpec, metrics: dict) -> None:
        self.finished += 1
        self.step += 1
        protocol = get_protocol(spec.protocol)
        # the seed where the protocol takes seeds (few-shot's draws, a training run's); a
        # deterministic one (eval, k-NN, the linear probe) has seed 0 only
        seed = f"seed {spec.seed}" if "seeds" in protocol.Options.names() else ""
        what = " ".join(part for part in (spec.protocol, protocol.describe(spec), seed) if part)
        shown = progress_text(protocol.metrics, metrics) + self._speed(spec.run_key)
        self.left.pop(spec.run_key, None)
        eta = f" (≈ {estimate.duration(sum(self.left.values()))} of device time left, estimated)" if self.left else ""
        log.info("[%d/%s] %s (%s) %s %s: %s%s", self.step, self.steps or "?", spec.model, weights_label(spec),
                 spec.dataset, what, shown, eta)  # fmt: skip

    def _speed(self, run_key: str) -> str:
        """` · 1,234 images/s`: the images the run passed through the model over its device time, as
        its shard records them (flops / flops per image); nothing where it passed none itself (a
        k-NN run on the features another run extracted) or the shard cannot be read."""
        if self.results is None:
            return ""
        try:
            run = json.loads(read_regular(shard_path(self.results, run_key)))["run"]
            images = run["flops"] / run["flops_per_image"]
            seconds = float(run["device_seconds"])
        except (OSError, ValueError, KeyError, TypeError, ZeroDivisionError):
            return ""
        return f" · {images / seconds:,.0f} images/s" if images >= 1 and seconds > 0 else ""

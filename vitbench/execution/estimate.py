"""Before the work, its cost: each planned run's device time, estimated from counted FLOPs and a
rate — the FLOP/s `vitbench bench` measured on this device (its own loop on real data where it
has one), or an assumed MFU of a named accelerator's bf16 peak. An estimate, and said to be one:
cached features, a shorter early-stopped run or another input pipeline make a run faster, a slow
disk slower."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from vitbench.devices import PEAK_BF16_FLOPS, peak_flops
from vitbench.engine.bench_types import MODES
from vitbench.errors import UserError
from vitbench.protocols.base import Group
from vitbench.protocols.registry import get_protocol

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Rate:
    """Achieved FLOP/s per mode (train counts 3 forward passes an image), and where they come from."""

    flops_per_second: dict[str, float]
    basis: str
    # (model, res, mode) -> FLOP/s measured for exactly that configuration, preferred where it exists
    measured: dict[tuple[str, int, str], float] = field(default_factory=dict)

    def of(self, model: str, res: int, mode: str) -> float | None:
        return self.measured.get((model, res, mode)) or self.flops_per_second.get(mode)


@dataclass
class Estimate:
    seconds: dict[str, float]  # run_key -> estimated device-seconds
    basis: str

    def total(self, keys: Iterable[str]) -> float:
        return sum(self.seconds.get(k, 0.0) for k in keys)


def parse_assume_mfu(text: str, device_name: str) -> Rate:
    """`--assume-mfu 0.4` (this device's bf16 peak) or `0.4@H100` (a named accelerator's)."""
    value, _, accelerator = text.partition("@")
    try:
        mfu = float(value)
    except ValueError:
        mfu = -1.0
    if not 0 < mfu <= 1:
        raise UserError(f"--assume-mfu {text}: expected a fraction of the bf16 peak from 0 to 1, e.g. 0.4 or 0.4@H100")
    name = accelerator.strip() or device_name
    peak = peak_flops(name)
    if peak is None:
        known = ", ".join(key for key, _ in PEAK_BF16_FLOPS)
        raise UserError(f"--assume-mfu {text}: no bf16 peak known for {name!r}; name one: 0.4@H100 ({known})")
    basis = f"assumed {mfu:.0%} MFU of {name}'s bf16 peak ({peak / 1e12:.0f} TFLOP/s)"
    return Rate(dict.fromkeys(MODES, mfu * peak), basis)


def measured_rate(results: Path, device_name: str) -> Rate | None:
    """The FLOP/s `vitbench bench` stored for this device: vitbench's own loop, on real data where
    it was measured (else on the synthetic batch); per mode, the median over configurations."""
    import pandas as pd  # (with the store: `vitbench run --help` reads neither)

    from vitbench.store.bench import read_bench_quietly

    rows = read_bench_quietly(results)
    if rows is None or rows.empty:
        return None
    rows = rows[(rows["device_name"] == device_name) & (rows["runner"] == "vitbench")]
    rows = rows[pd.to_numeric(rows["flops_per_image"], errors="coerce") > 0]
    if rows.empty:
        return None
    real = rows[rows["data"] != "synthetic"]
    rows = real if not real.empty else rows
    passes = rows["mode"].map({"train": 3.0}).fillna(1.0)
    rows = rows.assign(achieved=rows["images_per_second"] * rows["flops_per_image"].astype(float) * passes)
    latest = rows.sort_values("created_at").drop_duplicates(["model", "res", "mode"], keep="last")
    measured = {(str(r.model), int(r.res), str(r.mode)): float(r.achieved) for r in latest.itertuples()}
    per_mode = latest.groupby("mode")["achieved"].median().to_dict()
    if "inference" in per_mode and "train" not in per_mode:
        per_mode["train"] = per_mode["inference"]  # a forward-only measurement bounds the training rate
    return Rate(per_mode, f"`vitbench bench` on {device_name} ({len(latest)} measurement(s))", measured)


def micro_rate(groups: list[Group], device: torch.device, name: str) -> Rate:
    """A rate from a few seconds' micro-benchmark here (engine/bench.py `forward_rate`): one timed
    forward pass per (model, resolution) planned, the training rate taken as the forward one (a
    training step runs below it: the estimate is a lower bound there). For a dry run on a device
    `vitbench bench` has not measured."""
    from vitbench.engine.bench import forward_rate

    measured: dict[tuple[str, int, str], float] = {}
    took = 0.0
    for model, res in dict.fromkeys((g.model, g.res) for g in groups):
        flops, seconds = forward_rate(model, res, device)
        measured |= {(model.name, res, mode): flops for mode in MODES}
        took += seconds
    basis = (
        f"a {took:.0f} s micro-benchmark on {name} (one forward pass per model, at random init; training "
        "taken at the forward rate; `vitbench bench` measures properly)"
    )
    return Rate({}, basis, measured)


def planned_images(groups: list[Group]) -> dict[str, float]:
    """run_key -> images each planned run passes through the model (training images once each)."""
    return {
        key: sum(work.values())
        for group in groups
        for key, work in get_protocol(group.protocol).work(group).images.items()
    }


def estimate(groups: list[Group], rate: Rate) -> Estimate:
    """Every planned run's device-seconds: its protocol's planned images × the model's counted
    FLOPs per image (3 forward passes for a training image) ÷ the rate for that mode."""
    seconds: dict[str, float] = {}
    for group in groups:
        assert group.model.backend is not None
        per_image = group.model.backend.flops_per_image(group.model, group.res)
        for spec, work in get_protocol(group.protocol).work(group).images.items():
            seconds[spec] = _seconds(work, per_image, rate, group.model.name, group.res)
    return Estimate(seconds, rate.basis)


def _seconds(work: dict[str, float], per_image: int, rate: Rate, model: str, res: int) -> float:
    total = 0.0
    for mode, images in work.items():
        achieved = rate.of(model, res, mode)
        if achieved:
            total += images * per_image * (3 if mode == "train" else 1) / achieved
    return total


def duration(seconds: float) -> str:
    """Seconds as a person reads a budget: 42 s, 12 min, 3.4 h, 2.1 days."""
    if seconds < 1:
        return "< 1 s"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"

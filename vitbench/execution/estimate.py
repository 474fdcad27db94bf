"""Before the work, its cost: each planned run's device time, estimated from counted FLOPs and a
rate — the FLOP/s `vitbench bench` measured on this device (its own loop on real data where it
has one), or an assumed MFU of a named accelerator's bf16 peak. An estimate, and said to be one:
cached features, a shorter early-stopped run or another input pipeline make a run faster, a slow
disk slower."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from vitbench.catalog.registry import get_model
from vitbench.engine.bench_types import MODES
from vitbench.errors import UserError
from vitbench.execution.kept_rates import busy_entry, kept_rates, stamped
from vitbench.execution.machine_load import busy_text, others_while
from vitbench.files.atomic import keep_json
from vitbench.host.devices import PEAK_BF16_FLOPS, peak_flops
from vitbench.protocols.base import Group
from vitbench.protocols.registry import get_protocol
from vitbench.reference.shipped_rates import rows_for

if TYPE_CHECKING:
    import torch

    from vitbench.execution.overheads import Beside
    from vitbench.execution.solve_price import Solves


@dataclass(frozen=True)
class Rate:
    """Achieved FLOP/s per mode (train counts 3 forward passes an image), and where they come from."""

    flops_per_second: dict[str, float]
    basis: str
    # (model, res, mode) -> FLOP/s measured for exactly that configuration, preferred where it exists
    measured: dict[tuple[str, int, str], float] = field(default_factory=dict)
    # (model, res) -> (slowest, fastest) FLOP/s of the timed passes behind `measured`: the estimate's range
    spread: dict[tuple[str, int], tuple[float, float]] = field(default_factory=dict)
    # (model, res) -> seconds making the model took here (random init): part of loading its weights
    build: dict[tuple[str, int], float] = field(default_factory=dict)
    # measured on this machine (here, `vitbench bench` or the micro-benchmark; --assume-mfu of its own
    # peak): what a run pays beside the model's passes is then measured here too (execution/overheads.py)
    here: bool = True
    short: str = ""  # the basis in a few words, for the plan's summary (`basis` in full with --explain)

    @property
    def named(self) -> str:
        return self.short or self.basis

    def of(self, model: str, res: int, mode: str) -> float | None:
        return self.measured.get((model, res, mode)) or self.flops_per_second.get(mode)


@dataclass
class Estimate:
    seconds: dict[str, float]  # run_key -> estimated device-seconds
    basis: str
    short: str = ""  # the rate's basis in a few words (Rate.short)
    # run_key -> (fewest, most) device-seconds, where the rate was measured with a spread
    bounds: dict[str, tuple[float, float]] = field(default_factory=dict)
    # what the runs pay beside the model's passes, measured here; None: priced for another machine
    beside: Beside | None = None
    solves: Solves | None = None  # the solves in `beside`: their pace and what was priced (None: none)

    def run_seconds(self, key: str) -> float:
        """One run's wall-clock seconds: its device-seconds and, where measured, what it pays beside them."""
        return self.seconds.get(key, 0.0) + (self.beside.of(key) if self.beside else 0.0)

    def wall(self, keys: Iterable[str]) -> float:
        """The command's seconds for `keys`: theirs, and its start-up where measured."""
        return sum(self.run_seconds(k) for k in keys) + (self.beside.startup if self.beside else 0.0)

    def total(self, keys: Iterable[str]) -> float:
        return sum(self.seconds.get(k, 0.0) for k in keys)

    def range(self, keys: Iterable[str]) -> tuple[float, float] | None:
        """(fewest, most) device-seconds of `keys`, or None where the rate came with no spread."""
        keys = [k for k in keys if k in self.seconds]
        if not keys or not all(k in self.bounds for k in keys):
            return None
        beside = self.wall(keys) - self.total(keys)  # measured, not spread: added to both ends
        return sum(self.bounds[k][0] for k in keys) + beside, sum(self.bounds[k][1] for k in keys) + beside


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
    return Rate(dict.fromkeys(MODES, mfu * peak), basis, here=not accelerator.strip())


def price_on(kind: str, fallback: Rate | None = None) -> Rate:
    """`--price-on h100`: the rates vitbench ships for that GPU (vitbench/reference/shipped_rates.py), as FLOP/s
    of each measured (model, resolution, mode): images/s x the FLOPs vitbench counts per image (3
    forward passes for a training image). Configurations never measured there take `fallback`'s
    (--assume-mfu) where given; else they are not priced."""
    rows = rows_for(kind)
    measured = {}
    for row in rows:
        spec = get_model(row.model)
        assert spec.backend is not None
        passes = 3 if row.mode == "train" else 1
        measured[(row.model, row.res, row.mode)] = (
            row.images_per_second * passes * spec.backend.flops_per_image(spec, row.res)
        )
    dates = sorted({r.measured for r in rows})
    basis = (
        f"`vitbench bench` rows measured on an {rows[0].device} ({', '.join(dates)}; bf16, batch {rows[0].batch}; "
        f"results/measured/gpu-rates.csv names each row's section of docs/performance.md), shipped with vitbench; "
        + (
            f"where none was measured there: {fallback.basis}"
            if fallback
            else "a configuration never measured there is not priced (add --assume-mfu 0.4@H100)"
        )
    )
    short = f"`vitbench bench` rows measured on an {rows[0].device}, shipped with vitbench" + (
        f" (else {fallback.named})" if fallback else ""
    )
    return Rate(dict(fallback.flops_per_second) if fallback else {}, basis, measured, here=False, short=short)


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


# what every estimate counts, and what it leaves out (said with it): priced on this machine, and for another
COUNTED = (
    "It counts the model's passes over the planned images (an extraction that protocols share, once), "
    "decoding and resizing them (timed here on a sample of their own files), the solves of few-shot, k-NN and "
    "the linear probe on their features, loading the weights (making the model, reading the file) and this "
    "command's start-up (timed), not storing each run's results"
)
COUNTED_ELSEWHERE = (
    "It counts the model's passes over the planned images (an extraction that protocols share, once), not "
    "decoding and resizing them, the solves of few-shot, k-NN and the linear probe, loading weights or start-up "
    "(measured on this machine only)"
)
MICRO_RATES = "micro-rates.json"  # in the user's cache: what a dry run measured here, for the next one


def micro_rate(
    groups: list[Group], device: torch.device, name: str, cache: Path | None = None, precision: str | None = None
) -> Rate:
    """A rate from a few seconds' micro-benchmark here (engine/micro_rate.py `forward_rate`: the median of
    several timed forward passes per (model, resolution) planned, in batches of the run's extraction
    batch, their slowest and fastest the estimate's range; and timed training steps where the plan
    trains that model: the forward rate had priced the demo's pre-training at half its time). For a
    dry run on a device `vitbench bench` has not measured. What it measures is kept in the user's
    cache (`downloads.cache_root()`: VITBENCH_CACHE, else $XDG_CACHE_HOME/vitbench) per device,
    model, resolution, thread count, torch version, batch and mode, for KEEP_DAYS: every dry run on
    this machine reads it, whatever its results folder, so identical dry runs price the model's
    passes alike (two folders priced one suite 8.3 and 7.3 days). An entry that is not a measurement
    (wrong shape, not finite, not positive, out of order) is measured again, never used.
    `precision`: measured under it where it is not the device's own (bf16 on a CPU), kept apart."""
    import torch

    path = cache / MICRO_RATES if cache is not None else None
    kept = kept_rates(path)
    measured: dict[tuple[str, int, str], float] = {}
    spread: dict[tuple[str, int], tuple[float, float]] = {}
    build: dict[tuple[str, int], float] = {}
    passes, dates, changed, busy = 0, set[str](), False, 0.0
    own = precision is None or precision == ("fp32" if device.type == "cpu" else "bf16")
    for (model, res, batch), modes in _modes(groups).items():
        for mode in modes:  # inference first: its spread is the range, its build the model's making
            key = f"{name}|{model.name}|{res}|{torch.get_num_threads()} threads|torch {torch.__version__}|batch {batch}"
            key += ("" if own else f"|{precision}") + ("|train" if mode == "train" else "")
            if key not in kept or busy_entry(kept[key]):  # a rate measured beside other work: again, if quiet now
                kept[key], changed = _measure(model, res, device, None if own else precision, batch, mode), True
            entry = kept[key]
            busy = max(busy, float(entry.get("busy", 0.0)))
            for priced in MODES if mode == "inference" else (mode,):  # training at the forward rate unless timed
                measured[(model.name, res, priced)] = float(entry["median"])
            if mode == "inference":
                spread[(model.name, res)] = (float(entry["slowest"]), float(entry["fastest"]))
                build[(model.name, res)] = float(entry["build"])
            passes, dates = passes + int(entry["passes"]), dates | {entry["measured"]}
    # said kept only where it is: a cache that is a file, /dev/full or read-only keeps nothing
    stored = path is not None and (keep_json(path, kept) if changed else path.is_file())
    where = f" and kept in {path}" if stored else f" (not kept: {path} cannot be written)" if path is not None else ""
    basis = (
        f"a micro-benchmark on {name}: the median of {passes} timed passes of random images at random init "
        f"(forward passes, and training steps where the plan trains; the forward passes' slowest and fastest give "
        f"the range), measured {', '.join(sorted(dates))}" + where + "; `vitbench bench` measures the whole loop"
    )
    short = f"a micro-benchmark on {name}, measured {', '.join(sorted(dates))}"
    short += f" (not kept: {path} cannot be written)" if path is not None and not stored else ""
    loaded = busy_text(busy)
    if loaded:  # a plan priced on a busy machine says so: its estimate may be high
        short += f" while {loaded} (measured again once it is quiet)"
        basis += f"; measured while {loaded}: the estimate may be high, and is measured again once the machine is quiet"
    return Rate({}, basis, measured, spread, build, short=short)


def _modes(groups: list[Group]) -> dict[tuple, list[str]]:
    """(model, resolution, extraction batch) -> the modes the plan passes images in: inference always
    (first), train where a run trains."""
    found: dict[tuple, list[str]] = {}
    for group in groups:
        modes = found.setdefault((group.model, group.res, group.runtime.extraction_batch), ["inference"])
        works = get_protocol(group.protocol).work(group).images.values()
        if "train" not in modes and any(work.get("train") for work in works):
            modes.append("train")
    return found


def _measure(model, res: int, device: torch.device, precision: str | None, batch: int, mode: str) -> dict:
    """One kept entry: `forward_rate`'s passes, summed up, with the moment they were measured."""
    import statistics

    from vitbench.engine.micro_rate import forward_rate

    def passes():
        return forward_rate(model, res, device, precision, batch, mode)

    # on a CPU, how much of it other work used meanwhile: what the rate is worth
    (rates, made), others = others_while(passes) if device.type == "cpu" else (passes(), 0.0)
    return stamped({"median": statistics.median(rates), "slowest": min(rates), "fastest": max(rates),
                    "passes": len(rates), "build": made}, others)  # fmt: skip


SLOWER = 1.5  # a setting this much slower than the device's own is said before the runs


def slower_setting(groups: list[Group], name: str, cache: Path | None) -> str | None:
    """The warning a plan prints where its precision is much slower on this device than the one the
    device computes best in (bf16 on a CPU ran 4x slower than fp32, 12 min instead of 3, without a
    word), with the factor measured here (both micro-benchmarks kept, as a dry run's); else None."""
    slow = [g for g in groups if g.runtime.device.type == "cpu" and g.runtime.precision == "bf16"]
    if not slow:
        return None
    group = slow[0]
    device, model, res = group.runtime.device, group.model.name, group.res
    own = micro_rate([group], device, name, cache).of(model, res, "inference")
    asked = micro_rate([group], device, name, cache, precision="bf16").of(model, res, "inference")
    if not own or not asked or own / asked < SLOWER:
        return None
    return (
        f"--precision bf16 on this CPU: {own / asked:.1f}x slower than fp32, measured here ({model} at {res} px: "
        f"{asked / 1e9:.2f} against {own / 1e9:.2f} GFLOP/s); --precision fp32 (auto's choice on a CPU) is faster"
    )


def _priced(groups: list[Group], todo: set[str] | None = None) -> list[tuple[Group, dict[str, dict[str, float]]]]:
    """Each group with run_key -> mode -> images its runs pass through the model. An image of a
    cache entry several groups read (`Work.shared`: the frozen features of a split) is charged once,
    as the run extracts it once: to the first group in run order that needs it, shared by that
    group's runs still to do (`todo`; all where None); what the entry holds already, to none."""
    from vitbench.engine.feature_cache import held_images  # (the store's and torch's: `run --help` reads neither)

    held: dict[str, float] = {}
    priced = []
    for group in groups:
        work = get_protocol(group.protocol).work(group)
        if not work.shared:
            priced.append((group, work.images))
            continue
        runs = {key for key in work.images if todo is None or key in todo}  # a set: 100,000 runs looked up in it
        extracted = 0.0
        for path, needed in work.shared.items() if runs else ():  # a group with nothing to do reads nothing
            have = held[path] if path in held else float(held_images(Path(path)))
            extracted += max(0.0, needed - have)
            held[path] = max(have, needed)
        each = {key: {"inference": extracted / len(runs) if key in runs else 0.0} for key in work.images}
        priced.append((group, each))
    return priced


def planned_images(groups: list[Group], todo: set[str] | None = None) -> dict[str, float]:
    """run_key -> images each planned run passes through the model (training images once each)."""
    return {key: sum(work.values()) for _, images in _priced(groups, todo) for key, work in images.items()}


def estimate(groups: list[Group], rate: Rate, todo: set[str] | None = None) -> Estimate:
    """Every planned run's device-seconds: the images its protocol passes (an extraction shared
    between protocols charged once, `_priced`) × the model's counted FLOPs per image (3 forward
    passes for a training image) ÷ the rate for that mode."""
    seconds: dict[str, float] = {}
    bounds: dict[str, tuple[float, float]] = {}
    for group, images in _priced(groups, todo):
        assert group.model.backend is not None
        per_image = group.model.backend.flops_per_image(group.model, group.res)
        name, res = group.model.name, group.res
        for spec, work in images.items():
            priced = _seconds(work, per_image, rate, name, res)
            if priced is None:  # no rate for a mode it needs (--price-on: never measured there)
                continue
            seconds[spec] = priced
            if (name, res) in rate.spread:
                slowest, fastest = rate.spread[(name, res)]
                median = rate.of(name, res, "inference") or 0.0
                bounds[spec] = (seconds[spec] * median / fastest, seconds[spec] * median / slowest)
    return Estimate(seconds, rate.basis, rate.named, bounds)


def _seconds(work: dict[str, float], per_image: int, rate: Rate, model: str, res: int) -> float | None:
    """The device-seconds of a run's images at `rate`; None where a mode it passes images in has no rate."""
    total = 0.0
    for mode, images in work.items():
        achieved = rate.of(model, res, mode)
        if achieved:
            total += images * per_image * (3 if mode == "train" else 1) / achieved
        elif images:
            return None
    return total


def duration(seconds: float) -> str:
    """Seconds as a person reads a budget: 42 s, 1.6 min, 12 min, 3.4 h, 2.1 days."""
    if not math.isfinite(seconds) or seconds < 0:  # no rate makes these; said, never "≈ nan days"
        return "unknown"
    if seconds < 1:
        return "< 1 s"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 600:  # a tenth of a minute: 95 s is not "2 min"
        return f"{seconds / 60:.1f} min"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"

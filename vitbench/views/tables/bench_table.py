"""`vitbench table --bench`: the stored throughput measurements, one row per (device, model,
resolution, mode), vitbench beside its baselines, with the ratios the performance goals are about."""

from __future__ import annotations

import numpy as np
import pandas as pd

from vitbench.store.query import json_field
from vitbench.views.cells import Cell, TableData

COLUMNS = {
    "synthetic": "vitbench synthetic",
    "real": "vitbench real data",
    "real_ratio": "real / synthetic",
    "bare": "bare loop",
    "bare_ratio": "vitbench / bare",
    "timm": "timm benchmark.py",
    "timm_ratio": "real / timm",
    "real_bare": "real / bare",
    "real_peak": "real / matmul peak",
    "mfu": "MFU",
    "memory": "peak GiB",
    "micro": "micro-batch",
}


def _ratio(a: float | None, b: float | None) -> Cell:
    if a is None or b is None or not b:
        return Cell()
    return Cell(mean=a / b, text=f"{a / b:.2f}")


def _rate(row: pd.Series | None) -> float | None:
    return None if row is None else float(row["images_per_second"])


def bench_view(df: pd.DataFrame) -> TableData:
    """The latest measurement of each (device, precision, compile, batch, model, res, mode, runner)."""
    data = TableData(title="Throughput in images/s: vitbench's loops against a bare loop and timm's benchmark.py")
    if df.empty:
        return data
    vitbench_kind = np.where(df["data"] == "synthetic", "vitbench-synthetic", "vitbench-real")
    df = df.assign(kind=np.where(df["runner"] == "vitbench", vitbench_kind, df["runner"]))
    keys = ["device_name", "precision", "compile", "batch", "model", "res", "mode", "kind"]
    latest = df.sort_values("created_at").groupby(keys, sort=False).tail(1)
    settings = latest[["device_name", "precision", "compile", "batch"]].drop_duplicates()
    for column in COLUMNS.values():
        data.add_column(column)
    shown_ids: list[str] = []
    pipelines: set[str] = set()
    for _, group in latest.groupby(
        ["device_name", "precision", "compile", "batch", "model", "res", "mode"], sort=False
    ):
        first = group.iloc[0]
        label = f"{first['model']} @{first['res']} · {first['mode']}"
        if len(settings) > 1:
            compiled = ", compiled" if first["compile"] else ""
            label += f" · {first['device_name']}, {first['precision']}, batch {first['batch']}{compiled}"
        data.add_row(label)
        by_kind = {r["kind"]: r for _, r in group.iterrows()}
        synthetic, real = by_kind.get("vitbench-synthetic"), by_kind.get("vitbench-real")
        bare, timm = by_kind.get("bare"), by_kind.get("timm")
        cells = data.cells
        for key, row in (("synthetic", synthetic), ("real", real), ("bare", bare), ("timm", timm)):
            if row is not None:
                text = f"{row['images_per_second']:.1f}"
                cells[(label, COLUMNS[key])] = Cell(mean=float(row["images_per_second"]), text=text)
        cells[(label, COLUMNS["real_ratio"])] = _ratio(_rate(real), _rate(synthetic))
        cells[(label, COLUMNS["bare_ratio"])] = _ratio(_rate(synthetic), _rate(bare))
        cells[(label, COLUMNS["timm_ratio"])] = _ratio(_rate(real), _rate(timm))
        cells[(label, COLUMNS["real_bare"])] = _ratio(_rate(real), _rate(bare))
        of_peak = None if real is None else json_field(real["notes"]).get("of_matmul_peak")
        if isinstance(of_peak, int | float) and np.isfinite(of_peak):  # notes are JSON: trust no type
            cells[(label, COLUMNS["real_peak"])] = Cell(mean=of_peak, text=f"{100 * of_peak:.1f} %")
        if synthetic is not None:
            if pd.notna(synthetic["mfu"]):
                cells[(label, COLUMNS["mfu"])] = Cell(mean=synthetic["mfu"], text=f"{100 * synthetic['mfu']:.1f} %")
            if pd.notna(synthetic["peak_memory_bytes"]):
                gib = float(synthetic["peak_memory_bytes"]) / 2**30
                cells[(label, COLUMNS["memory"])] = Cell(mean=gib, text=f"{gib:.1f}")
            if pd.notna(synthetic["micro_batch"]):
                ckpt = ", activation checkpointing" if synthetic["activation_checkpointing"] else ""
                cells[(label, COLUMNS["micro"])] = Cell(text=f"{int(synthetic['micro_batch'])}{ckpt}")
        shown_ids = list(dict.fromkeys([*shown_ids, *group["bench_id"]]))
        if real is not None:
            pipelines.add(f"{real['data']} through the {real['input_pipeline']} pipeline")
    # a column no row has (timm without --timm-benchmark, MFU and memory on a CPU) is left out
    data.columns = [c for c in data.columns if any(data.cells.get((r, c), Cell()).value() for r in data.rows)]
    if len(settings) == 1:
        s = settings.iloc[0]
        data.title += f" — {s['device_name']}, {s['precision']}, batch {s['batch']}" + (
            ", compiled" if s["compile"] else ""
        )
    _footnotes(data, df, latest, shown_ids, pipelines)
    return data


def _footnotes(
    data: TableData, df: pd.DataFrame, latest: pd.DataFrame, shown_ids: list[str], pipelines: set[str]
) -> None:
    """What the ratios mean, how timm's script was run, and each bench's provenance."""
    data.footnotes.append(
        "MFU: achieved FLOP/s over the device's dense bf16 peak; training counts 3 forward passes "
        "(6 × multiply-adds) per image, inference one. Empty on devices without a known peak (CPUs). "
        "real / matmul peak: the same FLOP/s, end to end from the real data, over what a large square matrix "
        "product reaches on this device at this precision (measured in the same bench)."
    )
    data.footnotes.append(f"real data: {'; '.join(sorted(pipelines))}; synthetic: one random batch on the device")
    data.footnotes.append(
        "vitbench / bare: vitbench's own loop (fine-tune step or extraction) over a bare loop on the same "
        "synthetic batch; real / synthetic < 1 means the input pipeline, not the device, sets the pace."
    )
    timm_notes: dict[str, list[str]] = {}  # differences -> the rows timm measured that way
    for _, row in latest[latest["runner"] == "timm"].iterrows():
        notes = json_field(row["notes"])
        said = "; ".join(notes.get("differences") or ["the same model, image size, batch and precision"])
        timm_notes.setdefault(f"`{notes.get('command', '')}`: {said}", []).append(
            f"{row['model']} @{row['res']} · {row['mode']}"
        )
    for text, where in timm_notes.items():
        data.footnotes.append(f"timm benchmark.py ({', '.join(dict.fromkeys(where))}): {text}")
    for bench_id in shown_ids:
        row = df[df["bench_id"] == bench_id].iloc[0]
        notes = json_field(row["notes"])
        data.footnotes.append(
            f"{str(row['created_at'])[:19]} on {row['hostname']} ({row['device_name']}): vitbench "
            f"{row['vitbench_version']} ({row['git_sha']}), torch {row['torch_version']}, timm {row['timm_version']}, "
            f"{row['steps']} timed steps after {row['warmup_steps']} untimed, {notes.get('rounds_run', 1)} round(s); "
            f"`{row['command']}`"
        )

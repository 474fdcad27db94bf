"""What a run pays beside its model's passes, measured here for a dry run: decoding and resizing
the planned images (a sample of the group's own files through its own preprocessing, on one core),
loading the weights (making the model, timed by the micro-benchmark, and reading the file, timed
on its first READ_BYTES), the solves on frozen features (execution/solve_price.py) and the
command's own start-up (its imports and planning, timed as this dry run made them). The dry run's
estimate counts them beside the model's passes, each shown on its own, so that it prices the whole
wait (issue 69: an eval of 500 JPEGs took 1.6x its device time)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from vitbench.execution.machine_load import Stopwatch
from vitbench.protocols.base import Group, Trainer
from vitbench.protocols.registry import get_protocol

SAMPLE_IMAGES = 16  # decoded and resized per group, spread over its first split
SAMPLE_SECONDS = 1.0  # or fewer where they take longer (large files)
REPEATS = 3  # each sampled image timed this often, its fastest kept: other work only ever adds time
READ_BYTES = 64 * 2**20  # of a weights file, timed and scaled to its size


@dataclass
class Beside:
    """Seconds of wall time each planned run pays beside its model's passes, and the command's start-up."""

    decode: dict[str, float] = field(default_factory=dict)  # run_key -> decoding and resizing its images
    weights: dict[str, float] = field(default_factory=dict)  # run_key -> making the model and reading weights
    startup: float = 0.0  # the command's imports and planning, before its first run
    unmeasured: list[str] = field(default_factory=list)  # datasets whose decoding was not measured (no files)
    # run_key -> its solves on frozen features (execution/solve_price.py), at the pace measured here
    solves: dict[str, float] = field(default_factory=dict)

    def of(self, run_key: str) -> float:
        return self.decode.get(run_key, 0.0) + self.weights.get(run_key, 0.0) + self.solves.get(run_key, 0.0)


def decode_seconds(group: Group) -> float | None:
    """One core's seconds per image decoding and resizing the group's images as its DataLoader
    workers do (vitbench/datasets/transformed.py, the group's own preprocessing), timed on up to
    SAMPLE_IMAGES of its first split spread from first to last; None where its data is not here."""
    from vitbench.datasets.transformed import TransformedSplit

    split = group.splits.get(get_protocol(group.protocol).splits(group.dataset)[0])
    if group.absent is not None or split is None or not len(split):
        return None
    transform = group.preprocessing.transform(uint8=True)
    data = TransformedSplit(split, transform, batched=hasattr(transform, "batch"))
    # a batched transform finishes in collate_batch (the TensorFlow-style resize): timed with the items
    return seconds_per_item(len(split), data.__getitem__, data.collate_batch)


def seconds_per_item(n: int, item: Callable[[int], object], finish: Callable[[list], object] | None = None) -> float:
    """Seconds per item of `item(position)` over up to SAMPLE_IMAGES positions spread from the first
    of `n` to the last (fewer where they take over SAMPLE_SECONDS), `finish(items)` included. Each
    timed as a quiet machine takes it: the fastest of REPEATS, each read by machine_load.Stopwatch
    (the wait for a core other work holds left out); then the median item's time, not the mean. On a
    machine doing other work a few items wait for a core: the mean of sixteen single timings moved two
    dry runs of one plan 10 % apart (CI, the k-NN + linear plan), the median of them 12 %."""
    items, seconds = [], []
    start = time.perf_counter()
    for index in np.unique(np.linspace(0, n - 1, min(n, SAMPLE_IMAGES)).astype(int)):
        fastest = float("inf")
        for _ in range(REPEATS):
            began = Stopwatch.start()
            done = item(int(index))
            fastest = min(fastest, began.seconds())
        items.append(done)
        seconds.append(fastest)
        if time.perf_counter() - start > SAMPLE_SECONDS:
            break
    began = Stopwatch.start()
    if finish is not None:
        finish(items)
    return float(np.median(seconds)) + began.seconds() / len(items)


def read_seconds(path: str) -> float:
    """Seconds reading the weights file takes here: its first READ_BYTES timed, scaled to its size
    (0 for random init, or a file not here yet: a dry run's weights to be fetched or pre-trained)."""
    try:
        size = os.path.getsize(path)
        start = time.perf_counter()
        with open(path, "rb") as f:
            read = len(f.read(READ_BYTES))
    except OSError:
        return 0.0
    return (time.perf_counter() - start) * size / max(read, 1)


def measure(
    groups: list[Group],
    images: dict[str, float],
    device_seconds: dict[str, float],
    build: dict[tuple[str, int], float],
    startup: float,
    workers: int,
) -> Beside:
    """Each planned run's decoding (`images` it reads, at its group's measured pace: on a CPU the
    model's threads hold every core, so the workers' decoding takes all its time from them (measured:
    500 ImageNet JPEGs added 1.7 s to 6 s of passes here); on an accelerator the workers decode while
    the device computes, so only what outlasts `device_seconds` counts; with no workers, all of it)
    and weights (made once per group that passes images, or once per run of a protocol that trains
    its own copy), as `Beside`."""
    beside = Beside(startup=startup)
    reads: dict[str, float] = {}  # a weights file several groups load is timed once
    paces: dict[tuple, float | None] = {}  # and a split's decoding
    for group in groups:
        keys = [s.run_key for s in group.specs if images.get(s.run_key, 0.0) > 0]
        if not keys:
            continue
        split_name = get_protocol(group.protocol).splits(group.dataset)[0]
        where = (group.dataset.name, split_name, group.res, repr(group.preprocessing), group.absent)
        if where not in paces:  # few-shot, k-NN and the probe of one dataset read the same files
            paces[where] = decode_seconds(group)
        pace = paces[where]
        if pace is None:
            beside.unmeasured.append(group.dataset.name)
        for key in keys:
            if pace is None:
                break
            one_core = images[key] * pace
            if workers == 0 or group.runtime.device.type == "cpu":
                beside.decode[key] = one_core
            else:
                beside.decode[key] = max(0.0, one_core / workers - device_seconds.get(key, 0.0))
        if group.weights.path not in reads:
            reads[group.weights.path] = read_seconds(group.weights.path)
        load = build.get((group.model.name, group.res), 0.0) + reads[group.weights.path]
        for key in keys if isinstance(get_protocol(group.protocol), Trainer) else keys[:1]:
            beside.weights[key] = load
    return beside

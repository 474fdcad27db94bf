"""`vitbench bench`: how fast vitbench's own loops run on this machine, and against what.

For each (model, resolution) it measures images/s of
- the fine-tuning step (`training.train`: forward, loss, backward, clip, SGD, schedule, curves)
  and feature extraction (`inference.run_over`), each fed twice: with one synthetic batch already
  on the device (the compute ceiling) and with the real input pipeline over a real dataset (so an
  input-bound run shows as such: the `real / synthetic` ratio);
- a bare loop on the same synthetic batch (forward, loss, backward, clip, step; no scheduler,
  curves or data path): the ratio vitbench / bare is what vitbench's loop costs;
- timm's own `benchmark.py`, when a copy is given (`--timm-benchmark`; it ships with timm's
  repository, not with its wheel), at the same model, resolution, batch and precision.

MFU is achieved FLOP/s over the device's dense bf16 peak: training does 3 forward passes' worth
(6 x multiply-adds) per image, inference one. Beside it, on every device (a CPU has no data-sheet
peak), the same FLOP/s over what a large square matrix product reaches here at the run's precision
(`matmul_peak`): the floor a protocol's extraction is measured against (issue 46, goal 3). Peak
memory is CUDA's peak allocation. Every row is
stored in the `bench` table with the device, versions and command; `vitbench table --bench`.
"""

from __future__ import annotations

import functools
import logging
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from vitbench.catalog.registry import get_dataset, get_model
from vitbench.datasets import Split
from vitbench.engine import optimization, training
from vitbench.engine.bench_timm import timm_row
from vitbench.engine.bench_types import Config, Options, Row
from vitbench.engine.device_data import choose, decodes_on_device
from vitbench.engine.distributed import World
from vitbench.engine.inference import run_over
from vitbench.host.devices import autocast, device_name, peak_flops, resolve_precision
from vitbench.models.backend import ModelSpec, Preprocessing
from vitbench.provenance import environment
from vitbench.weights import RANDOM, build_model

log = logging.getLogger("vitbench")

# The configurations: the paper's fine-tuning resolutions for each family
GPU_CONFIGS = ("vit-b/16@224", "vit-b/16@384", "vit-l/16@384", "r50+vit-b/16@384", "bit-m-r50x1@448")
CPU_CONFIGS = ("vit-ti/16@64",)  # a tiny model: a CPU checks the loops, not the hardware


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn: Callable[[], object], device: torch.device) -> float:
    _sync(device)
    start = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - start


def _fresh_model(spec: ModelSpec, res: int, num_classes: int) -> nn.Module:

    return build_model(spec, num_classes, res, RANDOM)  # speed does not depend on the weights


def _repeat(split: Split, n: int, name: str) -> Split:
    """`n` images of `split` (cycled when it has fewer), as a split of their own."""
    return split.subset(name, np.arange(n) % len(split))


def _synthetic_split(n: int, res: int, num_classes: int) -> Split:
    """Random uint8 images already at the model's resolution (the eval resize is then a no-op)."""
    generator = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (n, res, res, 3), dtype=torch.uint8, generator=generator)
    labels = torch.randint(0, num_classes, (n,), generator=generator).numpy()
    return Split("synthetic", "bench", labels, "synthetic", "synthetic", images=images.numpy())


def matmul_peak(device: torch.device, precision: str) -> float:
    """FLOP/s of this device's dense square matrix product at `precision` (the fastest of a few):
    what its matmul units reach in practice, the ceiling for a transformer whose FLOPs are nearly all
    matmuls. Measured, not read off a data sheet: a 2-core VM or a power-capped GPU has no sheet."""
    n = 8192 if device.type == "cuda" else 2048  # fp32 on a GPU: TF32 where torch allows it, as the model's run
    dtype = torch.bfloat16 if device.type == "cuda" and precision == "bf16" else torch.float32
    generator = torch.Generator().manual_seed(0)
    a, b = (torch.randn(n, n, generator=generator).to(device, dtype) for _ in range(2))
    a @ b  # warm-up: the library picks its kernel
    seconds = min(_timed(lambda: a @ b, device) for _ in range(10))
    return 2 * n**3 / seconds


# --- training ---------------------------------------------------------------------------------------


def train_vitbench(spec: ModelSpec, cfg: Config, opts: Options, split: Split, pipeline: str, num_classes: int) -> Row:
    """Images/s of `training.train` over `opts.steps` steps after `opts.warmup` untimed ones."""

    chosen = "synthetic" if pipeline == "synthetic" else choose(pipeline, opts.device)
    on_device = decodes_on_device(pipeline)
    settings = training.Settings(
        steps=opts.warmup + opts.steps,
        batch=opts.batch,
        lr=1e-3,
        warmup=0,
        res=cfg.res,
        crop="inception",
        flip=True,
        precision=opts.precision,
        micro_batch=opts.micro_batch,
        compile=opts.compile,
        channels_last=bool(spec.backend and spec.backend.channels_last) and opts.device.type == "cuda",
        workers=opts.workers,
        input_pipeline=chosen,
        decode_on_device=on_device,
        log_every=10**9,
        checkpoint_every=10**9,
        timed_from=opts.warmup,
    )
    model = _fresh_model(spec, cfg.res, num_classes)
    with tempfile.TemporaryDirectory() as tmp:
        outcome = training.train(
            model, split, settings, spec.preprocessing.at(cfg.res), opts.device, World(), Path(tmp) / "ckpt.pt",
            "bench", description=f"bench {cfg} train",
        )  # fmt: skip
    return Row(
        cfg,
        "train",
        "vitbench",
        "synthetic" if pipeline == "synthetic" else split.dataset,
        opts.steps * opts.batch / outcome.timed_seconds,
        opts.batch,
        outcome.micro_batch,
        outcome.checkpointing,
        chosen if pipeline == "synthetic" else pipeline_label(pipeline, opts.device),
        outcome.peak_memory_bytes,
        notes={"memory_plan": outcome.memory_plan},
    )


def train_bare(spec: ModelSpec, cfg: Config, opts: Options, micro: int, checkpointing: bool, num_classes: int) -> Row:
    """The hand-written step on one batch on the device, at vitbench's micro-batch and checkpointing."""
    device = opts.device
    model = _fresh_model(spec, cfg.res, num_classes).to(device).train()
    if checkpointing:
        model.set_grad_checkpointing(True)  # type: ignore[operator]
    forward = torch.compile(model) if opts.compile else model
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(params, lr=1e-3, momentum=training.MOMENTUM, fused=optimization.fusable(params))
    generator = torch.Generator().manual_seed(0)
    x = (torch.rand(micro, 3, cfg.res, cfg.res, generator=generator) * 2 - 1).to(device)
    y = torch.randint(0, num_classes, (micro,), generator=generator).to(device)
    accum = opts.batch // micro

    def step() -> None:
        for _ in range(accum):
            with autocast(device, opts.precision):
                logits = forward(x)
            (F.cross_entropy(logits.float(), y) / accum).backward()
        nn.utils.clip_grad_norm_(params, training.CLIP_NORM)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(opts.warmup):
        step()
    seconds = _timed(lambda: [step() for _ in range(opts.steps)], device)  # type: ignore[func-returns-value]
    return Row(cfg, "train", "bare", "synthetic", opts.steps * opts.batch / seconds, opts.batch, micro, checkpointing)


# --- inference --------------------------------------------------------------------------------------


def inference_vitbench(spec: ModelSpec, cfg: Config, opts: Options, split: Split, pipeline: str) -> Row:
    """Images/s of `inference.run_over` (the few-shot extraction loop), after one untimed batch."""

    assert spec.backend is not None
    backend = spec.backend

    def features(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
        with autocast(opts.device, opts.precision):
            return backend.features(m, x)

    model = _fresh_model(spec, cfg.res, 0).to(opts.device)
    if opts.compile:
        model = torch.compile(model)  # type: ignore[assignment]
    if pipeline == "synthetic":  # already at the resolution, on the device: the resize is a no-op
        pre, pipeline = Preprocessing(size=cfg.res, crop_pct=1.0), "device"
    else:
        pre = spec.preprocessing.at(cfg.res)
    n = opts.batch * opts.steps

    def run(images: Split) -> None:
        run_over(features, model, images, pre, opts.device, opts.batch, opts.workers, "bench", False, pipeline)

    run(_repeat(split, opts.batch * max(1, opts.warmup), "warmup"))
    timed = _repeat(split, n, "bench")
    if opts.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(opts.device)
    seconds = _timed(lambda: run(timed), opts.device)
    peak = torch.cuda.max_memory_allocated(opts.device) if opts.device.type == "cuda" else None
    data = "synthetic" if pipeline == "synthetic" else split.dataset
    label = "device" if data == "synthetic" else pipeline_label(pipeline, opts.device)
    return Row(cfg, "inference", "vitbench", data, n / seconds, opts.batch, None, False, label, peak)


def pipeline_label(pipeline: str, device: torch.device) -> str:
    """The input pipeline a bench row measured: workers, device, or device with image files decoded
    there too (nvjpeg on a GPU: `--input-pipeline device`)."""
    chosen = choose(pipeline, device)
    return "device (nvjpeg)" if chosen == "device" and decodes_on_device(pipeline) and device.type == "cuda" else chosen


def inference_bare(spec: ModelSpec, cfg: Config, opts: Options) -> Row:
    assert spec.backend is not None
    device = opts.device
    model = _fresh_model(spec, cfg.res, 0).to(device).eval()
    forward = torch.compile(model) if opts.compile else model
    x = (torch.rand(opts.batch, 3, cfg.res, cfg.res, generator=torch.Generator().manual_seed(0)) * 2 - 1).to(device)

    backend = spec.backend

    @torch.inference_mode()
    def step() -> None:
        with autocast(device, opts.precision):
            backend.features(forward, x).float()  # type: ignore[arg-type]

    for _ in range(max(1, opts.warmup)):
        step()
    seconds = _timed(lambda: [step() for _ in range(opts.steps)], device)
    return Row(cfg, "inference", "bare", "synthetic", opts.steps * opts.batch / seconds, opts.batch)


# --- timm's benchmark.py ----------------------------------------------------------------------------


# --- one configuration, every runner -------------------------------------------------------------------


def real_split(opts: Options, mode: str) -> Split:

    dataset = get_dataset(opts.dataset)
    name = dataset.transfer_splits[0] if mode == "train" else dataset.transfer_splits[1]
    return dataset.load_split(opts.data_dir, name)


def measure_config(cfg: Config, opts: Options) -> list[Row]:
    """Every row for one configuration; MFU filled in from the device's peak where it is known."""

    spec = get_model(cfg.model)
    assert spec.backend is not None
    flops = spec.backend.flops_per_image(spec, cfg.res)
    # the matmul peak, before and after the runners (the faster kept): on a shared machine one
    # measurement alone was seen 25 % low
    measured = matmul_peak(opts.device, opts.precision)
    rows: list[Row] = []
    if "train" in opts.modes:
        train = real_split(opts, "train")
        classes = int(train.labels.max()) + 1
        fake = _synthetic_split(opts.batch, cfg.res, classes)
        plan: dict[str, Row] = {}  # the bare loop runs at the micro-batch and checkpointing vitbench chose

        def synthetic() -> Row:
            plan["row"] = train_vitbench(spec, cfg, opts, fake, "synthetic", classes)
            return plan["row"]

        def bare() -> Row:
            chosen = plan["row"]
            assert chosen.micro_batch is not None
            return train_bare(spec, cfg, opts, chosen.micro_batch, chosen.checkpointing, classes)

        log.info("bench %s: training step (synthetic on the device, %s, bare loop)", cfg, train.dataset)
        real = functools.partial(train_vitbench, spec, cfg, opts, train, opts.input_pipeline, classes)
        rows += alternately({"synthetic": synthetic, "real": real, "bare": bare}, opts.rounds)
        if opts.timm_script:
            rows += timm_row(spec, cfg, opts, "train", plan["row"], classes)
    if "inference" in opts.modes:
        test = real_split(opts, "inference")
        log.info("bench %s: feature extraction (synthetic on the device, %s, bare loop)", cfg, test.dataset)
        runners = {
            "synthetic": functools.partial(
                inference_vitbench, spec, cfg, opts, _synthetic_split(opts.batch, cfg.res, 1), "synthetic"
            ),
            "real": functools.partial(inference_vitbench, spec, cfg, opts, test, opts.input_pipeline),
            "bare": functools.partial(inference_bare, spec, cfg, opts),
        }
        rows += alternately(runners, opts.rounds)
        if opts.timm_script:
            rows += timm_row(spec, cfg, opts, "inference", None, 0)
    peak = peak_flops(device_name(opts.device)) if opts.device.type == "cuda" else None
    measured = max(measured, matmul_peak(opts.device, opts.precision))
    for row in rows:
        per_image = 3 * flops if row.mode == "train" else flops
        row.notes["flops_per_image"] = flops
        row.notes["matmul_peak_flops"] = measured
        row.notes["of_matmul_peak"] = per_image * row.images_per_second / measured
        if peak:
            row.mfu = per_image * row.images_per_second / peak
    return rows


def alternately(runners: Mapping[str, Callable[[], Row]], rounds: int) -> list[Row]:
    """Each runner once per round, the order reversed every other round (the first runner always
    starts round 0); per runner, the round with the median throughput, all rounds in its notes."""
    found: dict[str, list[Row]] = {name: [] for name in runners}
    for r in range(rounds):
        for name in list(runners)[:: 1 if r % 2 == 0 else -1]:
            found[name].append(runners[name]())
    kept = []
    for measured in found.values():
        ordered = sorted(measured, key=lambda row: row.images_per_second)
        row = ordered[(len(ordered) - 1) // 2]
        row.notes["rounds"] = [round(x.images_per_second, 2) for x in measured]
        kept.append(row)
    return kept


def to_records(rows: list[Row], opts: Options, bench_id: str) -> list[dict]:
    """The rows as `bench` table records, with the device, versions and command."""

    env = environment()
    created = datetime.now(UTC).isoformat()
    out = []
    for row in rows:
        notes = {**row.notes, "weights": "random (throughput does not depend on them)", "rounds_run": opts.rounds}
        out.append(
            {
                "bench_id": bench_id,
                "created_at": created,
                "model": row.config.model,
                "arch": get_model(row.config.model).arch,
                "res": row.config.res,
                "mode": row.mode,
                "runner": row.runner,
                "data": row.data,
                "input_pipeline": row.input_pipeline,
                "batch": row.batch,
                "micro_batch": row.micro_batch,
                "activation_checkpointing": row.checkpointing,
                "precision": opts.precision,
                "compile": opts.compile,
                "steps": opts.steps,
                "warmup_steps": opts.warmup,
                "images_per_second": row.images_per_second,
                "mfu": row.mfu,
                "peak_memory_bytes": row.peak_memory_bytes,
                "flops_per_image": row.notes.get("flops_per_image"),
                "device": opts.device.type,
                "device_name": device_name(opts.device),
                "device_count": 1,
                **env,
                "notes": notes,
            }
        )
    return out


def with_defaults(opts: Options) -> Options:
    """bf16 on a GPU, fp32 on a CPU (which has no fast bf16 path)."""
    return replace(opts, precision=resolve_precision(opts.precision, opts.device.type))

"""timm's own `benchmark.py` (from timm's repository; not in its wheel) run in a subprocess at the
configuration vitbench measured: the same architecture and constructor keywords, image size,
batch, precision, compile, and for training the micro-batch, activation checkpointing, memory
layout and optimizer vitbench used; every difference that remains is recorded with the row."""

from __future__ import annotations

import ast
import gc
import json
import logging
import os
import subprocess
import sys
from dataclasses import dataclass

from vitbench.catalog.registry import get_model
from vitbench.engine.bench_types import Config, Options, Row
from vitbench.errors import UserError
from vitbench.models.backend import ModelSpec

log = logging.getLogger("vitbench")

# benchmark.py logs every `num_bench_iter // 5` steps: fewer than 5 timed iterations divide by zero
TIMM_MIN_TIMED_ITERATIONS = 5


def _timm_literal(value: object) -> object:
    """What benchmark.py's `ParseKwargs` makes of `key=<text>` (timm/utils/misc.py)."""
    text = value if isinstance(value, str) else repr(value)
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def timm_model_args(spec: ModelSpec, res: int) -> list[str]:
    """benchmark.py's model arguments for the architecture vitbench builds at `res`: the same timm
    name and constructor keywords (`img_size` for ViTs and hybrids), so both sides run the same
    network at the same image size. A one-line error where the script cannot express it."""
    import timm

    assert spec.backend is not None
    if not timm.is_model(spec.arch):
        raise UserError(
            f"--timm-benchmark: {spec.name} builds {spec.arch}, which timm {timm.__version__} does not know"
        )
    kwargs = spec.backend.timm_kwargs(res)
    for key, value in kwargs.items():
        if _timm_literal(value) != value:
            raise UserError(
                f"--timm-benchmark: {spec.name}@{res} needs {key}={value!r}, which benchmark.py's "
                "--model-kwargs cannot express (it takes Python literals or plain strings)"
            )
    args = ["--model", spec.arch, "--img-size", str(res)]
    if kwargs:
        args += ["--model-kwargs", *(f"{k}={v if isinstance(v, str) else repr(v)}" for k, v in kwargs.items())]
    return args


def check_timm_configs(configs: list[Config], opts: Options) -> None:
    """Refuse, before anything is measured, a configuration that timm's script cannot run as vitbench does."""

    if opts.timm_script is None:
        return
    if opts.device.type not in ("cpu", "cuda"):
        raise UserError(f"--timm-benchmark: benchmark.py runs on cpu or cuda, not {opts.device.type}")
    for cfg in configs:
        timm_model_args(get_model(cfg.model), cfg.res)


@dataclass(frozen=True)
class TimmRun:
    """One benchmark.py command line, the batch it times, and where it differs from vitbench's loop."""

    args: list[str]
    batch: int
    differences: list[str]


def timm_run(spec: ModelSpec, cfg: Config, opts: Options, mode: str, vitbench_row: Row | None, classes: int) -> TimmRun:
    """benchmark.py at vitbench's model, image size, precision, compile and (train) the micro-batch,
    activation checkpointing and memory layout vitbench chose: timm's script does not accumulate,
    so each of its steps is one of vitbench's micro-batch passes plus an optimizer step."""
    train = mode == "train"
    micro = vitbench_row.micro_batch if train and vitbench_row and vitbench_row.micro_batch else opts.batch
    iterations = opts.steps * (opts.batch // micro if train else 1)
    timed = max(TIMM_MIN_TIMED_ITERATIONS, iterations)
    args = [
        "--bench", "train" if train else "inference",
        *timm_model_args(spec, cfg.res),
        # vitbench's features have no head (num_classes 0); its train step has `classes` outputs
        "--num-classes", str(classes if train else 0),
        "-b", str(micro),
        "--num-warm-iter", str(max(1, opts.warmup)),
        "--num-bench-iter", str(timed),
        "--device", opts.device.type,
        "--no-retry",  # a smaller batch than asked would be a different measurement
    ]  # fmt: skip
    differences = []
    if train:
        # timm's "sgd" is Nesterov; vitbench's step is plain momentum 0.9 without weight decay,
        # which timm calls "momentum" (its create_optimizer_v2 defaults: momentum 0.9, no decay)
        args += ["--opt", "momentum"]
        differences.append("timm's train step does not clip gradients (vitbench clips the global norm at 1)")
        if micro < opts.batch:
            differences.append(f"timm steps the optimizer every {micro} images (vitbench accumulates {opts.batch})")
        if vitbench_row is not None and vitbench_row.checkpointing:
            args.append("--grad-checkpointing")
        # as fine-tuning chooses
        if spec.backend is not None and spec.backend.channels_last and opts.device.type == "cuda":
            args.append("--channels-last")
    if opts.precision == "bf16":
        args += ["--amp", "--amp-dtype", "bfloat16"]
    if opts.compile:
        args.append("--torchcompile")
    if timed != iterations:
        differences.append(f"timm timed {timed} iterations, vitbench {iterations} (its log interval needs >= 5)")
    return TimmRun(args, micro, differences)


def timm_benchmark(spec: ModelSpec, cfg: Config, opts: Options, mode: str, run: TimmRun) -> Row:
    """timm's `benchmark.py` in a subprocess; its samples/s as a `timm` row."""
    assert opts.timm_script is not None
    env = dict(os.environ)
    if opts.device.type == "cuda":
        import torch

        # this process's caching allocator still holds what vitbench's runs freed (52 GiB after
        # ViT-B/16 @384 at batch 256 on an H100): timm's process would run out of memory beside it
        gc.collect()
        torch.cuda.empty_cache()
        if opts.device.index is not None:  # the script only knows "cuda"
            env["CUDA_VISIBLE_DEVICES"] = str(opts.device.index)
    done = subprocess.run([sys.executable, str(opts.timm_script), *run.args], capture_output=True, text=True, env=env)
    found = timm_result(done.stdout)
    key = "train_samples_per_sec" if mode == "train" else "infer_samples_per_sec"
    if done.returncode != 0 or key not in found:
        last = (done.stderr.strip().splitlines() or [str(found.get("error", "no output"))])[-1]
        raise UserError(f"--timm-benchmark {opts.timm_script}: {cfg} {mode} failed ({last[:200]})")
    notes = {"command": " ".join(["benchmark.py", *run.args]), "differences": run.differences}
    return Row(cfg, mode, "timm", "synthetic", float(found[key]), run.batch, run.batch, notes=notes)


def timm_row(
    spec: ModelSpec, cfg: Config, opts: Options, mode: str, vitbench_row: Row | None, classes: int
) -> list[Row]:
    """timm's row, or none with a warning: a failing external script must not cost the rows
    vitbench already measured for this configuration."""
    try:
        return [timm_benchmark(spec, cfg, opts, mode, timm_run(spec, cfg, opts, mode, vitbench_row, classes))]
    except UserError as e:
        log.warning("%s; stored without timm's row", e)
        return []


def timm_result(stdout: str) -> dict:
    """The JSON that benchmark.py prints after its `--result` line."""
    _, marker, rest = stdout.partition("--result")
    if not marker:
        return {}
    try:
        return json.loads(rest)
    except ValueError:
        return {}

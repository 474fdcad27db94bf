"""The fine-tuning protocol inside a benchmark run: which RunSpecs a dataset gets (the dev LR
sweep, then the final seeds) and how each is trained, scored and recorded. The training loop
itself is `finetune.train`; planning and storage are the runner's."""

from __future__ import annotations

from datetime import UTC, datetime

import torch

from vitbench import evaluate, finetune
from vitbench.backend import ModelSpec
from vitbench.datasets import DatasetSpec, Split
from vitbench.device_data import choose as choose_pipeline
from vitbench.inference import run_over
from vitbench.provenance import Clock
from vitbench.runner import Group, Recorder, Request, RunSpec
from vitbench.store import shard_dir
from vitbench.weights import build_model


def plan_specs(
    req: Request, model: ModelSpec, weights_sha: str, dataset: DatasetSpec, splits: dict[str, Split], common: dict
) -> list[RunSpec]:
    """The dev sweep (one run per LR of Table 4's grid, seed 0, train on the sweep's train split,
    scored on its dev split), then the final runs (one per seed, on the full train split) whose LR
    is the sweep's best. With --lr, or a one-value grid (VTAB), there is nothing to choose: no sweep."""
    from vitbench.provenance import resolve_device

    steps, grid = finetune.table4(dataset, len(splits[dataset.final_splits[0]]))
    if req.smoke:
        steps = finetune.SMOKE_STEPS
    steps = req.steps or steps
    batch = req.batch or (finetune.SMOKE_BATCH if req.smoke else finetune.BATCH)
    precision = req.precision
    if precision == "auto":
        precision = "bf16" if resolve_device(req.device).type == "cuda" else "fp32"
    warmup = finetune.warmup_steps(steps)
    hparams = {
        **common,
        "steps": steps,
        "batch": batch,
        "warmup": warmup,
        "warmup_source": "vit_jax/big_vision default, not in the paper",
        "optimizer": f"sgd(momentum={finetune.MOMENTUM}, wd=0)",
        "clip_global_norm": finetune.CLIP_NORM,
        "schedule": "linear warmup, cosine to 0",
        "head": "zero-init linear (pre-training head and pre_logits dropped)",
        "train_aug": ("inception_crop(area=0.05..1)" if dataset.train_crop else f"resize({common['res']})")
        + ("|flip_lr" if dataset.train_flip else ""),
        "precision": precision,
        "polyak": req.polyak,
        "dropout": model.dropout,
        "smoke": req.smoke,
    }
    sweep = req.lr is None and len(grid) > 1
    specs = []
    if sweep:
        train_on = splits[dataset.sweep_splits[0]]
        for lr in grid:
            h = {**hparams, "stage": "sweep", "lr": lr, "splits": list(dataset.sweep_splits)}
            specs.append(_spec(model, weights_sha, dataset, train_on, h, seed=0))
    final_lr: float | str = req.lr if req.lr is not None else ("best-on-dev" if sweep else grid[0])
    train_on = splits[dataset.final_splits[0]]
    for seed in req.seeds:
        h = {**hparams, "stage": "final", "lr": final_lr, "lr_grid": list(grid) if sweep else None}
        h["splits"] = list(dataset.final_splits)
        specs.append(_spec(model, weights_sha, dataset, train_on, h, seed))
    return specs


def _spec(
    model: ModelSpec, weights_sha: str, dataset: DatasetSpec, train_on: Split, hparams: dict, seed: int
) -> RunSpec:
    return RunSpec(
        model.name,
        weights_sha,
        dataset.name,
        train_on.source,
        train_on.fingerprint,
        finetune.PROTOCOL,
        finetune.VERSION,
        hparams,
        seed,
    )


def execute(group: Group, todo: list[RunSpec], req: Request, device: torch.device, recorder: Recorder) -> None:
    """The sweep runs first, then the final runs with the LR the sweep chose (read from the store,
    so a final run can follow a sweep made by an earlier command)."""
    from vitbench.distributed import barrier, broadcast

    world = recorder.world
    sweep = [s for s in group.specs if s.hparams["stage"] == "sweep"]
    for spec in todo:
        h = spec.hparams
        chosen: dict = {}
        lr = h["lr"]
        if lr == "best-on-dev":
            chosen = broadcast(recorder.sweep_choice(sweep) if world.is_main else None, world)
            lr = chosen["lr"]
        settings = _finetune_settings(group, spec, lr, req, device)
        started = datetime.now(UTC)
        model = build_model(
            group.model,
            group.dataset.num_classes,
            group.res,
            group.weights,
            h["gelu"],
            pre_logits=False,  # the whole pre-training head goes (B.1.1)
            dropout=h["dropout"],
        )
        what = f"{group.model.name} · {group.dataset.name} {h['stage']} lr={lr:g} seed={spec.seed}"
        checkpoint = shard_dir(req.results) / spec.run_key / "checkpoint.pt"
        train_split = group.splits[h["splits"][0]]
        outcome = finetune.train(
            model, train_split, settings, group.preprocessing, device, world, checkpoint, spec.run_key,
            req.skip_corrupt, what,
        )  # fmt: skip
        if world.is_main:  # one process scores the test (or dev) split; the others wait
            _score_finetuned(group, spec, settings, outcome, chosen, started, req, device, recorder, what)
            checkpoint.unlink(missing_ok=True)  # the result is stored: the checkpoint has done its job
            if checkpoint.parent.is_dir() and not any(checkpoint.parent.iterdir()):
                checkpoint.parent.rmdir()
        barrier(world)


def _finetune_settings(group: Group, spec: RunSpec, lr: float, req: Request, device: torch.device) -> finetune.Settings:
    """The run's hparams (what changes its numbers) plus this machine's choices (what changes speed)."""
    h = spec.hparams
    return finetune.Settings(
        steps=h["steps"],
        batch=h["batch"],
        lr=lr,
        warmup=h["warmup"],
        res=h["res"],
        crop=group.dataset.train_crop,
        flip=group.dataset.train_flip,
        precision=h["precision"],
        polyak=h["polyak"],
        seed=spec.seed,
        micro_batch=req.micro_batch,
        compile=req.compile,
        channels_last=group.model.family in ("bit", "hybrid") and device.type == "cuda",
        workers=req.workers,
        input_pipeline=choose_pipeline(req.input_pipeline, device),
        log_every=max(1, min(50, h["steps"] // 10)),
        checkpoint_every=req.checkpoint_every or finetune.checkpoint_interval(h["steps"]),
    )


def _score_finetuned(
    group: Group,
    spec: RunSpec,
    settings: finetune.Settings,
    outcome: finetune.Outcome,
    chosen: dict,
    started: datetime,
    req: Request,
    device: torch.device,
    recorder: Recorder,
    what: str,
) -> None:
    """Score the fine-tuned weights on the run's scored split (dev for a sweep run, test for a
    final one) and record accuracy, throughput, MFU, cost and curves."""
    world, stage = recorder.world, spec.hparams["stage"]
    train_split, scored_split = (group.splits[n] for n in spec.hparams["splits"])
    eval_clock = Clock(device)
    with eval_clock:
        logits = run_over(
            finetune.logits_fn(device, settings.precision), outcome.model, scored_split, group.preprocessing,
            device, req.batch_size, req.workers, f"{what} · {scored_split.name}", req.skip_corrupt,
            req.input_pipeline,
        )  # fmt: skip
    real = [scored_split.real_labels[i] for i in logits.indices] if scored_split.real_labels else None
    scores = evaluate.scores(logits.values, logits.labels, real)
    if stage == "sweep":
        metrics = {"dev_accuracy": scores["accuracy"]}
    else:
        metrics = {**scores, "lr": float(settings.lr)}
        if chosen:
            metrics["dev_accuracy"] = chosen["dev_accuracy"]
    train_seconds = outcome.seconds / world.size  # the training loop's wall-clock seconds
    metrics["train_images_per_second"] = outcome.train_images / max(train_seconds, 1e-9)
    metrics["final_train_loss"] = _last(outcome.curves["train_loss"])
    if outcome.peak_memory_bytes is not None:
        metrics["peak_memory_bytes"] = float(outcome.peak_memory_bytes)
    if recorder.peak:  # achieved training FLOP/s (3 x forward per image) against the devices' bf16 peak
        metrics["mfu"] = (
            3 * recorder.flops_per_image(group) * metrics["train_images_per_second"] / (recorder.peak * world.size)
        )
    recorder.record(
        group,
        spec,
        metrics,
        started,
        seconds=outcome.seconds + eval_clock.seconds,
        images=3.0 * outcome.train_images + len(logits.labels),
        n_train=len(train_split),
        n_test=len(logits.labels),
        skipped=outcome.skipped + logits.skipped,
        notes={
            "stage": stage,
            "scored_split": scored_split.name,
            "sweep": chosen.get("sweep"),
            "restarts": outcome.restarts,
            "micro_batch": outcome.micro_batch,
            "accumulation_steps": settings.batch // (outcome.micro_batch * world.size),
            "compile": settings.compile,
            "sdpa_attention": _fused_attention(),
            "channels_last": settings.channels_last,
            "input_pipeline": settings.input_pipeline,
            "activation_checkpointing": outcome.checkpointing,
            "memory_plan": outcome.memory_plan,
            "train_images": outcome.train_images,
            "train_device_seconds": outcome.seconds,
            "eval_device_seconds": eval_clock.seconds,
        },
        curves=outcome.curves,
    )


def _fused_attention() -> bool:
    """Whether timm's attention runs through F.scaled_dot_product_attention (flash where available)."""
    from timm.layers import use_fused_attn

    return bool(use_fused_attn())


def _last(values: list[float]) -> float:
    return values[-1] if values else float("nan")

"""The paper's fine-tuning protocol (App. B.1.1, Table 4; docs/protocols.md, "Fine-tuning").

For each dataset: a dev LR sweep (one run per LR of Table 4's grid, seed 0, trained on the
sweep's train split and scored on its dev split), then the final runs (one per seed, on the full
train split) with the LR the sweep chose, scored on test. Batch 512, 384 px, the pre-training
head replaced by one zero-initialised linear layer, vit_jax's inception crop + flip for training
(BiT's resize + random crop on VTAB) and a plain resize for evaluation, every resize TensorFlow's.
The training loop itself is engine/training.py.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from vitbench.datasets import DatasetSpec
from vitbench.engine.scoring import Predictions, image_ids, scores
from vitbench.errors import UserError
from vitbench.host.devices import Clock, Runtime
from vitbench.models.backend import ModelSpec, Preprocessing
from vitbench.protocols.base import Group, ModelInputs, Protocol, Recorder, Request, Result, RunSpec, Work
from vitbench.protocols.measures import Metric
from vitbench.protocols.options import FINETUNE_PANEL, limits, option
from vitbench.protocols.recipes import (
    HYPERRULE,
    RECIPES_NOTE,
    hyperrule_hparams,
    runs_hyperrule,
    sweep_choice,
    training_hparams,
)
from vitbench.protocols.shared_options import TrainingOptions, train_order, train_order_hparams
from vitbench.store.shards import checkpoint_path

# The engine (and torch) is imported where a protocol plans or runs: reading its name, label and
# version (tables, `--help`) stays light.
if TYPE_CHECKING:
    from vitbench.engine import training

BATCH = 512
RES = 384
GRID = (0.001, 0.003, 0.01, 0.03)
# Table 4: steps and base-LR grid. (ImageNet's 0.06 is the ResNet/hybrid addition of B.1.1; it sits
# in the ImageNet row of the table, so it is swept here too.)
TABLE4: dict[str, tuple[int, tuple[float, ...]]] = {
    "imagenet": (20_000, (0.003, 0.01, 0.03, 0.06)),
    "cifar10": (10_000, GRID),
    "cifar100": (10_000, GRID),
    "pets": (500, GRID),
    "flowers102": (500, GRID),
}
VTAB_SETTING = (2_500, (0.01,))  # one setting for all 19 tasks (B.1.1)
# --smoke: big_vision's `runlocal` in spirit. A pipeline check, never a number to compare.
SMOKE_STEPS, SMOKE_BATCH, SMOKE_RES = 20, 32, 64


def table4(dataset: DatasetSpec, n_train: int) -> tuple[int, tuple[float, ...]]:
    """(steps, LR grid) for a dataset: Table 4's row; VTAB's one setting; for a dataset the paper
    does not have, BiT-HyperRule's size rule (< 20k images: 500 steps, < 500k: 10k, else 20k)."""
    if dataset.name in TABLE4:
        return TABLE4[dataset.name]
    if dataset.group is not None:
        return VTAB_SETTING
    return (500 if n_train < 20_000 else 10_000 if n_train < 500_000 else 20_000), GRID


def warmup_steps(steps: int) -> int:
    """vit_jax / big_vision defaults (not in the paper): 500 steps, 100 for the 500-step datasets;
    at most a fifth of a shorter custom run, so that there is a decay phase at all."""
    return min(100 if steps <= 500 else 500, steps // 5)


def checkpoint_interval(steps: int) -> int:
    """Steps between checkpoints by default: a tenth of the run, at least 50 (a 500-step run
    still checkpoints) and at most 500 (a ViT-H step can take seconds; a checkpoint, gigabytes)."""
    return min(500, max(50, steps // 10))


def smoke_res(input_multiple: int) -> int:
    """The smallest multiple of the patch size that is at least SMOKE_RES."""
    return input_multiple * math.ceil(SMOKE_RES / input_multiple)


@dataclass(frozen=True)
class FinetuneOptions(TrainingOptions):
    polyak: float | None = option(
        None,
        "finetune: parameter EMA decay (Table 2 ImageNet: 0.9999).",
        panel=FINETUNE_PANEL,
        kind=float,
        bound=limits(float, 0, 1, high_open=True),  # 0: off; 1 would never move the average
    )
    polyak_warmup: bool = option(
        False,
        "finetune: warm the EMA decay up (timm's ModelEmaV3) instead of constant from the pre-trained weights.",
        panel=FINETUNE_PANEL,
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.polyak == 0:  # off, as no --polyak: one value, so one run key
            object.__setattr__(self, "polyak", None)


class Finetune(Protocol):
    name = "finetune"
    Options = FinetuneOptions
    version = "finetune/3"  # 2: TF's inception-crop sampler; 3: TF's resize, BiT's VTAB crop, bilinear always
    summary = "App. B fine-tuning: dev LR sweep, then 3 seeds on the full train split"
    label = "fine-tuned"
    # a sweep run stores its dev accuracy; a final run its test accuracy (and ReaL on ImageNet) and the LR it ran
    metrics = (
        Metric("accuracy", "accuracy", paper=True),
        Metric("accuracy_top5", "top-5 accuracy", paper=True, progress=False),
        Metric("accuracy_real", "ReaL", paper=True),
        Metric("dev_accuracy", "dev accuracy"),
        Metric("lr", "LR", unit="", progress=False),
    )

    def splits(self, dataset: DatasetSpec) -> tuple[str, ...]:
        """The dev sweep's (train on, score on), then the final runs' (train on, report on)."""
        return tuple(dict.fromkeys(dataset.sweep_splits + dataset.transfer_splits))

    def inputs(self, model: ModelSpec, req: Request) -> ModelInputs:
        # evaluated after vit_jax's plain resize, in the weights' value range (not their eval recipe)
        res = smoke_res(model.input_multiple) if FinetuneOptions.of(req).smoke else RES
        return ModelInputs(res, Preprocessing.plain_resize)

    def plan(self, group: Group, req: Request, weights_sha: str, hparams: dict) -> list[RunSpec]:
        """The dev sweep, then the final runs whose LR is the sweep's best. With --lr, or a
        one-value grid (VTAB), there is nothing to choose: no sweep."""
        from vitbench.engine import training
        from vitbench.engine.device_data import decoder_hparams
        from vitbench.engine.train_data import describe_train_aug

        dataset, splits, model, o = group.dataset, group.splits, group.model, FinetuneOptions.of(req)
        steps, grid = table4(dataset, len(splits[dataset.transfer_splits[0]]))
        if o.smoke:
            steps = SMOKE_STEPS
        steps = o.steps or steps
        batch = o.batch or (SMOKE_BATCH if o.smoke else BATCH)
        hparams = {
            **hparams,
            "steps": steps,
            "batch": batch,
            "warmup": warmup_steps(steps),
            "warmup_source": "vit_jax/big_vision default, not in the paper",
            "optimizer": f"sgd(momentum={training.MOMENTUM}, wd=0)",
            "clip_global_norm": training.CLIP_NORM,
            "schedule": "linear warmup, cosine to 0",
            "head": "zero-init linear (pre-training head and pre_logits dropped)",
            "train_aug": describe_train_aug(dataset.train_crop, hparams["res"])
            + ("|flip_lr" if dataset.train_flip else ""),
            "precision": group.runtime.precision,
            **decoder_hparams(group.runtime.input_pipeline, group.runtime.device, None, [*splits.values()]),
            "polyak": o.polyak,
            "dropout": model.dropout,
            "smoke": o.smoke,
            **train_order_hparams(o, splits[dataset.transfer_splits[0]]),
        }
        if o.polyak_warmup:  # recorded only when asked for: the default keeps its run keys
            if o.polyak is None:
                raise UserError("--polyak-warmup: warms up the decay of --polyak; give --polyak 0.9999 too")
            hparams["polyak_warmup"] = "timm ModelEmaV3: decay min(polyak, 1 - (1 + step)^(-2/3))"
        hyperrule = runs_hyperrule(group, o)
        if hyperrule:
            hparams["recipes"] = RECIPES_NOTE
        sweep = o.lr is None and (len(grid) > 1 or hyperrule)
        specs = []
        if sweep:
            train_on = splits[dataset.sweep_splits[0]]
            for lr in grid:
                h = {**hparams, "stage": "sweep", "lr": lr, "splits": list(dataset.sweep_splits)}
                specs.append(self.base_spec(group, train_on, weights_sha, h, seed=0))
            if hyperrule:
                recipe = hyperrule_hparams(group, o, hparams["res"], steps)
                h = {**hparams, "stage": "sweep", "lr": recipe["lr"], "splits": list(dataset.sweep_splits)}
                specs.append(self.base_spec(group, train_on, weights_sha, {**h, "recipe": recipe}, seed=0))
        final_lr: float | str = o.lr if o.lr is not None else ("best-on-dev" if sweep else grid[0])
        train_on = splits[dataset.transfer_splits[0]]
        for seed in o.seeds:
            h = {**hparams, "stage": "final", "lr": final_lr, "lr_grid": list(grid) if sweep else None}
            h["splits"] = list(dataset.transfer_splits)
            specs.append(self.base_spec(group, train_on, weights_sha, h, seed))
        return specs

    def run(
        self, group: Group, todo: list[RunSpec], req: Request, runtime: Runtime, recorder: Recorder
    ) -> Iterator[Result]:
        """The sweep runs first, then the final runs with the LR the sweep chose (read from the store,
        so a final run can follow a sweep made by an earlier command)."""
        from vitbench.engine import train_checkpoint, training
        from vitbench.engine.distributed import barrier, broadcast
        from vitbench.weights.loading import build_model

        world = recorder.world
        sweep = [s for s in group.specs if s.hparams["stage"] == "sweep"]
        for spec in todo:
            chosen: dict = {}
            lr = spec.hparams["lr"]
            if lr == "best-on-dev":
                chosen = broadcast(sweep_choice(sweep, recorder) if world.is_main else None, world)
                lr = chosen["lr"]
            # the settings of the recipe this run trains with (the HyperRule's, where it won or is run)
            h = training_hparams(spec.hparams, chosen.get("recipe") if chosen else spec.hparams.get("recipe"))
            settings = _settings(group, spec.seed, h, lr, req, runtime)
            started = datetime.now(UTC)
            model = build_model(
                group.model,
                group.dataset.num_classes,
                h["res"],
                group.weights.path,
                h["gelu"],
                pre_logits=False,  # the whole pre-training head goes (B.1.1)
                dropout=h["dropout"],
            )
            what = f"{group.model.name} · {group.dataset.name} {h['stage']} lr={lr:g} seed={spec.seed}"
            checkpoint = checkpoint_path(req.results, spec.run_key)
            train_split = group.splits[h["splits"][0]]
            outcome = training.train(
                model, train_split, settings, group.preprocessing, runtime.device, world, checkpoint, spec.run_key,
                runtime.skip_corrupt, what,
            )  # fmt: skip
            if world.is_main:  # one process scores the test (or dev) split; the others wait
                yield _score(group, spec, settings, outcome, chosen, started, runtime, recorder, what)
                train_checkpoint.discard(checkpoint)  # (once the result is stored)
            barrier(world)

    def work(self, group: Group) -> Work:
        """Each run trains on steps × batch images (the HyperRule's steps where it uses its recipe),
        then scores its split; one cluster job per run, the final runs that take the sweep's LR
        waiting for the sweep (a second wave); data-parallel training (engine/training.py)."""
        images: dict[str, dict[str, float]] = {}
        waves: list[list[list[RunSpec]]] = [[], []]
        for spec in group.specs:
            h = training_hparams(spec.hparams, spec.hparams.get("recipe"))
            images[spec.run_key] = {"train": h["steps"] * h["batch"], "inference": len(group.splits[h["splits"][1]])}
            waves[1 if spec.hparams.get("lr") == "best-on-dev" else 0].append([spec])
        return Work(images, waves)

    def describe(self, spec: RunSpec) -> str:
        h = training_hparams(spec.hparams, spec.hparams.get("recipe"))
        recipe = f" {HYPERRULE}" if "recipe" in spec.hparams else ""
        return f" {h['stage']}{recipe} lr={h['lr']} steps={h['steps']} batch={h['batch']} res={h['res']}"


def _settings(group: Group, seed: int, h: dict, lr: float, req: Request, runtime: Runtime) -> training.Settings:
    """The run's hparams `h` (what changes its numbers) plus this machine's choices (what changes speed)."""
    from vitbench.engine import training
    from vitbench.engine.device_data import choose as choose_pipeline
    from vitbench.engine.device_data import decodes_on_device

    o = FinetuneOptions.of(req)
    return training.Settings(
        steps=h["steps"],
        batch=h["batch"],
        lr=lr,
        warmup=h["warmup"],
        res=h["res"],
        # BiT-HyperRule: resize + random crop wherever the dataset allows a crop
        crop="random" if "precrop" in h and group.dataset.train_crop != "none" else group.dataset.train_crop,
        flip=group.dataset.train_flip,
        decay_steps=tuple(h.get("decay_steps", ())),
        mixup=h.get("mixup", 0.0),
        precrop=h.get("precrop"),
        precision=h["precision"],
        polyak=h["polyak"],
        polyak_warmup=h["polyak_warmup"] != "none",
        seed=seed,
        micro_batch=o.micro_batch,
        compile=runtime.compile,
        channels_last=bool(group.model.backend and group.model.backend.channels_last) and runtime.device.type == "cuda",
        workers=runtime.workers,
        input_pipeline=choose_pipeline(runtime.input_pipeline, runtime.device),
        decode_on_device=decodes_on_device(runtime.input_pipeline),
        log_every=max(1, min(50, h["steps"] // 10)),
        checkpoint_every=o.checkpoint_every or checkpoint_interval(h["steps"]),
        train_order=train_order(h),
    )


def _score(
    group: Group,
    spec: RunSpec,
    settings: training.Settings,
    outcome: training.Outcome,
    chosen: dict,
    started: datetime,
    runtime: Runtime,
    recorder: Recorder,
    what: str,
) -> Result:
    """Score the weights on the run's scored split (a sweep's dev, a final's test): the run's result."""
    from vitbench.engine import inference, training

    world, stage = recorder.world, spec.hparams["stage"]
    train_split, scored_split = (group.splits[n] for n in spec.hparams["splits"])
    device, eval_clock = runtime.device, Clock(runtime.device)
    with eval_clock:
        logits = inference.run_over(
            training.logits_fn(device, settings.precision), outcome.model, scored_split,
            group.preprocessing.at(settings.res),
            device, runtime.extraction_batch, runtime.workers, f"{what} · {scored_split.name}", runtime.skip_corrupt,
            runtime.input_pipeline,
        )  # fmt: skip
    real = [scored_split.real_labels[i] for i in logits.indices] if scored_split.real_labels else None
    found = scores(logits.values, logits.labels, real)
    if stage == "sweep":
        metrics = {"dev_accuracy": found["accuracy"]}
    else:
        metrics = {**found, "lr": float(settings.lr)}
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
    return Result(
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
            "recipe": (spec.hparams.get("recipe") or chosen.get("recipe") or {}).get("name", "paper"),
            "restarts": outcome.restarts,
            "micro_batch": outcome.micro_batch,
            "accumulation_steps": settings.batch // (outcome.micro_batch * world.size),
            "compile": settings.compile,
            "sdpa_attention": _fused_attention(),
            "channels_last": settings.channels_last,
            "input_pipeline": settings.input_pipeline,
            "decode_on_device": settings.decode_on_device and settings.input_pipeline == "device",
            "activation_checkpointing": outcome.checkpointing,
            "memory_plan": outcome.memory_plan,
            "train_images": outcome.train_images,
            "train_device_seconds": outcome.seconds,
            "eval_device_seconds": eval_clock.seconds,
        },
        curves=outcome.curves,
        # the test split's per-image predictions (a dev run's scored split is part of train)
        predictions=(
            Predictions.from_scores(logits.values, logits.labels, image_ids(scored_split, logits.indices))
            if stage == "final"
            else None
        ),
    )


def _fused_attention() -> bool:
    """Whether timm's attention runs through F.scaled_dot_product_attention (flash where available)."""
    from timm.layers import use_fused_attn

    return bool(use_fused_attn())


def _last(values: list[float]) -> float:
    return values[-1] if values else float("nan")


FINETUNE = Finetune()

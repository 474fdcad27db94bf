"""Pre-training from random init (paper §3.1, §4.3, §4.6, App. B.1, Table 3; docs/protocols.md,
"Pre-training"): the paper's supervised recipe, or masked patch prediction, on any classification
dataset vitbench reads, on nested subsets of its train split (Fig 4).

Adam 0.9/0.999 with decoupled weight decay, batch 4096 (accumulated where memory is short), linear
warmup then linear or cosine decay, clip 1, 224 px, a ViT's one-hidden-layer `pre_logits` head;
Table 3's row for the dataset as the default of every setting, each overridable and recorded.
Early stopping as in Fig 4: the dev split (held out of train) is scored every tenth of the run
and the best weights are the run's. They are written as .safetensors under `<results>/weights/`
with the run's provenance, and evaluated at once with linear few-shot on `--transfer` (default:
5-shot, the paper's Fig 4 metric), beside the same architecture at random init.
"""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

from vitbench import position_embeddings
from vitbench.backend import ModelSpec, Preprocessing
from vitbench.datasets import DatasetSpec, Split
from vitbench.devices import resolve_device, resolve_precision
from vitbench.engine import train_checkpoint, training
from vitbench.engine.device_data import choose as choose_pipeline
from vitbench.engine.distributed import barrier
from vitbench.engine.inference import run_over
from vitbench.engine.pretrain_objectives import Classifier, MaskedPatchPrediction
from vitbench.engine.train_data import describe_train_aug
from vitbench.errors import UserError
from vitbench.protocols import pretrain_recipe as recipe
from vitbench.protocols.base import SEEDS, Group, Protocol, Recorder, Request, RunSpec
from vitbench.protocols.finetune import checkpoint_interval
from vitbench.provenance import sha256_file
from vitbench.registry import get_dataset
from vitbench.store.shards import shard_dir
from vitbench.weights import RANDOM, RANDOM_INIT_SEED, build_model, pretrained

OBJECTIVES = ("supervised", "mpp")
SMOKE_RES, SMOKE_BATCH, SMOKE_STEPS = 48, 64, 50  # --smoke: a pipeline check, never a number to compare
VALIDATIONS = 10  # early stopping scores the dev split this many times per run
VALIDATION_SEED = 0  # MPP's dev score corrupts the same patches every time


class Pretrain(Protocol):
    name = "pretrain"
    version = "pretrain/1"
    summary = "pre-train from random init (Table 3 recipe, --objective mpp, --pretrain-subset), then 5-shot transfer"
    label = "pre-trained"
    data_parallel = True
    resumable = True
    from_random_init = True
    scores_transfer = False  # a dev accuracy during training: shown by `table --view pretrain`
    reads = frozenset(
        {
            "seeds", "steps", "batch", "micro_batch", "lr", "smoke", "checkpoint_every", "objective", "pos_embed",
            "pretrain_subset", "transfer", "transfer_shots", "weight_decay", "dropout", "label_smoothing", "warmup",
            "lr_decay", "pretrain_recipe", "epochs", "mpp_target", "mpp_rate",
        }
    )  # fmt: skip

    def splits(self, dataset: DatasetSpec) -> tuple[str, ...]:
        """Learn from the part of train that fine-tuning's LR sweep learns from; stop early on its dev part."""
        return tuple(dataset.sweep_splits)

    def resolution(self, model: ModelSpec, req: Request) -> int:
        if not req.smoke:
            return recipe.RES
        return model.input_multiple * math.ceil(SMOKE_RES / model.input_multiple)

    def preprocessing(self, pre: Preprocessing) -> Preprocessing:
        return pre.plain_resize()  # the dev split is scored after a plain resize, as fine-tuning's

    def plan(self, group: Group, req: Request, weights_sha: str, hparams: dict) -> list[RunSpec]:
        if group.weights != RANDOM:
            raise UserError("--protocol pretrain: trains from random init; give --weights random (or leave it out)")
        if req.objective not in OBJECTIVES:
            raise UserError(f"--objective {req.objective}: expected one of {', '.join(OBJECTIVES)}")
        if req.pos_embed not in position_embeddings.POS_EMBED:
            raise UserError(f"--pos-embed {req.pos_embed}: expected one of {', '.join(position_embeddings.POS_EMBED)}")
        if req.pos_embed != "1-d" and group.model.family != "vit":
            raise UserError(f"--pos-embed {req.pos_embed}: an option of ViT backbones; {group.model.name} is not one")
        if req.objective == "mpp" and group.model.family not in ("vit", "hybrid"):
            raise UserError(f"--objective mpp: masked patch prediction needs a ViT; {group.model.name} is not one")
        for name in () if req.transfer == ("none",) else req.transfer:
            get_dataset(name)  # a misspelt transfer dataset stops the plan, not the session after hours of training
        if any(k < 1 for k in req.transfer_shots):
            raise UserError("--transfer-shots: shot counts must be at least 1")
        train = group.splits[group.dataset.sweep_splits[0]]
        h = {**hparams, **settings_for(group, req, len(train))}
        seeds = req.seeds if req.seeds != SEEDS else (0,)  # pre-training is costly: one run unless asked
        return [
            self.base_spec(group, train, weights_sha, {**h, "subset": n}, seed)
            for n in recipe.subset_sizes(req.pretrain_subset, len(train))
            for seed in seeds
        ]

    def run(self, group: Group, todo: list[RunSpec], req: Request, device: torch.device, recorder: Recorder) -> None:
        for spec in todo:
            _pretrain(group, spec, req, device, recorder)

    def followups(self, req: Request, groups: list[Group]) -> list[Request]:
        """Per model: linear few-shot on the --transfer datasets with the weights each run wrote,
        beside the same architecture at random init (what the pre-training bought)."""
        if req.transfer == ("none",):
            return []
        datasets = req.transfer or tuple(dict.fromkeys(g.dataset.name for g in groups))
        follow = []
        for model in dict.fromkeys(g.model.name for g in groups):
            specs = [s for g in groups if g.model.name == model for s in g.specs]
            files = [str(weights_path(req, s)) for s in specs]
            # the weights written so far (a run leased by another process adds its own follow-up);
            # none yet is a dry run, which plans them by name
            files = [f for f in files if Path(f).is_file()] or files
            res = next(g.res for g in groups if g.model.name == model)
            follow.append(
                replace(
                    Request(),
                    model=model,
                    datasets=datasets,
                    protocol="fewshot",
                    weights=",".join([RANDOM, *files]),
                    shots=req.transfer_shots,
                    res=res,
                    results=req.results,
                    data_dir=req.data_dir,
                    device=req.device,
                    workers=req.workers,
                    extraction_batch=req.extraction_batch,
                    skip_missing=req.skip_missing,
                    skip_corrupt=req.skip_corrupt,
                    input_pipeline=req.input_pipeline,
                    config=req.config,
                )  # fmt: skip
            )
        return follow

    def jobs(self, specs: list[RunSpec]) -> list[list[list[RunSpec]]]:
        """One cluster job per pre-training run (each is hours of accelerator time at scale)."""
        return [[[spec] for spec in specs]] if specs else []

    def describe(self, spec: RunSpec) -> str:
        h = spec.hparams
        return f"pretrain {h['objective']} on {h['subset']} images, {h['steps']} steps, seed {spec.seed}"

    def dry_run_detail(self, spec: RunSpec) -> str:
        h = spec.hparams
        return f" {h['objective']} subset={h['subset']} steps={h['steps']} batch={h['batch']} lr={h['lr']:g}"

    def result_text(self, metrics: dict[str, float]) -> str:
        return f"best dev accuracy {metrics['val_accuracy'] * 100:.2f}% at step {int(metrics['best_step'])}"


def settings_for(group: Group, req: Request, n_train: int) -> dict:
    """Every setting that changes a pre-training run's numbers: Table 3's row, then the options."""
    row = recipe.table3_row(req.pretrain_recipe, group.model.name, group.dataset.num_classes)
    mpp = req.objective == "mpp"
    batch = req.batch or (SMOKE_BATCH if req.smoke else recipe.BATCH)
    steps = req.steps or (SMOKE_STEPS if req.smoke else recipe.steps_for(req.epochs or row.epochs, n_train, batch))
    if req.weight_decay is not None and req.weight_decay < 0:
        raise UserError(f"--weight-decay {req.weight_decay}: expected a value of 0 or more")
    for option, rate in (("--dropout", req.dropout), ("--label-smoothing", req.label_smoothing)):
        if rate is not None and not 0 <= rate < 1:
            raise UserError(f"{option} {rate}: expected a rate from 0 to below 1")
    decay = req.lr_decay or (recipe.MPP["decay"] if mpp else row.decay)
    if decay not in ("linear", "cosine"):
        raise UserError(f"--lr-decay {decay}: expected linear or cosine")
    return {
        "objective": req.objective,
        **({"mpp_target": req.mpp_target, "mpp_rate": req.mpp_rate} if mpp else {}),
        "pos_embed": req.pos_embed,
        "recipe": row.name + (" (§4.6 for the LR and decay)" if mpp else ""),
        "steps": steps,
        "steps_rule": "same steps for every subset: epochs x the full train split / batch (Fig 4: same hparams)",
        "batch": batch,
        "lr": req.lr or (recipe.MPP["lr"] if mpp else row.lr),
        "warmup": req.warmup if req.warmup is not None else recipe.warmup_for(steps),
        "lr_decay": decay,
        "optimizer": "adamw(b1=0.9, b2=0.999), decoupled weight decay",
        "weight_decay": req.weight_decay if req.weight_decay is not None else row.weight_decay,
        "dropout": req.dropout if req.dropout is not None else row.dropout,
        "label_smoothing": req.label_smoothing or 0.0,
        "clip_global_norm": training.CLIP_NORM,
        "head": "pre_logits tanh(Dense) + linear" if group.model.family in ("vit", "hybrid") else "linear",
        "train_aug": describe_train_aug(group.dataset.train_crop, group.res)
        + ("|flip_lr" if group.dataset.train_flip else ""),
        "early_stopping": f"best dev accuracy of {VALIDATIONS} evaluations",
        "subset_seed": recipe.SUBSET_SEED,
        "precision": resolve_precision(req.precision, resolve_device(req.device).type),
        "smoke": req.smoke,
    }


def weights_path(req: Request, spec: RunSpec):
    h = spec.hparams
    label = f"{spec.model.replace('/', '')}-{spec.dataset}-n{h['subset']}-{h['objective']}"
    return pretrained.weights_file(req.results, spec.run_key, label)


def _model(group: Group, h: dict) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(the backbone that is saved, the module that is trained: the backbone inside its objective)."""
    # MPP has no classifier: none is built, so that every parameter takes part (DDP requires it)
    classes = 0 if h["objective"] == "mpp" else group.dataset.num_classes
    backbone = build_model(group.model, classes, h["res"], RANDOM, h["gelu"], dropout=h["dropout"])
    assert group.model.backend is not None
    if group.model.family in ("vit", "hybrid") and h["objective"] == "supervised":
        dim = int(backbone.embed_dim)  # type: ignore[arg-type]  # the representation layer, D -> D (§3.1)
        group.model.backend.add_pre_logits(backbone, group.model, torch.Size((dim, dim)))
        dense: Any = backbone.pre_logits
        with torch.random.fork_rng(devices=[]):  # as timm inits a ViT's Linear layers, from the run's init seed
            torch.manual_seed(RANDOM_INIT_SEED)
            torch.nn.init.trunc_normal_(dense.weight, std=0.02)
        torch.nn.init.zeros_(dense.bias)
    position_embeddings.apply(backbone, h["pos_embed"])
    if h["objective"] == "mpp":
        pre = group.preprocessing
        return backbone, MaskedPatchPrediction(backbone, h["mpp_target"], h["mpp_rate"], pre.mean, pre.std)
    return backbone, Classifier(backbone, group.model.backend.features)


def _validator(group: Group, h: dict, req: Request, device: torch.device, dev: Split):
    """The dev split's accuracy of the weights being trained (MPP: of the corrupted patches' targets)."""
    mpp = h["objective"] == "mpp"

    def score(model: torch.nn.Module) -> float:
        if mpp:
            model.generator_seed = VALIDATION_SEED  # type: ignore[assignment]

        def fn(m, images):
            out = m(images)
            return MaskedPatchPrediction.accuracy(out)[:, None] if mpp else out

        try:
            outputs = run_over(
                fn, model, dev, group.preprocessing.at(h["res"]), device, req.extraction_batch, 0,
                f"{group.model.name} · {dev.name}", req.skip_corrupt,
            )  # fmt: skip
        finally:
            if mpp:
                model.generator_seed = None  # type: ignore[assignment]
        if mpp:
            return float(outputs.values.mean())
        return float((outputs.values.argmax(1) == outputs.labels).mean())

    return score


def _pretrain(group: Group, spec: RunSpec, req: Request, device: torch.device, recorder: Recorder) -> None:
    h, world = spec.hparams, recorder.world
    train = recipe.nested_subset(group.splits[group.dataset.sweep_splits[0]], h["subset"])
    dev = group.splits[group.dataset.sweep_splits[1]]
    backbone, model = _model(group, h)
    settings = training.Settings(
        steps=h["steps"], batch=h["batch"], lr=h["lr"], warmup=h["warmup"], res=h["res"],
        crop=group.dataset.train_crop, flip=group.dataset.train_flip, precision=h["precision"], seed=spec.seed,
        optimizer="adamw", weight_decay=h["weight_decay"], decay=h["lr_decay"], label_smoothing=h["label_smoothing"],
        eval_every=max(1, h["steps"] // VALIDATIONS), micro_batch=req.micro_batch, compile=req.compile,
        workers=req.workers, input_pipeline=choose_pipeline(req.input_pipeline, device),
        log_every=max(1, min(50, h["steps"] // 10)),
        checkpoint_every=req.checkpoint_every or checkpoint_interval(h["steps"]),
    )  # fmt: skip
    objective = model.loss() if isinstance(model, MaskedPatchPrediction) else None
    what = f"{group.model.name} · {group.dataset.name} pretrain n={h['subset']} seed={spec.seed}"
    checkpoint = shard_dir(req.results) / spec.run_key / "checkpoint.pt"
    started = datetime.now(UTC)
    outcome = training.train(
        model, train, settings, group.preprocessing, device, world, checkpoint, spec.run_key, req.skip_corrupt,
        what, objective=objective, validate=_validator(group, h, req, device, dev),
    )  # fmt: skip
    if world.is_main:  # one process writes the weights and the result; the others wait for it
        _finish(
            group, spec, req, outcome, settings, started, backbone, model, checkpoint, len(train), len(dev), recorder
        )
    barrier(world)


def _finish(
    group, spec, req, outcome, settings, started, backbone, model, checkpoint, n_train, n_dev, recorder
) -> None:
    """The best weights saved as the run's weights file, then the result recorded."""
    assert outcome.best_state is not None
    model.load_state_dict(outcome.best_state)
    position_embeddings.materialize(backbone)
    path = weights_path(req, spec)
    pretrained.save(path, backbone.state_dict(), _provenance(spec, outcome))
    _record(group, spec, outcome, settings, started, path, n_train, n_dev, recorder)
    train_checkpoint.discard(checkpoint)


def _provenance(spec: RunSpec, outcome: training.Outcome) -> dict:
    return {
        "run_key": spec.run_key,
        "protocol": spec.protocol_version,
        "model": spec.model,
        "dataset": spec.dataset,
        "data_fingerprint": spec.data_fingerprint,
        "subset": spec.hparams["subset"],
        "objective": spec.hparams["objective"],
        "pos_embed": spec.hparams["pos_embed"],
        "steps": spec.hparams["steps"],
        "best_step": outcome.best_step,
        "seed": spec.seed,
    }


def _record(group, spec, outcome, settings, started, path, n_train, n_dev, recorder: Recorder) -> None:
    world = recorder.world
    train_seconds = outcome.seconds / world.size
    metrics = {
        "val_accuracy": max(v for _, v in outcome.validation),
        "best_step": float(outcome.best_step),
        "final_train_loss": outcome.curves["train_loss"][-1] if outcome.curves["train_loss"] else float("nan"),
        "train_images_per_second": outcome.train_images / max(train_seconds, 1e-9),
        "pretrain_images": float(n_train),
    }
    if recorder.peak:
        metrics["mfu"] = (
            3 * recorder.flops_per_image(group) * metrics["train_images_per_second"] / (recorder.peak * world.size)
        )
    validations = len(outcome.validation)
    recorder.record(
        group, spec, metrics, started, seconds=outcome.seconds,
        images=3.0 * outcome.train_images + validations * n_dev, n_train=n_train, n_test=n_dev,
        skipped=outcome.skipped,
        notes={
            "weights_file": {"path": str(path.resolve()), "sha256": sha256_file(path)},
            "validation": outcome.validation,
            "restarts": outcome.restarts,
            "micro_batch": outcome.micro_batch,
            "accumulation_steps": settings.batch // (outcome.micro_batch * world.size),
            "train_images": outcome.train_images,
            "train_device_seconds": outcome.seconds,
        },
        curves=outcome.curves,
    )  # fmt: skip


PRETRAIN = Pretrain()

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
from pathlib import Path
from typing import TYPE_CHECKING

from vitbench.backend import ModelSpec, Preprocessing
from vitbench.datasets import DatasetSpec
from vitbench.devices import resolve_device, resolve_precision
from vitbench.errors import UserError
from vitbench.protocols import pretrain_recipe as recipe
from vitbench.protocols.base import SEEDS, Group, Protocol, Recorder, Request, RunSpec
from vitbench.protocols.fewshot import FEWSHOT
from vitbench.registry import get_dataset
from vitbench.weights import RANDOM

# The engine (and torch) is imported where a protocol plans or runs: reading its name, label and
# version (tables, `--help`) stays light. The training itself is pretrain_run.py.
if TYPE_CHECKING:
    import torch

OBJECTIVES = ("supervised", "mpp")
SMOKE_RES, SMOKE_BATCH, SMOKE_STEPS = 48, 64, 50  # --smoke: a pipeline check, never a number to compare


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
        from vitbench import position_embeddings

        if req.pos_embed not in position_embeddings.POS_EMBED:
            raise UserError(f"--pos-embed {req.pos_embed}: expected one of {', '.join(position_embeddings.POS_EMBED)}")
        if req.pos_embed != "1-d" and group.model.family != "vit":
            raise UserError(f"--pos-embed {req.pos_embed}: an option of ViT backbones; {group.model.name} is not one")
        if req.objective == "mpp" and group.model.family not in ("vit", "hybrid"):
            raise UserError(f"--objective mpp: masked patch prediction needs a ViT; {group.model.name} is not one")
        for name in () if req.transfer == ("none",) else req.transfer:
            get_dataset(name)  # a misspelt transfer dataset stops the plan, not the session after hours of training
        train = group.splits[group.dataset.sweep_splits[0]]
        h = {**hparams, **settings_for(group, req, len(train))}
        seeds = req.seeds if req.seeds != SEEDS else (0,)  # pre-training is costly: one run unless asked
        return [
            self.base_spec(group, train, weights_sha, {**h, "subset": n}, seed)
            for n in recipe.subset_sizes(req.pretrain_subset, len(train))
            for seed in seeds
        ]

    def run(self, group: Group, todo: list[RunSpec], req: Request, device: torch.device, recorder: Recorder) -> None:
        from vitbench.protocols.pretrain_run import pretrain

        for spec in todo:
            pretrain(group, spec, req, device, recorder, weights_path(req, spec))

    def followups(self, req: Request, groups: list[Group]) -> list[Request]:
        """Per model: linear few-shot on the --transfer datasets with the weights each run wrote,
        beside the same architecture at random init (what the pre-training bought)."""
        if req.transfer == ("none",):
            return []
        datasets = req.transfer or _default_transfer(req, groups)
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
                    tracker=req.tracker,  # the transfer runs go where the pre-training runs went
                    tensorboard=req.tensorboard,
                )  # fmt: skip
            )
        return follow

    def planned_work(self, group: Group) -> dict[str, dict[str, float]]:
        """steps × batch training images (early stopping can end a run sooner), and the dev split at each validation."""
        dev = len(group.splits[group.dataset.sweep_splits[1]])
        return {
            s.run_key: {"train": s.hparams["steps"] * s.hparams["batch"], "inference": recipe.VALIDATIONS * dev}
            for s in group.specs
        }

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
        step = int(metrics["best_step"])
        return f"dev accuracy {metrics['val_accuracy'] * 100:.2f}% at step {step} (its weights kept)"


def _default_transfer(req: Request, groups: list[Group]) -> tuple[str, ...]:
    """Fig 4's transfer metric is 5-shot on ImageNet: ImageNet where its few-shot splits are under
    --data-dir (from the folder layout), else the pre-training datasets themselves."""
    imagenet = get_dataset("imagenet")
    if req.data_source is None and imagenet.missing_for(req.data_dir, FEWSHOT.splits(imagenet)) is None:
        return ("imagenet",)
    return tuple(dict.fromkeys(g.dataset.name for g in groups))


def settings_for(group: Group, req: Request, n_train: int) -> dict:
    """Every setting that changes a pre-training run's numbers: Table 3's row, then the options."""
    from vitbench.engine.train_data import describe_train_aug

    row = recipe.table3_row(req.pretrain_recipe, group.model.name, group.dataset.num_classes)
    mpp = req.objective == "mpp"
    batch = req.batch or (SMOKE_BATCH if req.smoke else recipe.BATCH)
    steps = req.steps or (SMOKE_STEPS if req.smoke else recipe.steps_for(req.epochs or row.epochs, n_train, batch))
    if mpp and not (req.steps or req.smoke or req.epochs):  # App. B.1.2's budget, not Table 3's epochs
        steps = recipe.MPP_STEPS * recipe.MPP_BATCH // batch
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
        # what the relative variants compute (a stored `relative` run from before issue 35 had the bias)
        **(
            {"relative_positions": recipe.RELATIVE_METHOD[req.pos_embed]}
            if req.pos_embed in recipe.RELATIVE_METHOD
            else {}
        ),  # fmt: skip
        "recipe": row.name + (" (§4.6 for the LR and decay)" if mpp else ""),
        "steps": steps,
        "steps_rule": recipe.MPP_STEPS_RULE
        if mpp
        else "same steps for every subset: epochs x the full train split / batch (Fig 4: same hparams)",
        "batch": batch,
        "lr": req.lr or (recipe.MPP["lr"] if mpp else row.lr),
        "warmup": req.warmup if req.warmup is not None else recipe.warmup_for(steps),
        "lr_decay": decay,
        "optimizer": "adamw(b1=0.9, b2=0.999), decoupled weight decay",
        "weight_decay": req.weight_decay if req.weight_decay is not None else row.weight_decay,
        "dropout": req.dropout if req.dropout is not None else row.dropout,
        "label_smoothing": req.label_smoothing or 0.0,
        "clip_global_norm": row.clip,  # Table 3: the ImageNet rows only
        "head": "pre_logits tanh(Dense) + linear" if group.model.family in ("vit", "hybrid") else "linear",
        "train_aug": describe_train_aug(group.dataset.train_crop, group.res)
        + ("|flip_lr" if group.dataset.train_flip else ""),
        "early_stopping": recipe.MPP_STOPPING if mpp else f"best dev accuracy of {recipe.VALIDATIONS} evaluations",
        "subset_seed": recipe.SUBSET_SEED,
        "precision": resolve_precision(req.precision, resolve_device(req.device).type),
        "smoke": req.smoke,
    }


def weights_path(req: Request, spec: RunSpec) -> Path:
    from vitbench.weights import pretrained

    h = spec.hparams
    label = f"{spec.model.replace('/', '')}-{spec.dataset}-n{h['subset']}-{h['objective']}"
    return pretrained.weights_file(req.results, spec.run_key, label)


PRETRAIN = Pretrain()

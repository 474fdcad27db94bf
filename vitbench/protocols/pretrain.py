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
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vitbench.catalog.registry import get_dataset
from vitbench.datasets import DatasetSpec
from vitbench.errors import UserError
from vitbench.host.devices import Runtime
from vitbench.models.backend import ModelSpec, Preprocessing
from vitbench.protocols import pretrain_recipe as recipe
from vitbench.protocols.base import Group, ModelInputs, Recorder, Request, Result, RunSpec, Trainer, Work
from vitbench.protocols.bounds import INT32_MAX, MAX_EPOCHS
from vitbench.protocols.fewshot import FEWSHOT, FewshotOptions
from vitbench.protocols.measures import Metric
from vitbench.protocols.options import PRETRAIN_PANEL, Given, limits, option
from vitbench.protocols.shared_options import SEEDS, TrainingOptions, train_order_hparams
from vitbench.weights import RANDOM

# The engine (and torch) is imported where a protocol plans or runs: reading its name, label and
# version (tables, `--help`) stays light. The training itself is pretrain_run.py.
if TYPE_CHECKING:
    pass

OBJECTIVES = ("supervised", "mpp")
SMOKE_RES, SMOKE_BATCH, SMOKE_STEPS = 48, 64, 50  # --smoke: a pipeline check, never a number to compare


def _rate(what: str) -> Any:
    return option(
        None, f"pretrain: {what}.", panel=PRETRAIN_PANEL, kind=float, bound=limits(float, 0, 1, high_open=True)
    )


@dataclass(frozen=True)
class PretrainOptions(TrainingOptions):
    """Pre-training's own options (None: Table 3's value for the dataset)."""

    objective: str = option(
        "supervised",
        "pretrain: supervised (§3.1) or mpp (masked patch prediction, §4.6).",
        panel=PRETRAIN_PANEL,
        choices=OBJECTIVES,
    )
    mpp_target: str = option(
        "mean-colour",
        "pretrain --objective mpp: mean-colour (3-bit, 512 classes), downsized-4x4 or l2.",
        panel=PRETRAIN_PANEL,
    )
    mpp_rate: float = option(
        0.5,
        "pretrain --objective mpp: patches corrupted (0.5).",
        panel=PRETRAIN_PANEL,
        bound=limits(float, 0, 1, low_open=True),  # 0 corrupts nothing: nothing to predict
    )
    pos_embed: str = option(
        "1-d",
        "pretrain, ViT: position embeddings 1-d (default), none, 2-d, relative (App. D.4's) or "
        "relative-bias (vitbench's: a scalar per head and 2-D offset).",
        panel=PRETRAIN_PANEL,
    )
    pretrain_subset: str | None = option(
        None,
        "pretrain: nested random subsets of train, e.g. 10%,30%,100% or image counts (Fig 4); each is "
        "evaluated with 5-shot transfer.",
        panel=PRETRAIN_PANEL,
        kind=str,
    )
    pretrain_recipe: str = option(
        "auto",
        "pretrain: Table 3's row for the defaults: imagenet, imagenet21k or jft (auto: imagenet21k from "
        "10,000 classes, else imagenet).",
        panel=PRETRAIN_PANEL,
    )
    epochs: float | None = option(
        None,
        "pretrain: epochs of the full train split.",
        panel=PRETRAIN_PANEL,
        kind=float,
        bound=limits(float, 0, MAX_EPOCHS, low_open=True),
    )
    warmup: int | None = option(
        None,
        "pretrain: LR warmup steps [default: 10k].",
        panel=PRETRAIN_PANEL,
        kind=int,
        bound=limits(int, 0, INT32_MAX),
    )
    lr_decay: str | None = option(None, "pretrain: linear or cosine after the warmup.", panel=PRETRAIN_PANEL, kind=str)
    weight_decay: float | None = option(
        None, "pretrain: decoupled weight decay.", panel=PRETRAIN_PANEL, kind=float, bound=limits(float, 0)
    )
    dropout: float | None = _rate("dropout rate")
    label_smoothing: float | None = _rate("label smoothing")
    transfer: tuple[str, ...] = option(
        (),
        "pretrain: datasets for the few-shot evaluation of its weights [default: imagenet where it is under "
        "--data-dir, as Fig 4; else the pre-training dataset]; none.",
        panel=PRETRAIN_PANEL,
        kind=str,
        many=True,
    )
    transfer_shots: tuple[int, ...] = option(
        (5,),  # Fig 4's metric: linear 5-shot
        "pretrain: shots of that evaluation [5].",
        panel=PRETRAIN_PANEL,
        many=True,
        bound=limits(int, 1, INT32_MAX),
    )
    dedup_against: tuple[str, ...] = option(
        (),
        "pretrain: datasets whose test images' near-duplicates (vitbench dedup) are removed from the pre-training "
        "images, as §4.1 [default: the --transfer datasets present under --data-dir, the pre-training dataset "
        "itself excepted]; none.",
        panel=PRETRAIN_PANEL,
        kind=str,
        many=True,
    )


class Pretrain(Trainer):
    name = "pretrain"
    version = "pretrain/1"
    summary = "pre-train from random init (Table 3 recipe, --objective mpp, --pretrain-subset), then 5-shot transfer"
    label = "pre-trained"
    # a dev accuracy during training, shown by `table --view pretrain` beside the transfer accuracy
    # of the weights each run wrote
    metrics = (
        Metric("val_accuracy", "dev accuracy", view="pretrain"),
        Metric("best_step", "weights kept from step", unit="", view="pretrain"),
    )
    Options = PretrainOptions

    def splits(self, dataset: DatasetSpec) -> tuple[str, ...]:
        """Learn from the part of train that fine-tuning's LR sweep learns from; stop early on its dev part."""
        return tuple(dataset.sweep_splits)

    def inputs(self, model: ModelSpec, req: Request) -> ModelInputs:
        # the dev split is scored after a plain resize, as fine-tuning's
        smoke = model.input_multiple * math.ceil(SMOKE_RES / model.input_multiple)
        return ModelInputs(smoke if PretrainOptions.of(req).smoke else recipe.RES, Preprocessing.plain_resize)

    def plan(self, group: Group, req: Request, weights_sha: str, hparams: dict) -> list[RunSpec]:
        if not group.weights.random:
            raise UserError("--protocol pretrain: trains from random init; give --weights random (or leave it out)")
        o, backend = PretrainOptions.of(req), group.model.backend
        assert backend is not None  # (a paper-only name never reaches a plan)
        from vitbench.models import position_embeddings

        if o.pos_embed not in position_embeddings.POS_EMBED:
            raise UserError(f"--pos-embed {o.pos_embed}: expected one of {', '.join(position_embeddings.POS_EMBED)}")
        if o.pos_embed != "1-d" and not backend.position_variants:
            raise UserError(f"--pos-embed {o.pos_embed}: an option of ViT backbones; {group.model.name} is not one")
        if o.objective == "mpp" and not backend.patch_prediction:
            raise UserError(f"--objective mpp: masked patch prediction needs a ViT; {group.model.name} is not one")
        for name in () if o.transfer == ("none",) else o.transfer:
            _dataset("--transfer", name)  # a misspelt transfer dataset stops the plan, not the session after hours
        train = group.splits[group.dataset.sweep_splits[0]]
        h = {**hparams, **settings_for(group, req, len(train)), **_dedup_settings(group, req)}
        seeds = o.seeds if o.seeds != SEEDS else (0,)  # pre-training is costly: one run unless asked
        return [
            self.base_spec(group, train, weights_sha, {**h, "subset": n}, seed)
            for n in recipe.subset_sizes(o.pretrain_subset, len(train))
            for seed in seeds
        ]

    def run(
        self, group: Group, todo: list[RunSpec], req: Request, runtime: Runtime, recorder: Recorder
    ) -> Iterator[Result]:
        from vitbench.protocols.pretrain_run import pretrain

        tests = dedup_datasets(group, req)
        for spec in todo:
            yield from pretrain(group, spec, req, runtime, recorder, weights_path(req, spec), tests)

    def followups(self, req: Request, groups: list[Group]) -> list[Request]:
        """Per model: linear few-shot on the --transfer datasets with the weights each run wrote,
        beside the same architecture at random init (what the pre-training bought)."""
        o = PretrainOptions.of(req)
        if o.transfer == ("none",):
            return []
        datasets = o.transfer or _default_transfer(req, groups)
        follow = []
        for model in dict.fromkeys(g.model.name for g in groups):
            specs = [s for g in groups if g.model.name == model for s in g.specs]
            files = [str(weights_path(req, s)) for s in specs]
            # the weights written so far (a run leased by another process adds its own follow-up);
            # none yet is a dry run, which plans them by name
            files = [f for f in files if Path(f).is_file()] or files
            res = next(g.res for g in groups if g.model.name == model)
            # where and how the pre-training ran (results, data, device, trackers, GELU, …) holds for its transfer
            weights = ",".join([RANDOM, *files])
            shots = Given.made({"shots": o.transfer_shots}, [FewshotOptions])
            follow.append(req.next_stage(model=model, datasets=datasets, protocol=FEWSHOT.name, weights=weights,
                                         options=shots, res=res))  # fmt: skip
        return follow

    def work(self, group: Group) -> Work:
        """Each run trains on steps × batch images (early stopping can end it sooner) and scores
        the dev split at each validation; one cluster job per run (each is hours of accelerator
        time at scale); data-parallel training (engine/training.py)."""
        dev = len(group.splits[group.dataset.sweep_splits[1]])
        images = {
            s.run_key: {"train": s.hparams["steps"] * s.hparams["batch"], "inference": recipe.VALIDATIONS * dev}
            for s in group.specs
        }
        return Work(images, [[[spec] for spec in group.specs]] if group.specs else [])

    def describe(self, spec: RunSpec) -> str:
        h = spec.hparams
        return f"{h['objective']} subset={h['subset']} steps={h['steps']} batch={h['batch']} lr={h['lr']:g}"


def _default_transfer(req: Request, groups: list[Group]) -> tuple[str, ...]:
    """Fig 4's transfer metric is 5-shot on ImageNet: ImageNet where its few-shot splits are under
    --data-dir (from the folder layout), else the pre-training datasets themselves."""
    imagenet = get_dataset("imagenet")
    if req.data_source is None and imagenet.missing_for(req.data_dir, FEWSHOT.splits(imagenet)) is None:
        return ("imagenet",)
    return tuple(dict.fromkeys(g.dataset.name for g in groups))


def dedup_datasets(group: Group, req: Request) -> list[DatasetSpec]:
    """The datasets whose test images' near-duplicates leave the pre-training images: as asked
    (--dedup-against), else the transfer datasets that are here, the pre-training dataset's own
    split excepted (it is as its authors published it; `vitbench dedup` audits it)."""
    o = PretrainOptions.of(req)
    if o.dedup_against == ("none",):
        return []
    if o.dedup_against:
        return list({d.name: d for d in (_dataset("--dedup-against", n) for n in o.dedup_against)}.values())
    transfer = () if o.transfer == ("none",) else o.transfer or _default_transfer(req, [group])
    present = [d for d in map(get_dataset, transfer) if d.missing_for(req.data_dir, (d.test_split,)) is None]
    return list({d.name: d for d in present if d.name != group.dataset.name}.values())


def _dataset(option: str, name: str) -> DatasetSpec:
    """The dataset an option names, or a one-line error that names the option too."""
    try:
        return get_dataset(name)
    except UserError as e:
        raise UserError(f"{option} {name}: {e}") from None


def _dedup_settings(group: Group, req: Request) -> dict:
    """The test sets de-duplicated against, by name and test-split fingerprint (other files: another
    run), and the search's settings; nothing when there are none (the run keys of pre-training
    without de-duplication stay as they were)."""
    tests = dedup_datasets(group, req)
    if not tests:
        return {}
    from vitbench.engine.dedup import Method

    return {
        "dedup_against": {t.name: t.load_split(req.data_dir, t.test_split, req.data_source).fingerprint for t in tests},
        "dedup_method": Method().describe(),
    }


def settings_for(group: Group, req: Request, n_train: int) -> dict:
    """Every setting that changes a pre-training run's numbers: Table 3's row, then the options."""
    from vitbench.engine.device_data import decoder_hparams
    from vitbench.engine.train_data import describe_train_aug

    o, backend = PretrainOptions.of(req), group.model.backend  # (ranges checked where the request was made)
    assert backend is not None
    row = recipe.table3_row(o.pretrain_recipe, group.model.name, group.dataset.num_classes)
    mpp = o.objective == "mpp"
    batch = o.batch or (SMOKE_BATCH if o.smoke else recipe.BATCH)
    steps = o.steps or (SMOKE_STEPS if o.smoke else recipe.steps_for(o.epochs or row.epochs, n_train, batch))
    if mpp and not (o.steps or o.smoke or o.epochs):  # App. B.1.2's budget, not Table 3's epochs
        steps = recipe.MPP_STEPS * recipe.MPP_BATCH // batch
    decay = o.lr_decay or (recipe.MPP["decay"] if mpp else row.decay)
    if decay not in ("linear", "cosine"):
        raise UserError(f"--lr-decay {decay}: expected linear or cosine")
    return {
        "objective": o.objective,
        **({"mpp_target": o.mpp_target, "mpp_rate": o.mpp_rate} if mpp else {}),
        "pos_embed": o.pos_embed,
        # what the relative variants compute (a stored `relative` run from before issue 35 had the bias)
        **(
            {"relative_positions": recipe.RELATIVE_METHOD[o.pos_embed]} if o.pos_embed in recipe.RELATIVE_METHOD else {}
        ),  # fmt: skip
        "recipe": row.name + (" (§4.6 for the LR and decay)" if mpp else ""),
        "steps": steps,
        "steps_rule": recipe.MPP_STEPS_RULE
        if mpp
        else "same steps for every subset: epochs x the full train split / batch (Fig 4: same hparams)",
        "batch": batch,
        "lr": o.lr or (recipe.MPP["lr"] if mpp else row.lr),
        "warmup": o.warmup if o.warmup is not None else recipe.warmup_for(steps),
        "lr_decay": decay,
        "optimizer": "adamw(b1=0.9, b2=0.999), decoupled weight decay",
        "weight_decay": o.weight_decay if o.weight_decay is not None else row.weight_decay,
        "dropout": o.dropout if o.dropout is not None else row.dropout,
        "label_smoothing": o.label_smoothing or 0.0,
        "clip_global_norm": row.clip,  # Table 3: the ImageNet rows only
        "head": "pre_logits tanh(Dense) + linear" if backend.pre_logits_head else "linear",
        "train_aug": describe_train_aug(group.dataset.train_crop, group.res)
        + ("|flip_lr" if group.dataset.train_flip else ""),
        "early_stopping": recipe.MPP_STOPPING if mpp else f"best dev accuracy of {recipe.VALIDATIONS} evaluations",
        "subset_seed": recipe.SUBSET_SEED,
        "precision": group.runtime.precision,
        **decoder_hparams(group.runtime.input_pipeline, group.runtime.device, None, [*group.splits.values()]),
        "smoke": o.smoke,
        **train_order_hparams(o, group.splits[group.dataset.sweep_splits[0]]),
    }


def weights_path(req: Request, spec: RunSpec) -> Path:
    from vitbench.weights import pretrained

    h = spec.hparams
    label = f"{spec.model.replace('/', '')}-{spec.dataset}-n{h['subset']}-{h['objective']}"
    return pretrained.weights_file(req.results, spec.run_key, label)


PRETRAIN = Pretrain()

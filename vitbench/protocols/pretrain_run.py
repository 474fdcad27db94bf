"""One pre-training run (protocols/pretrain.py plans it): the model and its objective, early
stopping on the dev split, the best weights written with their provenance, the result recorded."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vitbench.datasets import DatasetSpec, Split
from vitbench.engine import train_checkpoint, training
from vitbench.engine.dedup import Method, duplicates_in
from vitbench.engine.device_data import choose as choose_pipeline
from vitbench.engine.device_data import decodes_on_device
from vitbench.engine.distributed import barrier
from vitbench.engine.inference import run_over
from vitbench.engine.pretrain_objectives import Classifier, MaskedPatchPrediction
from vitbench.errors import UserError
from vitbench.host.devices import Runtime
from vitbench.models import position_embeddings
from vitbench.protocols import pretrain_recipe as recipe
from vitbench.protocols.base import Group, Recorder, Request, Result, RunSpec
from vitbench.protocols.finetune import checkpoint_interval
from vitbench.protocols.shared_options import TrainingOptions, train_order
from vitbench.provenance import sha256_file
from vitbench.store.shards import checkpoint_path
from vitbench.weights import RANDOM, RANDOM_INIT_SEED, build_model, pretrained

log = logging.getLogger("vitbench")
VALIDATION_SEED = 0  # MPP's dev score corrupts the same patches every time


def _model(group: Group, h: dict) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(the backbone that is saved, the module that is trained: the backbone inside its objective)."""
    # MPP has no classifier: none is built, so that every parameter takes part (DDP requires it)
    classes = 0 if h["objective"] == "mpp" else group.dataset.num_classes
    backbone = build_model(group.model, classes, h["res"], RANDOM, h["gelu"], dropout=h["dropout"])
    assert group.model.backend is not None
    if group.model.backend.pre_logits_head and h["objective"] == "supervised":
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


def _validator(group: Group, h: dict, runtime: Runtime, dev: Split):
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
                fn, model, dev, group.preprocessing.at(h["res"]), runtime.device, runtime.extraction_batch, 0,
                f"{group.model.name} · {dev.name}", runtime.skip_corrupt,
            )  # fmt: skip
        finally:
            if mpp:
                model.generator_seed = None  # type: ignore[assignment]
        if mpp:
            return float(outputs.values.mean())
        return float((outputs.values.argmax(1) == outputs.labels).mean())

    return score


def pretrain(
    group: Group, spec: RunSpec, req: Request, runtime: Runtime, recorder: Recorder, path: Path,
    dedup_against: Sequence[DatasetSpec] = (),
) -> Iterator[Result]:  # fmt: skip
    """Train, keep the best weights on dev, write them to `path` and yield the run's result (from
    the main process; the others wait for it)."""
    h, world, o = spec.hparams, recorder.world, TrainingOptions.of(req)
    train = recipe.nested_subset(group.splits[group.dataset.sweep_splits[0]], h["subset"])
    train, dedup_note = _deduplicated(train, h, req, runtime, dedup_against)
    dev = group.splits[group.dataset.sweep_splits[1]]
    backbone, model = _model(group, h)
    settings = training.Settings(
        steps=h["steps"], batch=h["batch"], lr=h["lr"], warmup=h["warmup"], res=h["res"],
        crop=group.dataset.train_crop, flip=group.dataset.train_flip, precision=h["precision"], seed=spec.seed,
        optimizer="adamw", weight_decay=h["weight_decay"], decay=h["lr_decay"], label_smoothing=h["label_smoothing"],
        clip_norm=h["clip_global_norm"],
        eval_every=max(1, h["steps"] // recipe.VALIDATIONS), micro_batch=o.micro_batch, compile=runtime.compile,
        workers=runtime.workers, input_pipeline=choose_pipeline(runtime.input_pipeline, runtime.device),
        decode_on_device=decodes_on_device(runtime.input_pipeline),
        log_every=max(1, min(50, h["steps"] // 10)),
        checkpoint_every=o.checkpoint_every or checkpoint_interval(h["steps"]), train_order=train_order(h),
    )  # fmt: skip
    objective = model.loss() if isinstance(model, MaskedPatchPrediction) else None
    what = f"{group.model.name} · {group.dataset.name} pretrain n={h['subset']} seed={spec.seed}"
    checkpoint = checkpoint_path(req.results, spec.run_key)
    started = datetime.now(UTC)
    outcome = training.train(
        model, train, settings, group.preprocessing, runtime.device, world, checkpoint, spec.run_key,
        runtime.skip_corrupt, what, objective=objective, validate=_validator(group, h, runtime, dev),
    )  # fmt: skip
    if world.is_main:  # one process writes the weights and the result; the others wait for it
        result = _finish(group, spec, outcome, settings, started, backbone, model, path, len(train), len(dev), recorder)
        yield dataclasses.replace(result, notes={**result.notes, **dedup_note})
        train_checkpoint.discard(checkpoint)  # (once the result is stored)
    barrier(world)


def _deduplicated(
    train: Split, h: dict, req: Request, runtime: Runtime, datasets: Sequence[DatasetSpec]
) -> tuple[Split, dict]:
    """`train` without the near-duplicates of the test images of `datasets` (§4.1), and the note
    saying how many left and of what; `train` itself where the run de-duplicates nothing."""
    if not h.get("dedup_against"):
        return train, {}
    tests = []
    for spec in datasets:
        test = spec.load_split(req.data_dir, spec.test_split, req.data_source)
        if h["dedup_against"].get(spec.name) != test.fingerprint:  # the files changed since the run was planned
            raise UserError(f"{spec.name} {spec.test_split}: its files changed since this run was planned; plan again")
        tests.append(test)
    drop, flagged = duplicates_in(train, tests, Method.described(h["dedup_method"]), runtime.workers)
    kept = np.setdiff1d(np.arange(len(train)), drop)
    log.info(
        "pretrain: %d of %d pre-training images removed as near-duplicates of test images (%s)",
        len(drop), len(train), ", ".join(f"{name}: {n} test images" for name, n in flagged.items()),
    )  # fmt: skip
    note = {"dedup": {"removed": int(len(drop)), "of": len(train), "test_images_with_duplicates": flagged}}
    return train.subset(train.name, kept), note


def _finish(group, spec, outcome, settings, started, backbone, model, path, n_train, n_dev, recorder) -> Result:
    """The kept weights saved as the run's weights file (the best on dev; MPP's: the last step's, as
    App. B.1.2 trains without early stopping), and the run's result."""
    if spec.hparams["objective"] == "mpp":  # the model holds the last step's weights: they are kept
        outcome = dataclasses.replace(outcome, best_step=settings.steps, best_state=None)
    else:
        assert outcome.best_state is not None
        model.load_state_dict(outcome.best_state)
    position_embeddings.materialize(backbone)
    pretrained.save(path, backbone.state_dict(), _provenance(spec, outcome))
    return _result(group, spec, outcome, settings, started, path, n_train, n_dev, recorder)


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


def _result(group, spec, outcome, settings, started, path, n_train, n_dev, recorder: Recorder) -> Result:
    world = recorder.world
    train_seconds = outcome.seconds / world.size
    metrics = {
        "val_accuracy": dict(outcome.validation)[outcome.best_step],  # of the weights kept
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
    return Result(
        spec, metrics, started, seconds=outcome.seconds,
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

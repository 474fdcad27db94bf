"""The checkpoint's own classifier on a dataset with the same classes: top-1, top-5 and, on
ImageNet val, ReaL (images without ReaL labels are not scored; a hit is any ReaL label). The
robustness test sets are scored with an ImageNet-1k classifier through their class map (the logits
restricted to, or max-pooled into, the set's own classes: datasets/robustness.py)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from vitbench.datasets import DatasetSpec
from vitbench.engine.scoring import (
    Predictions,
    calibration,
    image_ids,
    pool_classes,
    scores,
    scores_over_the_head,
    with_other,
)
from vitbench.host.devices import Clock, Runtime, autocast
from vitbench.models.backend import ModelSpec, Preprocessing
from vitbench.protocols.base import Group, ModelInputs, Protocol, Recorder, Request, Result, RunSpec
from vitbench.protocols.measures import Metric
from vitbench.protocols.options import DATA_PANEL, ProtocolOptions, option
from vitbench.provenance import keyed_hparams

# The engine (and torch) is imported where a protocol plans or runs: reading its name, label and
# version (tables, `--help`) stays light.
if TYPE_CHECKING:
    pass


@dataclass(frozen=True)
class EvalOptions(ProtocolOptions):
    # ObjectNet: the head's logits restricted to the 113 overlapping classes (wise-ft's project_logits),
    # or the top-k over all 1,000 with a non-overlapping prediction a miss (ObjectNet's own code)
    objectnet_scoring: str = option(
        "restricted",
        "eval on ObjectNet: restricted (the logits of the 113 classes that overlap ImageNet, max-pooled) or "
        "all (the top-k over ImageNet's 1,000, a non-overlapping prediction a miss: ObjectNet's own code).",
        panel=DATA_PANEL,
        choices=("restricted", "all"),
    )


class Eval(Protocol):
    name = "eval"
    version = "eval/2"  # 2: each checkpoint family's own eval recipe (Google: vit_jax's; timm, DeiT: timm's)
    Options = EvalOptions
    summary = "score the checkpoint's own classifier (top-1, top-5, ImageNet ReaL)"
    label = "own classifier (eval)"
    # the checkpoint's own classifier: its accuracies stand beside the paper's Table 2 cells
    metrics = (
        Metric("accuracy", "accuracy", paper=True),
        Metric("accuracy_top5", "top-5 accuracy", paper=True, progress=False),
        Metric("accuracy_real", "ReaL", paper=True),
        Metric("ece", "ECE", unit="", higher_is_better=False, progress=False),
        Metric("nll", "NLL", unit="", higher_is_better=False, progress=False),
    )

    def splits(self, dataset: DatasetSpec) -> tuple[str, ...]:
        return dataset.transfer_splits[1:]  # the final test split only

    def inputs(self, model: ModelSpec, req: Request) -> ModelInputs:
        return ModelInputs(recipe=Preprocessing.published_eval)  # the checkpoint family's own eval recipe

    def plan(self, group: Group, req: Request, weights_sha: str, hparams: dict) -> list[RunSpec]:
        from vitbench.engine.device_data import decoder_hparams

        first = group.splits[self.splits(group.dataset)[0]]
        runtime = group.runtime
        hparams = {
            **hparams,
            "eval_recipe": group.preprocessing.family,
            # what moves its numbers beside the recipe: bf16 only when asked for (auto scores a
            # checkpoint in fp32, the arithmetic of the figures it is compared with), nvjpeg's pixels
            **({"precision": "bf16"} if req.precision == "bf16" else {}),
            **decoder_hparams(runtime.input_pipeline, runtime.device, group.preprocessing, [first]),
        }
        if first.class_map is not None:  # recorded (and keyed) only where a class map applies
            hparams = {**hparams, "head_classes": group.dataset.head_size, "class_pooling": "max"}
        if group.dataset.name == "objectnet":  # whose convention scored it (docs/protocols.md, "ObjectNet")
            hparams = {**hparams, "objectnet_scoring": EvalOptions.of(req).objectnet_scoring}
        return [self.base_spec(group, first, weights_sha, hparams, seed=0)]  # deterministic: one run

    def run(
        self, group: Group, todo: list[RunSpec], req: Request, runtime: Runtime, recorder: Recorder
    ) -> Iterator[Result]:
        from vitbench.engine.distributed import world
        from vitbench.engine.features import group_model, outputs_over

        spec = todo[0]
        started = datetime.now(UTC)
        clock = Clock(runtime.device, world().size)  # device-seconds: under torchrun every process extracts a share
        split_name = self.splits(group.dataset)[0]
        split = group.splits[split_name]
        model = group_model(group, keep_head=True)
        precision = spec.hparams["precision"]

        def classify(m, x):
            with autocast(runtime.device, precision):
                return m(x)

        # the logits' cache entry is keyed as it was first made: fp32 and the references' decoder left out
        keyed = keyed_hparams(self.name, {k: spec.hparams[k] for k in ("precision", "decoder")})
        logits, computed = outputs_over(
            group, split_name, runtime, clock, {"outputs": "logits", **keyed}, classify, model,
            distrust=group.dataset.head_size,
        )  # fmt: skip
        real = [split.real_labels[i] for i in logits.indices] if split.real_labels is not None else None
        if spec.hparams.get("objectnet_scoring") == "all" and split.class_map is not None:
            found = scores_over_the_head(logits.values, logits.labels, split.class_map)
            pooled = with_other(logits.values, split.class_map)  # stored: their arg-max is that top-1
        else:
            pooled = pool_classes(logits.values, split.class_map)
            found = scores(pooled, logits.labels, real)
            if split.class_map is None:  # the checkpoint's own softmax; a pooled (robustness) head has none
                found |= calibration(pooled, logits.labels)
        yield Result(
            spec,
            found,
            started,
            seconds=clock.seconds,
            images=float(len(logits.labels)) if computed else 0.0,
            n_train=None,
            n_test=len(logits.labels),
            skipped=logits.skipped,
            notes={"outputs_from_cache": not computed, "real_labels": split.real_labels is not None},
            predictions=Predictions.from_scores(pooled, logits.labels, image_ids(split, logits.indices)),
        )


EVAL = Eval()

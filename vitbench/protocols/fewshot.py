"""The paper's closed-form linear few-shot evaluation (big_vision's `fewshot_lsr`).

Frozen representations of the train images the runs draw (sampled first: at most shots x classes
x seeds of them) and of every test image are extracted once and cached on disk
(engine/features.py); each (seed, shots) then solves ridge regression in closed form
(engine/ridge.py). Accuracy is on the full test split. Details and sources: docs/protocols.md.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import numpy as np

from vitbench.datasets import DatasetSpec, Split
from vitbench.datasets.base import DEV_SEED
from vitbench.engine.scoring import Predictions, image_ids
from vitbench.errors import UserError
from vitbench.host.devices import Clock, Runtime
from vitbench.protocols.base import (
    Group,
    Protocol,
    Recorder,
    Request,
    Result,
    RunSpec,
    Solve,
    Work,
    frozen_result,
    frozen_work,
)
from vitbench.protocols.bounds import INT32_MAX
from vitbench.protocols.measures import Axis, Metric
from vitbench.protocols.options import FEWSHOT_PANEL, WHAT_PANEL, limits, option
from vitbench.protocols.shared_options import SeededOptions
from vitbench.provenance import WHOLE_TRAIN

if TYPE_CHECKING:
    import pandas as pd

# The engine (and torch) is imported where a protocol plans or runs: reading its name, label and
# version (tables, `--help`) stays light.
log = logging.getLogger("vitbench")

L2_GRID = tuple(2.0**i for i in range(-10, 20))  # the older sweep: 2^-10 .. 2^19


def parse_l2(text: str) -> tuple[str, tuple[float, ...]]:
    """`--fewshot-l2`: a number (1024, 2^10) or `sweep` for the 2^-10..2^19 grid."""
    if text == "sweep":
        return "sweep", L2_GRID
    try:
        value = float(2.0 ** float(text[2:])) if text.startswith("2^") else float(text)
    except (ValueError, OverflowError):
        value = -1.0
    if not 0 < value < float("inf"):
        raise UserError(f"--fewshot-l2 {text}: expected a positive number (e.g. 1024 or 2^10) or 'sweep'")
    return f"{value:g}", (value,)


FEWSHOT_TRAIN = ("default", "full")
SHOTS = (1, 5, 10, 25)  # the paper's few-shot counts (Fig. 2, Table 6)
DEFAULT_L2 = "1024"  # big_vision's few-shot l2_reg, as `--fewshot-l2` takes it


@dataclass(frozen=True)
class FewshotOptions(SeededOptions):
    shots: tuple[int, ...] = option(
        SHOTS,
        "Comma-separated shot counts [default: 1,5,10,25].",
        panel=WHAT_PANEL,
        many=True,
        bound=limits(int, 1, INT32_MAX),
    )
    fewshot_l2: str = option(DEFAULT_L2, "Ridge λ (1024, 2^10) or 'sweep' (2^-10..2^19).", panel=FEWSHOT_PANEL)
    fewshot_train: str = option(
        "default",
        "default: shots from big_vision's part of train where it has one (ImageNet: 65 per class, "
        "65,000 images); full: the whole train split.",
        panel=FEWSHOT_PANEL,
        choices=FEWSHOT_TRAIN,
    )


class FewShot(Protocol):
    name = "fewshot"
    Options = FewshotOptions
    # bump when a change alters the numbers (2: vit_jax pos-emb resize; 3: big_vision's resize without
    # antialiasing, and only the value range taken from the weights' own recipe)
    version = "fewshot-lsr/3"
    summary = "closed-form linear few-shot on frozen features (1/5/10/25 shots x 3 seeds)"
    label = "few-shot"
    # a `--fewshot-l2 sweep` run stores `accuracy@l2=λ` per λ instead (views/measured/columns.py picks one λ)
    # a figure of shots draws the full-data linear probe of the same features beside it: what few-shot approaches
    metrics = (Metric("accuracy", "accuracy", axis=Axis("shots", "shots per class", headline=10, shown="{}-shot",
                                                        reference="linear")),)  # fmt: skip

    def splits(self, dataset: DatasetSpec) -> tuple[str, ...]:
        return dataset.transfer_splits  # shots from the first, scored on the second

    def plan(self, group: Group, req: Request, weights_sha: str, hparams: dict) -> list[RunSpec]:
        from vitbench.engine.features import representation_hparams

        o = FewshotOptions.of(req)
        label, _ = parse_l2(o.fewshot_l2)
        hparams = {**hparams, "fewshot_l2": label, **representation_hparams(group, group.runtime)}
        first, drawn_from = _shots_split(group, self.splits(group.dataset)[0], o.fewshot_train)
        hparams |= drawn_from
        scored = scored_classes(group, self.splits(group.dataset)[1])
        fewest = fewest_per_class(first.labels, scored)
        beyond = sorted(k for k in o.shots if k > fewest)
        if fewest == 0:
            missing = scored[np.bincount(first.labels, minlength=int(scored.max()) + 1)[scored] == 0]
            log.warning(
                "%s %s has no image of %d class(es) the test split holds (class %d first): they cannot be "
                "predicted, so every run is stored and shown as [0-shot]",
                group.dataset.name, first.name, len(missing), int(missing[0]),
            )  # fmt: skip
        elif beyond:
            log.warning(
                "--shots %s: %s %s has only %d image(s) in its smallest class; those runs use all of a "
                "smaller class (the effective shot count is recorded and shown in tables)",
                ",".join(map(str, beyond)), group.dataset.name, first.name, fewest,
            )  # fmt: skip
        return [
            self.base_spec(group, first, weights_sha, {**hparams, "shots": shots}, seed)
            for seed in o.seeds
            for shots in o.shots
        ]

    def run(
        self, group: Group, todo: list[RunSpec], req: Request, runtime: Runtime, recorder: Recorder
    ) -> Iterator[Result]:
        import torch

        from vitbench.engine.features import frozen_features
        from vitbench.engine.ridge import fewshot_accuracies, sample_indices

        group = self._as_planned(group, todo[0])
        split_labels = group.splits[self.splits(group.dataset)[0]].labels
        scored = scored_classes(group, self.splits(group.dataset)[1])
        classes = group.dataset.num_classes

        def wanted(present: np.ndarray | None) -> np.ndarray:  # only the images the runs draw are extracted
            draws = [sample_indices(split_labels, classes, s.hparams["shots"], s.seed, present) for s in todo]
            return np.unique(np.concatenate(draws))

        found, device = frozen_features(group, runtime, self.splits(group.dataset), wanted), runtime.device
        train, test = found.train, found.test
        present = np.zeros(len(split_labels), dtype=bool)
        present[train.indices] = True
        test_ids = image_ids(group.splits[self.splits(group.dataset)[1]], test.indices)
        # on the device once for every (shots, seed, λ): the solve runs there in float64
        train_pair = (torch.from_numpy(train.values).to(device), train.labels)
        test_pair = (torch.from_numpy(test.values).to(device), torch.from_numpy(test.labels).to(device))
        for spec in todo:
            shots = spec.hparams["shots"]
            label, l2s = parse_l2(spec.hparams["fewshot_l2"])
            started = datetime.now(UTC)
            solve = Clock(device)
            kept: list = [] if len(l2s) == 1 else None  # type: ignore[assignment]  # a λ sweep keeps none
            with solve:
                accs, n_train = fewshot_accuracies(
                    train_pair, test_pair, classes, shots, spec.seed, l2s, train.indices, split_labels, kept
                )
            drawn = sample_indices(split_labels, classes, shots, spec.seed, present)
            share = 1 / len(todo)  # the one extraction is shared by the runs that needed it
            fewest = fewest_per_class(split_labels[drawn], scored)
            notes = {"extraction_seconds": found.seconds, "effective_shots": fewest}
            predictions = Predictions(list(test_ids), np.asarray(test.labels), kept[0]) if kept else None
            yield frozen_result(
                spec, found, _metrics(accs, label), started, share, solve.seconds, notes, predictions, n_train,
                train_rows=np.searchsorted(train.indices, drawn),  # its cost: the images it drew, and the test split
            )  # fmt: skip

    def work(self, group: Group) -> Work:
        """Only the drawn train images are extracted (at most shots × classes per seed), then the test split."""
        planned = self._as_planned(group, group.specs[0])  # the split the runs draw from: its own cache entry
        train_name, test_name = self.splits(group.dataset)
        shots, seeds = max(s.hparams["shots"] for s in group.specs), {s.seed for s in group.specs}
        drawn = min(len(planned.splits[train_name]), shots * group.dataset.num_classes * len(seeds))
        needed = {train_name: drawn, test_name: len(planned.splits[test_name])}
        return frozen_work(self, planned, needed, self._solves(group, planned.splits[train_name], needed[test_name]))

    def _solves(self, group: Group, train: Split, test: int) -> list[Solve]:
        """Each run's ridge: its shots of each class train holds (all of a smaller class), every class a target."""
        per_class = np.bincount(train.labels) if len(train.labels) else np.zeros(0, dtype=np.int64)
        return [
            Solve("ridge", (s.run_key,), int(np.minimum(per_class, s.hparams["shots"]).sum()), test,
                  group.dataset.num_classes, repeats=len(parse_l2(s.hparams["fewshot_l2"])[1]))
            for s in group.specs
        ]  # fmt: skip

    def _as_planned(self, group: Group, spec: RunSpec) -> Group:
        """A copy of the group whose train split is the part the shots are drawn from, as `plan`
        chose it (recorded in the runs' hparams); the planned group keeps its whole split."""
        name = self.splits(group.dataset)[0]
        split, _ = _shots_split(group, name, "full" if spec.hparams["fewshot_train"] == WHOLE_TRAIN else "default")
        return replace(group, splits={**group.splits, name: split})


def _shots_split(group: Group, name: str, choice: str) -> tuple[Split, dict]:
    """The split the shots are drawn from, and what the runs record of it: where a dataset draws
    its shots from a part of train (ImageNet: big_vision's 65,000 images), that part, the same
    number per class from a fixed permutation (a folder's order is sorted by class, TFDS's is
    shuffled: its first 65,000 hold at least 30 of every class). `full` (--fewshot-train full):
    the whole split."""
    limit, split = group.dataset.per_protocol.get(FEWSHOT.name, {}).get("train_limit"), group.splits[name]
    if choice == "full" or limit is None or len(split) <= limit:
        return split, {}
    per_class = limit // group.dataset.num_classes
    order = np.random.default_rng(DEV_SEED).permutation(len(split))
    labels = split.labels[order]
    # each class's first `per_class` in permutation order, classes in order: one stable sort, not a pass over
    # the split per class (ImageNet's 1,000 took 0.55 s, planned several times by a dry run)
    by_class = np.argsort(labels, kind="stable")
    sorted_labels = labels[by_class]
    rank = np.arange(len(sorted_labels)) - np.searchsorted(sorted_labels, sorted_labels)  # place within its class
    wanted = (rank < per_class) & (sorted_labels >= 0) & (sorted_labels < group.dataset.num_classes)
    keep = order[by_class[wanted]]
    return split.subset(name, keep), {
        "fewshot_train": f"{per_class} per class ({len(keep)} images; big_vision: train[:{limit}])"
    }


def fewest_per_class(labels: np.ndarray, scored: np.ndarray) -> int:
    """Images in the smallest of the classes the test split holds (`scored`): a k-shot run with k
    above it is a smaller-shot run for that class (big_vision's sampling takes what there is, as
    vitbench's does), and 0 where a test class has no training image at all (it cannot be
    predicted: the cell is a [0-shot] one). A class in neither split counts for nothing."""
    counts = np.bincount(labels, minlength=int(scored.max()) + 1 if len(scored) else 0)
    return int(counts[scored].min()) if len(scored) else 0


def scored_classes(group: Group, test_split: str) -> np.ndarray:
    return np.unique(group.splits[test_split].labels)


def _metrics(accs: dict[float, float], l2_label: str) -> dict[str, float]:
    if l2_label != "sweep":
        return {"accuracy": next(iter(accs.values()))}
    # every λ is kept; the table picks one λ per shot count across datasets (mean rank, as the
    # ViT-era code did) instead of choosing on this dataset's own test split
    return {f"accuracy@l2={l2:g}": acc for l2, acc in accs.items()}


FEWSHOT = FewShot()


def choose_sweep_l2(df: pd.DataFrame) -> tuple[pd.DataFrame, dict[int, float]]:
    """Stored runs (a row per run and metric) with the runs of `--fewshot-l2 sweep` (a metric per λ,
    `accuracy@l2=…`) reduced to one λ per shot count, chosen as the ViT-era code did — rank every λ
    on each dataset (mean over seeds), average the ranks over datasets, take the best — stored as
    `accuracy`; and the λ chosen per shot count. What the tables read, so few-shot keeps it."""
    import pandas as pd

    sweep = df[df["metric"].str.startswith("accuracy@l2=")].copy()
    if sweep.empty:
        return df, {}
    sweep["l2"] = sweep["metric"].str.split("=").str[1].astype(float)
    chosen: dict[int, float] = {}
    for shots, part in sweep.groupby("shots"):
        means = part.groupby(["dataset", "l2"])["value"].mean().unstack("l2")  # (dataset, λ)
        ranks = means.rank(axis=1).mean(axis=0)
        chosen[int(shots)] = float(ranks.idxmax())
    picked = sweep[sweep["l2"] == sweep["shots"].astype(int).map(chosen)].copy()
    picked["metric"] = "accuracy"
    rest = df[~df["metric"].str.startswith("accuracy@l2=")]
    return pd.concat([rest, picked.drop(columns="l2")], ignore_index=True), chosen

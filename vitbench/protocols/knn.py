"""Weighted k-NN on frozen features (DINO, Caron et al. 2021, `eval_knn.py`): the whole train split
is the memory bank, cosine similarity, k = 20 and temperature 0.07 by default; top-1 and top-5.
`--knn-k 10,20,100,200` scores several k from one similarity pass. The features are the few-shot
protocol's, from the same cache (engine/features.py)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from vitbench.datasets import DatasetSpec
from vitbench.engine.scoring import Predictions, image_ids
from vitbench.host.devices import Clock, Runtime
from vitbench.protocols.base import (
    FrozenFeatureProtocol,
    Group,
    Recorder,
    Request,
    Result,
    RunSpec,
    Solve,
    frozen_result,
)  # fmt: skip
from vitbench.protocols.bounds import INT32_MAX
from vitbench.protocols.measures import Axis, Metric
from vitbench.protocols.options import FEWSHOT_PANEL, ProtocolOptions, limits, option

# both metrics vary along k; a figure of k draws the linear probe of the same features beside it, and
# says the vote (DINO's) with the temperature the runs stored
K = Axis(
    "knn_k", "neighbours (k)", headline=20, symbol="k", reference="linear",
    rule="by DINO's rule (a weighted vote of the k nearest train images by cosine similarity of the L2-normalised "
    "features, each weighted exp(similarity / T), T = {temperature})",
)  # fmt: skip

# The engine (and torch) is imported where a protocol plans or runs: reading its name, label and
# version (tables, `--help`) stays light.
if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class KnnOptions(ProtocolOptions):
    knn_k: tuple[int, ...] = option(
        (20,),  # DINO's default k
        "knn: comma-separated neighbour counts [default: 20].",
        panel=FEWSHOT_PANEL,
        many=True,
        bound=limits(int, 1, INT32_MAX),
    )


class KNearestNeighbours(FrozenFeatureProtocol):
    name = "knn"
    Options = KnnOptions
    # 2: big_vision's resize without antialiasing, the weights' value range only;
    # 3: the top-5 of k < 5 ranks only k classes (DINO's min(5, k))
    version = "knn/3"
    summary = "weighted k-NN on frozen features (DINO: cosine, k=20, T=0.07), top-1 and top-5"
    label = "k-NN"
    metrics = (Metric("accuracy", "accuracy", axis=K), Metric("accuracy_top5", "top-5 accuracy", axis=K))

    def splits(self, dataset: DatasetSpec) -> tuple[str, ...]:
        return dataset.transfer_splits  # the memory bank, then the scored split

    def plan(self, group: Group, req: Request, weights_sha: str, hparams: dict) -> list[RunSpec]:
        from vitbench.engine.features import representation_hparams
        from vitbench.engine.knn import TEMPERATURE

        first = group.splits[self.splits(group.dataset)[0]]
        hparams = {**hparams, "temperature": TEMPERATURE, **representation_hparams(group, group.runtime)}
        return [
            self.base_spec(group, first, weights_sha, {**hparams, "knn_k": k}, seed=0) for k in KnnOptions.of(req).knn_k
        ]

    def run(
        self, group: Group, todo: list[RunSpec], req: Request, runtime: Runtime, recorder: Recorder
    ) -> Iterator[Result]:
        import torch

        from vitbench.engine.features import frozen_features
        from vitbench.engine.knn import knn_accuracies

        found, device = frozen_features(group, runtime, self.splits(group.dataset)), runtime.device
        train, test = found.train, found.test
        started, search = datetime.now(UTC), Clock(device)
        rankings: dict[int, list[torch.Tensor]] = {}
        with search:
            accuracies = knn_accuracies(
                torch.from_numpy(train.values).to(device),
                torch.from_numpy(train.labels).to(device),
                torch.from_numpy(test.values).to(device),
                torch.from_numpy(test.labels).to(device),
                group.dataset.num_classes,
                tuple(s.hparams["knn_k"] for s in todo),
                todo[0].hparams["temperature"],
                rankings=rankings,
            )
        ids = image_ids(group.splits[self.splits(group.dataset)[1]], test.indices)
        share = 1 / len(todo)  # one extraction and one similarity pass serve every k
        for spec in todo:
            top1, top5 = accuracies[spec.hparams["knn_k"]]
            predictions = Predictions(ids, test.labels, torch.cat(rankings[spec.hparams["knn_k"]]).numpy())
            metrics = {"accuracy": top1, "accuracy_top5": top5}
            yield frozen_result(spec, found, metrics, started, share, search.seconds * share, predictions=predictions)

    def solves(self, group: Group) -> list[Solve]:
        """One similarity pass over the whole memory bank, a vote per k, for all the group's runs."""
        train, test = (len(group.splits[name]) for name in self.splits(group.dataset))
        runs = tuple(s.run_key for s in group.specs)
        return [Solve("knn", runs, train, test, group.dataset.num_classes, repeats=len(runs))] if runs else []


KNN = KNearestNeighbours()

"""A full-data linear probe on frozen features (the CLIP / DINO / MAE papers' "linear probe"):
multinomial logistic regression with L2, λ chosen on a validation split carved from train (the
dataset's dev split where it has one, as fine-tuning chooses its LR), then refit on all of train
and scored on test. The features are the few-shot protocol's, from the same cache."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import numpy as np

from vitbench.datasets import DatasetSpec
from vitbench.datasets.base import dev_holdout
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
from vitbench.protocols.measures import Metric
from vitbench.protocols.options import FEWSHOT_PANEL, ProtocolOptions, option

# The engine (and torch) is imported where a protocol plans or runs: reading its name, label and
# version (tables, `--help`) stays light.
if TYPE_CHECKING:
    import torch

    from vitbench.engine.inference import Outputs

VALIDATION_FRACTION = 0.1  # where a dataset has no dev fraction of its own (ours: as Pets and Flowers)


@dataclass(frozen=True)
class LinearOptions(ProtocolOptions):
    linear_features: str = option(
        "raw",
        "linear: the probe's input: raw (CLIP's A.3 recipe) or standardized (z-scored per dimension).",
        panel=FEWSHOT_PANEL,
        choices=("raw", "standardized"),
    )


class LinearProbe(FrozenFeatureProtocol):
    name = "linear"
    # 2: big_vision's resize without antialiasing, the weights' value range only; 3: CLIP's A.3 recipe
    # (raw features, λ = scikit-learn's 1/C over 1e-6..1e6 to an eighth of a decade), z-scoring an option;
    # 4: the reference's solver and tolerance (scikit-learn on the CPU; torch L-BFGS stopping by its rule on a GPU);
    # 5: scikit-learn's BLAS on one thread (the same predictions at any thread count), and a small problem on a
    # GPU fitted by scikit-learn on the CPU (faster there, and the CPU's fit)
    # 6: the sweep stays within CLIP's 1e-6..1e6 (a best λ at 1e6 had been refined up to 7.5e6)
    version = "linear/6"
    summary = "full-data logistic-regression probe on frozen features, L2 chosen on a validation split (CLIP's)"
    Options = LinearOptions
    label = "linear-probe"
    metrics = (
        Metric("accuracy", "accuracy"),
        Metric("val_accuracy", "dev accuracy", progress=False),
        Metric("l2", "λ", unit="", higher_is_better=False),
    )

    def splits(self, dataset: DatasetSpec) -> tuple[str, ...]:
        return dataset.transfer_splits  # train (the validation split is carved from it), then test

    def plan(self, group: Group, req: Request, weights_sha: str, hparams: dict) -> list[RunSpec]:
        from vitbench.engine.features import representation_hparams

        first = group.splits[self.splits(group.dataset)[0]]
        hparams = {
            **hparams,
            **representation_hparams(group, group.runtime),
            "validation": f"{_validation_fraction(group.dataset):g} of train (dev split)",
            "l2_grid": "1e-6..1e6 per decade, refined x/÷ 10^(1/2), 10^(1/4), 10^(1/8) around the best",
            "objective": "sum CE + l2/2 |W|^2 (scikit-learn's C = 1/l2), L-BFGS, at most 1000 iterations",
            "solver": "scikit-learn lbfgs, tol 1e-4 (CPU); torch L-BFGS to the same stopping rule (GPU)",
            "linear_features": LinearOptions.of(req).linear_features,
            # torch's L-BFGS stops elsewhere than scikit-learn's: on an H200, 2 of 1,017 CIFAR-10
            # predictions moved (docs/performance.md, conformance). CPU runs keep the keys they had.
            **({"linear_fit": GPU_FIT} if group.runtime.device.type == "cuda" else {}),
        }
        return [self.base_spec(group, first, weights_sha, hparams, seed=0)]

    def run(
        self, group: Group, todo: list[RunSpec], req: Request, runtime: Runtime, recorder: Recorder
    ) -> Iterator[Result]:
        from vitbench.engine import logistic
        from vitbench.engine.features import frozen_features

        found, device = frozen_features(group, runtime, self.splits(group.dataset)), runtime.device
        started, solve = datetime.now(UTC), Clock(device)
        classes = group.dataset.num_classes
        train, test = _on(found.train, device), _on(found.test, device)
        train_split = group.splits[self.splits(group.dataset)[0]]
        fit_idx, val_idx = _validation(found.train, len(train_split), _validation_fraction(group.dataset))
        iterations: dict[float, int] = {}
        with solve:
            features = todo[0].hparams["linear_features"]
            # the sweep's two sets gathered straight into the solver's float64 (memory: features + the work)
            best, scores = logistic.sweep(
                (logistic.float64_rows(train[0], fit_idx), train[1][fit_idx]),
                (logistic.float64_rows(train[0], val_idx), train[1][val_idx]), classes, features, iterations=iterations,
            )  # fmt: skip
            probe = logistic.fit(*train, classes, best, features)
            accuracy = probe.accuracy(*test)
        predictions = Predictions(  # ranked a chunk of rows at a time: any class count
            list(image_ids(group.splits[self.splits(group.dataset)[1]], found.test.indices)),
            np.asarray(found.test.labels), probe.top(test[0]),
        )  # fmt: skip
        metrics = {"accuracy": accuracy, "l2": best, "val_accuracy": scores[best]}
        # each fit's L-BFGS iterations: what its solve cost (a dry run prices a fit at solve_pace.EXPECTED_ITERATIONS)
        notes = {
            "l2_sweep": {f"{k:.3g}": v for k, v in sorted(scores.items())},
            "l2_iterations": {f"{k:.3g}": v for k, v in sorted(iterations.items())},
        }
        yield frozen_result(todo[0], found, metrics, started, 1.0, solve.seconds, notes, predictions)

    def solves(self, group: Group) -> list[Solve]:
        """The sweep's fits on train less its validation rows, then the refit on all of train, each of
        the classes train holds (the reference fits only those)."""
        from vitbench.engine.logistic import FITS

        train, test = (group.splits[name] for name in self.splits(group.dataset))
        held_out = round(len(train) * _validation_fraction(group.dataset))
        present = int(np.count_nonzero(np.bincount(train.labels))) if len(train.labels) else 0
        return [
            Solve("logistic", (s.run_key,), len(train), len(test), present, repeats=FITS, held_out=held_out)
            for s in group.specs
        ]


GPU_FIT = "on the GPU: torch L-BFGS for large fits (engine/logistic.py GPU_MIN_WORK), scikit-learn for small ones"


def _validation_fraction(dataset: DatasetSpec) -> float:
    return dataset.dev_fraction or VALIDATION_FRACTION


def _validation(train: Outputs, n: int, fraction: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(fit, validation) positions in the train features: the dataset's dev holdout (a fixed
    permutation of the `n` images of the train split), restricted to the images that were read."""
    import torch

    _, dev = dev_holdout(n, fraction)
    is_dev = np.isin(train.indices, dev)
    return torch.from_numpy(np.flatnonzero(~is_dev)), torch.from_numpy(np.flatnonzero(is_dev))


def _on(outputs: Outputs, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    import torch

    return torch.from_numpy(outputs.values).to(device), torch.from_numpy(outputs.labels).to(device)


LINEAR = LinearProbe()

"""Throughput benchmarks (`nox -s bench`): vitbench's loops against bare baselines, same machine, one run.

Compare the `ours` and `baseline` rows of each group: the ratio is what the notes report.
"""

import numpy as np
import pytest
import torch
from torchvision import transforms

from vitbench import fewshot, registry
from vitbench.datasets import DATASETS, TransformedSplit

N_IMAGES = 128


@pytest.fixture(scope="module")
def demo():
    spec = registry.get_model("vit-ti/16")
    model = spec.backend.create(spec, num_classes=10, img_size=224).eval()
    split = DATASETS["digits"].load_split(None, "test")
    split.images, split.labels = split.images[:N_IMAGES], split.labels[:N_IMAGES]
    return spec, model, split


@pytest.mark.benchmark(group="feature extraction: vit-ti/16 @224 on 128 digits (images/s = 128 x ops)")
def test_extract_ours(benchmark, demo):
    spec, model, split = demo
    data = TransformedSplit(split, spec.preprocessing.transform())
    benchmark.pedantic(
        fewshot.extract,
        args=(spec.backend.features, model, data, torch.device("cpu"), 64, 0, "bench"),
        rounds=3,
        warmup_rounds=1,
    )


@pytest.mark.benchmark(group="feature extraction: vit-ti/16 @224 on 128 digits (images/s = 128 x ops)")
def test_extract_baseline(benchmark, demo):
    """A hand-written loop: PIL -> torchvision transforms -> batched forward, no DataLoader."""
    spec, model, split = demo
    tf = transforms.Compose(
        [
            transforms.Resize((256, 256)),
            transforms.CenterCrop(224),
            transforms.ToTensor(),
            transforms.Normalize([0.5] * 3, [0.5] * 3),
        ]
    )

    @torch.inference_mode()
    def bare():
        out = []
        for start in range(0, N_IMAGES, 64):
            batch = torch.stack([tf(split.image(i)) for i in range(start, min(start + 64, N_IMAGES))])
            out.append(model.forward_head(model.forward_features(batch), pre_logits=True))
        return torch.cat(out)

    benchmark.pedantic(bare, rounds=3, warmup_rounds=1)


@pytest.fixture(scope="module")
def solve_problem():
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(100), 10)  # 10 shots x 100 classes
    return rng.normal(size=(1000, 768)), labels, rng.normal(size=(2000, 768)), rng.integers(0, 100, 2000)


@pytest.mark.benchmark(group="few-shot solve: 10 shots x 100 classes x 768 dims")
def test_solve_ours(benchmark, solve_problem):
    x, y, xt, yt = solve_problem
    benchmark(fewshot.fewshot_accuracies, (x, y), (xt, yt), 100, 10, 0, (1024.0,))


def whitened_with_bias(x, y, xt):
    """The textbook set-up shared by the dense baselines: whiten, append the bias 100, {-1,1} targets."""
    mean, std = x.mean(0), x.std(0) + 1e-5
    xb = np.hstack([(x - mean) / std, np.full((len(x), 1), 100.0)])
    xtb = np.hstack([(xt - mean) / std, np.full((len(xt), 1), 100.0)])
    return xb, xtb, 2 * np.eye(100)[y] - 1


@pytest.mark.benchmark(group="few-shot solve: 10 shots x 100 classes x 768 dims")
def test_solve_baseline_dense(benchmark, solve_problem):
    """The textbook route: normal equations and a dense solve, one λ."""
    x, y, xt, yt = solve_problem

    def dense():
        xb, xtb, targets = whitened_with_bias(x, y, xt)
        w = np.linalg.solve(xb.T @ xb + 1024.0 * np.eye(xb.shape[1]), xb.T @ targets)
        return np.mean(np.argmax(xtb @ w, 1) == yt)

    benchmark(dense)


@pytest.mark.benchmark(group="few-shot solve, 30-value λ sweep")
def test_solve_sweep_ours(benchmark, solve_problem):
    x, y, xt, yt = solve_problem
    benchmark(fewshot.fewshot_accuracies, (x, y), (xt, yt), 100, 10, 0, fewshot.L2_GRID)


@pytest.mark.benchmark(group="few-shot solve, 30-value λ sweep")
def test_solve_sweep_baseline_dense(benchmark, solve_problem):
    x, y, xt, yt = solve_problem

    def dense_sweep():
        xb, xtb, targets = whitened_with_bias(x, y, xt)
        gram, rhs = xb.T @ xb, xb.T @ targets
        return [
            np.mean(np.argmax(xtb @ np.linalg.solve(gram + l2 * np.eye(len(gram)), rhs), 1) == yt)
            for l2 in fewshot.L2_GRID
        ]

    benchmark(dense_sweep)

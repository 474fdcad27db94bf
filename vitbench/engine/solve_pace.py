"""How fast this device solves on frozen features: a dry run's second micro-benchmark. The real
solvers (few-shot's ridge, engine/ridge.py; k-NN's pass and vote, engine/knn.py; the linear probe's
L-BFGS fit, engine/logistic.py) run on random features of two sizes, and each solve's seconds are
fitted as a fixed cost per call plus a cost per unit of work (`units`: the multiply-adds that grow
with its shape). execution/solve_price.py keeps what this measures per machine and prices a plan's
solves with it.

The units are a model of the work, not a count of it: what matters is that they grow as the solve
does, and that the pace is measured in the same units. The linear probe's L-BFGS iterations depend
on the features, not on the machine, and a dry run has none: each fit is priced at
EXPECTED_ITERATIONS, what real sweeps' fits cost (below), by whether the weights are trained."""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable

import numpy as np
import torch

from vitbench.engine import logistic

# what one L-BFGS fit of the linear probe costs, in iterations at the measured pace (scikit-learn's rule, at
# most MAX_ITER): real sweeps (CLIP's λ grid) measured here, their seconds per fit in iterations at the pace
# (docs/performance.md). Features of trained weights (DeiT-Ti at 224, 112 and 64 px on the shared Flowers,
# CIFAR-10 and CIFAR-100): 25 to 135, median 64, upper quartile 90; of random-init weights (DeiT-Ti and
# ResNet-18 at 64 px): 80 to 214, median and upper quartile 132 — less separable features take more
# iterations, and more line-search steps each. Priced between the median and the upper quartile: a plan
# that errs errs long (a budget overrun costs more than an early end). Each linear run stores the
# iterations its fits made (notes.l2_iterations): 18 to 162 a fit on average.
EXPECTED_ITERATIONS = {"trained": 80, "random init": 128}
REPEATS = 3  # timed calls per size, their median taken
FIT_ITERATIONS = 10  # a timed fit stops here (the pace per iteration is what is measured)


def units(
    kind: str, train: int, test: int, width: int, classes: int, repeats: int, held_out: int = 0,
    iterations: int = EXPECTED_ITERATIONS["trained"],
) -> tuple[int, float]:
    """(calls, units of work) of one solve (protocols/base.py `Solve`) on `width`-dimensional features.

    ridge: whitening, the Gram matrix and its solve (or eigen-decomposition) on the smaller side,
    scoring the test rows for each λ; knn: the test-by-train similarities, the top-k and a vote per
    k; logistic: per fit, `iterations` iterations of the loss and its gradient (train rows x
    width x classes; scikit-learn fits one row for two classes)."""
    if kind == "ridge":
        dims = width + 1  # the bias feature
        small, large = min(train, dims), max(train, dims)
        return 1, float(train * dims + small * small * large + small**3 + test * dims * classes * repeats)
    if kind == "knn":
        return 1, float(test * train * (width + 1) + test * classes * repeats)
    if kind == "logistic":
        rows = (repeats - 1) * (train - held_out) + train  # the sweep's fits, then the refit on all of train
        outputs = 1 if classes == 2 else classes
        return repeats, float(iterations * rows * width * outputs)
    raise ValueError(f"no pace for a {kind!r} solve")


def measure(device: torch.device) -> dict[str, list[float]]:
    """{kind: [seconds per call, seconds per unit]} for every kind `units` knows, measured on `device`
    (float64, as the runs solve), each from its median timed call at a small and a larger size."""
    generator = torch.Generator().manual_seed(0)
    # a GPU fits a problem this small with scikit-learn (logistic.GPU_MIN_WORK): its own pace, from larger ones
    fits = (64, 2048) if device.type == "cpu" else (1024, 8192)
    return {
        "ridge": _fitted(lambda n: _ridge(n, device, generator), (8, 64)),
        "knn": _fitted(lambda n: _knn(n, device, generator), (64, 2048)),
        "logistic": _fitted(lambda n: _logistic(n, device, generator), fits),
    }


def import_seconds() -> float | None:
    """Seconds importing scikit-learn's logistic regression (a linear probe on the CPU pays it once per
    process, about a second here), timed where this process has not imported it yet; else None."""
    if "sklearn.linear_model" in sys.modules:
        return None
    start = time.perf_counter()
    import sklearn.linear_model  # noqa: F401

    return time.perf_counter() - start


def _fitted(timed: Callable[[int], tuple[float, float]], sizes: tuple[int, int]) -> list[float]:
    """[seconds per call, seconds per unit] through the (units, seconds) of the two sizes' median calls."""
    (small_units, small), (large_units, large) = (_median(timed, n) for n in sizes)
    per_unit = max((large - small) / max(large_units - small_units, 1.0), 1e-15)
    return [max(small - per_unit * small_units, 0.0), per_unit]


def _median(timed: Callable[[int], tuple[float, float]], n: int) -> tuple[float, float]:
    timed(n)  # untimed: the first call pays for allocations and lazy imports
    found = [timed(n) for _ in range(REPEATS)]
    return statistics.median(u for u, _ in found), statistics.median(s for _, s in found)


def _features(rows: int, width: int, device: torch.device, generator: torch.Generator) -> torch.Tensor:
    return torch.randn(rows, width, generator=generator, dtype=torch.float64).to(device)


def _ridge(n: int, device: torch.device, generator: torch.Generator) -> tuple[float, float]:
    """Few-shot's solve as a run calls it: `n` shots of 10 classes, 4n-wide features, 4n test images."""
    from vitbench.engine.ridge import fewshot_accuracies

    classes, width, test = 10, 4 * n, 4 * n
    labels = np.arange(n * classes) % classes
    train = (_features(n * classes, width, device, generator), labels)
    scored = (_features(test, width, device, generator), torch.from_numpy(np.arange(test) % classes).to(device))
    start = time.perf_counter()
    fewshot_accuracies(train, scored, classes, n, 0, (1024.0,))
    _sync(device)
    return units("ridge", n * classes, test, width, classes, 1)[1], time.perf_counter() - start


def _knn(n: int, device: torch.device, generator: torch.Generator) -> tuple[float, float]:
    """k-NN's pass as a run calls it: `n` train and n/2 test images of 10 classes, 128-wide features."""
    from vitbench.engine.knn import knn_accuracies

    classes, width, test = 10, 128, n // 2
    train, scored = _features(n, width, device, generator), _features(test, width, device, generator)
    train_labels = torch.from_numpy(np.arange(n) % classes).to(device)
    test_labels = torch.from_numpy(np.arange(test) % classes).to(device)
    start = time.perf_counter()
    knn_accuracies(train, train_labels, scored, test_labels, classes, (20,))
    _sync(device)
    return units("knn", n, test, width, classes, 1)[1], time.perf_counter() - start


def _logistic(n: int, device: torch.device, generator: torch.Generator) -> tuple[float, float]:
    """One L-BFGS fit as the probe makes it (engine/logistic.py `solve`, which chooses scikit-learn
    or torch by size as a run does), `n` images of 16 classes, 128-wide, stopped at FIT_ITERATIONS:
    its units are the iterations it made."""
    classes, width = 16, 128
    x = _features(n, width, device, generator)
    y = torch.from_numpy(np.arange(n) % classes).to(device)
    start = time.perf_counter()
    _, iterations = logistic.solve(x, y, 1e-4, max_iter=FIT_ITERATIONS)
    _sync(device)
    return float(max(iterations, 1) * n * width * classes), time.perf_counter() - start


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)

"""The linear probe: the L-BFGS logistic regression against scikit-learn's at the same λ, the λ
sweep recorded, and the protocol end to end on the shared CIFAR-10 subset with DeiT-Ti."""

import json
import shutil

import numpy as np
import pytest
import torch
from conftest import DEIT_WEIGHTS, SHARED_DATA, needs_shared_data
from sklearn.linear_model import LogisticRegression

import vitbench
from vitbench import store
from vitbench.engine import logistic
from vitbench.engine.features import frozen_features
from vitbench.host.devices import Runtime


def sklearn_at(l2, x, y, x_test, y_test, features="raw"):
    """scikit-learn's logistic regression at CLIP's λ (C = 1 / λ) and its settings (lbfgs, 1,000
    iterations, the default tolerance), on the raw features as CLIP fits them, or standardised by
    the fitting set's mean and std."""
    mean, std = (x.mean(0), x.std(0) + 1e-5) if features == "standardized" else (0.0, 1.0)
    model = LogisticRegression(C=1 / l2, max_iter=1000)
    model.fit((x - mean) / std, y)
    return model, float((model.predict((x_test - mean) / std) == y_test).mean())


def mixture(classes: int, n: int, seed: int = 0, dims: int = 12):
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(classes, dims))
    y, y_test = rng.integers(0, classes, n), rng.integers(0, classes, n // 2)
    x = centres[y] + rng.normal(scale=2.0, size=(n, dims))
    return x, y, centres[y_test] + rng.normal(scale=2.0, size=(n // 2, dims)), y_test


def test_on_the_cpu_the_probe_is_scikit_learns_fit():
    """CLIP's reference itself: the same λ gives scikit-learn's model, raw and standardised."""
    x, y, x_test, y_test = mixture(4, 400)
    for features, l2 in [(f, l2) for f in ("raw", "standardized") for l2 in (0.04, 4.0, 400.0)]:
        probe = logistic.fit(torch.from_numpy(x), torch.from_numpy(y), 4, l2, features)
        model, theirs = sklearn_at(l2, x, y, x_test, y_test, features)
        assert probe.accuracy(torch.from_numpy(x_test), torch.from_numpy(y_test)) == theirs
        # the same fit (standardising in torch rounds the inputs in the last bits)
        assert np.allclose(probe.weight.numpy(), model.coef_.T, atol=1e-9)
        assert np.allclose(probe.bias.numpy(), model.intercept_, atol=1e-9)


def test_the_gpu_solver_reaches_scikit_learns_optimum():
    """torch's L-BFGS (what a GPU runs), here on the CPU: scikit-learn's objective and stopping rule,
    the same accuracy and weights within the stopping tolerance; two classes as one binary model."""
    for classes in (4, 2):
        x, y, x_test, y_test = mixture(classes, 400, seed=classes)
        for l2 in (0.04, 4.0, 400.0):
            found, iterations = logistic._torch(torch.from_numpy(x), torch.from_numpy(y), l2, logistic.MAX_ITER)
            model, theirs = sklearn_at(l2, x, y, x_test, y_test)
            assert 0 < iterations < logistic.MAX_ITER and found.coef.shape == model.coef_.shape
            # a softmax's intercepts are set up to a shared offset (unpenalised): compared centred
            centre = (lambda b: b - b.mean()) if classes > 2 else (lambda b: b)
            assert np.allclose(found.coef, model.coef_, atol=5e-3)
            assert np.allclose(centre(found.intercept), centre(model.intercept_), atol=5e-3)
            zero, one = torch.zeros(1, 12, dtype=torch.float64), torch.ones(1, 12, dtype=torch.float64)
            probe = found.probe(classes, zero, one)
            assert probe.accuracy(torch.from_numpy(x_test), torch.from_numpy(y_test)) == theirs


def test_classes_the_fit_never_saw_are_never_predicted_and_probabilities_are_scikit_learns():
    """A fitting set with 3 of 5 classes (or 2: scikit-learn's binary model) gives scikit-learn's
    probabilities over the classes it saw, and none to the others."""
    for present in ((0, 2, 4), (1, 3)):
        x, y, x_test, _ = mixture(len(present), 300, seed=len(present))
        y = np.asarray(present)[y]
        probe = logistic.fit(torch.from_numpy(x), torch.from_numpy(y), 5, 1.0)
        model, _ = sklearn_at(1.0, x, y, x_test, np.zeros(len(x_test)))
        probabilities = torch.softmax(probe.scores(torch.from_numpy(x_test)), dim=1).numpy()
        assert np.allclose(probabilities[:, list(present)], model.predict_proba(x_test), atol=1e-12)
        assert probabilities[:, [c for c in range(5) if c not in present]].max() == 0.0
        # the sweep's numpy scoring predicts what the probe does
        solution, _ = logistic.solve(torch.from_numpy(x), torch.from_numpy(y), 1.0)
        y_test = model.predict(x_test)
        assert solution.accuracy(x_test, y_test) == probe.accuracy(torch.from_numpy(x_test), torch.from_numpy(y_test))


def test_the_sweep_refines_around_the_best_and_prefers_the_larger_lambda_on_a_tie(caplog):
    calls = []
    scores = {1e-6: 0.5, 1e-5: 0.5, 1e-4: 0.6, 1e-3: 0.8, 1e-2: 0.8, 1e-1: 0.7, 1.0: 0.6, 10.0: 0.4, 100.0: 0.2}
    scores |= {1e3: 0.2, 1e4: 0.1, 1e5: 0.1, 1e6: 0.1}

    class Fit:
        def __init__(self, l2):
            self.l2 = l2

        def accuracy(self, z, y):
            calls.append(self.l2)
            return scores.get(self.l2, 0.79)

    real = logistic._solver
    logistic._solver = lambda x, y, features: lambda l2: (Fit(l2), 7)
    try:
        with caplog.at_level("INFO", logger="vitbench"):
            best, found = logistic.sweep((torch.zeros(3, 2), None), (torch.zeros(2, 2), torch.zeros(2)), 2)
    finally:
        logistic._solver = real
    assert best == 1e-2  # 1e-3 and 1e-2 tie: the larger λ
    # CLIP's range, a fit per decade, then 10^(±1/2), 10^(±1/4), 10^(±1/8) around the best: its eighths
    assert len(found) == len(calls) == 13 + 6 and found[best] == 0.8
    assert sorted(round(8 * np.log10(l2)) for l2 in found) == sorted([*range(-48, 49, 8), -20, -18, -17, -15, -14, -12])
    progress = [r.getMessage() for r in caplog.records if "linear probe: λ" in r.getMessage()]
    assert (
        len(progress) == 19 and progress[-1].startswith("linear probe: λ") and "(19/19), 7 iterations" in progress[-1]
    )


RUN = (
    "--model",
    "deit-ti/16",
    "--weights",
    DEIT_WEIGHTS,
    "--dataset",
    "cifar10",
    "--data-dir",
    SHARED_DATA,
    "--workers",
    "0",
)


def test_the_sweep_never_leaves_clips_range_where_the_best_is_at_its_edge():
    """CLIP's λ range is 1e-6..1e6. Before linear/6 a best at 1e6 (here every λ ties: the larger
    wins) was refined outward, and a random-init ResNet-18's CIFAR-100 probe chose λ = 7.5e6."""

    class Fit:
        def accuracy(self, z, y):
            return 0.0

    real = logistic._solver
    logistic._solver = lambda x, y, features: lambda l2: (Fit(), 7)
    try:
        best, found = logistic.sweep((torch.zeros(3, 2), None), (torch.zeros(2, 2), torch.zeros(2)), 2)
    finally:
        logistic._solver = real
    assert best == 1e6 and max(found) == 1e6 and min(found) == 1e-6
    assert sorted(round(8 * np.log10(l2)) for l2 in found) == [*range(-48, 41, 8), 44, 46, 47, 48]  # inward only


@needs_shared_data
def test_linear_and_knn_on_shared_cifar10_with_one_extraction(cli, results, deit_cifar10_linear):
    shutil.copytree(deit_cifar10_linear, results)  # the linear probe was run there, extracting every image once
    run_on = (*RUN[:-3], deit_cifar10_linear.parent / "data", *RUN[-2:])  # the first images of the shared subset
    code, _, err = cli("run", *run_on, "--protocol", "linear", "--results", results)
    assert code == 0, err
    df = store.read_results(results)
    run = df[df["metric"] == "accuracy"].iloc[0]
    metrics = dict(zip(df["metric"], df["value"], strict=True))
    sweep = json.loads(run["notes"])["l2_sweep"]
    assert len(sweep) == 19 and metrics["val_accuracy"] == max(sweep.values())
    # each fit's L-BFGS iterations, stored: what the dry run's price of a fit (EXPECTED_ITERATIONS) is checked on
    iterations = json.loads(run["notes"])["l2_iterations"]
    assert iterations.keys() == sweep.keys() and all(1 <= n <= 1000 for n in iterations.values())
    assert json.loads(run["hparams"])["linear_features"] == "raw"  # CLIP's A.3: no standardisation
    assert metrics["accuracy"] > 0.5  # DeiT-Ti's features separate CIFAR-10 well
    code, _, err = cli("run", *run_on, "--protocol", "knn", "--results", results)
    assert code == 0, err
    knn = store.read_results(results).query("protocol == 'knn' and metric == 'accuracy'")
    assert json.loads(knn["notes"].iloc[0])["features_from_cache"] is True and knn["value"].iloc[0] > 0.5
    code, md, _ = cli("table", "--protocol", "knn", "--format", "md", "--results", results)
    assert code == 0 and "| CIFAR-10 |" in md and "‡ |" in md and "one run each" in md

    # the same λ on the same (cached) features: scikit-learn's accuracy within 0.5 points
    (group,) = vitbench.plan(model="deit-ti/16", weights=str(DEIT_WEIGHTS), datasets="cifar10", protocol="linear",
                             data_dir=deit_cifar10_linear.parent / "data", results=results)  # fmt: skip
    runtime = Runtime.of(vitbench.api.request(results=results), torch.device("cpu"))
    found = frozen_features(group, runtime, ("train", "test"))
    assert not found.extracted
    l2 = metrics["l2"]
    _, theirs = sklearn_at(l2, found.train.values.astype(np.float64), found.train.labels,
                           found.test.values.astype(np.float64), found.test.labels)  # fmt: skip
    ours = logistic.fit(torch.from_numpy(found.train.values), torch.from_numpy(found.train.labels), 10, l2)
    accuracy = ours.accuracy(torch.from_numpy(found.test.values), torch.from_numpy(found.test.labels))
    assert accuracy == pytest.approx(metrics["accuracy"]) and abs(accuracy - theirs) <= 0.005

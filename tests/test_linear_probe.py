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
from vitbench.devices import Runtime
from vitbench.engine import logistic
from vitbench.engine.features import frozen_features


def sklearn_at(l2, x, y, x_test, y_test, features="raw"):
    """scikit-learn's multinomial logistic regression at CLIP's λ (C = 1 / λ), on the raw features
    as CLIP's A.3 fits them, or standardised by the fitting set's mean and std."""
    mean, std = (x.mean(0), x.std(0) + 1e-5) if features == "standardized" else (0.0, 1.0)
    model = LogisticRegression(C=1 / l2, max_iter=5000, tol=1e-10)
    model.fit((x - mean) / std, y)
    return model, float((model.predict((x_test - mean) / std) == y_test).mean())


def test_the_same_lambda_gives_scikit_learns_model():
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(4, 12))
    y, y_test = rng.integers(0, 4, 400), rng.integers(0, 4, 200)
    x = centres[y] + rng.normal(scale=2.0, size=(400, 12))
    x_test = centres[y_test] + rng.normal(scale=2.0, size=(200, 12))
    for features, l2 in [(f, l2) for f in ("raw", "standardized") for l2 in (0.04, 4.0, 400.0)]:
        probe = logistic.fit(torch.from_numpy(x), torch.from_numpy(y), 4, l2, features)
        model, theirs = sklearn_at(l2, x, y, x_test, y_test, features)
        assert probe.accuracy(torch.from_numpy(x_test), torch.from_numpy(y_test)) == pytest.approx(theirs, abs=1e-9)
        # the same optimum: the weights agree (up to the softmax's shared offset, removed by centring)
        ours = probe.weight.numpy() - probe.weight.numpy().mean(axis=1, keepdims=True)
        assert np.allclose(ours, model.coef_.T - model.coef_.T.mean(axis=1, keepdims=True), atol=1e-4)


def test_the_sweep_refines_around_the_best_and_prefers_the_larger_lambda_on_a_tie():
    calls = []
    scores = {1e-6: 0.5, 1e-5: 0.5, 1e-4: 0.6, 1e-3: 0.8, 1e-2: 0.8, 1e-1: 0.7, 1.0: 0.6, 10.0: 0.4, 100.0: 0.2}
    scores |= {1e3: 0.2, 1e4: 0.1, 1e5: 0.1, 1e6: 0.1}

    class Probe:
        def __init__(self, l2):
            self.l2 = l2

        def accuracy(self, x, y):
            calls.append(self.l2)
            return scores.get(self.l2, 0.79)

    real = logistic.fit
    logistic.fit = lambda x, y, k, l2, features: Probe(l2)
    try:
        best, found = logistic.sweep((None, None), (None, None), 2)
    finally:
        logistic.fit = real
    assert best == 1e-2  # 1e-3 and 1e-2 tie: the larger λ
    # CLIP's range, a fit per decade, then 10^(±1/2), 10^(±1/4), 10^(±1/8) around the best: its eighths
    assert len(found) == len(calls) == 13 + 6 and found[best] == 0.8
    assert sorted(round(8 * np.log10(l2)) for l2 in found) == sorted([*range(-48, 49, 8), -20, -18, -17, -15, -14, -12])


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
    assert json.loads(run["hparams"])["features"] == "raw"  # CLIP's A.3: no standardisation
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

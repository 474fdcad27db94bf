"""The k-NN protocol: DINO's weighted vote (eval_knn.py) against a brute-force transcription, the
uniform vote against scikit-learn, and end to end through the CLI on the few-shot feature cache."""

import json

import numpy as np
import pytest
import torch
from sklearn.neighbors import KNeighborsClassifier

from vitbench import store
from vitbench.engine.knn import knn_accuracies


def brute_force(train, train_y, test, test_y, classes, k, temperature):
    """facebookresearch/dino eval_knn.py `knn_classifier`, one test image at a time in numpy."""
    train = train / np.linalg.norm(train, axis=1, keepdims=True)
    test = test / np.linalg.norm(test, axis=1, keepdims=True)
    top1 = top5 = 0
    for x, y in zip(test, test_y, strict=True):
        similarity = train @ x
        nearest = np.argsort(-similarity, kind="stable")[:k]
        votes = np.zeros(classes)
        for i in nearest:
            votes[train_y[i]] += np.exp(similarity[i] / temperature)
        ranked = np.argsort(-votes, kind="stable")
        top1 += ranked[0] == y
        top5 += y in ranked[: min(5, k)]  # DINO: "top5 does not make sense if k < 5"
    return top1 / len(test), top5 / len(test)


@pytest.fixture
def features():
    rng = np.random.default_rng(0)
    classes = 7
    centres = rng.normal(size=(classes, 16))
    train_y, test_y = rng.integers(0, classes, 300), rng.integers(0, classes, 120)
    train = centres[train_y] + rng.normal(scale=1.5, size=(300, 16))
    test = centres[test_y] + rng.normal(scale=1.5, size=(120, 16))
    return train, train_y, test, test_y, classes


def test_weighted_vote_equals_dinos_rule_exactly(features):
    train, train_y, test, test_y, classes = features
    ks = (1, 3, 5, 20, 100)
    found = knn_accuracies(*map(torch.from_numpy, (train, train_y, test, test_y)), classes, ks, temperature=0.07)
    for k in ks:
        assert found[k] == brute_force(train, train_y, test, test_y, classes, k, 0.07), k
    assert 1 / classes < found[20][0] < 1.0 and found[20][1] >= found[20][0]
    # below 5 neighbours, top-5 counts only the classes that got a vote: 1-NN's top-5 is its top-1
    assert found[1][1] == found[1][0]


def test_uniform_vote_equals_scikit_learn(features):
    train, train_y, test, test_y, classes = features
    for k in (1, 4, 20):
        ours = knn_accuracies(*map(torch.from_numpy, (train, train_y, test, test_y)), classes, (k,), weighted=False)
        sklearn = KNeighborsClassifier(n_neighbors=k, metric="cosine", algorithm="brute").fit(train, train_y)
        assert ours[k][0] == pytest.approx(float((sklearn.predict(test) == test_y).mean()), abs=1e-12), k


RUN = ("run", "--model", "vit-ti/16", "--weights", "random", "--dataset", "digits", "--res", "32", "--workers", "0")


def test_knn_runs_on_the_fewshot_feature_cache_and_tables_by_k(cli, results):
    code, _, err = cli(*RUN, "--protocol", "knn", "--knn-k", "5,20", "--results", results)
    assert code == 0, err
    df = store.read_results(results)
    runs = df[df["metric"] == "accuracy"]
    assert sorted(json.loads(h)["knn_k"] for h in runs["hparams"]) == [5, 20]
    assert set(df["metric"]) == {"accuracy", "accuracy_top5"} and set(runs["protocol_version"]) == {"knn/3"}
    assert not any(json.loads(n)["features_from_cache"] for n in runs["notes"])
    # few-shot on the same model and data extracts nothing: the k-NN run's features are in the cache
    code, _, err = cli(*RUN, "--shots", "5", "--seeds", "0", "--results", results)
    assert code == 0, err
    fewshot = store.read_results(results).query("protocol == 'fewshot'")
    assert json.loads(fewshot["notes"].iloc[0])["features_from_cache"] is True
    code, md, _ = cli("table", "--protocol", "knn", "--format", "md", "--results", results)
    assert code == 0 and "| k=5 | k=20 |" in md  # the model all columns share is in the title
    code, _, err = cli(*RUN, "--protocol", "knn", "--knn-k", "0", "--results", results)
    assert code != 0 and "--knn-k 0: expected an integer from 1 to" in err

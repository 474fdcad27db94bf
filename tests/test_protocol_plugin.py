"""A protocol and a dataset from another package: nearest-class-mean on frozen features, defined
here, installed as a real wheel that registers through the `vitbench.protocols` and
`vitbench.datasets` entry-point groups, and run end to end through `vitbench run`, the store and
`vitbench table`, without any change to vitbench's own modules."""

import os
import subprocess
import sys

import pytest
from conftest import install_wheel

PACKAGE = '''
"""Nearest class mean: each test image takes the class whose mean L2-normalised train feature is
closest in cosine similarity."""
from datetime import UTC, datetime

import numpy as np
import torch

from vitbench.datasets.base import DatasetSpec, Split
from vitbench.datasets.digits import load_digits
from vitbench.devices import Clock
from vitbench.engine.features import group_model, outputs_over
from vitbench.protocols.base import Protocol


class NearestClassMean(Protocol):
    name = "ncm"
    version = "ncm/1"
    summary = "nearest class mean on L2-normalised frozen features"
    label = "nearest-class-mean"

    def splits(self, dataset):
        return dataset.fewshot_splits

    def plan(self, group, req, weights_sha, hparams):
        first = group.splits[self.splits(group.dataset)[0]]
        return [self.base_spec(group, first, weights_sha, {**hparams, "normalise": "l2"}, seed=0)]

    def run(self, group, todo, req, device, recorder):
        started, clock = datetime.now(UTC), Clock(device)
        model = group_model(group, keep_head=False)
        features = group.model.backend.features
        (train, _), (test, _) = [
            outputs_over(group, s, req, device, clock, {"representation": "ncm"}, features, model)
            for s in self.splits(group.dataset)
        ]
        unit = lambda x: x / np.linalg.norm(x, axis=1, keepdims=True)
        train_x, test_x = unit(train.values.astype(np.float64)), unit(test.values.astype(np.float64))
        means = np.stack([train_x[train.labels == c].mean(0) for c in range(group.dataset.num_classes)])
        accuracy = float((np.argmax(test_x @ means.T, axis=1) == test.labels).mean())
        recorder.record(
            group, todo[0], {"accuracy": accuracy}, started, seconds=clock.seconds,
            images=float(len(train.labels) + len(test.labels)), n_train=len(train.labels),
            n_test=len(test.labels), skipped=[], notes={},
        )


def load_low_digits(root, split):
    """Digits 0-4 only."""
    digits = load_digits(root, split)
    keep = np.flatnonzero(digits.labels < 5)
    images = digits.images[keep]
    return Split("low-digits", split, digits.labels[keep], "acme", digits.fingerprint + ":0-4", images=images)


PROTOCOL = NearestClassMean()
DATASETS = [
    DatasetSpec("low-digits", "Digits 0-4", 5, None, {"train": None, "test": None}, load_low_digits, source="acme")
]
'''

ENTRY_POINTS = "[vitbench.protocols]\nncm = acme_ncm:PROTOCOL\n[vitbench.datasets]\nlow = acme_ncm:DATASETS\n"


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    return install_wheel(tmp_path_factory.mktemp("ncm"), "acme-ncm", {"acme_ncm.py": PACKAGE}, ENTRY_POINTS)


def vitbench(site, *args):
    env = {**os.environ, "PYTHONPATH": str(site), "COLUMNS": "200"}
    env.pop("VITBENCH_DISABLE_PLUGIN_AUTOLOAD", None)
    done = subprocess.run(
        [sys.executable, "-c", "from vitbench.cli import main; main()", *args], env=env, capture_output=True, text=True
    )
    return done.returncode, done.stdout, done.stderr


def test_a_protocol_and_a_dataset_from_another_package_run_end_to_end(site, tmp_path):
    results = tmp_path / "results"
    code, out, _ = vitbench(site, "ls", "protocols")
    assert code == 0 and "ncm" in out and "nearest class mean" in out
    run = ("run", "--model", "vit-ti/16", "--weights", "random", "--res", "32", "--workers", "0", "--results", results)
    code, _, err = vitbench(site, *run, "--protocol", "ncm", "--dataset", "low-digits")
    assert code == 0, err
    assert "[1/1] vit-ti/16 (random init) low-digits ncm: accuracy" in err

    import duckdb

    con = duckdb.connect(str(results / "vitbench.duckdb"), read_only=True)
    protocol, version, dataset, source, value = con.execute(
        "SELECT protocol, protocol_version, dataset, data_source, value FROM runs JOIN metrics USING (run_key)"
    ).fetchone()
    con.close()
    assert (protocol, version, dataset, source) == ("ncm", "ncm/1", "low-digits", "acme")
    assert 0.2 < value <= 1.0  # five classes: chance is 0.2, and a random ViT's features separate digits

    code, out, _ = vitbench(site, *run, "--protocol", "ncm", "--dataset", "low-digits")
    assert code == 0 and "1 already stored, 0 to run" in _
    code, csv, err = vitbench(site, "table", "--protocol", "ncm", "--format", "csv", "--results", results)
    assert code == 0, err
    cells = [line for line in csv.splitlines() if line.startswith("Digits 0-4,")]
    assert len(cells) == 1 and float(cells[0].split(",")[2]) == pytest.approx(value * 100)


def test_a_protocol_registered_in_process_runs_through_the_python_api(tmp_path):
    """A notebook's way: `register` a protocol object, then `vitbench.run` and `vitbench.results`."""
    import vitbench
    from vitbench.errors import UserError
    from vitbench.protocols import registry

    namespace: dict = {}
    exec(PACKAGE, namespace)  # the same protocol, defined in this process instead of installed
    registry.register(namespace["PROTOCOL"])
    try:
        summary = vitbench.run(
            model="vit-ti/16", weights="random", protocol="ncm", datasets="digits", res=32, workers=0,
            results=tmp_path,
        )  # fmt: skip
        assert [s.protocol for s in summary.specs] == ["ncm"] and summary.ran == 1
        frame = vitbench.results(tmp_path, where=["protocol=ncm"])
        assert list(frame["metric"]) == ["accuracy"] and 0.1 < frame["value"].iloc[0] <= 1.0
        with pytest.raises(UserError, match="--protocol nope: expected fewshot, eval, .*, pretrain, ncm"):
            registry.get_protocol("nope")
    finally:
        registry._registered.pop("ncm")

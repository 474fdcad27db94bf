"""Issue 80, goal 2: chance and coverage from the data. The shared Pets subset holds 3 of the 37
breeds: chance is 100 / 3, and `doctor`, the table's subset footnote and the figures say "3 of 37
classes" (before: the figure's chance line sat at 100 / 37 = 2.7 %, and nothing said the subset
covers 3 classes)."""

from __future__ import annotations

import pandas as pd
import pytest
from conftest import SHARED_DATA, needs_shared_data

import vitbench
from vitbench import store
from vitbench.store.query import json_field

pytestmark = needs_shared_data


@pytest.fixture(scope="module")
def pets(tmp_path_factory):
    results = tmp_path_factory.mktemp("pets") / "results"
    vitbench.run(model="vit-ti/16", weights="random", datasets="pets", protocol="fewshot,knn", shots=(1, 5),
                 seeds=(0,), knn_k=(5,), res=32, workers=0, data_dir=SHARED_DATA, results=results)  # fmt: skip
    return results


def test_a_subset_of_3_of_37_classes_has_chance_one_in_three_everywhere(cli, pets, tmp_path):
    runs = store.read_results(pets).drop_duplicates("run_key")
    assert {(n["test_classes"]["present"], n["test_classes"]["of"]) for n in runs["notes"].map(json_field)} == {(3, 37)}
    code, table, err = cli("table", "--results", pets)
    assert code == 0, err
    # with 3 classes present a top-5 holds them all: k-NN's top-5 of 100 % is chance, and said so
    assert "scored on fewer classes than the dataset has: pets 3 of 37 classes (chance 33.3 %, top-5 100 %)" in table
    code, table, err = cli("table", "--protocol", "fewshot", "--results", pets)  # no top-5 among these runs
    assert code == 0 and "pets 3 of 37 classes (chance 33.3 %)" in table and "top-5" not in table
    code, out, err = cli("plot", "fewshot", "--out", tmp_path / "plots", "--formats", "png", "--results", pets)
    assert code == 0, err
    points = pd.read_csv(tmp_path / "plots" / "fewshot_shots.csv")
    assert points.loc[points["kind"] == "chance", "mean"].round(2).tolist() == [33.33]
    code, out, err = cli("doctor", "--data-dir", SHARED_DATA)
    assert code == 0, err
    line = next(line for line in out.splitlines() if "│ pets " in line)
    assert "test 298 / 3,669 (subset: 3 of 37 classes)" in line

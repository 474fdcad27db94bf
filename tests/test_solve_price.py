"""Issue 80, goal 4: the dry run prices what runs compute on frozen features — few-shot's ridge,
k-NN's pass and vote, the linear probe's λ sweep of L-BFGS fits — at a pace measured on this
device and kept per machine (execution/solve_price.py, engine/solve_pace.py). Before, a few-shot +
k-NN + linear plan ran 2.2x its dry run: the solves were not counted."""

from __future__ import annotations

import json
import math
import sys

import pytest
import torch

import vitbench
from vitbench.engine import solve_pace
from vitbench.engine.logistic import FITS
from vitbench.execution import solve_price
from vitbench.execution.estimate import duration
from vitbench.host.devices import cpu_name
from vitbench.protocols.registry import get_protocol

PLAN = dict(model="vit-ti/16", weights="random", datasets="digits", res=32, protocol="fewshot,knn,linear",
            shots=(1, 5), seeds=(0,), knn_k=(5, 20))  # fmt: skip
PACE = {"ridge": [0.01, 1e-9], "knn": [0.02, 2e-9], "logistic": [0.03, 3e-9]}
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def groups():
    return {g.protocol: g for g in vitbench.plan(**PLAN)}


def test_each_frozen_protocol_declares_the_solves_its_runs_compute(groups):
    fewshot, knn, linear = (get_protocol(name).work(groups[name]).solves for name in ("fewshot", "knn", "linear"))
    # a ridge per run: its shots of each of digits' 10 classes, scored on the 797 test digits at one λ
    assert [(s.kind, s.train, s.test, s.classes, s.repeats) for s in fewshot] == [
        ("ridge", 10, 797, 10, 1), ("ridge", 50, 797, 10, 1)
    ]  # fmt: skip
    assert [s.runs for s in fewshot] == [(spec.run_key,) for spec in groups["fewshot"].specs]
    # one similarity pass over the 1,000 train digits serves both k
    (pass_,) = knn
    assert (pass_.kind, pass_.train, pass_.test, pass_.repeats) == ("knn", 1000, 797, 2)
    assert pass_.runs == tuple(spec.run_key for spec in groups["knn"].specs)
    # the sweep's fits on train less its validation tenth, and the refit: the classes train holds
    (probe,) = linear
    assert (probe.kind, probe.train, probe.classes, probe.repeats, probe.held_out) == ("logistic", 1000, 10, FITS, 100)
    assert FITS == 20  # 13 decades, 6 refinements, the refit


def test_a_plan_prices_each_runs_share_of_its_solves_at_the_kept_pace(groups, tmp_path, monkeypatch):
    measured = []
    def measure(device):  # as the real one does: its fits import scikit-learn
        measured.append(device)
        sys.modules.setdefault("sklearn.linear_model", linear_model)
        return PACE

    from sklearn import linear_model

    monkeypatch.setattr(solve_pace, "measure", measure)
    monkeypatch.setattr(solve_pace, "import_seconds", lambda: 0.5)
    monkeypatch.delitem(sys.modules, "sklearn.linear_model", raising=False)  # as in a fresh process
    planned = list(groups.values())
    todo = {s.run_key for g in planned for s in g.specs}
    found = solve_price.plan_solves(planned, todo, CPU, cpu_name(), tmp_path)
    assert len(measured) == 1 and found.pace is not None and found.pace.sklearn_import == 0.5
    width = groups["fewshot"].model.backend.representation_width(groups["fewshot"].model, 32)
    assert width == 192  # ViT-Ti's LN(CLS)
    one_shot = groups["fewshot"].specs[0].run_key
    calls, units = solve_pace.units("ridge", 10, 797, width, 10, 1)
    assert found.seconds[one_shot] == pytest.approx(calls * 0.01 + units * 1e-9)
    # k-NN's one pass, halved between its two k
    knn_keys = [s.run_key for s in groups["knn"].specs]
    calls, units = solve_pace.units("knn", 1000, 797, width, 10, 2)
    assert [found.seconds[k] for k in knn_keys] == pytest.approx([(calls * 0.02 + units * 2e-9) / 2] * 2)
    # the probe's 20 fits at the expected iterations, and scikit-learn's import (a fresh process pays it once)
    probe = groups["linear"].specs[0].run_key
    rows = (FITS - 1) * 900 + 1000
    # (random init: its fits priced at more iterations than a trained model's, as measured on real sweeps)
    iterations = solve_pace.EXPECTED_ITERATIONS["random init"]
    assert iterations > solve_pace.EXPECTED_ITERATIONS["trained"]
    expected = FITS * 0.03 + iterations * rows * width * 10 * 3e-9 + 0.5
    assert found.seconds[probe] == pytest.approx(expected)
    # a run already done pays nothing; one of k-NN's k still to do pays the whole pass
    found = solve_price.plan_solves(planned, todo - {knn_keys[0], probe}, CPU, cpu_name(), tmp_path)
    assert found.seconds[knn_keys[1]] == pytest.approx(calls * 0.02 + units * 2e-9) and probe not in found.seconds
    assert len(measured) == 1  # kept: the next dry run reads the pace


def test_a_kept_pace_that_is_no_measurement_or_taken_busy_is_measured_again(groups, tmp_path, monkeypatch):
    measured = []
    monkeypatch.setattr(solve_pace, "measure", lambda device: measured.append(device) or PACE)
    planned, path = [groups["linear"]], tmp_path / solve_price.SOLVE_PACES
    todo = {groups["linear"].specs[0].run_key}
    solve_price.plan_solves(planned, todo, CPU, cpu_name(), tmp_path)
    (key, entry), = json.loads(path.read_text()).items()  # fmt: skip
    for damaged in ("{not json", json.dumps({key: {**entry, "knn": [0.1, -1.0]}}),
                    json.dumps({key: {**entry, "logistic": [float("nan"), 1e-9]}}),
                    json.dumps({key: {**entry, "measured": "yesterday"}}), json.dumps({key: "fast"})):  # fmt: skip
        path.write_text(damaged)
        before = len(measured)
        found = solve_price.plan_solves(planned, todo, CPU, cpu_name(), tmp_path)
        assert len(measured) == before + 1 and all(math.isfinite(s) and s > 0 for s in found.seconds.values())
    # measured beside other work: measured again once the machine is quiet, and kept then
    path.write_text(json.dumps({key: {**entry, "busy": 0.9}}))
    solve_price.plan_solves(planned, todo, CPU, cpu_name(), tmp_path)
    solve_price.plan_solves(planned, todo, CPU, cpu_name(), tmp_path)
    assert len(measured) == 7
    # a plan with nothing to solve measures nothing
    assert solve_price.plan_solves(planned, set(), CPU, cpu_name(), tmp_path).pace is None and len(measured) == 7


def test_the_pace_is_measured_with_the_real_solvers():
    """A fraction of a second on random features: a cost per call and per unit for every kind, a
    kept entry's shape (engine/solve_pace.py times fewshot_accuracies, knn_accuracies and the
    probe's own fit)."""
    pace = solve_pace.measure(CPU)
    assert set(pace) == {"ridge", "knn", "logistic"}
    assert all(call >= 0 and 0 < unit < 1e-6 for call, unit in pace.values())
    assert solve_price.is_pace({**pace, "measured": "2026-11-28 10:00 UTC", "busy": 0.0})


def test_a_linear_probes_plan_shows_its_solves_and_explains_their_price(cli, results, tmp_path, monkeypatch):
    # a user cache of its own: the session's is shared with tests in other processes that keep a rate for
    # the same model and size, and a rate one of them wrote between two of theirs would move their price
    monkeypatch.setenv("VITBENCH_CACHE", str(tmp_path / "user-cache"))
    code, out, err = cli("run", "--model", "vit-ti/16", "--weights", "random", "--dataset", "digits", "--res", "32",
                         "--protocol", "linear", "--results", results, "--dry-run", "--explain")  # fmt: skip
    assert code == 0, err
    total = next(line for line in out.splitlines() if line.startswith("1 run(s) to do"))
    # 20 fits of 1,000 x 192 x 10 at random init's 128 iterations, at the pace this dry run kept (measured
    # on a machine two test workers share, 1.4e-10 to 2.5e-10 s a unit here: 0.8 s to 1.2 s in all), and
    # scikit-learn's import where this process had not imported it yet
    (entry,) = json.loads((tmp_path / "user-cache" / solve_price.SOLVE_PACES).read_text()).values()
    iterations = solve_pace.EXPECTED_ITERATIONS["random init"]
    calls, work = solve_pace.units("logistic", 1000, 797, 192, 10, FITS, 100, iterations)
    seconds = calls * entry["logistic"][0] + work * entry["logistic"][1]
    said = {f"solves {duration(seconds)},", f"solves {duration(seconds + entry.get('import', 0.0))},"}
    assert any(part in total for part in said), (total, said)
    assert "each of the linear probe's fits at 80 L-BFGS iterations on trained weights' features, 128 on random " \
        "init's" in " ".join(out.split())  # fmt: skip
    assert "where this folder's linear runs show" not in out  # none stored: the prior alone


def test_the_probes_fits_are_priced_at_the_iterations_the_folders_own_linear_runs_took(cli, tmp_path, monkeypatch):
    """Before: every fit at the prior (80 trained, 128 random init) however many iterations the same
    dataset's stored runs had taken; here the median of theirs, said by --explain."""
    from statistics import mean

    from vitbench import store

    monkeypatch.setattr(solve_pace, "measure", lambda device: PACE)
    results = tmp_path / "results"
    probe = dict(model="vit-ti/16", weights="random", datasets="digits", protocol="linear", seeds=(0,))
    vitbench.run(**probe, res=32, results=results)
    took = mean(json.loads(store.read_results(results)["notes"].iloc[0])["l2_iterations"].values())
    assert solve_price.stored_iterations(results, "cpu") == {("digits", "random init"): [pytest.approx(took)]}
    assert solve_price.stored_iterations(results, "cuda") == {}  # another device's solver stops elsewhere
    (group,) = vitbench.plan(**probe, res=48)
    todo = {group.specs[0].run_key}
    learned = solve_price.plan_solves([group], todo, CPU, cpu_name(), tmp_path, results)
    prior = solve_price.plan_solves([group], todo, CPU, cpu_name(), tmp_path)
    assert learned.learned == {("digits", "random init"): (pytest.approx(took), 1)} and prior.learned == {}
    width = group.model.backend.representation_width(group.model, 48)
    rows = (FITS - 1) * 900 + 1000
    key = group.specs[0].run_key
    expected = learned.seconds[key] - prior.seconds[key]
    assert expected == pytest.approx((took - solve_pace.EXPECTED_ITERATIONS["random init"]) * rows * width * 10 * 3e-9)
    monkeypatch.setenv("VITBENCH_CACHE", str(tmp_path / "user-cache"))  # (as above)
    code, out, err = cli("run", "--model", "vit-ti/16", "--weights", "random", "--dataset", "digits", "--res", "48",
                         "--protocol", "linear", "--results", results, "--dry-run", "--explain")  # fmt: skip
    assert code == 0, err
    assert "where this folder's linear runs show what a fit took on the same dataset and kind of weights, the " \
        f"median of theirs: digits (random init) {took:.0f} (1 run)" in " ".join(out.split())  # fmt: skip

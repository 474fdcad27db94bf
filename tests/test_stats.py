"""Numbers a reviewer trusts: intervals that cover, paired tests equal to statsmodels', marks that
respond to significance (not to the size of a difference alone), `vitbench compare`, and the
`--ci` table (golden)."""

from __future__ import annotations

import re

import numpy as np
import pytest
from statsmodels.stats.contingency_tables import mcnemar
from statsmodels.stats.multitest import multipletests
from test_tables import build_store, check_golden, column_of, write_run

from vitbench import store
from vitbench.store.predictions import Predictions, write_predictions
from vitbench.views.statistics import methods as stats
from vitbench.views.statistics.significance import SIGNIFICANT_MARK
from vitbench.views.tables import render, table


def test_the_bootstrap_interval_covers_a_known_rate_95_percent_of_the_time():
    rng = np.random.default_rng(123)
    rate, n, repetitions = 0.8, 300, 800
    covered = 0
    for i in range(repetitions):
        outcomes = rng.random(n) < rate
        low, high = stats.bootstrap_interval(outcomes, samples=1000, seed=i)
        covered += low <= rate <= high
    assert 0.93 <= covered / repetitions <= 0.97, covered / repetitions


def test_a_mean_of_seeds_resamples_seeds_too():
    """Three runs that disagree (rates 0.6, 0.7, 0.8 on the same images): the interval of their mean
    is wider than one pooled over images alone would be."""
    rng = np.random.default_rng(0)
    runs = np.stack([rng.random(2000) < r for r in (0.6, 0.7, 0.8)])
    low, high = stats.bootstrap_interval(runs)
    pooled_low, pooled_high = stats.bootstrap_interval(runs.mean(axis=0) > 0.5)
    assert low < runs.mean() < high and (high - low) > 2 * (pooled_high - pooled_low) * 0.5
    assert stats.bootstrap_interval(runs) == (low, high)  # seeded: the same store, the same interval


@pytest.mark.parametrize("table_", [[[30, 7], [2, 40]], [[10, 0], [0, 10]], [[5, 12], [3, 80]], [[0, 25], [1, 0]]])
def test_exact_mcnemar_equals_statsmodels(table_):
    (both, only_a), (only_b, neither) = table_
    a = np.array([1] * both + [1] * only_a + [0] * only_b + [0] * neither, dtype=bool)
    b = np.array([1] * both + [0] * only_a + [1] * only_b + [0] * neither, dtype=bool)
    assert stats.mcnemar_exact(a, b) == pytest.approx(mcnemar(table_, exact=True).pvalue, abs=1e-12)


def test_holm_equals_statsmodels():
    p = [0.01, 0.04, 0.03, 0.2, 0.001]
    assert stats.holm(p) == pytest.approx(list(multipletests(p, method="holm")[1]))


def with_predictions(results, key: str, correct: np.ndarray, **fields) -> None:
    """A stored run whose kept predictions have the given per-image outcomes (label 0; wrong: class 1)."""
    labels = np.zeros(len(correct), dtype=np.int64)
    top = np.stack([np.where(correct, 0, 1), np.where(correct, 1, 0)], axis=1)
    kept = write_predictions(results, key, Predictions([f"img{i}" for i in range(len(correct))], labels, top))
    write_run(results, key, {"accuracy": float(correct.mean())}, notes={"predictions": kept}, **fields)


def test_marks_respond_to_significance_not_to_size(tmp_path):
    """On 40 images, 10 points apart is not significant; on 4,000, 3 points apart (consistently) is."""
    results = tmp_path / "results"
    rng = np.random.default_rng(5)
    small, big = rng.random(40) < 0.7, rng.random(4000) < 0.7
    for name, base in (("small", small), ("big", big)):
        better = base.copy()
        flips = np.flatnonzero(~base)[: 4 if name == "small" else 120]  # +10 points / +3 points
        better[flips] = True
        with_predictions(results, f"{name}-a", base, dataset="cifar10" if name == "small" else "pets",
                         weights_sha256="aa" * 32)  # fmt: skip
        with_predictions(results, f"{name}-b", better, dataset="cifar10" if name == "small" else "pets",
                         weights_sha256="bb" * 32)  # fmt: skip
    store.ingest_pending(store.connect(results), results)
    data = table.accuracy_view(store.read_results(results), ci=results)
    b_col = column_of(data, "bbbbbbbbbbbb")
    assert SIGNIFICANT_MARK not in data.cells[("CIFAR-10", b_col)].marks  # +10 points, 40 images
    assert SIGNIFICANT_MARK in data.cells[("Oxford-IIIT Pets", b_col)].marks  # +3 points, 4,000 images
    interval = data.cells[("CIFAR-10", b_col)].interval
    assert interval is not None and interval[0] < data.cells[("CIFAR-10", b_col)].mean / 100 < interval[1]


def test_compare_prints_delta_interval_and_p(cli, tmp_path):
    results = tmp_path / "results"
    rng = np.random.default_rng(1)
    for seed in (0, 1, 2):
        base = rng.random(500) < 0.6
        better = base | (rng.random(500) < 0.2)
        with_predictions(results, f"s{seed}-10", base, seed=seed, shots=10, protocol="fewshot")
        with_predictions(results, f"s{seed}-25", better, seed=seed, shots=25, protocol="fewshot")
    code, out, err = cli("compare", "shots=10", "shots=25", "--format", "md", "--results", results)
    assert code == 0, err
    row = next(line for line in out.splitlines() if line.startswith("| cifar10 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[3].startswith("+") and cells[5] == "< 0.0005" and "paired bootstrap over 3 seed(s)" in cells[7]
    code, _, err = cli("compare", "shots=10", "model=nothing", "--results", results)
    assert code != 0 and "selects no stored accuracy" in err and "Traceback" not in err


def test_compare_names_the_field_to_add_and_keeps_the_marks(cli, tmp_path):
    """After the demo, `compare shots=10 shots=25` selected pre-trained and random-init runs of each
    seed and said only "narrow it"; a Flowers subset printed +0.00, p 1 with no word why."""
    results = tmp_path / "results"
    rng = np.random.default_rng(3)
    for seed in (0, 1):
        for shots in (10, 25):
            outcomes = rng.random(200) < 0.6
            for weights in ("/w/mine.safetensors", "random"):
                fields = dict(seed=seed, shots=shots, protocol="fewshot", weights=weights, dataset="flowers102")
                with_predictions(results, f"{weights[-6:]}-{shots}-{seed}", outcomes, data_subset=True, **fields)
    code, _, err = cli("compare", "shots=10", "shots=25", "--results", results)
    assert code == 2 and "compare A: selects 4 runs on flowers102; they differ in weights" in err
    assert "narrow it, e.g. shots=10,weights=/w/mine.safetensors (or --where for both sides" in err
    # the clauses it suggests work, and the cells keep their ‡ mark with its footnote
    code, out, err = cli("compare", "shots=10,weights=random", "shots=25,weights=random", "--format", "md",
                         "--results", results)  # fmt: skip
    assert code == 0, err
    row = next(line for line in out.splitlines() if line.startswith("| flowers102 |"))
    assert row.count("‡") == 2 and "subset of the official splits" in out


def test_table_ci_golden(tmp_path):
    results = build_store(tmp_path / "results")
    rng = np.random.default_rng(7)
    for seed in (0, 1, 2):  # beside the fixture's CIFAR-10 runs: two columns with kept predictions
        good = np.ones(1000, dtype=bool)
        good[rng.choice(1000, 7, replace=False)] = False  # 99.30: within 2 std (0.06) of bit-l's 99.37
        worse = good.copy()
        worse[rng.choice(np.flatnonzero(good), 40, replace=False)] = False  # 95.30, on the same images
        for sha, outcomes in (("cc", good), ("dd", worse)):
            with_predictions(results, f"c10-{sha}-{seed}", outcomes, seed=seed, weights_sha256=sha * 32,
                             protocol_version="finetune/3")  # fmt: skip
    store.ingest_pending(store.connect(results), results)
    data = table.accuracy_view(store.read_results(results), compare=["bit-l"], ci=results)
    check_golden("table2_ci.md", render.render_text(data, "md"))
    cc, dd = (column_of(data, sha * 6) for sha in ("cc", "dd"))
    assert "≈" in data.cells[("CIFAR-10", cc)].marks and "≈" not in data.cells[("CIFAR-10", dd)].marks
    # one comparison (the later column against the row's first with predictions), and it is significant
    assert sum(SIGNIFICANT_MARK in data.cells[("CIFAR-10", c)].marks for c in (cc, dd)) == 1


def test_one_garbage_predictions_file_costs_its_own_interval_not_the_view(cli, tmp_path):
    """Before: one garbage predictions file made `table --ci` and `report` refuse the whole folder."""
    results = tmp_path / "results"
    rng = np.random.default_rng(1)
    for key, dataset in (("good", "cifar10"), ("bad", "pets")):
        with_predictions(results, key, rng.random(50) < 0.7, dataset=dataset)
    store.ingest_pending(store.connect(results), results)
    (garbage,) = [p for p in (results / "runs").rglob("*") if p.is_file() and p.suffix != ".json" and "bad" in p.name]
    garbage.write_bytes(b"not parquet at all")
    code, out, err = cli("table", "--ci", "--format", "md", "--results", results)
    assert code == 0, err
    assert f"no interval for this run: {garbage}: changed since run bad wrote it" in " ".join(out.split())
    assert re.search(r"\| CIFAR-10 \| [\d.]+ \[[\d.]+, [\d.]+\]", out)  # the good run keeps its interval
    code, _, err = cli("report", "--out", tmp_path / "r.html", "--results", results)
    assert code == 0, err
    said = f"&lt;results&gt;/{garbage.relative_to(results)}: changed since run bad wrote it"  # the folder, privately
    assert said in (tmp_path / "r.html").read_text()

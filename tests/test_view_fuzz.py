"""Keep it true over hostile stores (issue 81): a sweep of up to 40 checkpoints of one model, each
run carrying settings whose names and values are of every JSON type and size (names like the
exports' own columns, empty, dotted, Unicode, 300 characters; values nested, huge, 20,000 characters
long). `table`, `export --cells` and `report` answer without a traceback, and every run the store
keeps is one cell, with its own number, in each (hypothesis, derandomised: CI sees the same stores)."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pandas as pd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vitbench import store

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from synthetic_store import template  # noqa: E402

FUZZ = settings(derandomize=True, deadline=None, suppress_health_check=list(HealthCheck), database=None)

# names a view or an export uses itself, or that a parser may read as syntax
HOSTILE_NAMES = ["mean", "N", "p", "P_HOLM", "column", "row", "run_key", "model", "weights", "res", "shots", "", " ",
                 "a.b", "x=y", "a,b", "ñ", "n\u0303", "名前", "<b>", "|", "*", "‡", "x" * 300]  # fmt: skip
names = st.one_of(st.sampled_from(HOSTILE_NAMES), st.text(min_size=1, max_size=12))
leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=30),
    st.integers(min_value=1000, max_value=20_000).map(lambda n: "v" * n),  # longer than any label
)
values = st.recursive(leaves, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(names, inner, max_size=3))


@st.composite
def sweeps(draw) -> list[dict]:
    """The shards of a checkpoint sweep: one model, up to 40 weights files, each run its own settings."""
    record = template()
    count = draw(st.integers(min_value=1, max_value=40))
    shared = draw(st.dictionaries(names, values, max_size=3))  # the same in every run
    shards = []
    for step in range(count):
        weights = f"ckpt/vit-ti-step{step:03d}.safetensors"
        own = draw(st.dictionaries(names, values, max_size=2))
        run = {
            **record["run"], "weights": weights, "random_init": False,
            "run_key": hashlib.sha256(weights.encode()).hexdigest(),
            "weights_sha256": hashlib.sha256(f"sha{step}".encode()).hexdigest(),
            "finished_at": f"2026-11-28T10:{step // 60:02d}:{step % 60:02d}+00:00",
            "hparams": {**record["run"]["hparams"], **shared, **own},
        }  # fmt: skip
        shards.append({**record, "run": run, "metrics": {"accuracy": (step + 1) / 100}})
    return shards


@settings(FUZZ, max_examples=20)
@given(shards=sweeps())
def test_views_keep_every_run_of_a_hostile_sweep(cli, tmp_path_factory, shards):
    results = tmp_path_factory.mktemp("sweep") / "results"
    (results / "runs").mkdir(parents=True)
    for shard in shards:
        (results / "runs" / f"{shard['run']['run_key']}.json").write_text(json.dumps(shard))
    code, _, err = cli("ingest", "--results", results)
    assert "Traceback" not in err and code == 0, err[-2000:]
    kept = store.read_results(results)
    expected = sorted((kept.loc[kept["metric"] == "accuracy", "value"] * 100).round(2))  # cells are in %
    assert len(expected) == kept["run_key"].nunique() >= 1

    out = results.parent / "cells.csv"
    code, _, err = cli("export", "--cells", "--format", "csv", "--out", out, "--results", results)
    assert code == 0 and "Traceback" not in err, err[-2000:]
    cells = pd.read_csv(out, keep_default_na=False)
    assert sorted(cells["mean"].astype(float).round(2)) == expected  # each run one cell, its own number
    assert cells["column"].nunique() == len(expected)

    code, table, err = cli("table", "--format", "csv", "--results", results)
    assert code == 0 and "Traceback" not in err, err[-2000:]
    assert "earlier run" not in err  # no checkpoint folded into another's column
    assert len(table) < 200_000  # long values cut in labels

    page = results.parent / "report.html"
    code, _, err = cli("report", "--out", page, "--results", results)
    assert code == 0 and "Traceback" not in err, err[-2000:]
    assert page.stat().st_size < 2_000_000  # long values cut in labels and lists, whole in the exports

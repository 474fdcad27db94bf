"""One odd value never takes a command down (issue 49): shards holding non-finite, huge, negative
and wrongly typed values in every hparams and metric field, beside a real run, in one results
folder. `ingest`, `table` (every format), `report`, `export` (every format) and `compare` either
quarantine such a shard with one line or render it: never a traceback, and the real run is always
still there."""

from __future__ import annotations

import copy
import hashlib
import json
import math
import shutil

import pytest

from vitbench import store

ODD = {
    "nan": math.nan,
    "inf": math.inf,
    "-inf": -math.inf,
    "huge float": 1e308,
    "-huge float": -1e308,
    "huge int": 10**30,
    "negative": -1,
    "zero": 0,
    "text": "text",
    "empty text": "",
    "markup": "<script>alert(1)</script>|[bold]x[/bold]",
    "list": [1, "x", None],
    "object": {"a": [None, {"b": 1}]},
    "null": None,
    "true": True,
}


def _key(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()


# each hparams field alone holding these (the rest real): a view that reads one field as a number or text
ALONE = ("huge int", "negative", "text", "list", "object", "null", "true")


def _odd_shards(real: dict) -> dict[str, dict]:
    """{name: shard}: every hparams field set to each odd value at once, and each field alone to the
    type-breaking ones; every metric likewise; each shard a run of its own (another key, seed 1, the
    real run's predictions)."""
    found: dict[str, dict] = {}

    def add(name: str, hparams: dict | None = None, metrics: dict | None = None) -> None:
        shard = copy.deepcopy(real)
        shard["run"]["run_key"] = _key(name)
        shard["run"]["seed"] = 1
        if hparams is not None:
            shard["run"]["hparams"] = hparams
        if metrics is not None:
            shard["metrics"] = metrics
        found[name] = shard

    hparams, metrics = real["run"]["hparams"], real["metrics"]
    for label, value in ODD.items():
        add(f"every hparam {label}", hparams=dict.fromkeys(hparams, value))
        add(f"every metric {label}", metrics=dict.fromkeys(metrics, value))
        for field in hparams if label in ALONE else ():
            add(f"hparam {field} {label}", hparams={**hparams, field: value})
    return found


@pytest.fixture(scope="module")
def fuzzed(one_run, tmp_path_factory):
    results = tmp_path_factory.mktemp("fuzz") / "results"
    shutil.copytree(one_run, results)
    (real_path,) = store.shard_dir(results).glob("*.json")
    real = json.loads(real_path.read_text())
    shards = _odd_shards(real)
    for shard in shards.values():
        # json writes NaN and Infinity as Python reads them back: what a hand-edited shard holds
        text = json.dumps(shard)
        (store.shard_dir(results) / f"{shard['run']['run_key']}.json").write_text(text)
    return results, real["run"]["run_key"], len(shards)


def _one_line_or_fine(code: int, err: str, what: str) -> None:
    assert "Traceback" not in err, f"{what}: {err[-2000:]}"
    if code != 0:  # a refusal is one line naming the problem
        problem = [line for line in err.splitlines() if line.startswith("error") or "vitbench:" in line]
        assert code in (1, 2) and problem, f"{what}: exit {code}: {err[-2000:]}"


def test_ingest_quarantines_or_keeps_each_odd_shard_and_the_real_run_stays(cli, fuzzed):
    results, real_key, written = fuzzed
    code, out, err = cli("ingest", "--results", results)
    _one_line_or_fine(code, err, "ingest")
    kept = set(store.read_results(results)["run_key"])
    quarantined = list((results / "quarantine").glob("*.json")) if (results / "quarantine").is_dir() else []
    assert real_key in kept
    assert len(kept) - 1 + len(quarantined) == written  # each odd shard either kept or set aside, none lost


@pytest.mark.parametrize(
    "args",
    [
        ("table",),
        ("table", "--format", "md"),
        ("table", "--format", "latex"),
        ("table", "--format", "csv"),
        ("table", "--format", "html"),
        ("table", "--group-by", "seed"),
        ("table", "--group-by", "hparams.res"),
        ("table", "--ci"),
        ("table", "--compare", "bit-l", "--delta-to", "bit-l"),
        ("table", "--per-class", "digits"),
        ("table", "--where", "hparams.res>1"),
    ],
    ids=" ".join,
)
def test_every_view_renders_beside_odd_shards(cli, fuzzed, args):
    results, _, _ = fuzzed
    code, out, err = cli(*args, "--results", results)
    assert code == 0 and "Traceback" not in err, f"{' '.join(args)}: {err[-2000:]}"


@pytest.mark.parametrize("odd", ["every hparam text", "every hparam huge int", "every hparam list", "hparam res null"])
def test_compare_with_an_odd_run_renders_or_refuses_in_one_line(cli, fuzzed, odd):
    results, _, _ = fuzzed
    for fmt in ("rich", "md"):
        code, _, err = cli("compare", "seed=0", f"run_key={_key(odd)}", "--format", fmt, "--results", results)
        _one_line_or_fine(code, err, f"compare {odd} {fmt}")


@pytest.mark.parametrize("fmt", ["parquet", "csv", "json"])
def test_export_writes_every_format_beside_odd_shards(cli, fuzzed, fmt, tmp_path):
    results, _, _ = fuzzed
    out = tmp_path / f"runs.{fmt}"
    code, _, err = cli("export", "--format", fmt, "--out", out, "--results", results)
    _one_line_or_fine(code, err, f"export {fmt}")
    assert code != 0 or out.stat().st_size > 0
    if fmt == "json" and code == 0:
        json.loads(out.read_text())  # strict JSON: no NaN or Infinity


def test_report_renders_beside_odd_shards(cli, fuzzed, tmp_path):
    results, _, _ = fuzzed
    out = tmp_path / "report.html"
    code, _, err = cli("report", "--out", out, "--results", results)
    _one_line_or_fine(code, err, "report")
    assert code != 0 or "<html" in out.read_text()[:2000].lower()

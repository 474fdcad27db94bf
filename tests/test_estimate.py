"""`vitbench run --dry-run` estimates each planned run's device time before any work: the
protocol's planned images × the model's counted FLOPs, at the rate `vitbench bench` stored for the
device or at an assumed MFU of a named accelerator's peak."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest
import torch

import vitbench
from vitbench import store
from vitbench.engine import micro_rate
from vitbench.execution import estimate
from vitbench.files.downloads import cache_root
from vitbench.host.devices import cpu_name, peak_flops
from vitbench.store.bench import BENCH_COLUMNS

DIGITS = dict(model="vit-ti/16", weights="random", datasets="digits", res=32, shots=(1, 5), seeds=(0,))
DIGITS_ARGS = ("--model", "vit-ti/16", "--weights", "random", "--dataset", "digits", "--res", "32", "--shots", "1,5",
               "--seeds", "0")  # fmt: skip


def test_few_shot_runs_cost_their_share_of_one_extraction_at_the_rate_given():
    (group,) = vitbench.plan(**DIGITS)
    rate = estimate.Rate({"inference": 1e9, "train": 2e9}, "test rate")
    found = estimate.estimate([group], rate)
    flops = group.model.backend.flops_per_image(group.model, 32)
    drawn = min(1000, 5 * 10 * 1)  # the most shots x classes x seeds, within the 1,000 train digits
    for spec in group.specs:
        assert found.seconds[spec.run_key] == pytest.approx((drawn + 797) / 2 * flops / 1e9)
    assert found.total(found.seconds) == pytest.approx((drawn + 797) * flops / 1e9)


def test_a_fine_tune_costs_its_training_steps_three_passes_an_image_and_its_scored_split():
    (group,) = vitbench.plan(model="vit-ti/16", weights="random", datasets="digits", protocol="finetune", smoke=True,
                             lr=0.01, seeds=(0,))  # fmt: skip
    (spec,) = group.specs
    found = estimate.estimate([group], estimate.Rate({"inference": 1e9, "train": 3e9}, "test rate"))
    flops = group.model.backend.flops_per_image(group.model, group.res)
    steps, batch = spec.hparams["steps"], spec.hparams["batch"]
    assert found.seconds[spec.run_key] == pytest.approx(steps * batch * 3 * flops / 3e9 + 797 * flops / 1e9)


def test_assume_mfu_takes_a_fraction_of_a_named_peak_and_refuses_what_is_not_one():
    rate = estimate.parse_assume_mfu("0.4@H100", "CPU")
    assert rate.flops_per_second["train"] == pytest.approx(0.4 * peak_flops("H100"))
    for bad, said in (("1.5", "expected a fraction"), ("x", "expected a fraction"), ("0.4@TPUv9", "no bf16 peak")):
        with pytest.raises(vitbench.errors.UserError, match=said):
            estimate.parse_assume_mfu(bad, "CPU")


def test_dry_run_prints_each_runs_estimate_and_the_total(cli, results, monkeypatch):
    args = ("run", "--model", "vit-ti/16", "--weights", "random", "--dataset", "digits", "--res", "32",
            "--shots", "1,5", "--seeds", "0", "--results", results, "--dry-run")  # fmt: skip
    code, out, _ = cli(*args)
    # a CPU `vitbench bench` never measured: a few seconds' micro-benchmark gives the rate, and says
    # so, with its range and what it counts and leaves out
    assert code == 0 and out.count("≈") == 2 and "2 run(s) to do, estimated time" in out
    # the whole wait, its range, then each part on its own (issue 69, goal 1); then the rate in a few
    # words: two lines (issue 80: the last line was 616-888 characters, a paragraph on method)
    total, rate = out.strip().splitlines()[-2:]
    parts = r"model passes [^,]+, decoding and resizing [^,]+, solves [^,]+, weights [^,]+, start-up [^(]+"
    assert re.fullmatch(rf"2 run\(s\) to do, estimated time [^(]+ \([^)]+ to [^)]+\): {parts}", total), total
    assert rate.startswith("(an estimate at the rate of a micro-benchmark on CPU") and "--explain" in rate
    assert len(total) < 160 and len(rate) < 160
    # --explain: the method, what it counts and what it leaves out
    code, explained, _ = cli(*args, "--explain")
    assert code == 0 and "`vitbench bench` measures the whole loop" in explained
    assert "decoding and resizing them (timed here on a sample of their own files)" in explained
    assert "the solves of few-shot, k-NN and the linear probe on their features" in explained
    assert "The solves at the pace measured here" in explained and "not storing each run's results" in explained
    assert "L-BFGS" not in explained and "import" not in explained  # a few-shot plan fits no probe
    code, _, err = cli(*args[:-1], "--explain")
    assert code == 2 and "--explain: says how --dry-run's estimate was made; add --dry-run" in err
    # kept for the next dry run: the same command prices the model's passes the same, however busy the
    # machine (what it measures each time, the start-up and decoding, may move a little)
    monkeypatch.setattr(micro_rate, "forward_rate", lambda *a: pytest.fail("measured again"))
    assert _model_passes(cli(*args)[1]) == _model_passes(out)
    code, out, _ = cli(*args, "--assume-mfu", "0.4@H100", "--explain")  # another machine's: its device time alone
    assert code == 0 and out.count("≈") == 2 and "2 run(s) to do, estimated device time" in out
    assert (
        "not decoding and resizing them, the solves of few-shot, k-NN and the linear probe, loading weights or "
        "start-up (measured on this machine only)"
        in out
        and "The solves at the pace" not in out
    )
    assert "an estimate" in out and "40% MFU of H100" in out
    code, _, err = cli(*args, "--assume-mfu", "2")
    assert code == 2 and "--assume-mfu 2: expected a fraction" in err and len(err.strip().splitlines()) == 1


def _model_passes(out: str) -> str:
    """The plan's model passes and their range, from its last line: what the kept rate decides."""
    line = " ".join(out.split())
    found = re.search(r"estimated time [^(]+ (\([^)]+ to [^)]+\))?: (model passes [^,]+),", line)
    assert found, line[-500:]
    return found.group(2)


def test_a_stored_bench_measurement_of_this_device_sets_the_rate(cli, results):
    (group,) = vitbench.plan(**DIGITS)
    flops = group.model.backend.flops_per_image(group.model, 32)
    row = dict.fromkeys(BENCH_COLUMNS)
    row |= {"bench_id": "b", "created_at": datetime.now(UTC), "model": "vit-ti/16", "res": 32, "mode": "inference",
            "runner": "vitbench", "data": "digits", "batch": 16, "precision": "fp32", "compile": False,
            "images_per_second": 100.0, "flops_per_image": flops, "device_name": cpu_name(), "notes": {}}  # fmt: skip
    con = store.connect(results)
    try:
        store.save_bench(con, [row])
    finally:
        con.close()
    rate = estimate.measured_rate(results, cpu_name())
    assert rate is not None and rate.of("vit-ti/16", 32, "inference") == pytest.approx(100.0 * flops)
    found = estimate.estimate([group], rate)
    assert found.total(found.seconds) == pytest.approx((50 + 797) / 100.0)  # images at the measured images/s
    code, out, _ = cli("run", "--model", "vit-ti/16", "--weights", "random", "--dataset", "digits", "--res", "32",
                       "--shots", "1,5", "--seeds", "0", "--results", results, "--dry-run")  # fmt: skip
    assert code == 0 and "model passes 8 s" in out and f"`vitbench bench` on {cpu_name()}" in out
    code, _, err = cli("run", "--model", "vit-ti/16", "--weights", "random", "--dataset", "digits", "--res", "32",
                       "--shots", "1,5", "--seeds", "0", "--results", results, "--workers", "0")  # fmt: skip
    assert code == 0 and "[1/2]" in err and "of device time left, estimated" in err  # the dry run's rate
    assert "[2/2]" in err and err.count("of device time left") == 1  # none left after the last run


def _rows(out: str) -> list[list[str]]:
    """The per-dataset table's body rows, cell by cell."""
    return [[c.strip() for c in line.split("│")[1:-1]] for line in out.splitlines() if line.startswith("│")]


def test_a_dry_run_plans_every_vtab_task_without_its_files(cli, tmp_path):
    """Issue 45: before, "19 of 19 datasets not found" and exit 2. Now each task is planned from its
    official split sizes: a row with its images, its estimated time (a micro-benchmark here) and
    where its data is published; no file is read, nothing fetched, the paper's weights by name."""
    args = ("run", "--model", "vit-b/16", "--weights", "paper", "--suite", "vtab", "--data-dir", tmp_path,
            "--results", tmp_path / "results", "--dry-run")  # fmt: skip
    code, out, err = cli(*args)
    assert code == 0, err
    rows = _rows(out)
    assert len(rows) == 19 and rows[0][0] == "vtab/caltech101" and rows[-1][0] == "vtab/smallnorb_elev"
    for _, runs, images, time, decode, weights, data in rows:  # priced here: each part, decoding not measured
        assert runs == "3" and int(images.replace(",", "")) > 3 * 2500 * 512  # 3 seeds × steps × batch, then test
        assert time.endswith("days") and data.startswith("missing: no ") and "official split sizes" in data
        assert decode == "not measured" and weights.endswith("s")
    # no files to time decoding on: said in the summary's two lines, each named with --explain
    assert "decoding not measured for 19 datasets (no files here)" in " ".join(out.split())
    assert "to get vtab/caltech101 … vtab/smallnorb_elev (19 datasets): `--data-source tfds --download`" in out
    assert "vtab-1k/<task>/ with train800.txt" in out and "micro-benchmark" in out
    assert "(no data yet) vit-b/16     paper (not here)" in out  # no run key for files that are not there
    assert not (tmp_path / "results" / "vitbench.duckdb").exists()


def test_a_dry_run_plans_imagenet_few_shot_from_its_official_sizes(cli, tmp_path):
    code, out, err = cli("run", "--model", "vit-b/16", "--weights", "paper", "--dataset", "imagenet", "--protocol",
                         "fewshot", "--assume-mfu", "0.4@H100", "--results", tmp_path, "--dry-run")  # fmt: skip
    assert code == 0, err
    ((name, runs, images, time, data),) = _rows(out)
    # one extraction shared by the 12 runs: big_vision's 65,000 train images, then the 50,000 of val
    assert (name, runs, images, time) == ("imagenet", "12", "115,000", "10 s")  # 35 GFLOPs an image at 40 % of 989T
    assert data == "missing: no imagenet (planned from the official split sizes)"
    assert "to get imagenet: https://image-net.org/download" in out and "40% MFU of H100" in out


@pytest.fixture
def own_cache(tmp_path, monkeypatch):
    """A user cache of the test's own: the session's is shared with runs that measured for real."""
    monkeypatch.setenv("VITBENCH_CACHE", str(tmp_path / "user-cache"))
    return tmp_path / "user-cache"


def test_the_micro_benchmark_is_kept_per_configuration_and_measured_again_when_damaged(results, monkeypatch, own_cache):
    """A dry run's rate comes from several timed passes (their median; slowest and fastest its
    range), kept in the user's cache (micro-rates.json, per machine: every results folder prices
    alike): read back by the next dry run, measured again for another model or resolution, or when
    the file is damaged."""
    calls = []
    monkeypatch.setattr(
        micro_rate, "forward_rate", lambda spec, res, device, *_: calls.append(res) or ([1e9, 2e9, 4e9], 0.1)
    )
    groups = vitbench.plan(**DIGITS)
    cpu = torch.device("cpu")
    cache = cache_root()
    rate = estimate.micro_rate(groups, cpu, cpu_name(), cache)
    assert rate.of("vit-ti/16", 32, "inference") == 2e9 and rate.spread[("vit-ti/16", 32)] == (1e9, 4e9)
    found = estimate.estimate(groups, rate)
    keys = list(found.seconds)
    low, high = found.range(keys)
    assert low == pytest.approx(found.total(keys) / 2) and high == pytest.approx(found.total(keys) * 2)
    assert estimate.micro_rate(groups, cpu, cpu_name(), cache) == rate and calls == [32]
    estimate.micro_rate(vitbench.plan(**{**DIGITS, "res": 48}), cpu, cpu_name(), cache)
    assert calls == [32, 48]  # another resolution is measured once, beside the first
    (cache / estimate.MICRO_RATES).write_text("{not json")
    estimate.micro_rate(groups, cpu, cpu_name(), cache)
    assert calls == [32, 48, 32]


TODAY = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
HOSTILE_ENTRIES = [
    "not an object",
    {"median": "fast"},
    {"median": float("nan"), "slowest": 1.0, "fastest": 2.0},
    {"median": -5.0, "slowest": -6.0, "fastest": -1.0},
    {"median": 1e9, "slowest": 2e9, "fastest": 3e9},
    {"median": 1e9, "slowest": 5e8, "fastest": 2e9, "passes": 0, "measured": "2026-11-27 10:00 UTC"},
    {"median": 1e9, "slowest": 5e8, "fastest": 2e9, "passes": 5, "measured": "yesterday"},
    {"median": 1e9, "slowest": 5e8, "fastest": 2e9, "passes": 5, "measured": "2020-01-01 10:00 UTC"},  # too old
    {"median": 1e9, "slowest": 5e8, "fastest": 2e9, "passes": 5, "measured": TODAY},  # made before builds were timed
    {"median": 1e9, "slowest": 5e8, "fastest": 2e9, "passes": 5, "measured": TODAY, "build": -1},
]


@pytest.mark.parametrize("entry", HOSTILE_ENTRIES, ids=range(len(HOSTILE_ENTRIES)))
def test_a_kept_rate_that_is_no_measurement_is_measured_again(results, monkeypatch, entry, own_cache):
    """Issue 71, item 10. Before: a micro-rates.json of the wrong shape was a traceback (TypeError,
    ZeroDivisionError, KeyError), NaN printed "≈ nan days", negative rates "< 1 s", and the first
    measurement was kept forever."""
    import json

    calls = []
    monkeypatch.setattr(
        micro_rate, "forward_rate", lambda spec, res, device, *_: calls.append(res) or ([1e9, 2e9, 4e9], 0.1)
    )
    groups = vitbench.plan(**DIGITS)
    cpu = torch.device("cpu")
    estimate.micro_rate(groups, cpu, cpu_name(), cache_root())
    path = cache_root() / estimate.MICRO_RATES
    (key,) = json.loads(path.read_text())
    path.write_text(json.dumps({key: entry}))
    rate = estimate.micro_rate(groups, cpu, cpu_name(), cache_root())
    assert calls == [32, 32] and rate.of("vit-ti/16", 32, "inference") == 2e9
    assert estimate.duration(float("nan")) == "unknown" and estimate.duration(-5.0) == "unknown"


def test_every_results_folder_on_a_machine_prices_alike(cli, tmp_path, monkeypatch, own_cache):
    """Issue 69, goal 2: the micro-benchmark runs once per machine, not once per results folder."""
    calls = []
    real = micro_rate.forward_rate
    monkeypatch.setattr(micro_rate, "forward_rate", lambda *a: calls.append(a[1]) or real(*a))
    lines = []
    for folder in ("one", "two"):
        code, out, err = cli("run", *DIGITS_ARGS, "--dry-run", "--results", tmp_path / folder)
        assert code == 0, err
        lines.append(_model_passes(out))
    assert calls == [32] and lines[0] == lines[1]


def test_the_forward_rate_times_several_passes():
    (group,) = vitbench.plan(**DIGITS)
    rates, seconds = micro_rate.forward_rate(group.model, 32, torch.device("cpu"))
    assert len(rates) >= micro_rate.RATE_PASSES and all(r > 0 for r in rates) and seconds > 0
    rates, _ = micro_rate.forward_rate(group.model, 32, torch.device("cpu"), None, 16, "train")  # training steps
    assert len(rates) >= micro_rate.RATE_PASSES and all(r > 0 for r in rates)


def test_a_plan_that_trains_is_priced_at_timed_training_steps(monkeypatch, own_cache):
    """Issue 69, goal 1: a training image was priced at the forward rate (3 passes' FLOPs), a lower
    bound that made the demo's pre-training half as long as it ran; a plan that trains now times
    training steps too (kept beside the forward passes), and a plan that does not, does not."""
    calls = []

    def timed(spec, res, device, precision, batch, mode):
        calls.append(mode)
        return ([1e9, 2e9, 4e9] if mode == "inference" else [3e8, 4e8, 5e8]), 0.1

    monkeypatch.setattr(micro_rate, "forward_rate", timed)
    groups = vitbench.plan(model="vit-ti/16", weights="random", datasets="digits", protocol="finetune", smoke=True,
                           lr=0.01, seeds=(0,))  # fmt: skip
    cpu, res = torch.device("cpu"), groups[0].res
    rate = estimate.micro_rate(groups, cpu, cpu_name(), cache_root())
    assert calls == ["inference", "train"]
    assert rate.of("vit-ti/16", res, "train") == 4e8 and rate.of("vit-ti/16", res, "inference") == 2e9
    assert estimate.micro_rate(groups, cpu, cpu_name(), cache_root()) == rate and len(calls) == 2  # kept
    estimate.micro_rate(vitbench.plan(**DIGITS), cpu, cpu_name(), cache_root())
    assert calls == ["inference", "train", "inference"]  # few-shot trains nothing: forward passes alone


def test_a_precision_much_slower_on_this_cpu_is_said_before_the_runs(cli, tmp_path, monkeypatch, own_cache):
    """Issue 69, goal 4: `--precision bf16` on a CPU that computes it slowly is said before any run,
    with the factor measured here (the forward micro-benchmark under each precision, both kept). This
    machine's CPU has AMX and computes bf16 faster, so its slow case is the measurement's stand-in."""
    rates = {"fp32": [4e9, 5e9, 6e9], "bf16": [1e9, 1.2e9, 1.5e9]}
    monkeypatch.setattr(micro_rate, "forward_rate", lambda spec, res, device, precision, *_: (
        rates[precision or "fp32"], 0.1))  # fmt: skip
    code, out, err = cli("run", *DIGITS_ARGS, "--precision", "bf16", "--dry-run", "--results", tmp_path / "r")
    assert code == 0, err
    assert "--precision bf16 on this CPU: 4.2x slower than fp32, measured here (vit-ti/16 at 32 px" in err, err
    code, out, err = cli("run", *DIGITS_ARGS, "--dry-run", "--results", tmp_path / "r")  # fp32: nothing to say
    assert code == 0 and "slower than fp32" not in err
    rates["bf16"] = [5e9, 6e9, 7e9]  # where bf16 is not slower (this machine's AMX), nothing is said either
    assert estimate.slower_setting(vitbench.plan(**DIGITS, precision="bf16"), "another CPU", own_cache) is None


NO_DATA = ("--weights", "random", "--dry-run")


def test_price_on_a_gpu_one_does_not_have_from_the_rates_vitbench_ships(cli, tmp_path):
    """Issue 69, goal 3: `--price-on h100` prices ViT-B/16 eval on ImageNet val and the VTAB-1k
    fine-tuning suite from the rows measured on an H100 (results/measured/gpu-rates.csv), naming
    them; a configuration never measured there is priced by --assume-mfu, or said not to be."""
    data = tmp_path / "no-data"
    data.mkdir()
    common = (*NO_DATA, "--data-dir", data, "--results", tmp_path / "r", "--price-on", "h100")
    code, out, err = cli("run", "--model", "vit-b/16", "--dataset", "imagenet", "--protocol", "eval", *common)
    assert code == 0, err
    text = " ".join(out.split())
    # 50,000 val images at the 5,973.9 images/s ViT-B/16 inference measured there: 8.4 s
    assert "1 run(s) to do, estimated device time 8 s" in text and "measured on an NVIDIA H100 80GB HBM3" in text
    code, out, err = cli("run", "--suite", "vtab", "--model", "vit-b/16", *common)
    assert code == 0, err
    text = " ".join(out.split())
    # 19 tasks x 3 seeds of 2,500 steps of 512 images at 384 px (872.2 images/s training there), plus dev/test
    assert re.search(r"57 run\(s\) to do, estimated device time 2[34]\.\d h", text), text[-600:]
    code, out, err = cli("run", "--model", "vit-b/16", "--dataset", "imagenet", "--protocol", "eval",
                         *common[:-1], "h200")  # fmt: skip
    text = " ".join(out.split())  # 50,000 images at the 8,674.2 images/s measured on an H200: 5.8 s
    assert code == 0 and "1 run(s) to do, estimated device time 6 s" in text and "on an NVIDIA H200" in text, err
    code, out, err = cli("run", "--model", "vit-s/16", "--dataset", "imagenet", "--protocol", "eval", *common)
    assert code == 0 and "1 run(s) to do, none priced" in " ".join(out.split()), out
    code, out, err = cli("run", "--model", "vit-s/16", "--dataset", "imagenet", "--protocol", "eval", *common,
                         "--assume-mfu", "0.3@H100")  # fmt: skip
    assert code == 0 and "(else assumed 30% MFU of H100" in " ".join(out.split())
    code, _, err = cli("run", "--model", "vit-b/16", "--dataset", "imagenet", *NO_DATA, "--price-on", "a100")
    assert code == 2 and "--price-on a100: no rates measured there ship with vitbench; expected h100" in err


def test_an_extraction_protocols_share_is_priced_once_where_the_run_extracts_it(tmp_path):
    """Issue 69, goal 1: few-shot, k-NN and the linear probe read one cache entry per split. The plan
    charges each image once, to the first protocol that extracts it (few-shot's drawn images and the
    test split, then k-NN the rest of train, the probe nothing), and nothing for what the entry
    holds: after a real few-shot run, k-NN is priced for the train images few-shot did not draw."""
    from vitbench.engine.feature_cache import cache_entry, held_images

    common = dict(model="vit-ti/16", weights="random", datasets="digits", res=32, seeds=(0,),
                  results=tmp_path / "r", workers=0)  # fmt: skip
    groups = vitbench.plan(**common, protocol="fewshot,knn,linear", shots=(1, 5), knn_k=(1, 5))
    images = estimate.planned_images(groups)
    fewshot, knn, linear = ([images[s.run_key] for s in g.specs] for g in groups)
    assert sum(fewshot) == 5 * 10 + 797 and sum(knn) == 1000 - 50 and linear == [0.0]
    (alone,) = vitbench.plan(**common, protocol="knn", knn_k=(1, 5))
    assert sum(estimate.planned_images([alone]).values()) == 1000 + 797
    vitbench.run(**common, protocol="fewshot", shots=(1, 5))
    drawn = held_images(cache_entry(alone, "train"))
    assert 50 <= drawn <= 60 and held_images(cache_entry(alone, "test")) == 797  # the run's own entries
    assert sum(estimate.planned_images([alone]).values()) == 1000 - drawn


def test_the_plan_counts_decoding_weights_and_start_up_measured_here(tmp_path, monkeypatch):
    """Issue 69, goal 1: beside the model's passes, what a run pays is measured here and counted,
    each part on its own: decoding and resizing (the group's own images through its preprocessing),
    the weights (making the model, reading the file: timed on the file) and the start-up."""
    from vitbench.execution import overheads

    (group,) = vitbench.plan(**DIGITS)
    pace = overheads.decode_seconds(group)
    assert pace is not None and 0 < pace < 1
    weights = tmp_path / "w.bin"
    weights.write_bytes(b"\0" * 2**20)
    assert overheads.read_seconds(str(weights)) > 0 and overheads.read_seconds(str(tmp_path / "absent")) == 0
    found = estimate.estimate([group], estimate.Rate({"inference": 1e9}, "test rate"))
    images = estimate.planned_images([group])
    monkeypatch.setattr(overheads, "decode_seconds", lambda g: 0.01)  # (the arithmetic, at a pace of its own)
    found.beside = overheads.measure([group], images, found.seconds, {("vit-ti/16", 32): 0.5}, 2.0, workers=2)
    first, second = (s.run_key for s in group.specs)
    assert found.beside.decode[first] == pytest.approx(images[first] * 0.01)  # on a CPU: all of a core's time
    assert found.beside.weights == {first: 0.5}  # random init: the model made once for the group, no file
    keys = [first, second]
    assert found.wall(keys) == pytest.approx(
        found.total(keys) + 2.0 + 0.5 + found.beside.decode[first] + found.beside.decode[second]
    )


def test_a_rate_measured_on_a_busy_machine_is_said_and_measured_again_once_quiet(cli, tmp_path, monkeypatch):
    """Issue 80, goal 4. Before: the rate kept per machine was whatever it gave when first measured:
    measured beside other work (load 5 on 2 cores), it priced a later plan on the quiet machine at
    2.0x its run, and nothing said so."""
    from vitbench.execution import machine_load

    monkeypatch.setenv("VITBENCH_CACHE", str(tmp_path / "cache"))
    args = ("run", "--model", "vit-ti/16", "--weights", "random", "--dataset", "digits", "--res", "32",
            "--shots", "1", "--seeds", "0", "--results", tmp_path / "results", "--dry-run")  # fmt: skip
    monkeypatch.setattr(estimate, "others_while", lambda work: (work(), 0.9))
    code, out, err = cli(*args)
    assert code == 0, err
    assert "while other work used 90% of the CPUs (measured again once it is quiet)" in " ".join(out.split())
    measured = []
    real = micro_rate.forward_rate
    monkeypatch.setattr(micro_rate, "forward_rate", lambda *a: measured.append(a) or real(*a))
    quiet, busy = (lambda work: (work(), 0.0)), (lambda work: (work(), 0.9))
    monkeypatch.setattr(estimate, "others_while", quiet)  # quiet now: measured again, and kept as the pace
    code, out, err = cli(*args)
    assert code == 0 and measured and "other work" not in out, err
    monkeypatch.setattr(estimate, "others_while", busy)  # busy again: the quiet rate stands, not measured
    monkeypatch.setattr(micro_rate, "forward_rate", lambda *a: pytest.fail("measured again"))
    code, out, err = cli(*args)
    assert code == 0 and "other work" not in out, err
    assert machine_load.busy_text(0.1) == "" and 0.0 <= (machine_load.others_busy(0.05) or 0.0) <= 1.0


def test_other_work_is_read_over_the_measurement_less_this_process_own_cpu():
    """Before: a 0.2 s look just before the measurement, which a lull in a fluctuating load read as
    quiet; here the load starts as the measurement does, and is seen."""
    import os
    import subprocess
    import sys
    import time

    from vitbench.execution import machine_load

    assert machine_load.others_fraction(150, 200, 50) == 0.5  # 2 CPUs' 200 ticks: 150 busy, 50 of them ours
    assert machine_load.others_fraction(40, 200, 50) == 0.0 and machine_load.others_fraction(1, 0, 0) is None
    spin = "import time\nend = time.monotonic() + 20\nwhile time.monotonic() < end:\n    pass"
    spinners: list[subprocess.Popen] = []

    def measured() -> str:  # the load starts with it, as a lull ends
        spinners.extend(subprocess.Popen([sys.executable, "-c", spin]) for _ in range(os.cpu_count() or 1))
        end = time.monotonic() + 1.5
        while time.monotonic() < end:
            pass
        return "rate"

    try:
        result, others = machine_load.others_while(measured)
    finally:
        for proc in spinners:
            proc.kill()
            proc.wait()
    assert result == "rate" and others is not None and others > machine_load.BUSY_ABOVE, others

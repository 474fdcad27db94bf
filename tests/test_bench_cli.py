"""`vitbench bench` and `vitbench table --bench` on the CPU: every runner measured in vitbench's own
loops, stored with its provenance, shown with the ratios the performance goals are about."""

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from vitbench import store
from vitbench.engine import bench, bench_timm, bench_types

QUICK = ("--config", "vit-ti/16@32", "--steps", "2", "--warmup", "1", "--batch", "8", "--workers", "0")


def test_bench_measures_stores_and_tables_every_runner(cli, results):
    code, out, err = cli("bench", *QUICK, "--results", results)
    assert code == 0, err
    df = store.read_bench(results)
    got = set(zip(df["mode"], df["runner"], df["data"], strict=True))
    assert got == {
        ("train", "vitbench", "synthetic"),
        ("train", "vitbench", "digits"),
        ("train", "bare", "synthetic"),
        ("inference", "vitbench", "synthetic"),
        ("inference", "vitbench", "digits"),
        ("inference", "bare", "synthetic"),
    }
    assert (df["images_per_second"] > 0).all() and df["bench_id"].nunique() == 1
    assert df["mfu"].isna().all()  # a CPU has no bf16 peak in the table: no MFU rather than a guess
    row = df[(df["mode"] == "train") & (df["data"] == "synthetic") & (df["runner"] == "vitbench")].iloc[0]
    assert row["micro_batch"] == 8 and row["precision"] == "fp32" and row["input_pipeline"] == "synthetic"
    assert row["flops_per_image"] > 0 and row["device_name"].startswith("CPU") and "bench" in row["command"]
    assert row["git_sha"] and row["torch_version"] and row["timm_version"]
    assert "vit-ti/16 @32 · train" in out and "vitbench / bare" in out

    code, md, _ = cli("table", "--bench", "--format", "md", "--results", results)
    assert code == 0
    lines = [line for line in md.splitlines() if line.startswith("| vit-ti/16 @32 · train")]
    assert len(lines) == 1
    header = next(line for line in md.splitlines() if line.startswith("| |")).split("|")[2:-1]
    cells = dict(zip([h.strip() for h in header], [c.strip() for c in lines[0].split("|")[2:-1]], strict=True))
    # the ratios are the stored rates' (the table rounds a rate to 0.1 image/s, a ratio to 0.01: ratios of the
    # rounded rates drift where a loaded machine measures a few images/s)
    train = df[df["mode"] == "train"].set_index(["runner", "data"])["images_per_second"]
    synthetic, real = train[("vitbench", "synthetic")], train[("vitbench", "digits")]
    bare = train[("bare", "synthetic")]
    assert float(cells["vitbench / bare"]) == pytest.approx(synthetic / bare, abs=0.005 + 1e-9)
    assert float(cells["real / synthetic"]) == pytest.approx(real / synthetic, abs=0.005 + 1e-9)
    for name, rate in (("vitbench synthetic", synthetic), ("vitbench real data", real), ("bare loop", bare)):
        assert float(cells[name]) == pytest.approx(rate, abs=0.05 + 1e-9)
    assert "timm benchmark.py" not in header  # not given: the column is left out, not shown empty
    # the report has the same table in a section of its own (a store with no runs, only measurements)
    code, _, err = cli("report", "--out", results / "report.html", "--results", results)
    page = (results / "report.html").read_text()
    assert code == 0 and '<section id="bench">' in page and "vit-ti/16 @32 · train" in page, err


def test_a_second_bench_adds_rows_and_the_table_shows_the_latest(cli, results):
    for _ in range(2):
        assert cli("bench", *QUICK, "--mode", "inference", "--results", results)[0] == 0
    df = store.read_bench(results)
    assert df["bench_id"].nunique() == 2 and len(df) == 6
    _, md, _ = cli("table", "--bench", "--format", "md", "--results", results)
    assert md.count("| vit-ti/16 @32 · inference") == 1


@pytest.mark.parametrize(
    "args,message",
    [
        (("--config", "vit-b/16@abc"), "--config vit-b/16@abc: expected MODEL@RES"),
        (("--config", "vit-b/16@100"), "--res 100: vit-b/16 needs an image size that is a positive multiple of 16"),
        (("--config", "nope@224"), "nope"),
        (("--mode", "fly"), "--mode fly: expected train, inference or both"),
        (("--timm-benchmark", "/nowhere/benchmark.py"), "--timm-benchmark /nowhere/benchmark.py: no such file"),
        (("--batch", "8", "--micro-batch", "3"), "--micro-batch 3: must divide --batch 8"),
        (("--input-pipeline", "gpu"), "--input-pipeline gpu: expected auto, workers, device"),
    ],
)
def test_bench_mistakes_are_one_line_errors(cli, results, args, message):
    code, _, err = cli("bench", *args, "--results", results)
    assert code != 0 and message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_table_bench_on_an_empty_store_says_what_to_do(cli, results):
    code, _, err = cli("table", "--bench", "--results", results)
    assert code == 0 and "vitbench bench" in err


def test_timm_results_are_read_from_its_result_marker():
    out = 'INFO: Running train...\n--result\n{"model": "vit_tiny", "train_samples_per_sec": 12.5}\n'
    assert bench_timm.timm_result(out)["train_samples_per_sec"] == 12.5
    assert bench_timm.timm_result("no marker") == {}


def test_alternately_keeps_the_median_round_and_alternates_who_goes_first():
    order: list[str] = []

    def runner(name, rates):
        def run():
            order.append(name)
            return bench_types.Row(bench_types.Config("m", 32), "train", name, "synthetic", rates.pop(0), 8)

        return run

    rows = bench.alternately({"a": runner("a", [3.0, 1.0, 2.0]), "b": runner("b", [5.0, 6.0, 4.0])}, 3)
    assert order == ["a", "b", "b", "a", "a", "b"]
    assert [r.images_per_second for r in rows] == [2.0, 5.0]
    assert rows[0].notes["rounds"] == [3.0, 1.0, 2.0]


def test_a_failing_timm_script_keeps_vitbenchs_rows(cli, results, tmp_path):
    broken = tmp_path / "benchmark.py"
    broken.write_text("import sys\nsys.exit('unrecognized arguments: --amp-dtype')\n")
    code, _, err = cli("bench", *QUICK, "--mode", "inference", "--timm-benchmark", broken, "--results", results)
    assert code == 0 and "unrecognized arguments: --amp-dtype" in err and "stored without timm's row" in err
    assert set(store.read_bench(results)["runner"]) == {"vitbench", "bare"}


# --- timm's own benchmark.py, run for real ------------------------------------------------------------

TIMM_SCRIPT = Path(__file__).resolve().parents[2] / "shared" / "third_party" / "timm" / "benchmark.py"
needs_timm_script = pytest.mark.skipif(
    not TIMM_SCRIPT.is_file(), reason=f"timm's benchmark.py is not at {TIMM_SCRIPT} (shared/ beside the checkout)"
)


@needs_timm_script
def test_timm_benchmark_runs_for_real_at_a_non_default_resolution_and_under_5_steps(cli, results):
    """vit-ti/16 is a 224 px architecture: at 32 px timm's script needs img_size passed to the
    model, and 2 timed steps are fewer than its log interval allows."""
    code, _, err = cli("bench", *QUICK, "--timm-benchmark", TIMM_SCRIPT, "--results", results)
    assert code == 0 and "stored without timm's row" not in err, err
    df = store.read_bench(results)
    timm_rows = df[df["runner"] == "timm"]
    assert sorted(timm_rows["mode"]) == ["inference", "train"]
    assert (timm_rows["images_per_second"] > 0).all() and (timm_rows["res"] == 32).all()
    train = json.loads(timm_rows[timm_rows["mode"] == "train"].iloc[0]["notes"])
    assert "img_size=32" in train["command"] and "--opt momentum" in train["command"]
    assert any("timm timed 5 iterations, vitbench 2" in d for d in train["differences"])
    _, md, _ = cli("table", "--bench", "--format", "md", "--results", results)
    assert "timm benchmark.py (vit-ti/16 @32 · train)" in md and "does not clip gradients" in md


def _timm_parser():
    """benchmark.py's own argument parser (the module only runs `main()` as a script)."""
    spec = importlib.util.spec_from_file_location("timm_benchmark_script", TIMM_SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.parser


@needs_timm_script
@pytest.mark.parametrize("config", [*bench.GPU_CONFIGS, *bench.CPU_CONFIGS, "vit-s/16@384", "bit-m-r50x1@160"])
@pytest.mark.parametrize("precision,compiled", [("fp32", False), ("bf16", True)])
@pytest.mark.parametrize("mode", bench_types.MODES)
def test_every_configuration_reaches_timms_script_as_vitbench_builds_it(config, precision, compiled, mode):
    """What the script's parser makes of vitbench's arguments builds vitbench's architecture at its
    image size (checked on the meta device, as the script would build it), at the same batch."""
    import timm
    from timm.data import resolve_data_config

    from vitbench.catalog.registry import get_model

    cfg = bench_types.Config.parse(config)
    spec = get_model(cfg.model)
    opts = bench_types.Options(
        batch=16, steps=3, warmup=0, precision=precision, compile=compiled, device=torch.device("cpu")
    )
    chosen = bench_types.Row(cfg, "train", "vitbench", "synthetic", 1.0, 16, micro_batch=8, checkpointing=True)
    run = bench_timm.timm_run(spec, cfg, opts, mode, chosen if mode == "train" else None, 10)
    args = _timm_parser().parse_args(run.args)
    assert args.model == spec.arch and args.batch_size == run.batch == (8 if mode == "train" else 16)
    assert args.num_bench_iter >= 5 and (args.amp_dtype == "bfloat16") == (precision == "bf16") == args.amp
    assert (args.torchcompile == "inductor") == compiled
    if mode == "train":
        assert args.opt == "momentum" and args.grad_checkpointing and args.num_bench_iter == 3 * 2
        assert any("accumulates 16" in d for d in run.differences)
    with torch.device("meta"):
        model = timm.create_model(args.model, num_classes=args.num_classes, **args.model_kwargs)
    assert resolve_data_config(vars(args), model=model)["input_size"] == (3, cfg.res, cfg.res)
    assert model.num_classes == (10 if mode == "train" else 0)


def test_a_configuration_timm_cannot_express_is_refused_before_measuring(cli, results, monkeypatch):
    from vitbench.catalog.registry import get_model

    backend = get_model("vit-ti/16").backend
    monkeypatch.setattr(type(backend), "timm_kwargs", lambda self, img_size, gelu="exact": {"act_layer": torch.nn.GELU})
    script = Path(results) / "benchmark.py"
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text("raise SystemExit('must not run')\n")
    code, _, err = cli("bench", *QUICK, "--timm-benchmark", script, "--results", results)
    assert code != 0 and "--model-kwargs cannot express" in err and len(err.strip().splitlines()) == 1
    assert not (Path(results) / store.DB_NAME).exists()  # nothing measured, nothing stored


@pytest.mark.parametrize("command", ["run", "bench"])
def test_nvjpeg_off_a_gpu_is_one_line(cli, tmp_path, command):
    """nvjpeg is a GPU's decoder: asked for on a CPU it is refused in one line, nothing run or stored
    (bench measured with another decoder and labelled the row as the device pipeline)."""
    args = (
        ("--model", "vit-ti/16", "--weights", "random", "--dataset", "digits", "--res", "32")
        if command == "run"
        else ("-c", "vit-ti/16@32", "--steps", "1", "--warmup", "1", "--rounds", "1")
    )
    code, _, err = cli(command, *args, "--input-pipeline", "nvjpeg", "--device", "cpu", "--results", tmp_path / "r")
    assert (
        code == 2
        and err.strip() == "error: --input-pipeline nvjpeg: decodes on a CUDA GPU, and this run's device is cpu"
    )
    assert not (tmp_path / "r" / "vitbench.duckdb").exists()

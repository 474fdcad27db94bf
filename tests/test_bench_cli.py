"""`vitbench bench` and `vitbench table --bench` on the CPU: every runner measured in vitbench's own
loops, stored with its provenance, shown with the ratios the performance goals are about."""

import pytest

from vitbench import bench, store

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
    synthetic, real, bare = (float(cells[k]) for k in ("vitbench synthetic", "vitbench real data", "bare loop"))
    assert float(cells["vitbench / bare"]) == pytest.approx(synthetic / bare, abs=0.01)
    assert float(cells["real / synthetic"]) == pytest.approx(real / synthetic, abs=0.01)
    assert "timm benchmark.py" not in header  # not given: the column is left out, not shown empty


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
    assert bench._timm_result(out)["train_samples_per_sec"] == 12.5
    assert bench._timm_result("no marker") == {}


def test_alternately_keeps_the_median_round_and_alternates_who_goes_first():
    order: list[str] = []

    def runner(name, rates):
        def run():
            order.append(name)
            return bench.Row(bench.Config("m", 32), "train", name, "synthetic", rates.pop(0), 8)

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

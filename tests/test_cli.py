"""The CLI end to end (real models, real data, real DuckDB) and every user mistake from the issue."""

import re
import shutil

import duckdb
import pytest
from conftest import DEIT_WEIGHTS, needs_shared_data
from safetensors.torch import save_file

from vitbench import store
from vitbench.engine import ridge
from vitbench.protocols import fewshot
from vitbench.views.measured.axes import with_axes

FAST = ("--res", "32", "--workers", "0", "--extraction-batch", "256")


DIGITS = ("--dataset", "digits", "--model", "vit-ti/16", "--weights", "random")


def run_demo(cli, results, *extra):
    """Few-shot of a random-init ViT-Ti on digits: the quickest complete run (the demo before it pre-trained)."""
    return cli("run", *DIGITS, "--results", results, "--shots", "1,5", "--seeds", "0,1", *FAST, *extra)


def test_demo_runs_stores_and_renders(cli, results, caplog):
    code, out, _ = run_demo(cli, results)
    assert code == 0, out
    assert "Digits (8x8, scikit-learn)" in out and "5-shot" in out and "· vit-ti/16 (random init)†" in out
    df = with_axes(store.read_results(results))
    assert len(df) == 4 and set(df["shots"]) == {1, 5} and set(df["seed"]) == {0, 1}
    row = df.iloc[0]
    assert (
        row["random_init"] and row["weights_sha256"] == "random" and row["protocol_version"] == fewshot.FEWSHOT.version
    )
    for column in (
        "data_fingerprint",
        "device_name",
        "git_sha",
        "torch_version",
        "timm_version",
        "vitbench_version",
        "started_at",
        "finished_at",
        "hostname",
    ):
        assert row[column] is not None and str(row[column]) != "", column
    assert row["flops_per_image"] > 0 and row["device_seconds"] > 0 and row["device_count"] == 1
    assert 0.1 < df["value"].mean() <= 1.0  # well above chance (10 classes) even from random features
    assert len(list((results / "runs").glob("*.json"))) == 4

    caplog.clear()
    code, _, _ = run_demo(cli, results)  # finished runs are skipped
    assert code == 0 and "4 already stored, 0 to run" in caplog.text
    code, _, _ = run_demo(cli, results, "--rerun")
    assert code == 0 and len(store.read_results(results)) == 4


def test_table_formats_and_compare(cli, results):
    run_demo(cli, results)
    code, md, _ = cli("table", "--results", results, "--format", "md", "--compare", "bit-l")
    assert code == 0
    assert "**Table 2 layout: top-1 accuracy (%) · vit-ti/16 (random init)†**" in md  # what all columns share
    assert "| | 1-shot | 5-shot | bit-l (paper) |" in md
    assert "| paper TPUv3-core-days |  |  | 9.9k |" in md
    # a row only paper columns fill is left out and named (issue 45: seven empty rows beside digits)
    assert "| CIFAR-10 |" not in md and "rows with paper cells only not shown: ImageNet, ImageNet ReaL, CIFAR-10" in md
    code, md, _ = cli("table", "--results", results, "--format", "md", "--compare", "bit-l", "--all-rows")
    assert "| CIFAR-10 |  |  | 99.37 ± 0.06 |" in md  # no measured cell: empty, never 0 (one cell: no bold)
    assert "not shown" not in md
    assert " ± " in md and "mean ± std over 2 runs (seeds) each" in md and "(Δ" not in md  # random init: no Δ
    code, latex, _ = cli("table", "--results", results, "--format", "latex")
    assert code == 0 and r"\toprule" in latex and r"$\pm$" in latex and r"$^\dagger$" in latex
    code, csv, _ = cli("table", "--results", results, "--format", "csv", "--shots", "5")
    assert code == 0 and csv.startswith("row,column,mean,std,n") and "1-shot" not in csv
    code, out, _ = cli("table", "--results", results, "--compare", "vit-l/16-i21k", "--all-rows")
    assert code == 0 and "99.15 ± 0.03" in out and "vit-l/16-i21k (paper)" in out and "0.23k" in out
    code, out, _ = cli("table", "--results", results / "empty", "--compare", "bit-l")
    assert code == 0 and "99.37 ± 0.06" in out  # paper column alone on an empty store


def test_sweep_stores_every_l2_and_the_table_picks_one(cli, results):
    code, out, _ = run_demo(cli, results, "--fewshot-l2", "sweep")
    assert code == 0
    df = store.read_results(results)
    assert df["metric"].nunique() == 30 and "chosen by mean rank" in out


def test_dry_run_plans_without_running(cli, results):
    code, out, _ = cli("run", *DIGITS, "--dry-run", "--results", results, "--shots", "1", "--seeds", "0,1,2")
    assert code == 0 and out.count("todo") == 3 and not (results / store.DB_NAME).exists()
    # each line names its weights (issue 45: two weights of one model planned lines that read the same)
    planned = [line for line in out.splitlines() if "  todo" in line]
    assert len(planned) == 3 and all(" random init " in line for line in planned)


def test_ctrl_c_leaves_no_partial_row_and_the_rerun_does_only_the_rest(cli, results, monkeypatch, caplog):
    real, calls = ridge.fewshot_accuracies, []

    def interrupted_on_third_run(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(ridge, "fewshot_accuracies", interrupted_on_third_run)
    code, _, err = run_demo(cli, results)
    assert code == 130 and "interrupted: 2 of 4 runs stored" in err
    con = duckdb.connect(str(results / store.DB_NAME), read_only=True)
    assert con.execute("SELECT count(*) FROM runs").fetchone()[0] == 2
    assert con.execute("SELECT count(*) FROM runs r ANTI JOIN metrics m USING (run_key)").fetchone()[0] == 0
    con.close()
    monkeypatch.setattr(ridge, "fewshot_accuracies", real)
    caplog.clear()
    code, _, _ = run_demo(cli, results)
    assert code == 0 and "2 already stored, 2 to run" in caplog.text
    assert len(store.read_results(results)) == 4


@pytest.mark.parametrize(
    "args, message",
    [
        (["--model", "vit-b16"], "unknown model 'vit-b16'; did you mean vit-b/16"),
        (["--model", "bit-l"], "model bit-l is a paper reference only and cannot be run"),
        (["--suite", "vtabb"], "unknown suite 'vtabb'"),
        (
            ["--dataset", "cifar11", "--model", "vit-ti/16", "--weights", "random"],
            "unknown dataset 'cifar11'; did you mean cifar10",
        ),
        (["--seeds", "a,b"], "--seeds a,b: expected comma-separated non-negative integers"),
        (["--shots", "0"], "--shots 0: expected an integer from 1 to 2147483647"),
        (["--dataset", "cifar10", "--model", "vit-ti/16"], "--weights is required"),
        (["--protocol", "probe"], "--protocol probe: expected fewshot, finetune, eval, knn, linear"),
        (["--res", "30"], "--res 30: vit-ti/16 needs an image size that is a positive multiple of 16"),
        (["--weights", "nothing.safetensors"], "--weights nothing.safetensors: no such file"),
        (["--device", "tpu9"], "--device tpu9"),
        (["--nonsense"], "No such option: --nonsense"),
        (["--extraction-batch", "0"], "--extraction-batch"),
        (["--batch-size", "0"], "--extraction-batch"),
        (["--workers", "-1"], "--workers"),
    ],
)
def test_bad_input_is_one_line_without_traceback(cli, results, args, message):
    code, out, err = cli("run", "--results", results, *args)
    assert code != 0 and message in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_data_dir_mistakes(cli, results, tmp_path, cifar10_dir):
    base = ["run", "--results", results, "--model", "vit-ti/16", "--weights", "random", "--dataset", "cifar10", *FAST]
    code, _, err = cli(*base, "--data-dir", tmp_path / "nowhere")
    assert code == 2 and "--data-dir" in err and "no such folder" in err
    (tmp_path / "file").write_text("")
    code, _, err = cli(*base, "--data-dir", tmp_path / "file")
    assert code == 2 and "is a file" in err
    (cifar10_dir / "cifar-10-batches-py" / "test_batch").unlink()
    code, _, err = cli(*base, "--data-dir", cifar10_dir)
    assert code == 2 and f"cifar10 (no {cifar10_dir / 'cifar-10-batches-py' / 'test_batch'})" in err


def test_weights_mistakes(cli, results, tmp_path):
    base = [
        "run",
        "--results",
        results,
        "--model",
        "vit-ti/16",
        "--dataset",
        "digits",
        *FAST,
        "--shots",
        "1",
        "--seeds",
        "0",
    ]
    broken = tmp_path / "broken.safetensors"
    broken.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    code, _, err = cli(*base, "--weights", broken)
    assert code == 2 and "broken.safetensors: not a readable safetensors file" in err
    import torch

    save_file({"conv.weight": torch.zeros(3)}, str(tmp_path / "resnet.safetensors"))
    code, _, err = cli(*base, "--weights", tmp_path / "resnet.safetensors")
    assert code == 2 and "resnet.safetensors: no tensor" in err and "another architecture" in err
    assert store.read_results(results).empty  # nothing half-stored


def test_unwritable_results_and_newer_store(cli, tmp_path):
    (tmp_path / "afile").write_text("")
    code, _, err = cli("run", "--results", tmp_path / "afile" / "results", *FAST)
    assert code == 2 and "--results" in err and "cannot write there" in err
    results = tmp_path / "r"
    store.connect(results).close()
    con = duckdb.connect(str(results / store.DB_NAME))
    con.execute("INSERT INTO schema_version VALUES (?, now(), '9')", [store.SCHEMA_VERSION + 1])
    con.close()
    code, _, err = cli("run", "--results", results, *FAST)
    assert code == 2 and "newer vitbench" in err
    code, _, err = cli("table", "--results", results)
    assert code == 2 and "newer vitbench" in err


def test_ls_doctor_version(cli, cifar10_dir):
    assert "vitbench 0.1" in cli("--version")[1]
    assert "cifar10" in cli("ls", "datasets")[1] and "demo" in cli("ls", "suites")[1]
    code, out, _ = cli("ls", "models")
    assert code == 0 and "vit-h/14" in out and "never released" in out
    code, out, _ = cli("doctor", "--data-dir", cifar10_dir)
    assert code == 0 and "torch" in out and "found" in out and "absent" in out
    code, _, err = cli("ls", "widgets")
    assert code == 2 and "expected models, datasets, suites, protocols or plugins" in err
    assert "Usage" in cli("run", "-h")[1]


@needs_shared_data
def test_deit_tiny_few_shot_on_shared_cifar10(cli, results, deit_cifar10_linear):
    shutil.copytree(deit_cifar10_linear / "cache", results / "cache")  # the features the linear probe extracted
    data = deit_cifar10_linear.parent / "data"  # the first images of the shared subset, which it read
    code, out, _ = cli(
        "run",
        "--model",
        "deit-ti/16",
        "--weights",
        DEIT_WEIGHTS,
        "--dataset",
        "cifar10",
        "--data-dir",
        data,
        "--protocol",
        "fewshot",
        "--shots",
        "10",
        "--seeds",
        "0",
        "--results",
        results,
        "--workers",
        "0",
    )
    assert code == 0
    df = store.read_results(results)
    row = df.iloc[0]
    assert row["data_subset"] and not row["random_init"] and len(row["weights_sha256"]) == 64
    assert row["value"] > 0.6  # real pretrained features: far above the 10 % of chance


def test_random_init_is_reproducible_and_the_feature_cache_tells_gelu_apart(cli, results):
    import json

    assert run_demo(cli, results, "--shots", "5", "--seeds", "0")[0] == 0
    first = store.read_results(results)
    assert run_demo(cli, results, "--shots", "5", "--seeds", "0", "--rerun")[0] == 0
    again = store.read_results(results)
    assert again["value"].tolist() == first["value"].tolist()  # the same run_key, the same number
    assert json.loads(again.iloc[0]["notes"])["features_from_cache"]
    assert run_demo(cli, results, "--shots", "5", "--seeds", "0", "--gelu", "tanh")[0] == 0
    tanh = store.read_results(results)
    tanh = tanh[tanh["hparams"].map(lambda h: json.loads(h)["gelu"] == "tanh")]
    assert len(tanh) == 1 and not json.loads(tanh.iloc[0]["notes"])["features_from_cache"]


def test_the_summary_shows_the_runs_this_command_planned(cli, results):
    """After `vitbench run --suite fewshot`, the summary used to print every table of the folder
    (the demo's digits among them); it shows the runs this command planned, stored now or before."""
    assert cli("run", *DIGITS, "--results", results, "--shots", "1", "--seeds", "0", *FAST)[0] == 0
    code, out, err = cli("run", "--dataset", "digits5-9", "--model", "vit-ti/16", "--weights", "random",
                         "--results", results, "--shots", "1", "--seeds", "0", *FAST)  # fmt: skip
    assert code == 0, err
    assert "Digits 5–9" in out and "Digits (8x8" not in out
    assert "[1/1] vit-ti/16 (random init) digits5-9 fewshot shots=1 seed 0: accuracy" in err
    # issue 69, goal 4: each run's line says the images/s it achieved (its shard's images over its device time)
    assert re.search(r"digits5-9 fewshot shots=1 seed 0: accuracy [\d.]+% · [\d,]+ images/s", err), err
    code, out, _ = cli("table", "--results", results)  # the folder's table still has both
    assert code == 0 and "Digits 5–9" in out and "Digits (8x8" in out


def test_an_empty_folder_points_to_the_demos_own(cli, tmp_path):
    """The demo keeps its runs in results/demo: `vitbench table` on the empty results/ says where."""
    results = tmp_path / "results"
    store.connect(results / "demo").close()
    code, _, err = cli("table", "--results", results)
    assert code == 0 and f"the demo's runs are in {results / 'demo'}: --results {results / 'demo'}" in " ".join(
        err.split()
    )


def test_a_warning_is_shown_once_per_command(cli, results, cifar10_dir):
    """Issue 45: two protocols load the same (subset) splits, and a resumed run loads them again;
    each warning still prints once per command, and again in the next command."""
    args = ("run", "--model", "vit-ti/16", "--weights", "random", "--dataset", "cifar10", "--data-dir", cifar10_dir,
            "--res", "32", "--seeds", "0", "--shots", "1", "--protocol", "fewshot,knn", "--workers", "0",
            "--results", results)  # fmt: skip
    for _ in range(2):  # the second: a resumed run, every run stored
        code, _, err = cli(*args)
        assert code == 0, err
        subset = [line for line in err.splitlines() if "a subset, so numbers are not comparable" in line]
        assert len(subset) == 2 and len(set(subset)) == 2, subset  # train and test, once each

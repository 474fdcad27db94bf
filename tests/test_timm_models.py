"""`--model timm:<architecture>`: three tiny timm architectures of different families (a ViT, a
ConvNeXt, an EfficientNet with batch norm), built at random init, each through few-shot and a smoke
fine-tune on digits; and a mistyped architecture is a one-line error (issue 17, part 1)."""

from __future__ import annotations

import json

import pytest

from vitbench import store
from vitbench.catalog.registry import get_model

COMMON = ("--weights", "random", "--dataset", "digits", "--res", "32", "--seeds", "0", "--workers", "0")


@pytest.mark.parametrize("arch", ["test_vit", "test_convnext", "test_efficientnet"])
def test_any_timm_architecture_runs_few_shot_and_fine_tuning(cli, tmp_path, arch):
    results = tmp_path / "results"
    model = f"timm:{arch}"
    code, _, err = cli("run", "--model", model, *COMMON, "--shots", "5", "--results", results)
    assert code == 0, err
    code, _, err = cli("run", "--model", model, *COMMON, "--protocol", "finetune", "--smoke", "--steps", "2",
                       "--batch", "8", "--lr", "0.01", "--results", results)  # fmt: skip
    assert code == 0, err
    df = store.read_results(results)
    runs = df.drop_duplicates("run_key")
    assert set(runs["protocol"]) == {"fewshot", "finetune"} and set(runs["model"]) == {model}
    assert set(runs["backend"]) == {"timm"} and set(runs["arch"]) == {arch}
    assert (runs["flops"] > 0).all()  # counted on the meta device, batch-norm nets included
    fewshot = json.loads(runs[runs["protocol"] == "fewshot"]["hparams"].iloc[0])
    assert fewshot["representation"] == "timm pre-logits" and "no_antialias" in fewshot["preprocessing"]


def test_the_architectures_config_gives_the_value_range():
    spec = get_model("timm:convnext_tiny")
    assert spec.preprocessing.mean == (0.485, 0.456, 0.406) and spec.preprocessing.family == "timm"
    assert get_model("timm:vit_small_patch16_224").input_multiple == 16


def test_an_unknown_architecture_is_one_line(cli, tmp_path):
    code, _, err = cli("run", "--model", "timm:convnext_tinny", *COMMON, "--results", tmp_path)
    assert code != 0 and "timm has no architecture 'convnext_tinny'; did you mean timm:convnext_tiny" in err
    assert "Traceback" not in err


def test_models_and_a_folder_of_checkpoints_are_one_plan(cli, tmp_path):
    """`--model a,b` and `--weights DIR` (each checkpoint, in step order) plan their cross product;
    the table gives each (model, weights) a column and `plot checkpoints` draws the series."""
    import timm
    from safetensors.torch import save_file

    folder = tmp_path / "ckpts"
    folder.mkdir()
    for step in (900, 1000, 50):  # step order is numeric, not by name (step_1000 after step_900)
        model = timm.create_model("test_vit", num_classes=0)
        save_file(model.state_dict(), str(folder / f"step_{step}.safetensors"))
    results = tmp_path / "results"
    args = ("run", "--model", "timm:test_vit", "--weights", folder, "--dataset", "digits", "--res", "32",
            "--shots", "2", "--seeds", "0", "--workers", "0", "--results", results)  # fmt: skip
    code, out, err = cli(*args, "--dry-run")
    assert code == 0, err
    planned = [line for line in (out + err).splitlines() if "timm:test_vit" in line and "shots=2" in line]
    assert len(planned) == 3
    assert cli(*args)[0] == 0
    code, md, _ = cli("table", "--format", "md", "--results", results)
    header = md.splitlines()[2]
    assert "| 2-shot† |" not in header and header.count("2-shot (") == 3  # (a), (b), (c): three weights
    notes = [line for line in md.splitlines() if line.startswith("- [timm:test_vit · 2-shot (")]
    assert [n.split("weights ")[1].split(" ")[0] for n in notes] == [
        "step_50.safetensors", "step_900.safetensors", "step_1000.safetensors"]  # fmt: skip
    code, text, err = cli("plot", "checkpoints", "--out", tmp_path / "plots", "--formats", "svg", "--results", results)
    assert code == 0, err
    assert (tmp_path / "plots" / "accuracy_vs_checkpoint.svg").exists() and "3 run(s)" in text
    code, _, err = cli(*args[:4], str(folder / "*.pth"), *args[5:])
    assert code != 0 and "the pattern matches no file" in err

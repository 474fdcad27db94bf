"""Where each part of a preprocessing recipe comes from (vitbench/models/preprocessing.py): the protocol
sets the geometry, the weights only their value range, and `eval` scores a checkpoint with its
own family's published recipe (issue 15, items 3 and 4). Planned on real weights files: a timm
folder (with the `config.json` a Hugging Face snapshot keeps) and a bare file."""

from __future__ import annotations

import json
import logging

import pytest
import timm
from safetensors.torch import save_file

from vitbench.api import request
from vitbench.execution.plan import plan

IMAGENET = "mean=0.485,0.456,0.406,std=0.229,0.224,0.225"
TIMM_CONFIG = {
    "pretrained_cfg": {
        "mean": [0.485, 0.456, 0.406],
        "std": [0.229, 0.224, 0.225],
        "crop_pct": 0.9,
        "interpolation": "bicubic",
        "crop_mode": "center",
    }
}


def weights_file(folder, name: str = "model.safetensors", config: dict | None = None) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    model = timm.create_model("vit_tiny_patch16_224", num_classes=10)
    save_file(model.state_dict(), str(folder / name))
    if config is not None:
        (folder / "config.json").write_text(json.dumps(config))
    return str(folder / name)


def planned(weights: str, protocol: str, results, **options) -> dict:
    req = request(model="vit-ti/16", weights=weights, datasets=("digits",), protocol=protocol, seeds=(0,),
                  shots=(1,), workers=0, results=results, **options)  # fmt: skip
    return plan(req)[0].specs[-1].hparams


@pytest.fixture(scope="module")
def timm_weights(tmp_path_factory):
    return weights_file(tmp_path_factory.mktemp("hub") / "snapshot", config=TIMM_CONFIG)


def test_a_timm_config_sets_only_the_value_range_of_few_shot_and_fine_tuning(timm_weights, tmp_path):
    fewshot = planned(timm_weights, "fewshot", tmp_path)["preprocessing"]
    assert fewshot == f"resize_squash(256,bilinear,no_antialias)|central_crop(224)|normalize({IMAGENET})"
    finetune = planned(timm_weights, "finetune", tmp_path, lr=0.01)["preprocessing"]
    assert finetune == f"resize_squash(384,bilinear,no_antialias)|central_crop(384)|normalize({IMAGENET})"


def test_eval_uses_the_checkpoint_familys_own_recipe(timm_weights, tmp_path):
    timm_eval = planned(timm_weights, "eval", tmp_path)
    assert timm_eval["eval_recipe"] == "timm"
    assert timm_eval["preprocessing"] == f"resize_center(248,bicubic)|central_crop(224)|normalize({IMAGENET})"
    google = weights_file(tmp_path / "google", "ViT-Ti_16.safetensors")  # no timm config beside it
    vit_jax = planned(google, "eval", tmp_path, res=384)
    assert vit_jax["eval_recipe"] == "vit_jax"  # a plain resize to 384, not timm's 438 + crop
    assert (
        vit_jax["preprocessing"]
        == "resize_squash(384,bilinear,no_antialias)|central_crop(384)|normalize(mean=0.5,0.5,0.5,std=0.5,0.5,0.5)"
    )
    deit = planned("random", "eval", tmp_path) | {}
    assert deit["eval_recipe"] == "vit_jax"  # random init of vit-ti/16: no family recipe but Google's


def test_deit_weights_keep_timms_recipe_for_eval_only(tmp_path):
    req = dict(weights="random", datasets=("digits",), seeds=(0,), shots=(1,), workers=0, results=tmp_path)
    eval_h = plan(request(model="deit-ti/16", protocol="eval", **req))[0].specs[0].hparams
    fewshot_h = plan(request(model="deit-ti/16", protocol="fewshot", **req))[0].specs[0].hparams
    assert eval_h["eval_recipe"] == "timm" and eval_h["preprocessing"].startswith("resize_center(248,bicubic)")
    assert (
        fewshot_h["preprocessing"]
        == f"resize_squash(256,bilinear,no_antialias)|central_crop(224)|normalize({IMAGENET})"
    )


def test_in21k_weights_without_pre_logits_are_warned_about_and_recorded(tmp_path, caplog):
    weights = weights_file(tmp_path / "models--timm--vit_tiny_patch16_224.augreg_in21k" / "snapshot")
    with caplog.at_level(logging.WARNING, logger="vitbench"):
        hparams = planned(weights, "fewshot", tmp_path)
    assert hparams["representation"] == "LN(CLS)"
    assert "tanh(Dense(LN(CLS)))" in hparams["representation_note"]
    assert any("without the pre_logits layer" in r.getMessage() for r in caplog.records)
    plain = planned(weights_file(tmp_path / "other"), "fewshot", tmp_path)
    assert "representation_note" not in plain

"""Google .npz checkpoints: each family round-trips exactly through timm's loaders, every tensor is
accounted for, pre_logits is kept, position embeddings resize as vit_jax does, and nothing is fetched."""

import json
import os
from pathlib import Path

import google_npz
import numpy as np
import pytest
import scipy.ndimage
import timm
import torch
from conftest import DEIT_WEIGHTS, SHARED_DATA, needs_shared_data
from safetensors.torch import load_file, save_file
from vitbench_plugins.bit import BACKEND as BIT
from vitbench_plugins.hybrid import BACKEND as HYBRID

from vitbench import store
from vitbench.catalog import registry
from vitbench.errors import UserError
from vitbench.models.backend import ModelSpec
from vitbench.weights import check_weights_arg, load_into
from vitbench.weights.npz import read_npz

VIT_TI = registry.get_model("vit-ti/16")
TINY_HYBRID = ModelSpec("test-hybrid", "vitbench_test_hybrid", HYBRID, input_multiple=8)
TINY_BIT = ModelSpec("test-bit", "vitbench_test_bit", BIT)


def create(spec, num_classes, res):
    return spec.backend.create(spec, num_classes=num_classes, img_size=res).eval()


def save_npz(path: Path, arrays: dict) -> Path:
    np.savez(path, **arrays)
    return path


@pytest.fixture(scope="module")
def vit():
    return google_npz.randomize(create(VIT_TI, 5, 32))


@pytest.mark.parametrize("layout", ["vit_jax", "scan", "big_vision"])
def test_vit_layouts_reproduce_the_source_model(tmp_path, vit, layout):
    path = save_npz(tmp_path / "vit.npz", google_npz.vit_arrays(vit, layout))
    x = torch.randn(2, 3, 32, 32)
    whole = create(VIT_TI, 5, 32)
    whole.load_state_dict(read_npz(path, VIT_TI))  # head included: strict, every tensor
    backbone = create(VIT_TI, 10, 32)
    load_into(backbone, VIT_TI, path)  # the protocols' path: head replaced by a zero layer
    with torch.inference_mode():
        torch.testing.assert_close(whole(x), vit(x), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(
            VIT_TI.backend.features(backbone, x), VIT_TI.backend.features(vit, x), atol=1e-5, rtol=1e-5
        )
    assert torch.count_nonzero(backbone.head.weight) == 0


@pytest.mark.parametrize("spec, res", [(TINY_HYBRID, 32), (TINY_BIT, 64)])
def test_hybrid_and_bit_reproduce_the_source_model(tmp_path, spec, res):
    source = google_npz.randomize(create(spec, 5, res), seed=1)
    arrays = google_npz.vit_arrays(source) if spec is TINY_HYBRID else google_npz.bit_arrays(source)
    path = save_npz(tmp_path / "model.npz", arrays)
    loaded = create(spec, 5, res)
    loaded.load_state_dict(read_npz(path, spec))
    x = torch.randn(2, 3, res, res)
    with torch.inference_mode():
        torch.testing.assert_close(loaded(x), source(x), atol=1e-5, rtol=1e-5)


def test_pre_logits_is_kept_and_used(tmp_path, vit):
    rng = np.random.default_rng(0)
    kernel, bias = rng.normal(size=(192, 192)).astype(np.float32) * 0.05, rng.normal(size=192).astype(np.float32)
    path = save_npz(tmp_path / "upstream.npz", google_npz.vit_arrays(vit, pre_logits=(kernel, bias)))
    model = create(VIT_TI, 10, 32)
    load_into(model, VIT_TI, path)
    x = torch.randn(2, 3, 32, 32)
    with torch.inference_mode():
        cls = vit.forward_features(x)[:, 0]  # LN(CLS) of the source
        expected = torch.tanh(cls @ torch.from_numpy(kernel) + torch.from_numpy(bias))  # Flax Dense: x @ kernel + b
        torch.testing.assert_close(VIT_TI.backend.features(model, x), expected, atol=1e-5, rtol=1e-5)
    assert VIT_TI.backend.representation_name(True) == "tanh(Dense(LN(CLS)))"


def test_position_embeddings_resize_like_vit_jax(tmp_path, vit):
    path = save_npz(tmp_path / "vit.npz", google_npz.vit_arrays(vit))
    bigger = create(VIT_TI, 10, 64)  # 2x2 grid -> 4x4
    load_into(bigger, VIT_TI, path)
    old = vit.pos_embed.detach()[0, 1:].reshape(2, 2, 192).double().numpy()
    expected = scipy.ndimage.zoom(old, (2, 2, 1), order=1).reshape(16, 192)  # vit_jax interpolate_posembed
    np.testing.assert_allclose(bigger.pos_embed.detach()[0, 1:].numpy(), expected, atol=1e-6)
    torch.testing.assert_close(bigger.pos_embed[0, 0], vit.pos_embed[0, 0])  # class token kept as is


def test_missing_extra_misshaped_and_truncated_are_one_line_errors(tmp_path, vit):
    arrays = google_npz.vit_arrays(vit)
    missing = {k: v for k, v in arrays.items() if k != "Transformer/encoderblock_1/LayerNorm_2/scale"}
    with pytest.raises(UserError, match="no array .*encoderblock_1/LayerNorm_2/scale"):
        read_npz(save_npz(tmp_path / "missing.npz", missing), VIT_TI)
    with pytest.raises(UserError, match="array 'Transformer/extra/kernel' is not part of vit-ti/16"):
        read_npz(save_npz(tmp_path / "extra.npz", {**arrays, "Transformer/extra/kernel": np.zeros(3)}), VIT_TI)
    wide = {**arrays, "embedding/kernel": np.zeros((16, 16, 3, 64), np.float32)}
    with pytest.raises(UserError, match="does not fit vit-ti/16"):
        read_npz(save_npz(tmp_path / "wide.npz", wide), VIT_TI)
    # before: integer weights were cast and used (issue 49, item 6), where a .safetensors file is refused
    integers = {k: (v * 100).astype(np.int64) for k, v in arrays.items()}
    with pytest.raises(UserError, match=r"ints\.npz: array '.*' is int64, expected floating-point values"):
        read_npz(save_npz(tmp_path / "ints.npz", integers), VIT_TI)
    good = save_npz(tmp_path / "good.npz", arrays)
    (tmp_path / "cut.npz").write_bytes(good.read_bytes()[:4000])
    with pytest.raises(UserError, match=r"cut\.npz: not a readable \.npz archive"):
        read_npz(tmp_path / "cut.npz", VIT_TI)


def test_gelu_tanh_option(tmp_path):
    model = VIT_TI.backend.create(VIT_TI, num_classes=0, img_size=32, gelu="tanh")
    x = torch.linspace(-4, 4, 101)
    act = model.blocks[0].mlp.act
    torch.testing.assert_close(act(x), torch.nn.functional.gelu(x, approximate="tanh"))  # Flax's default GELU
    assert not torch.allclose(act(x), torch.nn.functional.gelu(x), atol=1e-5)
    with pytest.raises(UserError, match="--gelu tanh: only transformer backends"):
        BIT.timm_kwargs(224, "tanh")


def make_hf_cache(root: Path, tag: str, state: dict) -> Path:
    """The layout huggingface_hub writes: models--timm--<tag>/{refs/main, snapshots/<rev>/...}."""
    repo = root / f"models--timm--{tag}"
    snapshot = repo / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123abcd")
    save_file({k: v.contiguous() for k, v in state.items()}, str(snapshot / "model.safetensors"))
    return snapshot / "model.safetensors"


def test_timm_tags_resolve_from_the_local_cache_only(tmp_path, monkeypatch, vit):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    cached = make_hf_cache(tmp_path / "hub", "vit_tiny_patch16_224.augreg_in21k", vit.state_dict())
    assert Path(check_weights_arg("timm:vit_tiny_patch16_224.augreg_in21k", VIT_TI)) == cached
    with pytest.raises(
        UserError,
        match=r"not in the local Hugging Face cache \(looked in .*hub/models--timm--"
        r"vit_base_patch16_224\.orig_in21k\)",
    ):
        check_weights_arg("timm:paper", registry.get_model("vit-b/16"))  # the paper's upstream tag
    with pytest.raises(UserError, match="weights for vit_base_patch16_224, but vit-ti/16 is vit_tiny_patch16_224"):
        check_weights_arg("timm:vit_base_patch16_224.orig_in21k", VIT_TI)
    with pytest.raises(UserError, match="not a timm weights tag"):
        check_weights_arg("timm:nonsense", VIT_TI)


def test_weights_fingerprint_is_cached_by_path_size_and_mtime(tmp_path, monkeypatch):
    from vitbench import provenance

    path = tmp_path / "w.bin"
    path.write_bytes(b"a" * 1000)
    first = provenance.sha256_file(path, tmp_path / "cache")
    reads, real_sha256 = [], provenance.hashlib.sha256
    monkeypatch.setattr(provenance.hashlib, "sha256", lambda *a: reads.append(1) or real_sha256(*a))
    assert provenance.sha256_file(path, tmp_path / "cache") == first and not reads  # served from the cache
    path.write_bytes(b"b" * 1000)  # same size: only the mtime tells
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    assert provenance.sha256_file(path, tmp_path / "cache") != first and reads


def test_inspect_and_convert(tmp_path, vit, cli):
    rng = np.random.default_rng(0)
    pre = (rng.normal(size=(192, 192)).astype(np.float32), rng.normal(size=192).astype(np.float32))
    path = save_npz(tmp_path / "ViT-Ti_16.npz", google_npz.vit_arrays(vit, pre_logits=pre))
    code, out, _ = cli("weights", "inspect", path)
    assert code == 0
    for text in (
        "Google .npz (vit_jax)",
        "width",
        "192",
        "depth",
        "12",
        "heads",
        "3",
        "patch",
        "16",
        "2x2",
        "head_classes",
        "5",
        "pre_logits",
        "True",
        "vit-ti/16, deit-ti/16",
    ):
        assert text in out, text
    out_file = tmp_path / "converted.safetensors"
    code, out, _ = cli("weights", "convert", path, out_file, "--model", "vit-ti/16")
    assert code == 0 and "vit-ti/16" in out
    state = load_file(str(out_file))
    assert "pre_logits.weight" in state and "head.weight" in state
    from safetensors import safe_open

    with safe_open(str(out_file), "pt") as f:
        meta = f.metadata()
    assert (
        meta["timm_arch"] == "vit_tiny_patch16_224"
        and meta["pre_logits"] == "true"
        and len(meta["source_sha256"]) == 64
    )
    a, b = create(VIT_TI, 10, 32), create(VIT_TI, 10, 32)
    load_into(a, VIT_TI, path)
    load_into(b, VIT_TI, out_file)  # the converted file loads the same model, pre_logits included
    x = torch.randn(1, 3, 32, 32)
    with torch.inference_mode():
        torch.testing.assert_close(VIT_TI.backend.features(a, x), VIT_TI.backend.features(b, x))
    code, _, err = cli("weights", "convert", path, tmp_path / "x.pth")
    assert code == 2 and "must be a .safetensors file" in err
    code, _, err = cli("weights", "convert", path, tmp_path / "x.safetensors", "--model", "vit-b/16")
    assert code == 2 and "vit-b/16" in err and "Traceback" not in err
    # issue 71, item 2: a conversion is the same bytes each time, and never replaces its own input
    again = tmp_path / "again.safetensors"
    assert cli("weights", "convert", path, again, "--model", "vit-ti/16")[0] == 0
    assert again.read_bytes() == out_file.read_bytes()
    out_file.chmod(0o444)
    before = (out_file.read_bytes(), out_file.stat().st_mode)
    code, _, err = cli("weights", "convert", out_file, out_file)
    assert code == 2 and "is the file being converted" in err and len(err.strip().splitlines()) == 1, err
    code, _, err = cli("weights", "convert", path, out_file, "--model", "vit-ti/16")
    assert code == 2 and "is read-only" in err, err
    assert (out_file.read_bytes(), out_file.stat().st_mode) == before


def test_few_shot_run_from_npz_records_the_representation(tmp_path, vit, cli):
    rng = np.random.default_rng(0)
    pre = (rng.normal(size=(192, 192)).astype(np.float32) * 0.05, np.zeros(192, np.float32))
    path = save_npz(tmp_path / "up.npz", google_npz.vit_arrays(vit, pre_logits=pre))
    results = tmp_path / "results"
    code, _, err = cli(
        "run",
        "--dataset",
        "digits",
        "--model",
        "vit-ti/16",
        "--weights",
        path,
        "--res",
        "64",
        "--gelu",
        "tanh",
        "--shots",
        "5",
        "--seeds",
        "0",
        "--workers",
        "0",
        "--results",
        results,
    )
    assert code == 0, err
    run = store.read_results(results).iloc[0]
    import json

    hparams = json.loads(run["hparams"])
    assert hparams["representation"] == "tanh(Dense(LN(CLS)))" and hparams["gelu"] == "tanh" and hparams["res"] == 64
    assert run["weights"].endswith("up.npz") and len(run["weights_sha256"]) == 64


@needs_shared_data
def test_deit_tiny_as_vit_jax_npz_gives_the_same_imagenet_predictions(tmp_path, deit_imagenet_eval):
    """DeiT-Ti written as a Google .npz and read back predicts, image for image, the top-1 that the
    eval of its safetensors file stored (the shared fixture's run, same images, same recipe)."""
    from vitbench.datasets import DATASETS
    from vitbench.datasets.transformed import TransformedSplit
    from vitbench.store.predictions import read_predictions

    deit = registry.get_model("deit-ti/16")
    reference = timm.create_model("deit_tiny_patch16_224", num_classes=1000).eval()
    reference.load_state_dict(load_file(str(DEIT_WEIGHTS)))
    path = save_npz(tmp_path / "DeiT-Ti.npz", google_npz.vit_arrays(reference))
    from_npz = timm.create_model("deit_tiny_patch16_224", num_classes=1000).eval()
    from_npz.load_state_dict(read_npz(path, deit))
    run = store.read_results(deit_imagenet_eval).iloc[0]
    stored = read_predictions(deit_imagenet_eval, run["run_key"], json.loads(run["notes"])["predictions"])
    top1 = dict(zip(stored["id"], stored["top1"], strict=True))
    split = DATASETS["imagenet"].load_split(SHARED_DATA, "val")
    data = TransformedSplit(split, deit.preprocessing.transform())
    loader = torch.utils.data.DataLoader(data, batch_size=100, collate_fn=TransformedSplit.collate)
    seen = 0
    with torch.inference_mode():
        for images, _, indices, _ in loader:
            expected = torch.tensor([top1[str(split.paths[i])] for i in indices.tolist()])
            assert torch.equal(from_npz(images).argmax(1), expected)
            seen += len(indices)
    assert seen == len(top1) == 500


@needs_shared_data
def test_inspect_and_convert_the_shared_deit_weights(tmp_path, cli):
    code, out, _ = cli("weights", "inspect", DEIT_WEIGHTS)
    assert code == 0
    for text in ("safetensors (timm)", "5717416", "192", "16", "14x14", "1000", "vit-ti/16, deit-ti/16"):
        assert text in out, text
    code, _, err = cli("weights", "convert", DEIT_WEIGHTS, tmp_path / "deit.safetensors")
    assert code == 2 and "pass --model" in err  # two architectures fit: the user must say which
    code, out, _ = cli("weights", "convert", DEIT_WEIGHTS, tmp_path / "deit.safetensors", "--model", "deit-ti/16")
    assert code == 0
    assert load_file(str(tmp_path / "deit.safetensors")).keys() == load_file(str(DEIT_WEIGHTS)).keys()

import re
from pathlib import Path

import pytest
import torch
from conftest import DEIT_WEIGHTS, needs_shared_data
from safetensors.torch import save_file

from vitbench.catalog import registry
from vitbench.errors import UserError
from vitbench.weights import check_weights_arg, load_into

VIT_TI = registry.get_model("vit-ti/16")


def make_model(res=32, num_classes=10):
    return VIT_TI.backend.create(VIT_TI, num_classes=num_classes, img_size=res).eval()


@pytest.fixture
def source_model():
    torch.manual_seed(0)
    return make_model(num_classes=5)


@pytest.mark.parametrize("suffix", [".safetensors", ".pth"])
def test_weights_round_trip_gives_identical_features(tmp_path, source_model, suffix):
    path = tmp_path / f"w{suffix}"
    state = {k: v.contiguous() for k, v in source_model.state_dict().items()}
    save_file(state, str(path)) if suffix == ".safetensors" else torch.save({"model": state}, path)
    target = make_model(num_classes=10)  # another head: replaced, never loaded
    load_into(target, VIT_TI, path)
    x = torch.randn(2, 3, 32, 32)
    with torch.inference_mode():
        torch.testing.assert_close(VIT_TI.backend.features(target, x), VIT_TI.backend.features(source_model, x))
    assert torch.count_nonzero(target.head.weight) == 0  # the head stays zero-initialised


def test_position_embeddings_are_resized_to_a_new_grid(tmp_path, source_model):
    path = tmp_path / "w.safetensors"
    save_file({k: v.contiguous() for k, v in source_model.state_dict().items()}, str(path))
    bigger = make_model(res=64)
    load_into(bigger, VIT_TI, path)
    assert bigger.pos_embed.shape == (1, 1 + 16, 192)
    torch.testing.assert_close(bigger.pos_embed[:, 0], source_model.pos_embed[:, 0])  # class token kept


def test_truncated_safetensors_is_a_one_line_error(tmp_path, source_model):
    path = tmp_path / "w.safetensors"
    save_file({k: v.contiguous() for k, v in source_model.state_dict().items()}, str(path))
    path.write_bytes(path.read_bytes()[:5000])
    with pytest.raises(UserError, match=r"w\.safetensors: not a readable safetensors file, truncated or corrupt"):
        load_into(make_model(), VIT_TI, path)


def test_pth_with_code_is_refused_by_weights_only(tmp_path):
    path = tmp_path / "evil.pth"
    torch.save({"model": {"x": torch.zeros(1)}, "hook": print}, path)
    # before: torch's advice to load it with weights_only=False, cut before its warning (issue 49's notes)
    with pytest.raises(UserError, match=r"evil\.pth: holds Python objects besides tensors") as refused:
        load_into(make_model(), VIT_TI, path)
    assert "can run code" in str(refused.value) and "weights_only" not in str(refused.value)


def test_wrong_shape_and_missing_tensors_are_named(tmp_path, source_model):
    state = {k: v.contiguous() for k, v in source_model.state_dict().items()}
    save_file({**state, "cls_token": torch.zeros(1, 1, 64)}, str(tmp_path / "shape.safetensors"))
    with pytest.raises(
        UserError,
        match=r"shape\.safetensors: tensor 'cls_token' has shape \(1, 1, 64\), vit-ti/16 expects \(1, 1, 192\)",
    ):
        load_into(make_model(), VIT_TI, tmp_path / "shape.safetensors")
    save_file({k: v for k, v in state.items() if k != "norm.weight"}, str(tmp_path / "missing.safetensors"))
    with pytest.raises(UserError, match=r"missing\.safetensors: no tensor 'norm\.weight'"):
        load_into(make_model(), VIT_TI, tmp_path / "missing.safetensors")
    save_file({**state, "extra.weight": torch.zeros(2)}, str(tmp_path / "extra.safetensors"))
    with pytest.raises(UserError, match=r"tensor 'extra\.weight' is not part of vit-ti/16"):
        load_into(make_model(), VIT_TI, tmp_path / "extra.safetensors")


def test_weights_argument_checks(tmp_path):
    assert check_weights_arg("random") == "random"
    with pytest.raises(UserError, match="no such file"):
        check_weights_arg(str(tmp_path / "nope.safetensors"))
    (tmp_path / "w.ckpt").write_text("")
    with pytest.raises(UserError, match="unknown format '.ckpt'"):
        check_weights_arg(str(tmp_path / "w.ckpt"))


@needs_shared_data
def test_real_deit_weights_load_and_wrong_architecture_is_refused():
    deit = registry.get_model("deit-ti/16")
    load_into(deit.backend.create(deit, num_classes=10, img_size=224), deit, DEIT_WEIGHTS)
    base = registry.get_model("vit-b/16")
    with torch.device("meta"):
        model = base.backend.create(base, num_classes=10, img_size=224)
    with pytest.raises(
        UserError, match=r"deit_tiny_patch16_224\.safetensors: tensor '.*' has shape .*vit-b/16 expects"
    ):
        load_into(model, base, DEIT_WEIGHTS)


def test_pre_logits_probe_reads_keys_of_wrapped_pth(tmp_path):
    from vitbench.weights import has_pre_logits

    torch.save({"model": {"pre_logits.weight": torch.zeros(2, 2), "x": torch.zeros(1)}}, tmp_path / "up.pth")
    torch.save({"x": torch.zeros(1)}, tmp_path / "plain.pth")
    assert has_pre_logits(str(tmp_path / "up.pth")) and not has_pre_logits(str(tmp_path / "plain.pth"))


def test_random_init_is_drawn_from_a_fixed_seed():
    from vitbench.weights import build_model

    torch.manual_seed(123)
    a = build_model(VIT_TI, 10, 32, "random").state_dict()
    after = torch.rand(1)
    torch.manual_seed(123)
    b = build_model(VIT_TI, 10, 32, "random").state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    torch.manual_seed(123)
    assert torch.equal(torch.rand(1), after)  # the caller's RNG stream is untouched
    torch.manual_seed(7)
    c = build_model(VIT_TI, 10, 32, "random").state_dict()
    assert all(torch.equal(a[k], c[k]) for k in a)  # whatever the global seed


def _saved(tmp_path, source_model, name="w.safetensors", metadata=None, **replace) -> Path:
    state = {k: v.contiguous() for k, v in source_model.state_dict().items()}
    path = tmp_path / name
    save_file({**state, **replace}, str(path), metadata=metadata)
    return path


@pytest.mark.parametrize(
    "replace, message",
    [
        ({"blocks.3.attn.qkv.weight": torch.full((576, 192), float("nan"))},
         "tensor 'blocks.3.attn.qkv.weight' holds NaN or infinite values; a diverged or damaged checkpoint?"),
        ({"norm.bias": torch.tensor([float("inf")] * 192)}, "tensor 'norm.bias' holds NaN or infinite values"),
        ({"cls_token": torch.zeros(1, 1, 192, dtype=torch.int64)},
         "tensor 'cls_token' is int64, vit-ti/16 expects floating-point values; saved with the wrong type?"),
        ({"pos_embed": torch.zeros(1, 3, 7)},
         "tensor 'pos_embed' has shape (1, 3, 7), vit-ti/16 expects (1, tokens, 192) to resample to its grid"),
        ({"pos_embed": torch.zeros(1, 3, 192)}, "cannot fit its tensors to vit-ti/16 (position embeddings of 2 tokens"),
    ],
    ids=["nan", "inf", "int64", "pos-embed-width", "pos-embed-grid"],
)  # fmt: skip
def test_weights_that_cannot_give_a_meaningful_number_are_refused(tmp_path, source_model, replace, message):
    """Before: all-NaN weights stored 9.91 %, int64 tensors were cast in silence, and a pos_embed of
    shape (1, 3, 7) was a traceback from the resampler."""
    path = _saved(tmp_path, source_model, **replace)
    with pytest.raises(UserError, match=re.escape(f"{path}: {message}")):
        load_into(make_model(), VIT_TI, path)


@pytest.mark.parametrize("metadata", ["not json {", "[1, 2]", '{"run_key": 7}'])
def test_vitbench_metadata_that_is_not_vitbenchs_is_one_line(tmp_path, source_model, metadata):
    from vitbench.weights import pretrained

    path = _saved(tmp_path, source_model, metadata={"vitbench": metadata})
    with pytest.raises(UserError, match="its 'vitbench' metadata is not the JSON object vitbench writes"):
        pretrained.provenance(path)


def test_a_run_on_nan_weights_stores_nothing(cli, tmp_path, source_model):
    path = _saved(tmp_path, source_model, **{"blocks.0.mlp.fc1.bias": torch.full((768,), float("nan"))})
    results = tmp_path / "results"
    run = ("run", "--model", "vit-ti/16", "--weights", path, "--dataset", "digits", "--res", "32", "--workers", "0")
    code, _, err = cli(*run, "--shots", "5", "--seeds", "0", "--results", results)
    assert code == 2 and "tensor 'blocks.0.mlp.fc1.bias' holds NaN or infinite values" in err
    assert err.count("error:") == 1 and "Traceback" not in err and not list(results.glob("runs/*.json"))


def test_weights_are_resolved_once_into_one_value(tmp_path, caplog):
    """The planner's Weights (issue 30.2): --weights is read once, and what later layers ask of the
    weights (random? which file and sha256? pre_logits? ImageNet-21k by name?) is answered by the
    value, not by parsing the string again."""
    import hashlib

    from vitbench.weights.resolved import resolve

    random = resolve("random", VIT_TI)
    assert (random.kind, random.path, random.sha256, random.pre_logits, random.provenance) == (
        "random", "random", "random", False, None,
    )  # fmt: skip
    file = tmp_path / "vit_tiny.augreg_in21k.pth"
    torch.save({"pre_logits.weight": torch.zeros(2, 2)}, file)
    found = resolve(str(file), VIT_TI, tmp_path / "cache")
    assert found.kind == "file" and found.path == str(file.resolve()) and found.pre_logits and found.in21k
    assert found.sha256 == hashlib.sha256(file.read_bytes()).hexdigest() and found.provenance is None
    with pytest.raises(UserError, match="no such file"):
        resolve(str(tmp_path / "later.pth"), VIT_TI)
    planned = resolve(str(tmp_path / "later.pth"), VIT_TI, dry_run=True)  # a dry run plans it by name
    assert planned.kind == "absent" and planned.sha256 == f"absent:{tmp_path / 'later.pth'}" and not planned.pre_logits
    assert "the dry run plans it by name" in caplog.text

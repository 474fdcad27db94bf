"""Paper §4.5 views: the analyses on hand-built inputs with known answers, the attention captured
from the real forward pass, and `vitbench inspect` end to end."""

import itertools
import math

import numpy as np
import pytest
import torch
from conftest import DEIT_WEIGHTS, SHARED_DATA, needs_shared_data
from PIL import Image

from vitbench import store
from vitbench.catalog import registry
from vitbench.execution import inspection
from vitbench.views.figures.inspection_plots import DPI, SIZES


def brute_force_mean_pairwise_distance(grid, patch_px):
    cells = [(r, c) for r in range(grid[0]) for c in range(grid[1])]
    total = sum(math.dist(a, b) for a, b in itertools.product(cells, cells))
    return total / len(cells) ** 2 * patch_px


def test_mean_attention_distance_of_hand_built_attention():
    grid, n = (3, 4), 12
    self_only = np.zeros((2, 1, 1 + n, 1 + n))
    self_only[:, :, np.arange(1 + n), np.arange(1 + n)] = 1.0
    assert inspection.mean_attention_distance(self_only, 1, grid, 16)[0] == pytest.approx(0.0)
    uniform = np.full((2, 1, 1 + n, 1 + n), 1.0 / (1 + n))  # some mass on the class token: left out
    expected = brute_force_mean_pairwise_distance(grid, 16)
    assert inspection.mean_attention_distance(uniform, 1, grid, 16)[0] == pytest.approx(expected)
    both = np.concatenate([self_only, uniform], axis=1)  # heads are kept apart
    np.testing.assert_allclose(inspection.mean_attention_distance(both, 1, grid, 16), [0.0, expected])


def sincos_2d(grid, dim):
    """A 2-D sine-cosine position embedding (half the channels encode the row, half the column)."""
    rows, cols = np.divmod(np.arange(grid * grid), grid)
    freqs = 1.0 / 10000 ** (np.arange(dim // 4) / (dim // 4))
    parts = [f(pos[:, None] * freqs[None]) for pos in (rows, cols) for f in (np.sin, np.cos)]
    return np.concatenate(parts, axis=1)


def test_position_similarity_of_a_2d_sinusoidal_embedding_is_local():
    sim = inspection.position_similarity(sincos_2d(8, 64))
    np.testing.assert_allclose(np.diag(sim), 1.0)
    assert (sim.argmax(axis=1) == np.arange(64)).all()  # each position is most similar to itself
    centre = 3 * 8 + 3
    assert sim[centre, centre + 1] > sim[centre, centre + 3] > sim[centre, 63]  # falls off with grid distance
    assert sim[centre, centre + 8] > sim[centre, centre + 24]  # along columns too: a 2-D topology


def test_rollout_of_identity_attention_stays_on_the_class_token():
    identity = np.broadcast_to(np.eye(5), (1, 2, 5, 5))
    result = inspection.rollout([identity, identity, identity])
    np.testing.assert_allclose(result[0, 0], [1, 0, 0, 0, 0])
    uniform = np.full((1, 2, 5, 5), 0.2)
    np.testing.assert_allclose(inspection.rollout([uniform, uniform]).sum(-1), 1.0)


def test_captured_attention_is_the_real_forward_softmax():
    spec = registry.get_model("vit-ti/16")
    torch.manual_seed(0)
    model = spec.backend.create(spec, num_classes=0, img_size=32).eval()
    block = model.blocks[0]
    fused_before = block.attn.fused_attn
    x = torch.randn(2, 3, 32, 32)
    with torch.inference_mode():
        with inspection.capture_attention(model) as maps:
            out = model.forward_features(x)
        tokens = model.norm_pre(model._pos_embed(model.patch_embed(x)))
        qkv = block.attn.qkv(block.norm1(tokens)).reshape(2, 5, 3, 3, 64).permute(2, 0, 3, 1, 4)
        manual = ((qkv[0] * block.attn.scale) @ qkv[1].transpose(-2, -1)).softmax(-1)
        torch.testing.assert_close(out, model.forward_features(x))  # the explicit path computes the same model
    assert len(maps) == 12 and maps[0].shape == (2, 3, 5, 5)
    torch.testing.assert_close(maps[0], manual)
    assert block.attn.fused_attn == fused_before and not block.attn.attn_drop._forward_hooks  # restored


def png_size(path):
    with Image.open(path) as img:
        img.load()
        return img.size


def expected_size(kind):
    w, h = SIZES[kind]
    return (round(w * DPI), round(h * DPI))


def test_inspect_cli_writes_the_views_and_stores_the_distances(cli, tmp_path):
    out, results = tmp_path / "views", tmp_path / "results"
    code, stdout, err = cli(
        "inspect",
        "--model",
        "vit-ti/16",
        "--weights",
        "random",
        "--dataset",
        "digits",
        "--res",
        "48",
        "--num-images",
        "6",
        "--rollout-images",
        "2",
        "--out",
        out,
        "--results",
        results,
        "--device",
        "cpu",
    )
    assert code == 0, err
    assert png_size(out / "embedding_filters.png") == expected_size("filters")
    assert png_size(out / "position_similarity.png") == expected_size("positions")
    assert png_size(out / "attention_distance.png") == expected_size("distance")
    rollouts = sorted((out / "attention_rollout").glob("*.png"))
    assert len(rollouts) == 2 and png_size(rollouts[0]) == expected_size("rollout")
    df = store.read_attention_distance(results)
    assert len(df) == 12 * 3 and set(df["res"]) == {48} and set(df["n_images"]) == {6}
    assert df["random_init"].all() and (df["distance_px"] >= 0).all() and (df["distance_px"] <= 48 * 1.5).all()
    assert "layer 12" in stdout
    code, md, _ = cli("table", "--view", "attention", "--format", "md", "--results", results)
    assert code == 0 and "| layer 1 |" in md and "vit-ti/16 (random init) @48px, 6 images" in md
    # the report shows the stored distances as a table and as Fig. 7 (right), inline
    code, _, err = cli("report", "--out", tmp_path / "report.html", "--results", results)
    page = (tmp_path / "report.html").read_text()
    assert code == 0 and '<section id="attention">' in page and '<figure id="figure-attention-0"><svg' in page, err


def test_inspect_refuses_bit_and_skips_hybrid_filters(cli, tmp_path):
    code, _, err = cli(
        "inspect",
        "--model",
        "bit-m-r50x1",
        "--weights",
        "random",
        "--dataset",
        "digits",
        "--out",
        tmp_path / "v",
        "--results",
        tmp_path / "r",
    )
    assert code == 2 and "bit-m-r50x1 is not a transformer" in err
    code, _, err = cli(
        "inspect",
        "--model",
        "r50+vit-b/16",
        "--weights",
        "random",
        "--dataset",
        "digits",
        "--res",
        "64",
        "--num-images",
        "2",
        "--rollout-images",
        "1",
        "--out",
        tmp_path / "h",
        "--results",
        tmp_path / "r",
    )
    assert code == 0 and "embedding filters skipped" in err
    assert (tmp_path / "h" / "attention_distance.png").exists() and not (
        tmp_path / "h" / "embedding_filters.png"
    ).exists()
    code, _, err = cli("inspect", "--model", "vit-ti/16", "--weights", "random", "--out", tmp_path / "x")
    assert code == 2 and "give --images DIR or --dataset NAME" in err


@needs_shared_data
def test_inspect_deit_tiny_on_shared_imagenet_images(cli, tmp_path):
    out, results = tmp_path / "inspect", tmp_path / "results"
    code, _, err = cli(
        "inspect",
        "--model",
        "deit-ti/16",
        "--weights",
        DEIT_WEIGHTS,
        "--images",
        SHARED_DATA / "imagenet" / "val",
        "--num-images",
        "10",
        "--rollout-images",
        "2",
        "--out",
        out,
        "--results",
        results,
    )
    assert code == 0, err
    for name in ("embedding_filters.png", "position_similarity.png", "attention_distance.png"):
        assert (out / name).exists()
    assert len(list((out / "attention_rollout").glob("*.png"))) == 2
    df = store.read_attention_distance(results)
    assert len(df) == 36 and df["images"].iloc[0].endswith("imagenet/val") and not df["random_init"].any()
    first = df[df["layer"] == 12]["distance_px"]
    assert first.min() > 80  # the last layer of a trained ViT attends globally


def test_inspect_decodes_images_as_a_run_does(tmp_path, monkeypatch):
    """Issue 71, item 12. Before: `inspect --images DIR` read a 16-bit PNG as solid white (PIL's
    convert("RGB") clips its values at 255) and a decompression bomb was a traceback. Now it decodes
    as `run` does (datasets/base.decode): the grey kept, the bomb one line naming the file."""
    import numpy as np
    from PIL import Image

    from vitbench.errors import UserError
    from vitbench.execution.inspection import collect_images

    folder = tmp_path / "images"
    folder.mkdir()
    Image.fromarray(np.full((16, 16), 30_000, dtype=np.uint16)).save(folder / "grey16.png")
    assert Image.open(folder / "grey16.png").mode.startswith("I")
    _, images, _, _ = collect_images(folder, None, None, 4)
    assert np.asarray(images[0]).max() == round(30_000 / 257)  # 117, not 255 (white)
    Image.new("L", (100, 100)).save(folder / "bomb.png")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1_000)  # 100 x 100 is past twice that: a bomb
    with pytest.raises(UserError, match="bomb.png: not a readable image") as raised:
        collect_images(folder, None, None, 4)
    assert "\n" not in str(raised.value)

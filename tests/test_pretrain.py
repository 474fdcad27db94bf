"""Pre-training (protocols/pretrain.py): the MPP target and corruption, nested subsets, the
schedule, FLOPs, position-embedding variants and the weights file. End-to-end runs are in
test_pretrain_cli.py."""

from __future__ import annotations

import numpy as np
import pytest
import timm
import torch
from torch.utils.flop_counter import FlopCounterMode

from vitbench.catalog import registry
from vitbench.datasets.base import Split
from vitbench.engine import pretrain_objectives as po
from vitbench.engine import training
from vitbench.errors import UserError
from vitbench.models import position_embeddings
from vitbench.protocols import pretrain_recipe as recipe
from vitbench.weights import RANDOM, build_model, load_into, pretrained

VIT_TI = registry.get_model("vit-ti/16")


def test_the_3_bit_mean_colour_target_equals_a_hand_computation():
    images = torch.zeros(1, 3, 32, 32)  # four 16 px patches
    images[0, :, :16, :16] = torch.tensor([0.30, 0.60, 0.95])[:, None, None]  # patch 0: one colour
    images[0, 0, :16, 16:] = 1.0  # patch 1: pure red (1.0 is the top level, 7, not 8)
    images[0, :, 16:, :16] = 0.5  # patch 2: left half 0.5, right half 0 -> mean 0.25
    images[0, :, 16:, 8:16] = 0.0
    target = po.mpp_targets(images, 16, "mean-colour")
    # floor(v * 8) per channel, then r * 64 + g * 8 + b
    by_hand = [2 * 64 + 4 * 8 + 7, 7 * 64, (2 * 64 + 2 * 8 + 2), 0]
    assert target.tolist() == [by_hand]
    small = po.mpp_targets(images, 16, "downsized-4x4")
    assert small.shape == (1, 4, 16) and set(small[0, 0].tolist()) == {by_hand[0]}
    assert po.mpp_targets(images, 16, "l2").shape == (1, 4, 16 * 16 * 3)


def test_corruption_proportions_over_many_draws():
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randn(400, 196, 8, generator=generator)
    mask = torch.full((1, 1, 8), 7.0)
    corrupted, chosen = po.corrupt(tokens, mask, 0.5, generator)
    assert chosen.shape == (400, 98)  # half of the 196 patches of each image
    assert all(len(set(row.tolist())) == 98 for row in chosen)  # distinct positions
    rows = torch.arange(400)[:, None]
    after, before = corrupted[rows, chosen], tokens[rows, chosen]
    masked = (after == 7.0).all(-1)
    kept = (after == before).all(-1)
    other = ~masked & ~kept
    total = chosen.numel()
    assert masked.sum() / total == pytest.approx(0.8, abs=0.01)
    assert kept.sum() / total == pytest.approx(0.1, abs=0.01)
    assert other.sum() / total == pytest.approx(0.1, abs=0.01)
    # a replaced embedding is another patch's, from anywhere in the batch
    flat = tokens.reshape(-1, 8)
    some = after[other][:50]
    assert all(((flat == t).all(-1)).any() for t in some)
    untouched = torch.ones(400, 196, dtype=torch.bool)
    untouched[rows, chosen] = False
    assert torch.equal(corrupted[untouched], tokens[untouched])  # the other half is never changed
    _, fifteen = po.corrupt(tokens, mask, 0.15, generator)
    assert fifteen.shape[1] == round(0.15 * 196)  # the paper's BERT-like alternative rate


def test_mpp_learns_its_targets_and_reports_accuracy():
    backbone = timm.create_model("vit_tiny_patch16_224", img_size=32, num_classes=0)
    mpp = po.MaskedPatchPrediction(backbone, "mean-colour", 0.5, (0.5,) * 3, (0.5,) * 3)
    images = torch.rand(8, 3, 32, 32) * 2 - 1
    prediction, target = mpp(images)
    assert prediction.shape == (8, 2, 512) and target.shape == (8, 2)
    loss = mpp.loss()((prediction, target), torch.zeros(8, dtype=torch.long))
    assert loss.item() == pytest.approx(8 * np.log(512), rel=0.2)  # summed over images, near chance at init
    assert po.MaskedPatchPrediction.accuracy((prediction, target)).shape == (8,)
    with pytest.raises(UserError, match="--mpp-target"):
        po.MaskedPatchPrediction(backbone, "colour", 0.5, (0.5,) * 3, (0.5,) * 3)


def test_every_mpp_parameter_takes_part_as_ddp_requires():
    """DDP fails on a parameter without a gradient: MPP's backbone is built without a classifier."""
    backbone = build_model(VIT_TI, 0, 32, RANDOM)
    mpp = po.MaskedPatchPrediction(backbone, "mean-colour", 0.5, (0.5,) * 3, (0.5,) * 3)
    mpp.loss()(mpp(torch.randn(4, 3, 32, 32)), torch.zeros(4, dtype=torch.long)).backward()
    unused = [n for n, p in mpp.named_parameters() if p.requires_grad and p.grad is None]
    assert not unused


def _split(n: int) -> Split:
    """A toy split whose image i carries i in its pixels (i // 256, i % 256)."""
    ids = np.arange(n)
    images = np.stack([ids // 256, ids % 256, ids * 0], axis=-1).astype(np.uint8)[:, None, None, :]  # (n, 1, 1, 3)
    return Split("toy", "train", np.arange(n) % 5, "memory", "toy", images=images)


def _ids(split: Split) -> set[int]:
    pixels = np.asarray(split.images)[:, 0, 0].astype(np.int64)
    return set((pixels[:, 0] * 256 + pixels[:, 1]).tolist())


def test_subsets_are_nested_and_seeded():
    split = _split(1000)
    sizes = recipe.subset_sizes("10%,30%,100%", 1000)
    assert sizes == [100, 300, 1000]
    assert recipe.subset_sizes("250, 50", 1000) == [50, 250]
    ids = [_ids(recipe.nested_subset(split, n)) for n in sizes]
    assert ids[0] < ids[1] < ids[2] and [len(i) for i in ids] == sizes  # each inside the next
    assert _ids(recipe.nested_subset(_split(1000), 300)) == ids[1]  # the same draw every time
    assert ids[0] != set(range(100))  # a random draw, not the first images
    for bad in ("0", "1001", "ten%", ","):
        with pytest.raises(UserError, match="--pretrain-subset"):
            recipe.subset_sizes(bad, 1000)


def vit_jax_linear(step, base_lr, total_steps, warmup_steps, linear_end=1e-5):
    """vit_jax/utils.py::create_learning_rate_schedule(decay_type='linear'), transcribed (jnp -> np)."""
    progress = (step - warmup_steps) / float(total_steps - warmup_steps)
    progress = np.clip(progress, 0.0, 1.0)
    lr = linear_end + (base_lr - linear_end) * (1.0 - progress)
    if warmup_steps:
        lr = lr * np.minimum(1.0, step / warmup_steps)
    return float(lr)


@pytest.mark.parametrize(("total", "base"), [(93_750, 3e-3), (300, 1e-3), (20, 8e-4)])
def test_warmup_then_linear_decay_equals_vit_jax_step_by_step(total, base):
    warmup = recipe.warmup_for(total)
    assert warmup == {93_750: 10_000, 300: 60, 20: 4}[total]
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=base)
    scheduler = training.schedule(optimizer, total, warmup, decay="linear")
    for step in range(0, total, max(1, total // 997)):
        scheduler.step_update(step)
        assert optimizer.param_groups[0]["lr"] == pytest.approx(vit_jax_linear(step, base, total, warmup), abs=1e-12)


def test_table3_rows_are_the_defaults():
    assert recipe.table3_row("auto", "vit-b/16", 1000) == recipe.IMAGENET
    assert recipe.table3_row("auto", "vit-b/16", 21_843) == recipe.IMAGENET21K
    jft = recipe.table3_row("jft", "vit-l/16", 1000)
    assert (jft.lr, jft.epochs, jft.weight_decay, jft.decay, jft.dropout) == (4e-4, 7, 0.1, "linear", 0.0)
    assert recipe.table3_row("jft", "vit-h/14", 1000).epochs == 14
    # the caption: clipping at global norm 1 was "additionally" applied for ImageNet, not the others
    assert (recipe.IMAGENET.clip, recipe.IMAGENET21K.clip, jft.clip) == (1.0, None, None)
    # Table 3's "7/14" and "30/90": the count used is the one the recorded row names
    assert "7 of its 7/14 epochs" in jft.name and "7/14" not in recipe.table3_row("jft", "vit-b/16", 1000).name
    i21k_l = recipe.table3_row("imagenet21k", "vit-l/32", 21_843)
    assert i21k_l.epochs == 90 and "90 of vit-l/32's 30/90 epochs" in i21k_l.name
    assert recipe.steps_for(300, 1_281_167, 4096) == 93_836  # ImageNet, 300 epochs at batch 4096
    with pytest.raises(UserError, match="--pretrain-recipe"):
        recipe.table3_row("jft300m", "vit-b/16", 1000)


def test_a_pretraining_step_costs_three_forwards_as_recorded():
    """The recorder charges 3 x the counted forward FLOPs per trained image: a real step (forward +
    backward of the pre-training model, pre_logits head included) counts that within 2 %."""
    res, batch = 32, 4
    backbone = build_model(VIT_TI, 5, res, RANDOM)
    VIT_TI.backend.add_pre_logits(backbone, VIT_TI, torch.Size((192, 192)))
    model = po.Classifier(backbone, VIT_TI.backend.features)
    images, labels = torch.randn(batch, 3, res, res), torch.arange(batch) % 5
    with FlopCounterMode(display=False) as counter:
        training.classification_loss()(model(images), labels).backward()
    recorded = 3 * VIT_TI.backend.flops_per_image(VIT_TI, res) * batch
    assert counter.get_total_flops() == pytest.approx(recorded, rel=0.02)


@pytest.mark.parametrize("variant", position_embeddings.POS_EMBED)
def test_each_position_embedding_variant_saves_weights_every_protocol_reads(variant, tmp_path):
    backbone = build_model(VIT_TI, 5, 32, RANDOM)
    position_embeddings.apply(backbone, variant)
    trainable = {n for n, p in backbone.named_parameters() if p.requires_grad}
    if variant in ("none", "relative", "relative-bias"):
        assert "pos_embed" not in trainable and not backbone.pos_embed.abs().sum()
    if variant == "2-d":
        assert any("rows" in n for n in trainable) and any("cols" in n for n in trainable)
        assert "parametrizations.pos_embed.original" not in trainable  # read by nothing
    with torch.no_grad():
        for p in backbone.parameters():
            p.add_(torch.randn_like(p) * 0.01)  # as if trained
    backbone.eval()
    x = torch.randn(2, 3, 32, 32)
    expected = VIT_TI.backend.features(backbone, x)
    position_embeddings.materialize(backbone)
    path = tmp_path / "w.safetensors"
    pretrained.save(path, backbone.state_dict(), {"run_key": "ab" * 32})
    fresh = build_model(VIT_TI, 10, 32, RANDOM)
    load_into(fresh, VIT_TI, path)  # a plain timm ViT (the relative bias is installed from the weights)
    assert torch.allclose(VIT_TI.backend.features(fresh.eval(), x), expected, atol=1e-5)
    assert pretrained.provenance(path) == {"run_key": "ab" * 32}


def test_relative_attention_is_app_d4s_query_against_offset_embeddings():
    """App. D.4: for patches i, j the logit gains q_i · r(p_i - p_j), r an embedding per 1-D offset,
    added to the content logit q_i · k_j before the softmax (both scaled by 1/sqrt(head width));
    the class token takes part without relative positions. Transcribed here in plain loops."""
    backbone = build_model(VIT_TI, 5, 32, RANDOM).eval()
    position_embeddings.apply(backbone, "relative")
    attn = backbone.blocks[0].attn
    with torch.no_grad():
        attn.relative_key.normal_()
    assert attn.relative_key.shape == (2 * 4 - 1, attn.head_dim)  # 2x2 patches at 32 px: offsets -3..3
    x = torch.randn(2, 5, 192)  # class token + 4 patches
    b, n, _ = x.shape
    q, k, v = attn.qkv(x).reshape(b, n, 3, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4)
    logits = torch.einsum("bhid,bhjd->bhij", q, k)
    for i in range(1, n):
        for j in range(1, n):
            offset = (i - 1) - (j - 1)  # patch positions in raster order
            logits[:, :, i, j] += q[:, :, i] @ attn.relative_key[offset + 3]
    out = (logits * attn.head_dim**-0.5).softmax(-1) @ v
    expected = attn.proj(out.transpose(1, 2).reshape(b, n, -1))
    with torch.no_grad():
        assert torch.allclose(attn(x), expected, atol=1e-5)
    without = build_model(VIT_TI, 5, 32, RANDOM).eval()
    without.load_state_dict({k: v for k, v in backbone.state_dict().items() if "relative_key" not in k})
    with torch.no_grad():
        assert not torch.allclose(without.blocks[0].attn(x), attn(x), atol=1e-3)  # the offsets count


def _train_each_variant_in_a_process_group(rank: int, port: int) -> None:
    """One of two gloo processes: each position-embedding variant, wrapped in DDP as training.py
    wraps it (only the parameters that train), takes three steps."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        for variant in position_embeddings.POS_EMBED:
            torch.manual_seed(0)
            backbone = build_model(VIT_TI, 5, 32, RANDOM)
            position_embeddings.apply(backbone, variant)
            params = [p for p in backbone.parameters() if p.requires_grad]
            optimizer = torch.optim.SGD(params, lr=0.01)
            model = torch.nn.parallel.DistributedDataParallel(backbone)
            for _ in range(3):
                images, labels = torch.randn(4, 3, 32, 32), torch.arange(4) % 5
                training.classification_loss()(model(images), labels).backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
    finally:
        dist.destroy_process_group()


def test_every_position_embedding_variant_trains_under_data_parallelism():
    """Before: `--pos-embed 2-d --devices 2` failed at step 2 with DDP's "Expected to have finished
    reduction in the prior iteration": the parametrization kept `pos_embed`'s original tensor
    trainable, though nothing reads it, so it never got a gradient."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_train_each_variant_in_a_process_group, args=(port,), nprocs=2)


def test_run_weights_are_found_by_key_prefix(tmp_path):
    key = "0123456789abcdef" * 4
    path = pretrained.weights_file(tmp_path, key, "vit-ti16-digits0-4-n453-supervised")
    pretrained.save(path, {"x": torch.zeros(1)}, {"run_key": key})
    assert pretrained.resolve_run("run:01234567", tmp_path) == str(path)
    for text, message in (("run:zz", "expected run:<run key>"), ("run:fedcba98", "no pre-training run")):
        with pytest.raises(UserError, match=message):
            pretrained.resolve_run(text, tmp_path)

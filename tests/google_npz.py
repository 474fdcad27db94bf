"""Write timm models into the original Google .npz key layouts (docs/protocols.md, "Weights files"), with
numpy: the inverse of timm's loaders, so tests can check that loading reproduces the source model."""

from __future__ import annotations

from functools import partial

import numpy as np
import torch
from timm.layers import StdConv2d, StdConv2dSame
from timm.models import register_model
from timm.models.resnetv2 import ResNetV2, _create_resnetv2
from timm.models.vision_transformer_hybrid import _create_vision_transformer_hybrid


@register_model
def vitbench_test_hybrid(pretrained=False, **kwargs):
    """A small R+ViT hybrid from timm's own parts: post-activation ResNetV2 stem + 2 stages (stride 8)."""
    backbone = ResNetV2(
        layers=(1, 1),
        channels=(128, 256),
        num_classes=0,
        global_pool="",
        preact=False,
        stem_type="same",
        conv_layer=partial(StdConv2dSame, eps=1e-8),
    )
    return _create_vision_transformer_hybrid(
        "vitbench_test_hybrid",
        backbone=backbone,
        pretrained=pretrained,
        **dict(dict(embed_dim=64, depth=2, num_heads=2), **kwargs),
    )


@register_model
def vitbench_test_bit(pretrained=False, **kwargs):
    """A small BiT: pre-activation ResNetV2, fixed stem, weight-standardised convs, 4 stages."""
    return _create_resnetv2(
        "vitbench_test_bit",
        pretrained=pretrained,
        layers=(1, 1, 2, 1),
        channels=(128, 128, 128, 128),
        stem_type="fixed",
        conv_layer=partial(StdConv2d, eps=1e-8),
        **kwargs,
    )


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().float().numpy().copy()


def _hwio(w: torch.Tensor) -> np.ndarray:
    return _np(w).transpose(2, 3, 1, 0)  # OIHW -> HWIO


def vit_arrays(model, layout: str = "vit_jax", pre_logits: tuple[np.ndarray, np.ndarray] | None = None):
    """{key: array} of a timm VisionTransformer (or hybrid) in the vit_jax layout, big_vision's
    (`params/` prefix, top-level `pos_embedding`, `_0` sub-modules), or big_vision's scan layout
    (the same names, layers stacked on axis 0 under `Transformer/encoderblock/`)."""
    sd = model.state_dict()
    dim, heads = model.embed_dim, model.blocks[0].attn.num_heads
    big_vision = layout in ("big_vision", "scan")
    mha, mlp, ln2 = (
        ("MultiHeadDotProductAttention_0", "MlpBlock_0", "LayerNorm_1")
        if big_vision
        else ("MultiHeadDotProductAttention_1", "MlpBlock_3", "LayerNorm_2")
    )
    out = {
        "embedding/kernel": _hwio(sd["patch_embed.proj.weight"]),
        "embedding/bias": _np(sd["patch_embed.proj.bias"]),
        "cls": _np(sd["cls_token"]),
        ("pos_embedding" if big_vision else "Transformer/posembed_input/pos_embedding"): _np(sd["pos_embed"]),
        "Transformer/encoder_norm/scale": _np(sd["norm.weight"]),
        "Transformer/encoder_norm/bias": _np(sd["norm.bias"]),
    }
    if "head.weight" in sd:
        out["head/kernel"], out["head/bias"] = _np(sd["head.weight"]).T, _np(sd["head.bias"])
    if pre_logits is not None:
        out["pre_logits/kernel"], out["pre_logits/bias"] = pre_logits
    blocks = []
    for i in range(len(model.blocks)):
        p = f"blocks.{i}."
        q, k, v = _np(sd[p + "attn.qkv.weight"]).reshape(3, dim, dim)
        qb, kb, vb = _np(sd[p + "attn.qkv.bias"]).reshape(3, heads, dim // heads)
        block = {
            "LayerNorm_0/scale": _np(sd[p + "norm1.weight"]),
            "LayerNorm_0/bias": _np(sd[p + "norm1.bias"]),
            f"{ln2}/scale": _np(sd[p + "norm2.weight"]),
            f"{ln2}/bias": _np(sd[p + "norm2.bias"]),
            f"{mha}/out/kernel": _np(sd[p + "attn.proj.weight"]).reshape(dim, heads, dim // heads).transpose(1, 2, 0),
            f"{mha}/out/bias": _np(sd[p + "attn.proj.bias"]),
            f"{mlp}/Dense_0/kernel": _np(sd[p + "mlp.fc1.weight"]).T,
            f"{mlp}/Dense_0/bias": _np(sd[p + "mlp.fc1.bias"]),
            f"{mlp}/Dense_1/kernel": _np(sd[p + "mlp.fc2.weight"]).T,
            f"{mlp}/Dense_1/bias": _np(sd[p + "mlp.fc2.bias"]),
        }
        for name, w, b in (("query", q, qb), ("key", k, kb), ("value", v, vb)):
            block[f"{mha}/{name}/kernel"] = w.T.reshape(dim, heads, dim // heads)  # (D, H, D/H)
            block[f"{mha}/{name}/bias"] = b
        blocks.append(block)
    if layout == "scan":  # one array per parameter, layers stacked on axis 0
        out.update({f"Transformer/encoderblock/{k}": np.stack([b[k] for b in blocks]) for k in blocks[0]})
    else:
        for i, block in enumerate(blocks):
            out.update({f"Transformer/encoderblock_{i}/{k}": v for k, v in block.items()})
    if hasattr(model.patch_embed, "backbone"):
        out.update(_hybrid_stem_arrays(model.patch_embed.backbone))
    prefix = "params/" if layout == "big_vision" else ""
    return {prefix + k: v for k, v in out.items()}


def _hybrid_stem_arrays(backbone) -> dict[str, np.ndarray]:
    out = {
        "conv_root/kernel": _hwio(backbone.stem.conv.weight),
        "gn_root/scale": _np(backbone.stem.norm.weight),
        "gn_root/bias": _np(backbone.stem.norm.bias),
    }
    for i, stage in enumerate(backbone.stages):
        for j, block in enumerate(stage.blocks):
            p = f"block{i + 1}/unit{j + 1}/"
            for r in (1, 2, 3):
                out[f"{p}conv{r}/kernel"] = _hwio(getattr(block, f"conv{r}").weight)
                out[f"{p}gn{r}/scale"] = _np(getattr(block, f"norm{r}").weight)
                out[f"{p}gn{r}/bias"] = _np(getattr(block, f"norm{r}").bias)
            if block.downsample is not None:
                out[f"{p}conv_proj/kernel"] = _hwio(block.downsample.conv.weight)
                out[f"{p}gn_proj/scale"] = _np(block.downsample.norm.weight)
                out[f"{p}gn_proj/bias"] = _np(block.downsample.norm.bias)
    return out


def bit_arrays(model) -> dict[str, np.ndarray]:
    """{key: array} of a timm ResNetV2 in BiT's `resnet/` layout."""
    p = "resnet/"
    out = {
        f"{p}root_block/standardized_conv2d/kernel": _hwio(model.stem.conv.weight),
        f"{p}group_norm/gamma": _np(model.norm.weight),
        f"{p}group_norm/beta": _np(model.norm.bias),
    }
    if getattr(model.head, "fc", None) is not None and hasattr(model.head.fc, "weight"):
        out[f"{p}head/conv2d/kernel"] = _hwio(model.head.fc.weight)
        out[f"{p}head/conv2d/bias"] = _np(model.head.fc.bias)
    for i, stage in enumerate(model.stages):
        for j, block in enumerate(stage.blocks):
            u = f"{p}block{i + 1}/unit{j + 1:02d}/"
            for letter, r in (("a", 1), ("b", 2), ("c", 3)):
                out[f"{u}{letter}/standardized_conv2d/kernel"] = _hwio(getattr(block, f"conv{r}").weight)
                out[f"{u}{letter}/group_norm/gamma"] = _np(getattr(block, f"norm{r}").weight)
                out[f"{u}{letter}/group_norm/beta"] = _np(getattr(block, f"norm{r}").bias)
            if block.downsample is not None:
                out[f"{u}a/proj/standardized_conv2d/kernel"] = _hwio(block.downsample.conv.weight)
    return out


def randomize(model, seed: int = 0):
    """Non-trivial values everywhere (timm zero-inits some tensors, which would hide a missed copy)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for t in model.state_dict().values():
            if t.is_floating_point():
                t.copy_(torch.randn(t.shape, generator=gen) * 0.05)
    return model.eval()

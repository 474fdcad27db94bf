"""ViT (Dosovitskiy et al. 2021) and DeiT (Touvron et al. 2021): timm's VisionTransformer.

Few-shot representation: LN(CLS), the class token after the final LayerNorm, or, when the
upstream checkpoint carries a representation layer, tanh(Dense(LN(CLS))) as in the paper (§3.1,
vit_jax `pre_logits`).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from vitbench import plugin
from vitbench.plugin import BIG_VISION_FEWSHOT, Backend, ModelSpec, Preprocessing, UserError

if TYPE_CHECKING:  # torch loads where a model is built: listing models and reading results never pay for it
    import torch
    from torch import nn


class ViTBackend(Backend):
    family = "vit"
    representation = "LN(CLS)"
    position_variants = True
    patch_prediction = True
    pre_logits_head = True
    in21k_without_pre_logits = True
    npz_has_conv_root = False  # vit_jax's hybrid layout adds a ResNet root (conv_root/kernel)

    def fits_npz(self, spec, model, shapes) -> bool:
        """vit_jax's layout: width, depth and patch size (a hybrid's patch is its stem's downsampling)."""
        if "embedding/kernel" not in shapes or ("conv_root/kernel" in shapes) != self.npz_has_conv_root:
            return False
        kernel = shapes["embedding/kernel"]
        depth = max(
            shapes.get("Transformer/encoderblock/LayerNorm_0/scale", (0,))[0],
            len({k.split("/")[1] for k in shapes if k.startswith("Transformer/encoderblock_")}),
        )
        return (
            model.embed_dim == kernel[-1]
            and len(model.blocks) == depth
            and (self.npz_has_conv_root or model.patch_embed.patch_size[0] == kernel[0])
        )

    def timm_kwargs(self, img_size: int, gelu: str = "exact") -> dict:

        if gelu not in ("exact", "tanh"):
            raise UserError(f"--gelu {gelu}: expected exact (PyTorch's erf GELU) or tanh (Flax's approximate GELU)")
        return {"img_size": img_size, **({"act_layer": "gelu_tanh"} if gelu == "tanh" else {})}

    def representation_name(self, pre_logits: bool) -> str:
        return "tanh(Dense(LN(CLS)))" if pre_logits else self.representation

    def dropout_kwargs(self, rate: float) -> dict:
        # vit_jax drops after the position embeddings, after attention and in the MLP (twice):
        # timm's pos_drop and proj_drop sit at the same places; attention dropout stays 0 in both
        return {"pos_drop_rate": rate, "proj_drop_rate": rate}

    def add_pre_logits(self, model: nn.Module, spec: ModelSpec, shape: torch.Size) -> None:
        """The upstream representation layer (Dense D->D, then tanh), which timm drops on load."""
        from torch import nn

        model.pre_logits = nn.Linear(shape[1], shape[0])  # type: ignore[assignment]  # keys pre_logits.{weight,bias}

    def features(self, model: nn.Module, images: torch.Tensor) -> torch.Tensor:
        import torch

        cls = super().features(model, images)  # (B, D): LN(CLS)
        dense = getattr(model, "pre_logits", None)
        return torch.tanh(dense(cls)) if dense is not None else cls

    def adapt_state_dict(self, state: dict[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
        """Resize the position embeddings to the model's grid, class token kept (paper §3.2); weights
        pre-trained with relative positions (Table 8's variant, or vitbench's relative bias) get them installed."""
        variant = plugin.relative_variant(state)  # loaded on first use: it imports torch
        if variant is not None and plugin.relative_variant(model.state_dict()) is None:
            plugin.install_relative(model, variant)
        posemb = state.get("pos_embed")
        target = getattr(model, "pos_embed", None)
        if posemb is None or target is None or posemb.shape == target.shape:
            return state
        prefix = 0 if getattr(model, "no_embed_class", False) else int(model.num_prefix_tokens)  # type: ignore[arg-type]
        grid = tuple(model.patch_embed.grid_size)  # type: ignore[union-attr]
        return {**state, "pos_embed": zoom_posemb(posemb, prefix, grid)}


def zoom_posemb(posemb: torch.Tensor, num_prefix: int, grid: tuple[int, int]) -> torch.Tensor:
    """vit_jax's `interpolate_posembed`: split off the class token, `scipy.ndimage.zoom(order=1)`
    on the (gs, gs, D) grid, concatenate again. (timm's bilinear resize differs slightly.)"""
    import numpy as np
    import scipy.ndimage
    import torch

    prefix, tokens = posemb[:, :num_prefix], posemb[0, num_prefix:]
    old = math.isqrt(tokens.shape[0])
    if old * old != tokens.shape[0]:
        raise ValueError(f"position embeddings of {tokens.shape[0]} tokens are not a square grid")
    old_grid = tokens.reshape(old, old, -1).double().numpy()
    zoomed = scipy.ndimage.zoom(old_grid, (grid[0] / old, grid[1] / old, 1), order=1)
    return torch.cat(
        [prefix, torch.from_numpy(np.ascontiguousarray(zoomed)).to(posemb.dtype).reshape(1, -1, posemb.shape[-1])], 1
    )


BACKEND = ViTBackend()
# DeiT weights expect timm's DeiT preprocessing: bicubic resize to 248, centre crop 224, ImageNet mean/std.
# Written out (timm's pretrained config for deit_*_patch16_224, which tests/test_backends.py compares with
# Preprocessing.from_timm) so that listing models does not import timm.
_DEIT = Preprocessing(
    crop_pct=0.9,
    crop_mode="center",
    interpolation="bicubic",
    mean=(0.485, 0.456, 0.406),
    std=(0.229, 0.224, 0.225),
    family="timm",
)


def _vit(
    name: str,
    arch: str,
    patch: int,
    summary: str,
    preprocessing: Preprocessing = BIG_VISION_FEWSHOT,
    paper_tag: str | None = None,
    dropout: float = 0.0,
):
    return ModelSpec(
        name, arch, BACKEND, preprocessing, summary, input_multiple=patch, paper_tag=paper_tag, dropout=dropout
    )


MODELS = [
    _vit("vit-ti/16", "vit_tiny_patch16_224", 16, "ViT-Tiny, patch 16 (D=192, 12 layers, 3 heads)"),
    _vit("vit-s/16", "vit_small_patch16_224", 16, "ViT-Small, patch 16 (D=384, 12 layers, 6 heads)"),
    _vit(
        "vit-b/16",
        "vit_base_patch16_224",
        16,
        "ViT-Base, patch 16 (Table 1: 86M)",
        paper_tag="vit_base_patch16_224.orig_in21k",
    ),
    _vit("vit-b/32", "vit_base_patch32_224", 32, "ViT-Base, patch 32", paper_tag="vit_base_patch32_224.orig_in21k"),
    _vit(
        "vit-l/16",
        "vit_large_patch16_224",
        16,
        "ViT-Large, patch 16 (Table 1: 307M)",
        paper_tag="vit_large_patch16_224.orig_in21k",
        dropout=0.1,
    ),
    _vit("vit-l/32", "vit_large_patch32_224", 32, "ViT-Large, patch 32", paper_tag="vit_large_patch32_224.orig_in21k"),
    _vit(
        "vit-h/14",
        "vit_huge_patch14_224",
        14,
        "ViT-Huge, patch 14 (Table 1: 632M)",
        paper_tag="vit_huge_patch14_224.orig_in21k",
        dropout=0.1,
    ),
    _vit("deit-ti/16", "deit_tiny_patch16_224", 16, "DeiT-Tiny: ViT-Ti/16 trained on ImageNet-1k", _DEIT),
    _vit("deit-s/16", "deit_small_patch16_224", 16, "DeiT-Small: ViT-S/16 trained on ImageNet-1k", _DEIT),
    _vit("deit-b/16", "deit_base_patch16_224", 16, "DeiT-Base: ViT-B/16 trained on ImageNet-1k", _DEIT),
]

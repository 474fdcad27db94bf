"""ViT (Dosovitskiy et al. 2021) and DeiT (Touvron et al. 2021): timm's VisionTransformer.

Few-shot representation: LN(CLS), the class token after the final LayerNorm (paper §3.1; the
upstream `pre_logits` Dense+tanh layer is only present in Google .npz files).
"""

from __future__ import annotations

import torch
from timm.layers import resample_abs_pos_embed
from torch import nn

from vitbench.backend import BIG_VISION_FEWSHOT, Backend, ModelSpec, Preprocessing


class ViTBackend(Backend):
    family = "vit"
    representation = "LN(CLS)"

    def timm_kwargs(self, img_size: int) -> dict:
        return {"img_size": img_size}

    def adapt_state_dict(self, state: dict[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
        """Resize the position embeddings to the model's grid, class token kept (paper §3.2).

        Bilinear on the 2-D patch grid without antialiasing, as timm does for the original
        Google checkpoints (its generic default is bicubic + antialias, which differs).
        """
        posemb = state.get("pos_embed")
        target = getattr(model, "pos_embed", None)
        if posemb is None or target is None or posemb.shape == target.shape:
            return state
        grid = model.patch_embed.grid_size  # type: ignore[union-attr]
        prefix = 0 if getattr(model, "no_embed_class", False) else int(model.num_prefix_tokens)  # type: ignore[arg-type]
        resized = resample_abs_pos_embed(
            posemb, new_size=list(grid), num_prefix_tokens=prefix, interpolation="bilinear", antialias=False
        )
        return {**state, "pos_embed": resized}


BACKEND = ViTBackend()
# DeiT weights expect timm's DeiT preprocessing: bicubic resize to 248, centre crop 224, ImageNet mean/std.
_DEIT = Preprocessing.from_timm("deit_tiny_patch16_224")


def _vit(name: str, arch: str, patch: int, summary: str, preprocessing: Preprocessing = BIG_VISION_FEWSHOT):
    return ModelSpec(name, arch, BACKEND, preprocessing, summary, input_multiple=patch)


MODELS = [
    _vit("vit-ti/16", "vit_tiny_patch16_224", 16, "ViT-Tiny, patch 16 (D=192, 12 layers, 3 heads)"),
    _vit("vit-s/16", "vit_small_patch16_224", 16, "ViT-Small, patch 16 (D=384, 12 layers, 6 heads)"),
    _vit("vit-b/16", "vit_base_patch16_224", 16, "ViT-Base, patch 16 (Table 1: 86M)"),
    _vit("vit-b/32", "vit_base_patch32_224", 32, "ViT-Base, patch 32"),
    _vit("vit-l/16", "vit_large_patch16_224", 16, "ViT-Large, patch 16 (Table 1: 307M)"),
    _vit("vit-l/32", "vit_large_patch32_224", 32, "ViT-Large, patch 32"),
    _vit("vit-h/14", "vit_huge_patch14_224", 14, "ViT-Huge, patch 14 (Table 1: 632M)"),
    _vit("deit-ti/16", "deit_tiny_patch16_224", 16, "DeiT-Tiny: ViT-Ti/16 trained on ImageNet-1k", _DEIT),
    _vit("deit-s/16", "deit_small_patch16_224", 16, "DeiT-Small: ViT-S/16 trained on ImageNet-1k", _DEIT),
    _vit("deit-b/16", "deit_base_patch16_224", 16, "DeiT-Base: ViT-B/16 trained on ImageNet-1k", _DEIT),
]

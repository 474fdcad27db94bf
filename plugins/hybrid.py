"""R50+ViT hybrids (paper §3.1 "Hybrid Architecture"): a ResNet-50 stem feeding a ViT.

In the paper's names "/16" and "/32" are the ResNet's total downsampling (§4.4), so image sizes
must be multiples of it. timm's ViTHybrid is a VisionTransformer, so position-embedding
resizing and the LN(CLS) representation are the ViT backend's.
"""

from vitbench_plugins.vit import ViTBackend

from vitbench.plugin import ModelSpec


class HybridBackend(ViTBackend):
    family = "hybrid"
    channels_last = True  # the ResNet stem
    position_variants = False  # Table 8 is of plain ViTs
    in21k_without_pre_logits = False
    npz_has_conv_root = True


BACKEND = HybridBackend()

MODELS = [
    ModelSpec(
        "r50+vit-b/16",
        "vit_base_r50_s16_224",
        BACKEND,
        summary="ResNet-50 (3 stages) + ViT-Base",
        input_multiple=16,
        dropout=0.1,
    ),
    ModelSpec(
        "r50+vit-l/32", "vit_large_r50_s32_224", BACKEND, summary="ResNet-50 (4 stages) + ViT-Large", input_multiple=32
    ),
]

"""What a pre-training run optimises: the paper's supervised objective (§3.1: the class token
through a one-hidden-layer `pre_logits` head, tanh(Dense(LN(CLS))), then the classifier) and
self-supervised masked patch prediction (§4.6, App. B.1.2).

Each is an nn.Module around the backbone whose forward takes normalised images; the classifier's
loss is the loop's default cross-entropy, and MPP's `loss` turns its outputs into the loss summed
over the batch: the training loop
(engine/training.py) runs either the same way, with accumulation, DDP, checkpoints and clocks.
`backbone` is the timm model that is saved as the run's weights.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from vitbench.errors import UserError

MPP_TARGETS = ("mean-colour", "downsized-4x4", "l2")  # §4.6: the reported target first, then the alternatives
COLOUR_BITS = 3  # each of R, G, B quantised to 3 bits: 512 classes
MASK, RANDOM_PATCH = 0.8, 0.1  # of the corrupted patches: 80 % [mask], 10 % another patch, 10 % unchanged


class Classifier(nn.Module):
    """The supervised pre-training model: for a ViT with a `pre_logits` layer, its representation
    tanh(Dense(LN(CLS))), then its classifier; for any other backbone, timm's own forward."""

    def __init__(self, backbone: nn.Module, features):
        super().__init__()
        self.backbone = backbone
        self._features = features  # Backend.features: (model, images) -> (B, D)
        self.num_classes = int(getattr(backbone, "num_classes", 0))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        model: Any = self.backbone
        if not isinstance(getattr(model, "pre_logits", None), nn.Linear):  # no representation layer: timm's forward
            return model(images)  # (B, classes); a BiT ResNet's head is a 1x1 convolution on the feature map
        return model.get_classifier()(self._features(model, images))  # (B, classes)

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        self.backbone.set_grad_checkpointing(enable)  # type: ignore[operator]


def patches(images: torch.Tensor, patch: int) -> torch.Tensor:
    """(B, 3, H, W) -> (B, N, patch, patch, 3), patches in the row-major order of the token grid."""
    b, c, h, w = images.shape
    grid = images.reshape(b, c, h // patch, patch, w // patch, patch)
    return grid.permute(0, 2, 4, 3, 5, 1).reshape(b, (h // patch) * (w // patch), patch, patch, c)


def colour_classes(pixels: torch.Tensor) -> torch.Tensor:
    """Colours in [0, 1] (..., 3) -> their 3-bit class: r * 64 + g * 8 + b, each channel floor(v * 8) in 0..7."""
    levels = 2**COLOUR_BITS
    q = (pixels.clamp(0, 1) * levels).floor().clamp(max=levels - 1).long()
    return (q[..., 0] * levels + q[..., 1]) * levels + q[..., 2]


def mpp_targets(raw: torch.Tensor, patch: int, target: str) -> torch.Tensor:
    """Per patch of images in [0, 1] (B, 3, H, W): its mean colour's class (B, N); the classes of
    its 4x4 downsized version (B, N, 16); or, for `l2`, its pixels (B, N, patch * patch * 3)."""
    p = patches(raw, patch)  # (B, N, P, P, 3)
    if target == "mean-colour":
        return colour_classes(p.mean(dim=(2, 3)))
    if target == "downsized-4x4":
        b, n = p.shape[:2]
        small = F.adaptive_avg_pool2d(p.reshape(b * n, patch, patch, 3).permute(0, 3, 1, 2), 4)  # (BN, 3, 4, 4)
        return colour_classes(small.permute(0, 2, 3, 1)).reshape(b, n, 16)
    return p.reshape(*p.shape[:2], -1)


def corruption(batch: int, tokens: int, rate: float, generator: torch.Generator | None, device) -> tuple:
    """Which patches to corrupt and how: round(rate * N) positions per image (B, K), and per position
    0 ([mask]), 1 (another patch's embedding) or 2 (unchanged) with probabilities 0.8, 0.1, 0.1."""
    count = max(1, round(rate * tokens))
    order = torch.rand(batch, tokens, generator=generator, device=device).argsort(dim=1)
    chosen = order[:, :count]  # (B, K)
    draw = torch.rand(batch, count, generator=generator, device=device)
    kind = (draw >= MASK).long() + (draw >= MASK + RANDOM_PATCH).long()
    return chosen, kind


def corrupt(
    tokens: torch.Tensor, mask_token: torch.Tensor, rate: float, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """§4.6's corruption of patch embeddings (B, N, D): the corrupted copy, and which positions (B, K)
    were chosen. Of those, 80 % become the learnable [mask] embedding, 10 % the embedding of a random
    patch of the batch, 10 % stay as they are."""
    b, n, d = tokens.shape
    chosen, kind = corruption(b, n, rate, generator, tokens.device)
    rows = torch.arange(b, device=tokens.device)[:, None]
    picked = tokens[rows, chosen]  # (B, K, D)
    flat = tokens.reshape(-1, d)
    other = flat[torch.randint(flat.shape[0], kind.shape, generator=generator, device=tokens.device)]
    mask = mask_token.to(picked.dtype).expand_as(picked)
    replaced = torch.where((kind == 0)[..., None], mask, torch.where((kind == 1)[..., None], other, picked))
    return tokens.index_put((rows.expand_as(chosen), chosen), replaced), chosen


class MaskedPatchPrediction(nn.Module):
    """§4.6: corrupt `rate` of the patch embeddings, predict each corrupted patch's target from its
    output token. The values of `mean`/`std` undo the input normalisation for the targets."""

    def __init__(self, backbone: nn.Module, target: str, rate: float, mean, std, seed: int | None = None):
        super().__init__()
        if not hasattr(backbone, "patch_embed") or not hasattr(backbone, "blocks"):
            raise UserError("--objective mpp: masked patch prediction needs a ViT (or hybrid) backbone")
        if target not in MPP_TARGETS:
            raise UserError(f"--mpp-target {target}: expected one of {', '.join(MPP_TARGETS)}")
        if not 0 < rate < 1:
            raise UserError(f"--mpp-rate {rate}: expected a fraction between 0 and 1")
        self.backbone, self.target, self.rate = backbone, target, rate
        dim = int(backbone.embed_dim)  # type: ignore[arg-type]
        self.mask_token = nn.Parameter(torch.zeros(1, 1, dim))
        nn.init.normal_(self.mask_token, std=0.02)
        embed: Any = backbone.patch_embed
        # pixels per token side: the patch size of a ViT, 16 for a hybrid's ResNet stem
        self.patch = int(embed.img_size[0]) // int(embed.grid_size[0])
        outputs = {"mean-colour": 512, "downsized-4x4": 16 * 512}.get(target, self.patch * self.patch * 3)
        self.head = nn.Linear(dim, outputs)
        self.mean: torch.Tensor
        self.std: torch.Tensor
        self.register_buffer("mean", torch.tensor(mean).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(std).view(1, 3, 1, 1), persistent=False)
        self.generator_seed = seed  # a fixed corruption (validation), else torch's global RNG

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        self.backbone.set_grad_checkpointing(enable)  # type: ignore[operator]

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(predictions at the corrupted positions (B, K, ...), their targets (B, K, ...))."""
        vit: Any = self.backbone
        b = images.shape[0]
        raw = images.float() * self.std + self.mean  # back to [0, 1]
        targets = mpp_targets(raw, self.patch, self.target)  # (B, N, ...)
        tokens = vit.patch_embed(images)  # (B, N, D)
        generator = None
        if self.generator_seed is not None:
            generator = torch.Generator(images.device).manual_seed(self.generator_seed)
        tokens, chosen = corrupt(tokens, self.mask_token, self.rate, generator)
        rows = torch.arange(b, device=images.device)[:, None]
        # the rest of timm's VisionTransformer.forward_features, after patch_embed
        x = vit.norm(vit.blocks(vit.norm_pre(vit.patch_drop(vit._pos_embed(tokens)))))
        out = x[:, vit.num_prefix_tokens :][rows, chosen]  # (B, K, D): the corrupted patches' output tokens
        prediction = self.head(out)
        if self.target == "downsized-4x4":
            prediction = prediction.reshape(*prediction.shape[:2], 16, 512)
        return prediction, targets[rows, chosen]

    def loss(self):
        def summed(outputs: tuple[torch.Tensor, torch.Tensor], _labels: torch.Tensor) -> torch.Tensor:
            """Per image the mean over its corrupted patches (and sub-patches), summed over images."""
            prediction, target = outputs
            if self.target == "l2":
                per_image = (prediction.float() - target).pow(2).mean(dim=(1, 2))
            else:
                per_patch = F.cross_entropy(prediction.float().flatten(0, -2), target.flatten(), reduction="none")
                per_image = per_patch.reshape(prediction.shape[0], -1).mean(dim=1)
            return per_image.sum()

        return summed

    @staticmethod
    def accuracy(outputs: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """Per image (B,): the fraction of corrupted patches whose target class is predicted (for l2,
        minus the mean squared error, so that higher is better here too)."""
        prediction, target = outputs
        if prediction.shape == target.shape:  # l2
            return -(prediction.float() - target).pow(2).mean(dim=(1, 2))
        return (prediction.argmax(-1) == target).float().reshape(prediction.shape[0], -1).mean(dim=1)

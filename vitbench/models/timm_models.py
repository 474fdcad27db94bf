"""`--model timm:<architecture>`: any architecture timm can build, without writing a plugin.

The representation is timm's own pre-logits features (`forward_features`, then
`forward_head(pre_logits=True)`: the Backend default); normalisation comes from the architecture's
pretrained config, the geometry from the protocol (vitbench/models/preprocessing.py); the head is reset
to zeros for fine-tuning (Backend.create); FLOPs are counted on the meta device as for every model.
Weights: a file, `timm:<architecture>.<tag>` from the local Hugging Face cache, or `random`.
"""

from __future__ import annotations

import difflib
from functools import cache
from typing import TYPE_CHECKING, Any

from vitbench.errors import UserError
from vitbench.models.backend import Backend, ModelSpec, Preprocessing

if TYPE_CHECKING:  # timm and torch load when a timm: model is named, not when vitbench starts
    import torch
    from torch import nn

PREFIX = "timm:"


class TimmBackend(Backend):
    """One timm architecture: the image size is passed where the architecture takes one (ViT-style
    models with a fixed position grid); CNNs take any size."""

    family = "timm"
    representation = "timm pre-logits"

    def __init__(self, arch: str):
        self.arch = arch

    def timm_kwargs(self, img_size: int, gelu: str = "exact") -> dict:
        super().timm_kwargs(img_size, gelu)  # only the exact GELU: an arbitrary architecture has no switch
        return {"img_size": img_size} if _takes_img_size(self.arch) else {}

    def adapt_state_dict(self, state: dict[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
        """A checkpoint's absolute position embeddings resampled to the model's grid (timm's own resampler)."""
        from timm.layers import resample_abs_pos_embed

        posemb, target = state.get("pos_embed"), getattr(model, "pos_embed", None)
        if posemb is None or target is None or posemb.shape == target.shape:
            return state
        m: Any = model
        prefix = 0 if getattr(m, "no_embed_class", False) else int(getattr(m, "num_prefix_tokens", 1))
        grid = list(m.patch_embed.grid_size)
        return {**state, "pos_embed": resample_abs_pos_embed(posemb, grid, num_prefix_tokens=prefix)}


@cache
def _takes_img_size(arch: str) -> bool:
    import timm
    import torch

    try:
        with torch.device("meta"):
            timm.create_model(arch, pretrained=False, num_classes=0, img_size=64)
    except TypeError:
        return False
    return True


@cache
def timm_spec(name: str) -> ModelSpec:
    """The ModelSpec of `timm:<architecture>`, or a one-line error naming the closest architectures."""
    import timm
    import torch

    arch = name.removeprefix(PREFIX)
    if arch not in timm.list_models():
        close = difflib.get_close_matches(arch, timm.list_models(), n=3, cutoff=0.6)
        hint = (
            f"; did you mean {', '.join(PREFIX + c for c in close)}?" if close else " (timm.list_models() lists them)"
        )
        raise UserError(f"--model {name}: timm has no architecture '{arch}'{hint}")
    with torch.device("meta"):
        model: Any = timm.create_model(arch, pretrained=False, num_classes=0)
    patch = getattr(getattr(model, "patch_embed", None), "patch_size", None)
    multiple = int(patch[0]) if isinstance(patch, tuple | list) else int(patch or 1)
    return ModelSpec(
        name,
        arch,
        TimmBackend(arch),
        Preprocessing.from_timm(arch),
        summary=f"timm's {arch} (any timm architecture: --model timm:<architecture>)",
        input_multiple=multiple,
    )

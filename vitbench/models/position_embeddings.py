"""The position-embedding variants of the paper's ablation (App. D.4, Table 8), for a ViT trained
from random init: none, 1-D learnable (the default), 2-D learnable, relative; and vitbench's own
relative-bias variant.

Each is written so that the saved weights are a plain timm ViT's, which every other protocol
reads: "none" is a zero `pos_embed` that is never trained; "2-d" learns X and Y embeddings of
D/2 each, concatenated per grid position, through a parametrization of `pos_embed` that is folded
back into a plain tensor before saving (`materialize`).

"relative" is App. D.4's: "1-dimensional Relative Attention": each offset p_q - p_k between two
patches (in raster order) has an embedding, and "an extra attention" uses "the original query ...
but relative positional embeddings as keys"; its logits are "a bias term" added to the content
logits before the softmax. Here: one table of 2·HW - 1 embeddings of the head width per layer,
shared by the heads (as Shaw et al. 2018's relative keys), the query-embedding products scaled by
1/sqrt(head width) with the content logits; the class token gets no relative position. Its
weights keep the table (`blocks.N.attn.relative_key`).

"relative-bias" (vitbench's own, not the paper's; vitbench's "relative" before issue 35) adds a
learned scalar per head and 2-D (dy, dx) offset to the logits instead (`blocks.N.attn.relative_bias`).

`install_relative` rebuilds either where such weights are loaded.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrize

from vitbench.errors import UserError

# Table 8's rows (1-D learnable is the paper's default), then vitbench's own variant
POS_EMBED = ("1-d", "none", "2-d", "relative", "relative-bias")
RELATIVE_KEYS = {"relative": "attn.relative_key", "relative-bias": "attn.relative_bias"}


class TwoD(nn.Module):
    """`pos_embed` as [X embedding (D/2) ; Y embedding (D/2)] at each grid position (App. D.4);
    the class token's own embedding is a free vector."""

    def __init__(self, grid: tuple[int, int], dim: int, prefix: int):
        super().__init__()
        self.grid, self.prefix = grid, prefix
        self.rows = nn.Parameter(torch.randn(grid[0], dim // 2) * 0.02)
        self.cols = nn.Parameter(torch.randn(grid[1], dim - dim // 2) * 0.02)
        self.tokens = nn.Parameter(torch.randn(prefix, dim) * 0.02)

    def forward(self, _original: torch.Tensor) -> torch.Tensor:
        h, w = self.grid
        y = self.rows[:, None, :].expand(h, w, -1)
        x = self.cols[None, :, :].expand(h, w, -1)
        return torch.cat([self.tokens, torch.cat([x, y], dim=-1).reshape(h * w, -1)])[None]  # (1, prefix + HW, D)


def _relative_index(grid: tuple[int, int]) -> torch.Tensor:
    """(HW, HW): for each pair of grid positions, the row of their (dy, dx) offset in the bias table."""
    h, w = grid
    ys, xs = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    coords = torch.stack([ys.flatten(), xs.flatten()])  # (2, HW)
    offset = coords[:, :, None] - coords[:, None, :]  # (2, HW, HW)
    return (offset[0] + h - 1) * (2 * w - 1) + (offset[1] + w - 1)


def _offset_index(n: int) -> torch.Tensor:
    """(n, n): for each (query, key) patch pair, the row of their 1-D offset p_q - p_k in the table."""
    positions = torch.arange(n)
    return positions[:, None] - positions[None, :] + n - 1


def _with_relative_attention(attn: Any, prefix: int):
    """timm's Attention.forward (the same projections, norms and SDPA), with App. D.4's relative
    logits q · r(p_q - p_k) added to the content logits through SDPA's additive mask."""

    def forward(x: torch.Tensor, attn_mask: torch.Tensor | None = None, is_causal: bool = False) -> torch.Tensor:
        b, n, _ = x.shape
        gate = attn.gate(x).sigmoid() if getattr(attn, "gate", None) is not None else None
        q, k, v = attn.qkv(x).reshape(b, n, 3, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        q, k = attn.q_norm(q), attn.k_norm(k)
        keys = attn.relative_key[attn.relative_index].to(q.dtype)  # (HW, HW, head width)
        relative = torch.einsum("bhqd,qkd->bhqk", q[:, :, prefix:], keys) * attn.scale
        bias = F.pad(relative, (prefix, 0, prefix, 0))  # (B, heads, N, N): none for the class token
        if attn_mask is not None:
            bias = bias + attn_mask
        dropout = attn.attn_drop.p if attn.training else 0.0
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout, is_causal=is_causal)
        out = attn.norm(out.transpose(1, 2).reshape(b, n, -1))
        return attn.proj_drop(attn.proj(out * gate if gate is not None else out))

    return forward


def _with_relative_bias(attn: Any, prefix: int):
    """timm's Attention.forward with the bias table added to the logits through its `attn_mask`
    (an additive mask); the class token gets no relative position (zero bias)."""
    original = attn.forward

    def forward(x: torch.Tensor, attn_mask: torch.Tensor | None = None, is_causal: bool = False) -> torch.Tensor:
        table = attn.relative_bias[:, attn.relative_index]  # (heads, HW, HW)
        bias = F.pad(table, (prefix, 0, prefix, 0)).to(x.dtype)  # (heads, N, N)
        return original(x, attn_mask=bias if attn_mask is None else bias + attn_mask, is_causal=is_causal)

    return forward


def apply(model: nn.Module, variant: str) -> None:
    """Give a freshly built timm ViT the position embeddings of `variant` (in place)."""
    if variant not in POS_EMBED:
        raise UserError(f"--pos-embed {variant}: expected one of {', '.join(POS_EMBED)}")
    vit: Any = model
    if variant == "1-d":
        return
    if not hasattr(vit, "pos_embed") or vit.pos_embed is None:
        raise UserError(f"--pos-embed {variant}: a ViT backbone's option (this model has no position embeddings)")
    if variant == "none":
        with torch.no_grad():
            vit.pos_embed.zero_()
        vit.pos_embed.requires_grad_(False)
    elif variant == "2-d":
        grid = tuple(vit.patch_embed.grid_size)
        parametrize.register_parametrization(vit, "pos_embed", TwoD(grid, vit.embed_dim, _prefix(vit)), unsafe=True)
        # TwoD builds pos_embed from its rows and columns alone: the tensor the parametrization keeps
        # as `original` is never read, so it must not train (under DDP it would wait for a gradient)
        vit.parametrizations.pos_embed.original.requires_grad_(False)
    else:
        install_relative(vit, variant)
        with torch.no_grad():  # relative positions replace the absolute ones
            vit.pos_embed.zero_()
        vit.pos_embed.requires_grad_(False)


def install_relative(model: nn.Module, variant: str) -> None:
    """Give every block's attention the relative positions of `variant` (zero until loaded or trained)."""
    vit: Any = model
    h, w = (int(n) for n in vit.patch_embed.grid_size)
    for block in vit.blocks:
        attn = block.attn
        if variant == "relative":
            attn.relative_key = nn.Parameter(torch.zeros(2 * h * w - 1, attn.head_dim))
            attn.register_buffer("relative_index", _offset_index(h * w), persistent=False)
            attn.forward = _with_relative_attention(attn, _prefix(vit))
        else:
            attn.relative_bias = nn.Parameter(torch.zeros(attn.num_heads, (2 * h - 1) * (2 * w - 1)))
            attn.register_buffer("relative_index", _relative_index((h, w)), persistent=False)
            attn.forward = _with_relative_bias(attn, _prefix(vit))


def materialize(model: nn.Module) -> None:
    """Fold a 2-D parametrization back into a plain `pos_embed` tensor (before saving the weights)."""
    if parametrize.is_parametrized(model, "pos_embed"):
        parametrize.remove_parametrizations(model, "pos_embed", leave_parametrized=True)


def relative_variant(state: dict[str, torch.Tensor]) -> str | None:
    """The relative variant whose tables `state` holds, if any."""
    return next((v for v, key in RELATIVE_KEYS.items() if any(k.endswith(key) for k in state)), None)


def _prefix(vit: Any) -> int:
    return 0 if getattr(vit, "no_embed_class", False) else int(vit.num_prefix_tokens)

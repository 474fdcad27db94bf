"""Looking inside a ViT (paper §4.5, Figures 6 and 7), from the same weights vitbench benchmarks.

- principal components of the patch-embedding filters (Fig. 7 left),
- cosine similarity between position embeddings (Fig. 7 centre),
- mean attention distance per head and layer (Fig. 7 right),
- attention rollout from the class token to the input (Fig. 6; Abnar & Zuidema 2020).

Attention weights come from the real forward pass: each block's timm `Attention` is switched to
its explicit (non-fused) path and a hook on `attn_drop` records the softmaxed attention. This
module measures; the figures are drawn by the `figures` it is handed (views/figures/inspection_plots.py,
which the API passes: a measurement never imports a view), and `api.inspect` stores the distances.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from vitbench.catalog.registry import get_dataset
from vitbench.datasets import IMAGE_SUFFIXES, CorruptImage
from vitbench.datasets.base import decode
from vitbench.engine.progress import track
from vitbench.errors import UserError
from vitbench.provenance import canonical_json, environment, fingerprint_files, sha256_text
from vitbench.weights import build_model
from vitbench.weights.resolved import resolve as resolve_weights


def require_transformer(model: Any, name: str) -> None:
    blocks = getattr(model, "blocks", None)
    if blocks is None or not all(hasattr(b, "attn") and hasattr(b.attn, "attn_drop") for b in blocks):
        raise UserError(f"{name} is not a transformer: attention views need a ViT or hybrid backbone")


def embedding_filter_components(model: Any, count: int = 28) -> np.ndarray | None:
    """The first `count` principal components of the RGB patch-embedding filters, (k, P, P, 3) in
    [0, 1] each; None for hybrids, whose "patches" are 1x1 projections of ResNet features."""
    if hasattr(model.patch_embed, "backbone"):
        return None
    w = model.patch_embed.proj.weight.detach().double().cpu()  # (D, 3, P, P)
    d, c, p, _ = w.shape
    x = w.reshape(d, -1)
    x = x - x.mean(0, keepdim=True)
    _, _, vt = torch.linalg.svd(x, full_matrices=False)  # rows of vt: principal directions
    comps = vt[: min(count, vt.shape[0])].reshape(-1, c, p, p).permute(0, 2, 3, 1).numpy()
    lo = comps.min(axis=(1, 2, 3), keepdims=True)
    hi = comps.max(axis=(1, 2, 3), keepdims=True)
    return (comps - lo) / np.maximum(hi - lo, 1e-12)


def patch_position_embeddings(model: Any) -> tuple[np.ndarray, tuple[int, int]]:
    """(N, D) position embeddings of the patch grid (class token dropped) and the grid shape."""
    pos = model.pos_embed.detach().cpu()[0]
    prefix = 0 if getattr(model, "no_embed_class", False) else int(model.num_prefix_tokens)
    grid = tuple(model.patch_embed.grid_size)
    return pos[prefix:].double().numpy(), (int(grid[0]), int(grid[1]))


def position_similarity(pos: np.ndarray) -> np.ndarray:
    """(N, N) cosine similarity between every pair of position embeddings."""
    unit = pos / np.maximum(np.linalg.norm(pos, axis=1, keepdims=True), 1e-12)
    return unit @ unit.T


def grid_distances(grid: tuple[int, int], patch_px: float) -> np.ndarray:
    """(N, N) Euclidean distances in pixels between patch centres of a row-major grid."""
    rows, cols = np.divmod(np.arange(grid[0] * grid[1]), grid[1])
    centres = np.stack([rows, cols], axis=1).astype(np.float64)
    return np.linalg.norm(centres[:, None] - centres[None], axis=-1) * patch_px


def mean_attention_distance(attn: np.ndarray, num_prefix: int, grid: tuple[int, int], patch_px: float) -> np.ndarray:
    """Per head, the attention-weighted distance in pixels between a patch and the patches it attends
    to, averaged over query patches and images. attn: (B, H, T, T) with T = num_prefix + N.
    Attention to the class token is left out and each query's patch attention renormalised, so the
    figure measures how far across the image information is integrated."""
    patches = attn[:, :, num_prefix:, num_prefix:].astype(np.float64)  # (B, H, N, N)
    patches = patches / np.maximum(patches.sum(-1, keepdims=True), 1e-12)
    dist = grid_distances(grid, patch_px)
    return (patches * dist).sum(-1).mean(axis=(0, 2))  # (H,)


def rollout(attns: list[np.ndarray]) -> np.ndarray:
    """Attention rollout: per layer, average the heads, add the identity for the residual path and
    renormalise the rows, then multiply through the layers. (L of (B, H, T, T)) -> (B, T, T)."""
    result = None
    for attn in attns:
        a = attn.astype(np.float64).mean(axis=1)  # (B, T, T)
        a = a + np.eye(a.shape[-1])
        a = a / a.sum(-1, keepdims=True)
        result = a if result is None else a @ result
    assert result is not None
    return result


@contextlib.contextmanager
def capture_attention(model: Any) -> Iterator[list[torch.Tensor]]:
    """Record every block's attention probabilities (B, H, T, T) during forward passes."""
    maps: list[torch.Tensor] = []
    blocks = list(model.blocks)
    fused = [b.attn.fused_attn for b in blocks]
    hooks = [b.attn.attn_drop.register_forward_hook(lambda _m, _i, out: maps.append(out.detach())) for b in blocks]
    for b in blocks:
        b.attn.fused_attn = False  # the explicit path computes softmax(QK^T) where the hook sees it
    try:
        yield maps
    finally:
        for b, was in zip(blocks, fused, strict=True):
            b.attn.fused_attn = was
        for h in hooks:
            h.remove()


# --- the `vitbench inspect` job ----------------------------------------------------------------------


def collect_images(images_dir, dataset: str | None, data_dir, limit: int):
    """(names, PIL images, source label, fingerprint): image files under a folder (sorted, recursive)
    or the first images of a dataset's test split."""
    from pathlib import Path

    if (images_dir is None) == (dataset is None):
        raise UserError("give --images DIR or --dataset NAME (one of them)")
    if images_dir is not None:
        root = Path(images_dir)
        if not root.is_dir():
            raise UserError(f"--images {root}: expected a folder of images")
        files = sorted(p for p in root.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES)
        # evenly spaced over the sorted files, so class folders are all represented (deterministic)
        picks = np.unique(np.linspace(0, len(files) - 1, min(limit, len(files))).round().astype(int))
        files = [files[i] for i in picks]
        if not files:
            raise UserError(f"--images {root}: no image files ({', '.join(sorted(IMAGE_SUFFIXES))})")
        images = []
        for f in files:  # decoded as `run` decodes them: 16-bit PNGs scaled (not clipped to white), bombs refused
            try:
                images.append(decode(f))
            except CorruptImage as e:
                raise UserError(f"{f}: not a readable image ({' '.join(str(e.reason).split())[:100]})") from None
        return [f.stem for f in files], images, str(root.resolve()), fingerprint_files(root, files, content=False)
    spec = get_dataset(str(dataset))
    split = spec.load_split(data_dir, spec.transfer_splits[1])
    count = min(limit, len(split))
    names = [f"{spec.name}_{split.name}_{i:05d}" for i in range(count)]
    return names, [split.image(i) for i in range(count)], f"{spec.name}:{split.name}[:{count}]", split.fingerprint


def inspect_backbone(
    spec,
    weights: str,
    res: int | None,
    images_dir,
    dataset,
    data_dir,
    out_dir,
    device,
    figures: Any,
    num_images: int = 32,
    rollout_images: int = 8,
    batch_size: int = 8,
) -> dict:
    """Draw the four §4.5 views under `out_dir` with `figures` (views/figures/inspection_plots.py);
    return the mean attention distances and provenance."""
    from pathlib import Path

    res = res or spec.preprocessing.size
    spec.backend.check_img_size(spec, res)
    resolved = resolve_weights(weights, spec)
    model: Any = build_model(spec, num_classes=0, img_size=res, weights=resolved.path)
    require_transformer(model, spec.name)
    names, images, source, fingerprint = collect_images(images_dir, dataset, data_dir, num_images)
    out = Path(out_dir)
    label = f"{spec.name}, " + ("random init" if resolved.random else Path(resolved.path).name) + f", {res} px"
    preprocessing = spec.preprocessing.at(res)
    transform = preprocessing.transform()

    components = embedding_filter_components(model)
    if components is not None:
        figures.embedding_filters(components, out / "embedding_filters.png", label)
    pos, grid = patch_position_embeddings(model)
    figures.position_similarity(position_similarity(pos), grid, out / "position_similarity.png", label)

    model.eval().to(device)
    num_prefix = 0 if getattr(model, "no_embed_class", False) else int(model.num_prefix_tokens)
    patch_px = res / grid[0]  # the patch size, or the hybrid's total stride
    distance_sum, seen, rollout_files = None, 0, []
    starts = range(0, len(images), batch_size)
    for start in track(starts, total=len(starts), description=f"inspect {spec.name}"):
        batch = images[start : start + batch_size]
        x = torch.stack([transform(img) for img in batch]).to(device)
        with torch.inference_mode(), capture_attention(model) as maps:
            model.forward_features(x)
        attns = [m.float().cpu().numpy() for m in maps]  # L x (B, H, T, T)
        per_layer = np.stack([mean_attention_distance(a, num_prefix, grid, patch_px) for a in attns])  # (L, H)
        distance_sum = per_layer * len(batch) + (0 if distance_sum is None else distance_sum)
        seen += len(batch)
        rolled = rollout(attns)[:, 0, num_prefix:].reshape(len(batch), *grid)  # class token -> patches
        mean, std = np.array(preprocessing.mean), np.array(preprocessing.std)
        for i in range(len(batch)):
            if start + i >= rollout_images:
                break
            shown = np.clip(x[i].cpu().permute(1, 2, 0).numpy() * std + mean, 0, 1)  # the crop the model saw
            path = out / "attention_rollout" / f"{names[start + i]}.png"
            rollout_files.append(figures.rollout_overlay(shown, rolled[i], path, f"{names[start + i]}: {label}"))
    assert distance_sum is not None
    distances = distance_sum / seen  # (L, H)
    figures.attention_distance(distances, seen, out / "attention_distance.png", label)
    return {
        "distances": distances,
        "n_images": seen,
        "images": source,
        "images_fingerprint": fingerprint,
        "res": res,
        "weights": resolved.path,
        "weights_sha256": resolved.sha256,
        "filters_written": components is not None,
        "rollout_files": rollout_files,
    }


def attention_distance_rows(spec, found: dict, device_name: str) -> tuple[str, list[dict]]:
    """The store rows of one inspection, keyed on what changes the numbers (model, weights,
    resolution, images), each carrying its provenance."""
    from datetime import UTC, datetime

    key = sha256_text(
        canonical_json(
            {
                "model": spec.name,
                "weights": found["weights_sha256"],
                "res": found["res"],
                "images": found["images_fingerprint"],
                "n_images": found["n_images"],
            }
        )
    )
    env = environment()
    common = {
        "inspect_key": key,
        "model": spec.name,
        "weights": found["weights"],
        "weights_sha256": found["weights_sha256"],
        "random_init": found["weights"] == "random",
        "res": found["res"],
        "images": found["images"],
        "images_fingerprint": found["images_fingerprint"],
        "n_images": found["n_images"],
        "created_at": datetime.now(UTC),
        "device_name": device_name,
        **{k: env[k] for k in ("git_sha", "vitbench_version", "torch_version", "timm_version")},
    }
    rows = [
        {**common, "layer": layer + 1, "head": head + 1, "distance_px": float(distance)}
        for layer, per_head in enumerate(found["distances"])
        for head, distance in enumerate(per_head)
    ]
    return key, rows

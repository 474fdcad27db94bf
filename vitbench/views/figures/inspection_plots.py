"""The §4.5 figures as PNG files (matplotlib, Agg). Fixed figure sizes, so every PNG has a known
pixel size; each title says which model and weights it shows."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from vitbench.files.out_paths import no_mathtext, write_figure
from vitbench.views.figures.plots import pyplot  # matplotlib on Agg, loaded when a figure is drawn

DPI = 100
SIZES = {  # inches at DPI: the PNG sizes tests expect
    "filters": (7.0, 4.6),
    "positions": (8.0, 7.2),
    "distance": (6.0, 4.5),
    "rollout": (6.0, 3.2),
}


def _save(fig, path: Path) -> Path:
    path.parent.mkdir(exist_ok=True)  # the folder asked for (its parent checked: out_paths.check_out_folder)
    write_figure(fig, path, dpi=DPI)
    pyplot().close(fig)
    return path


def embedding_filters(components: np.ndarray, path: Path, title: str) -> Path:
    """Fig. 7 left: the principal components of the patch-embedding filters as RGB tiles."""
    fig, axes = pyplot().subplots(4, 7, figsize=SIZES["filters"])
    for i, ax in enumerate(axes.flat):
        if i < len(components):
            ax.imshow(components[i], interpolation="nearest")
        ax.axis("off")
    fig.suptitle(f"RGB embedding filters (first {len(components)} principal components)\n{title}", fontsize=9)
    return _save(fig, path)


def position_similarity(similarity: np.ndarray, grid: tuple[int, int], path: Path, title: str) -> Path:
    """Fig. 7 centre: for each patch position (tile), the cosine similarity of its position embedding
    to every other position's (pixels of the tile), as one mosaic."""
    gh, gw = grid
    mosaic = np.full((gh * (gh + 1) - 1, gw * (gw + 1) - 1), np.nan)
    for i in range(gh * gw):
        r, c = divmod(i, gw)
        mosaic[r * (gh + 1) : r * (gh + 1) + gh, c * (gw + 1) : c * (gw + 1) + gw] = similarity[i].reshape(gh, gw)
    fig, ax = pyplot().subplots(figsize=SIZES["positions"])
    image = ax.imshow(mosaic, cmap="viridis", vmin=-1, vmax=1, interpolation="nearest")
    ax.set_xlabel("input patch column")
    ax.set_ylabel("input patch row")
    ax.set_xticks([])
    ax.set_yticks([])
    fig.colorbar(image, ax=ax, fraction=0.046, label="cosine similarity")
    ax.set_title(f"Position embedding similarity ({gh}x{gw} grid)\n{title}", fontsize=9)
    return _save(fig, path)


def attention_distance(distances: np.ndarray, n_images: int, path: Path, title: str) -> Path:
    """Fig. 7 right: mean attention distance of every head against network depth. (L, H) pixels."""
    fig, ax = pyplot().subplots(figsize=SIZES["distance"])
    layers, heads = distances.shape
    for h in range(heads):
        ax.scatter(np.arange(1, layers + 1), distances[:, h], s=12, label=f"head {h + 1}" if heads <= 16 else None)
    ax.set_xlabel("network depth (layer)")
    ax.set_ylabel("mean attention distance (pixels)")
    ax.set_title(f"Mean attention distance over {n_images} images\n{title}", fontsize=9)
    if heads <= 16:
        ax.legend(fontsize=8, ncol=2)  # read on a page at its own size: 8 pt, not 6
    no_mathtext(fig)  # the title holds the model's name: drawn as written
    fig.tight_layout()
    return _save(fig, path)


def rollout_overlay(image: np.ndarray, mask: np.ndarray, path: Path, title: str) -> Path:
    """Fig. 6: the input and the class token's attention rollout over it."""
    fig, (left, right) = pyplot().subplots(1, 2, figsize=SIZES["rollout"])
    h, w = image.shape[:2]
    left.imshow(image)
    left.set_title("input", fontsize=8)
    right.imshow(image)
    right.imshow(mask / max(mask.max(), 1e-12), cmap="jet", alpha=0.5, extent=(0, w, h, 0), interpolation="bilinear")
    right.set_title("attention rollout (class token)", fontsize=8)
    for ax in (left, right):
        ax.axis("off")
    fig.suptitle(title, fontsize=8)
    return _save(fig, path)

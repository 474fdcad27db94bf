"""A near-duplicate audit's pairs as a person checks them: each test image beside the image it was
found to copy, with where each lives (its file, or `split:index` where the dataset keeps its images
in arrays, as CIFAR's pickles do: then the image itself is the only way to see it) and the pair's
distance. The nearest pairs and those nearest the threshold (where a look-alike would be) are shown;
`vitbench dedup` writes the sheet beside the stored audit and the report shows it."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pandas as pd

from vitbench.datasets import CorruptImage, Split
from vitbench.files.out_paths import no_mathtext, write_figure
from vitbench.views.figures.figure_kit import DPI, pyplot

PAIRS_SHOWN = 12  # half the nearest pairs, half those nearest the threshold
PER_ROW = 3  # pairs side by side in a row of the sheet


def sheet_path(results: Path, audit_key: str) -> Path:
    return results / "dedup" / f"{audit_key}.png"


def chosen_pairs(pairs: pd.DataFrame, shown: int = PAIRS_SHOWN) -> pd.DataFrame:
    """One pair per test image (its nearest), then the `shown // 2` nearest and the rest of `shown`
    farthest (nearest the threshold), nearest first."""
    first = pairs.sort_values("distance", kind="stable").drop_duplicates("test_index")
    if len(first) <= shown:
        return first
    return pd.concat([first.head(shown // 2), first.tail(shown - shown // 2)])


def pixels(split: Split, index: int) -> np.ndarray | None:
    """An image of the split as (H, W, 3) uint8, or None where it cannot be read any more."""
    if split.images is not None:
        return np.asarray(split.images[index])
    try:
        return np.asarray(split.decoded(index))
    except (CorruptImage, OSError, ValueError):
        return None


def where(split: Split, index: int, name: str) -> str:
    """A file's path as stored, or `split:index` and what holds it where the images are arrays."""
    if split.paths is not None or split.records is not None:
        return name
    return f"{name} ({split.dataset}'s {split.name} split, in its {split.source} arrays)"


def write_sheet(audit: dict, test: Split, audited: Split, out: Path) -> Path | None:
    """The audit's contact sheet as PNG at `out` (None where it found no pair)."""
    pairs = audit["pairs"]
    if pairs is None or pairs.empty:
        return None
    chosen = chosen_pairs(pairs)
    rows = -(-len(chosen) // PER_ROW)
    plt = pyplot()
    fig, axes = plt.subplots(rows, 2 * PER_ROW, figsize=(2.2 * 2 * PER_ROW, 2.9 * rows + 0.6), squeeze=False)
    for ax in axes.ravel():
        ax.axis("off")
    for n, pair in enumerate(chosen.itertuples()):
        row, column = divmod(n, PER_ROW)
        sides = (
            (test, int(pair.test_index), str(pair.test_image), "test"),
            (audited, int(pair.duplicate_index), str(pair.duplicate), "found in"),
        )
        for side, (split, index, name, role) in enumerate(sides):
            ax = axes[row, 2 * column + side]
            image = pixels(split, index)
            if image is not None:
                ax.imshow(image, interpolation="nearest")
            label = "\n".join(textwrap.wrap(f"{role}: {where(split, index, name)}", 34)[:4])
            if side == 1:
                label += f"\ndistance {pair.distance:.3f}" + (" (exact copy)" if pair.exact else "")
            ax.set_title(label, fontsize=7.5, loc="left")
    threshold = float(audit["threshold"])
    fig.suptitle(
        f"{audit['test_dataset']} {audit['test_split']} against {audit['audited_dataset']} {audit['audited_split']}: "
        f"{len(chosen)} of {audit['n_pairs']} pair(s), threshold {threshold:g} (distance ≤ {1 - threshold:.3f})",
        fontsize=9, x=0.01, ha="left",
    )  # fmt: skip
    no_mathtext(fig)  # before the layout is measured: measuring parses the titles
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)  # the results folder's own sheets/ folder
    write_figure(fig, out, "the contact sheet", dpi=DPI)
    plt.close(fig)
    return out

"""How every figure of `vitbench plot` and `vitbench report` is laid out and saved: the axes at a
fixed size, the legend under them (never beside, where it squeezed the axes into half the canvas),
the caption under the legend in a file, and beside each image the numbers it draws as CSV.

FILE (`vitbench plot`): 900 px wide; the axes 7.8 × 3.9 in at 100 dpi whatever the legend holds,
the canvas 600 px tall or taller by what the legend and caption need (a figure without a legend is
900 × 600). PAGE (`vitbench report`): the page says the caption once, in HTML; the canvas is cropped
to what is drawn. Small multiples (`new_grid`, a panel per dataset): panels of a fixed size two to a
row, one legend under them all; nothing is left out for want of room, the canvas grows.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from vitbench.files.atomic import write_atomic
from vitbench.files.out_paths import check_out_file, no_mathtext, write_figure
from vitbench.files.text_safety import csv_frame

if TYPE_CHECKING:
    import pandas as pd

DPI = 100
SIZE = (9.0, 6.0)  # inches: the least a FILE figure is, 900 x 600 pixels
FILE_NAMES = {
    "vtab": "vtab_groups",
    "cost": "accuracy_vs_cost",
    "curves": "finetune_curves",
    "confusion": "confusion_matrix",  # views/figures/confusion.py; asked for by name only (it needs --run)
    "checkpoints": "accuracy_vs_checkpoint",  # views/figures/series.py; asked for by name only
    "datasize": "accuracy_vs_pretraining_images",  # views/figures/pretraining.py
    "compute": "accuracy_vs_pretraining_exaflops",  # views/figures/pretraining.py
}
# a FILE figure's axes, in inches: left margin, top margin, width, height; the x label's room below them
AXES = (0.8, 0.5, 7.8, 3.9)
BELOW_AXES = 0.6
CAPTION_WIDTH = 150  # characters a caption line holds in a file (7 pt over 9 in)
CAPTION_LINE = 0.125  # inches a caption line takes


def pyplot():
    """matplotlib's pyplot on the Agg backend (files only, never a window), loaded when a figure is
    drawn: `vitbench table` and the rest of this module's importers never pay for it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


@dataclass
class Figure:
    name: str
    caption: str
    files: list[Path]


def runs_text(keys) -> str:
    keys = sorted({str(k) for k in keys if k is not None})
    shown = ", ".join(k[:8] for k in keys[:6]) + (f" and {len(keys) - 6} more" if len(keys) > 6 else "")
    return f"{len(keys)} run(s): {shown}" if keys else "no measured runs"


@dataclass(frozen=True)
class Look:
    """How a figure is laid out: FILE for `vitbench plot`, PAGE for `vitbench report` (the module)."""

    size: tuple[float, float]
    caption_in_image: bool
    legend_size: float


FILE = Look(SIZE, caption_in_image=True, legend_size=8)
PAGE = Look((7.5, 4.2), caption_in_image=False, legend_size=9)
# small multiples (`new_grid`): panels two to a row, each PANEL_HEIGHT inches tall; between them room
# for the next panel's y labels (across) and for an x label and the next panel's title (down)
GRID_COLUMNS = 2
PANEL_HEIGHT = 2.6
PANEL_GAP = (0.75, 0.9)
RIGHT_MARGIN = 0.3


def new_figure(look: Look = FILE):
    fig, ax = pyplot().subplots(figsize=look.size)
    if look.caption_in_image:
        _place_axes(fig, ax, look.size[1])
    return fig, ax


def _place_axes(fig, ax, height: float) -> None:
    """The axes at their fixed size in inches, `height` the canvas' (grown for the legend below)."""
    left, top, width, tall = AXES
    fig.set_size_inches(SIZE[0], height)
    ax.set_position((left / SIZE[0], (height - top - tall) / height, width / SIZE[0], tall / height))


def new_grid(panels: int, look: Look = FILE):
    """Small multiples: a figure of `panels` axes (a panel per dataset), two to a row at the look's
    width, one legend under them all (`legend_under`); one panel is `new_figure`'s figure."""
    if panels == 1:
        fig, ax = new_figure(look)
        return fig, [ax]
    fig = pyplot().figure(figsize=(look.size[0], 1.0))
    axes = [fig.add_axes((0.0, 0.0, 1.0, 1.0)) for _ in range(panels)]
    fig.vitbench_grid = True  # `save` lays the panels, the legend and the caption out in inches
    _place_grid(fig, 0.0)
    return fig, axes


def _place_grid(fig, below: float) -> None:
    """The panels at their fixed size in inches, two to a row, and `below` inches under them (the
    legend and caption): the canvas grows, the panels never shrink."""
    width, axes = fig.get_figwidth(), fig.axes
    rows = -(-len(axes) // GRID_COLUMNS)
    panel = (width - AXES[0] - RIGHT_MARGIN - (GRID_COLUMNS - 1) * PANEL_GAP[0]) / GRID_COLUMNS
    grid = AXES[1] + rows * PANEL_HEIGHT + (rows - 1) * PANEL_GAP[1]
    height = grid + BELOW_AXES + below
    fig.set_size_inches(width, height)
    for i, ax in enumerate(axes):
        left = AXES[0] + (i % GRID_COLUMNS) * (panel + PANEL_GAP[0])
        top = AXES[1] + (i // GRID_COLUMNS) * (PANEL_HEIGHT + PANEL_GAP[1])
        ax.set_position((left / width, (height - top - PANEL_HEIGHT) / height, panel / width, PANEL_HEIGHT / height))
    if fig.legends:  # under the panels, at the left margin
        fig.legends[0].set_bbox_to_anchor((AXES[0] / width, (height - grid - BELOW_AXES) / height), fig.transFigure)


def legend_under(fig, axes: list, look: Look = FILE) -> None:
    """One legend for every panel: each label once (a line keeps its style in every panel), under
    the panels (one panel: `legend`)."""
    if len(axes) == 1:
        legend(axes[0], look)
        return
    seen = _entries(axes)
    if seen:
        wrapped = ["\n".join(textwrap.wrap(label, 110)) for label in seen]
        fig.legend(list(seen.values()), wrapped, fontsize=look.legend_size, frameon=False, loc="upper left")
        _place_grid(fig, 0.0)


def _entries(axes: list) -> dict[str, object]:
    """label -> the first handle drawn with it, over `axes`, in drawing order."""
    seen: dict[str, object] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            seen.setdefault(label, handle)
    return seen


def legend(ax, look: Look = FILE) -> None:
    """The legend under the axes, one entry a label (reference lines drawn once per line share
    one), long labels wrapped (they carry the weights' name and fingerprint): the axes keep their
    size, the canvas grows (`save`)."""
    entries = _entries([ax])
    if not entries:
        return
    handles, wrapped = list(entries.values()), ["\n".join(textwrap.wrap(label, 110)) for label in entries]
    below = (BELOW_AXES / AXES[3]) if look.caption_in_image else 0.16
    ax.legend(handles, wrapped, fontsize=look.legend_size, frameon=False, loc="upper left",
              bbox_to_anchor=(0.0, -below))  # fmt: skip


def save(
    fig, caption: str, out_dir: Path, name: str, formats: tuple[str, ...], look: Look = FILE,
    points: pd.DataFrame | None = None,
) -> list[Path]:  # fmt: skip
    """The figure in each format, and `points` (one row per point drawn) as CSV beside them."""
    lines = textwrap.wrap(caption, CAPTION_WIDTH) if look.caption_in_image else []
    no_mathtext(fig)  # before the legend is measured: measuring parses it
    if getattr(fig, "vitbench_grid", False):
        _fit_grid(fig, len(lines))
    elif look.caption_in_image:
        _fit_legend_and_caption(fig, len(lines))
    if lines:
        fig.text(0.01, 0.01, "\n".join(lines), fontsize=7, va="bottom", ha="left")
    out_dir.mkdir(exist_ok=True)  # the folder asked for (its parent checked: out_paths.check_out_folder)
    stem = FILE_NAMES.get(name, name)
    files = []
    for ext in formats:
        path = out_dir / f"{stem}.{ext}"
        write_figure(
            fig, path, dpi=DPI, metadata={"Title": caption[:200]} if ext in ("png", "svg") else None,
            bbox_inches=None if look.caption_in_image else "tight",
        )  # fmt: skip
        files.append(path)
    pyplot().close(fig)
    if points is not None:
        path = out_dir / f"{stem}.csv"
        write_atomic(check_out_file(path), csv_frame(points).to_csv(index=False))
        files.append(path)
    return files


def _fit_grid(fig, caption_lines: int) -> None:
    """Grow a grid of panels for the legend under them and the caption (if any) under that."""
    legend_inches = 0.0
    if fig.legends:
        legend_inches = fig.legends[0].get_window_extent(fig.canvas.get_renderer()).height / fig.dpi
    _place_grid(fig, legend_inches + 0.2 + caption_lines * CAPTION_LINE + 0.1)


def _fit_legend_and_caption(fig, caption_lines: int) -> None:
    """Grow a one-axes FILE figure for the legend under its axes and the caption under that."""
    if len(fig.axes) != 1 or fig.axes[0].get_legend() is None:
        return
    ax = fig.axes[0]
    legend_inches = ax.get_legend().get_window_extent(fig.canvas.get_renderer()).height / fig.dpi
    needed = AXES[1] + AXES[3] + BELOW_AXES + legend_inches + 0.2 + caption_lines * CAPTION_LINE + 0.1
    _place_axes(fig, ax, max(SIZE[1], needed))

"""`vitbench table --view attention`: the stored mean attention distances (`vitbench inspect`)."""

from __future__ import annotations

import pandas as pd

from vitbench.views.cells import RANDOM_MARK, Cell, TableData
from vitbench.views.measured.footnotes import marker_footnotes


def attention_view(df: pd.DataFrame, only: str | None = None) -> TableData:
    """Mean attention distance per layer: one column per inspected (model, weights, resolution, images),
    each cell the range over heads and their mean, in pixels (Fig. 7 right, as numbers)."""
    data = TableData(title="Mean attention distance (pixels)")
    if only is not None:
        df = df[df["inspect_key"] == only]
    if df.empty:
        return data
    for _key, part in df.groupby("inspect_key", sort=False):
        first = part.iloc[0]
        weights = "random init" if first["random_init"] else f"{str(first['weights']).rsplit('/', 1)[-1]}"
        col = f"{first['model']} ({weights}) @{first['res']}px, {first['n_images']} images"
        if first["random_init"]:
            col += RANDOM_MARK
        data.add_column(col)
        for layer, heads in part.groupby("layer"):
            row = f"layer {int(layer)}"
            data.add_row(row)
            lo, hi, mean = heads["distance_px"].min(), heads["distance_px"].max(), heads["distance_px"].mean()
            data.cells[(row, col)] = Cell(mean=float(mean), n=len(heads), text=f"{lo:.0f}–{hi:.0f} (mean {mean:.0f})")
    data.rows.sort(key=lambda r: int(r.split()[1]))
    data.footnotes.append("mean attention distance in pixels: min–max over heads (mean over heads)")
    marker_footnotes(data, True, False)
    return data

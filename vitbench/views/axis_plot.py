"""`vitbench plot NAME` for a protocol whose runs vary along an axis (few-shot: shots; k-NN: k; a
plugin's): its accuracy against that axis, a line per backbone, dataset and setting, each point the
mean ± std over seeds of one table cell (views/settings.py: a line never averages two settings, so
DeiT-Ti at 64 and at 224 px are two lines, named `res=64` and `res=224`). The points drawn are
written beside the image as CSV (one row per point: its line, x, mean, std, n and run keys)."""

from __future__ import annotations

import pandas as pd

from vitbench.errors import UserError
from vitbench.protocols.registry import protocols
from vitbench.views import cells, columns, table
from vitbench.views.axes import axis_values
from vitbench.views.figure_kit import FILE, Figure, Look, legend, new_figure, runs_text, save

# what makes a line: the backbone, the dataset, the protocol's version and the settings it names
LINE = ["model", "weights", "weights_sha256", "random_init", "dataset", "protocol_version", "series", "smoke"]


def axis_points(acc: pd.DataFrame, x: pd.Series) -> pd.DataFrame:
    """One row per point: its line's label and identity, x, and the mean, std (points of accuracy)
    and n over the runs (seeds) of that cell, with their run keys; lines in the views' order."""
    acc = acc.assign(_x=x, series=acc["series"].fillna("") if "series" in acc else "")
    acc = acc[acc["_x"].notna()]
    versions = acc["protocol_version"].nunique() > 1
    rows = []
    for key, part in acc.groupby(LINE, sort=False, dropna=False):
        model, weights, sha, random_init, dataset, version, series, smoke = key
        label = columns.weights_label(model, weights, sha, bool(random_init))
        label += cells.RANDOM_MARK if random_init else ""
        label += f" · {table.title(str(dataset))}" + (cells.SUBSET_MARK if part["data_subset"].any() else "")
        label += (f" · {series}" if series else "") + (f" · {version}" if versions else "")
        label += cells.SMOKE_MARK if smoke else ""
        for value, point in part.groupby("_x", sort=True):
            percent = point["value"].astype(float) * 100
            rows.append({
                "line": label, "model": model, "weights_sha256": sha, "dataset": dataset, "setting": series,
                "x": value, "mean": float(percent.mean()),
                "std": float(percent.std(ddof=1)) if len(percent) > 1 else None, "n": len(percent),
                "run_keys": " ".join(sorted(point["run_key"].astype(str))),
            })  # fmt: skip
    return pd.DataFrame(rows, columns=["line", "model", "weights_sha256", "dataset", "setting", "x", "mean", "std",
                                       "n", "run_keys"])  # fmt: skip


def axis_figure(
    df: pd.DataFrame, protocol: str, out_dir, formats: tuple[str, ...], look: Look = FILE, values_needed: int = 1
) -> Figure:
    """A protocol's accuracy against the axis its runs vary along: `vitbench plot NAME` for any such
    protocol. `values_needed`: 2 where the figure is drawn unasked (a bare `vitbench plot`, the
    report), so that one value is not drawn as a "line"; asked for by name, one value is drawn."""
    known = protocols().get(protocol)
    if known is None or known.axis is None:
        raise UserError(f"vitbench plot {protocol}: its runs vary along no axis (protocols/measures.py)")
    axis = known.axis
    m = columns.measured_columns(df, protocol)
    if m.acc.empty:
        raise UserError(f"no {known.label} runs are stored; run `vitbench run --protocol {protocol}`")
    x = pd.to_numeric(axis_values(m.acc, axis), errors="coerce")
    values = sorted(set(x.dropna()))
    if len(values) < values_needed:
        found = ", ".join(axis.text(v) for v in values) or f"no value of {axis.name}"
        raise UserError(f"every stored {known.label} run has {found}: a line against {axis.label} needs two values")
    points = axis_points(m.acc, x)
    lines = list(dict.fromkeys(points["line"]))
    shown = lines[: look.max_lines] if look.max_lines else lines
    drawn = points[points["line"].isin(shown)]
    fig, ax = new_figure(look)
    for line, part in drawn.groupby("line", sort=False):
        ax.errorbar(part["x"], part["mean"], yerr=part["std"].fillna(0), marker="o", capsize=3,
                    label=f"{line} (n={int(part['n'].min())})")  # fmt: skip
    if axis.log:
        from matplotlib.ticker import NullLocator

        ax.set_xscale("log")
        ax.xaxis.set_minor_locator(NullLocator())  # only the values measured are ticked: no 6×10⁰ between them
    ax.set_xticks(values, [axis.text(v).removeprefix(axis.setting("")) for v in values])
    ax.set_xlabel(axis.label + (" (log scale)" if axis.log else ""))
    ax.set_ylabel("top-1 accuracy (%)")
    ax.set_title(f"{known.label} accuracy against {axis.label}")
    legend(ax, look)
    caption = _caption(known, axis, drawn, values, len(shown), len(lines))
    name = f"{protocol}_{axis.name}"
    return Figure(protocol, caption, save(fig, caption, out_dir, name, formats, look, points=drawn))


def _caption(known, axis, drawn: pd.DataFrame, values: list, shown: int, lines: int) -> str:
    """What is drawn, from what is drawn: the protocol, the values of the axis, the lines, what each
    point is, and the marks that appear in the legend (only those)."""
    keys = {k for text in drawn["run_keys"] for k in text.split()}
    ticks = ", ".join(axis.text(v) for v in values)
    caption = (
        f"{known.label} ({known.version}) at {ticks}: each point is the mean top-1 accuracy over seeds of one table "
        f"cell (error bar: std; n: runs per point, the fewest on the line), one line per model, weights, dataset "
        f"and setting, from {runs_text(keys)}."
    )
    labels = " ".join(drawn["line"])
    for mark, said in ((cells.SUBSET_MARK, "a subset of the official splits"), (cells.RANDOM_MARK, "random-init "
                       "weights"), (cells.SMOKE_MARK, "a smoke run")):  # fmt: skip
        if mark in labels:
            caption += f" {mark}: {said}."
    if shown < lines:
        caption += f" The first {shown} of {lines} lines; the tables have all."
    return caption

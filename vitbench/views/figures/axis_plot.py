"""`vitbench plot NAME` for a protocol whose runs vary along an axis (few-shot: shots; k-NN: k; a
plugin's): its accuracy against that axis, a panel per dataset, a line per backbone and setting,
each point the mean ± std over seeds of one table cell (views/measured/settings.py: a line never averages two
settings, so DeiT-Ti at 64 and at 224 px are two lines, named `res=64` and `res=224`). Every line is
drawn, each in a colour, marker and dash of its own (the same in every panel), lines that coincide
side by side; a point whose runs had fewer shots than its x says so (`[2-shot]`). The linear probe
of the same features, where stored, is a reference line, and chance a dotted one. The points drawn
are written beside the image as CSV (one row per point: its line, x, mean, std, n and run keys; the
reference lines as rows of their own kind)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from vitbench.catalog.registry import get_dataset
from vitbench.errors import UserError
from vitbench.protocols.registry import protocols
from vitbench.store.query import json_field
from vitbench.views import cells
from vitbench.views.figures.figure_kit import FILE, Figure, Look, legend_under, new_grid, runs_text, save
from vitbench.views.measured import columns
from vitbench.views.measured.axes import axis_values
from vitbench.views.measured.coverage import chance_percent, class_coverage, fewer_classes_text
from vitbench.views.measured.dataset_titles import title
from vitbench.views.measured.settings import INPUT_SETTINGS, run_setting, value_text
from vitbench.views.measured.shot_counts import cell_effective_shots

# what makes a line: the backbone, the protocol's version and the settings it names (a panel: the dataset)
LINE = ["model", "weights", "weights_sha256", "random_init", "protocol_version", "series", "smoke"]
POINT = "point"
COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
DASHES = ("-", "--", "-.", ":")
CSV_COLUMNS = ["kind", "line", "model", "weights_sha256", "dataset", "setting", "x", "mean", "std", "n",
               "effective_shots", "colour", "marker", "dash", "run_keys"]  # fmt: skip
# each drawn line's id in an SVG (`vitbench-line-<panel>-<line>`): what a test counts in the report's figures
LINE_ID = "vitbench-line"


def line_style(i: int) -> dict:
    """The i-th line's look: colour, marker and dash each cycle at their own length, so that the
    first 40 lines differ in colour and marker together (10 × 8, coprime cycles' product), and dashes
    set apart every further ten."""
    return {"color": COLOURS[i % 10], "marker": MARKERS[i % 8], "linestyle": DASHES[(i // 10) % 4]}


def _line_label(identity: tuple, versions: bool, where: str = "") -> str:
    """A line's label: its backbone, `where` (the dataset: a panel's lines leave it out of their
    legend), the settings it names, its version where several, its marks."""
    model, weights, sha, random_init, version, series, smoke = identity
    label = columns.weights_label(model, weights, sha, bool(random_init)) + (cells.RANDOM_MARK if random_init else "")
    label += (
        (f" · {where}" if where else "") + (f" · {series}" if series else "") + (f" · {version}" if versions else "")
    )
    return label + (cells.SMOKE_MARK if smoke else "")


def axis_points(acc: pd.DataFrame, x: pd.Series) -> pd.DataFrame:
    """One row per point: its line's label (backbone · dataset · setting), identity and legend
    label, x, and the mean, std (points of accuracy) and n over the runs (seeds) of that cell, the
    fewest shots its runs had where fewer than x (`effective_shots`), with their run keys; lines in
    the views' order."""
    acc = acc.assign(_x=x, series=acc["series"].fillna("") if "series" in acc else "")
    acc = acc[acc["_x"].notna()]
    versions = acc["protocol_version"].nunique() > 1
    rows = []
    for key, part in acc.groupby([*LINE, "dataset"], sort=False, dropna=False):
        *identity, dataset = key
        model, _, sha, _, _, series, _ = identity
        subset = cells.SUBSET_MARK if part["data_subset"].any() else ""
        where = f"{title(str(dataset))}{subset}"
        legend, label = _line_label(tuple(identity), versions), _line_label(tuple(identity), versions, where)
        for value, point in part.groupby("_x", sort=True):
            percent = point["value"].astype(float) * 100
            rows.append({
                "kind": POINT, "line": label, "legend": legend, "key": tuple(identity), "panel": where,
                "model": model, "weights_sha256": sha, "dataset": dataset, "setting": series, "x": value,
                "mean": float(percent.mean()), "std": float(percent.std(ddof=1)) if len(percent) > 1 else None,
                "n": len(percent), "effective_shots": cell_effective_shots(point),
                "run_keys": " ".join(sorted(point["run_key"].astype(str))),
            })  # fmt: skip
    return pd.DataFrame(rows, columns=[*CSV_COLUMNS, "legend", "key", "panel"])


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
    coverage = class_coverage(df.drop_duplicates("run_key"))  # classes present in each scored split, as stored
    references = _references(df, axis.reference, m.acc, points, coverage)
    panels = list(dict.fromkeys(points["panel"]))
    style = {key: line_style(i) for i, key in enumerate(dict.fromkeys(points["key"]))}
    for frame in (points, references):  # each row says how its line is drawn
        looks = [style.get(k, {"color": "#555555", "marker": "", "linestyle": ":"}) for k in frame["key"]]
        frame["colour"], frame["marker"] = [s["color"] for s in looks], [s["marker"] for s in looks]
        frame["dash"] = [s["linestyle"] for s in looks]
    references.loc[references["kind"] != "chance", "dash"] = "dashed"
    fig, axes = new_grid(len(panels), look)
    for i, (ax, panel) in enumerate(zip(axes, panels, strict=True)):
        here = points[points["panel"] == panel]
        _draw_panel(ax, here, references[references["panel"] == panel], style, axis, f"{LINE_ID}-{i}")
        if axis.log:
            from matplotlib.ticker import NullLocator

            ax.set_xscale("log")
            ax.xaxis.set_minor_locator(NullLocator())  # only the values measured are ticked: no 6×10⁰ between them
        ax.set_xticks(values, [axis.text(v).removeprefix(axis.setting("")) for v in values])
        ax.set_xlabel(axis.label + (" (log scale)" if axis.log else ""))
        ax.set_ylabel("top-1 accuracy (%)")
        ax.set_title(panel if len(panels) > 1 else f"{known.label} accuracy against {axis.label} · {panel}",
                     fontsize=10 if len(panels) > 1 else None)  # fmt: skip
    if len(panels) > 1:
        fig.suptitle(f"{known.label} accuracy against {axis.label}", x=0.01, ha="left")
    legend_under(fig, axes, look)
    caption = _caption(known, axis, points, references, values, df, coverage)
    written = pd.concat([points[CSV_COLUMNS], references[CSV_COLUMNS]], ignore_index=True)
    return Figure(protocol, caption, save(fig, caption, out_dir, f"{protocol}_{axis.name}", formats, look, written))


def _draw_panel(ax, points: pd.DataFrame, references: pd.DataFrame, style: dict, axis, ids: str) -> None:
    """A panel's lines, each in its own style, side by side where several share an x (dodged by a
    few percent of the axis, so that lines that coincide stay visible), its reduced-shot points
    marked, and its reference lines. Each line's SVG id: `ids`-<its place in the panel>."""
    keys = list(dict.fromkeys(points["key"]))
    for j, key in enumerate(keys):
        part = points[points["key"] == key]
        shift = j - (len(keys) - 1) / 2
        xs = part["x"].to_numpy(dtype=float)
        xs = xs * 1.04**shift if axis.log else xs + 0.01 * shift * max(float(np.ptp(xs)) if len(xs) > 1 else 1.0, 1.0)
        look = style[key]
        n = int(part["n"].min())
        drawn = ax.errorbar(xs, part["mean"], yerr=part["std"].fillna(0), capsize=3, markersize=5, linewidth=1.3,
                            label=f"{part['legend'].iloc[0]} (n={n})", **look)  # fmt: skip
        drawn.lines[0].set_gid(f"{ids}-{j}")
        rightmost = float(points["x"].max())
        for x, x_at, mean, fewer in zip(part["x"], xs, part["mean"], part["effective_shots"], strict=True):
            if fewer is not None and not pd.isna(fewer):  # fewer shots than x: said at the point itself
                ax.plot([x_at], [mean], marker=look["marker"], markersize=11, markerfacecolor="none",
                        markeredgecolor=look["color"], linestyle="none")  # fmt: skip
                # left of a point at the panel's last x: to its right, the label ran into the next panel
                left = float(x) >= rightmost
                ax.annotate(f"[{int(fewer)}-shot]", (x_at, mean), textcoords="offset points",
                            xytext=(-6 if left else 4, -11), ha="right" if left else "left", fontsize=7,
                            color=look["color"], annotation_clip=True)  # fmt: skip
    for ref in references.itertuples():
        colour = style[ref.key]["color"] if ref.key in style else "#555555"
        dotted = ref.kind == "chance"
        ax.axhline(ref.mean, color=colour, linestyle=":" if dotted else (0, (6, 3)), linewidth=1.0 if dotted else 1.2,
                   alpha=0.8, label=None if ref.kind == "chance" else "linear probe of the same features (dashed, "
                   "in its line's colour)")  # fmt: skip


def _references(
    df: pd.DataFrame, reference: str | None, acc: pd.DataFrame, points: pd.DataFrame, coverage: dict
) -> pd.DataFrame:
    """The reference lines of each panel: the stored cell of the `reference` protocol (the one the
    figure's protocol names: the linear probe) for each line's backbone, dataset and input settings
    (res, precision, decoder), in that line's colour; and chance: 100 / the classes present in the
    scored split as the runs stored it (a subset may hold 3 of 37), else the dataset's class count."""
    rows = []
    if reference is not None and reference in set(df["protocol"]):
        probe = columns.measured_columns(df, reference).acc
        if not probe.empty:
            inputs = {k: _inputs(h) for k, h in zip(acc["run_key"], acc["hparams"], strict=True)}
            probe = probe.assign(_inputs=[_inputs(h) for h in probe["hparams"]])
            for (key, panel), part in points.groupby(["key", "panel"], sort=False):
                first_run = part["run_keys"].iloc[0].split()[0]
                mine = probe[(probe["model"] == part["model"].iloc[0])
                             & (probe["weights_sha256"] == part["weights_sha256"].iloc[0])
                             & (probe["dataset"] == part["dataset"].iloc[0])
                             & probe["_inputs"].map(inputs[first_run].__eq__)]  # fmt: skip
                if not mine.empty:
                    percent = mine["value"].astype(float) * 100
                    rows.append({
                        "kind": f"reference: {reference}", "line": f"{part['line'].iloc[0]} · {reference}",
                        "legend": "", "key": key, "panel": panel, "model": part["model"].iloc[0],
                        "weights_sha256": part["weights_sha256"].iloc[0], "dataset": part["dataset"].iloc[0],
                        "setting": part["setting"].iloc[0], "x": None, "mean": float(percent.mean()),
                        "std": float(percent.std(ddof=1)) if len(percent) > 1 else None, "n": len(percent),
                        "effective_shots": None, "run_keys": " ".join(sorted(mine["run_key"].astype(str))),
                    })  # fmt: skip
    for panel, part in points.groupby("panel", sort=False):
        dataset = str(part["dataset"].iloc[0])
        chance = chance_percent(coverage, dataset, _classes(dataset))
        if chance:
            rows.append({"kind": "chance", "line": f"chance · {panel}", "legend": "", "key": None, "panel": panel,
                         "model": None, "weights_sha256": None, "dataset": part["dataset"].iloc[0], "setting": "",
                         "x": None, "mean": chance, "std": None, "n": None, "effective_shots": None,
                         "run_keys": ""})  # fmt: skip
    return pd.DataFrame(rows, columns=[*CSV_COLUMNS, "legend", "key", "panel"])


def _inputs(hparams) -> tuple:
    """A run's input settings (res, precision, decoder, gelu): what a reference must share with a line."""
    setting = run_setting(hparams)
    return tuple(value_text(setting.get(k), k) for k in INPUT_SETTINGS)


def _classes(dataset: str) -> int | None:
    try:
        return int(get_dataset(dataset).num_classes)
    except (UserError, TypeError, ValueError):  # a dataset this installation does not know: no chance line
        return None


def _caption(
    known, axis, points: pd.DataFrame, references: pd.DataFrame, values: list, df: pd.DataFrame, coverage: dict
) -> str:
    """What is drawn, from what is drawn: the protocol and its rule, the values of the axis, the
    lines, what each point is, the reference lines and chance, and the marks that appear (only those)."""
    keys = {k for text in points["run_keys"] for k in text.split()}
    ticks = ", ".join(axis.text(v) for v in values)
    panels = points["panel"].nunique()
    caption = (
        f"{known.label} ({known.version}) at {ticks}{_rule(known, df, keys)}: each point is the mean top-1 accuracy "
        f"over seeds of one table cell (error bar: std; n: runs per point, the fewest on the line), one line per "
        f"model, weights and setting{', a panel per dataset' if panels > 1 else ''}; lines that share an x are "
        f"drawn side by side; every line is drawn ({points['key'].nunique()}), from {runs_text(keys)}."
    )
    linear = references[references["kind"].str.startswith("reference")]
    if not linear.empty:
        caption += (f" Dashed, in a line's colour: the {linear['kind'].iloc[0].split(': ')[1]} probe of the same "
                    "features (the same backbone, dataset, resolution and precision), a reference.")  # fmt: skip
    chance = references[references["kind"] == "chance"]
    if not chance.empty:
        said = "; ".join(f"{c.panel.rstrip(cells.SUBSET_MARK)} {c.mean:.3g}%" for c in chance.itertuples())
        caption += f" Dotted grey: chance, 100 / the classes in the scored split ({said})."
        fewer = fewer_classes_text(coverage, set(chance["dataset"].astype(str)))
        caption += f" Scored on fewer classes than the dataset has: {fewer}." if fewer else ""
    if points["effective_shots"].notna().any():
        caption += (" A ringed point marked [k-shot]: its train split's smallest class has only k images, so its "
                    "runs used k there (fewer than its x).")  # fmt: skip
    labels = " ".join(points["line"])
    for mark, said in ((cells.SUBSET_MARK, "a subset of the official splits"), (cells.RANDOM_MARK, "random-init "
                       "weights"), (cells.SMOKE_MARK, "a smoke run")):  # fmt: skip
        if mark in labels:
            caption += f" {mark}: {said}."
    return caption


def _rule(known, df: pd.DataFrame, keys: set[str]) -> str:
    """The protocol's rule as its axis declares it, with the values its runs stored, after a comma."""
    runs = df[df["run_key"].isin(keys)].drop_duplicates("run_key")
    said = known.axis.rule_text([json_field(h) for h in runs["hparams"]]) if known.axis.rule else ""
    return f", {said}" if said else ""

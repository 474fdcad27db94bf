"""The report's first section: what the store measured (models, datasets, protocols, devices,
dates, code) and the headline numbers — one row per (model and weights, dataset), one column per
transfer protocol, and beside them the paper's cell measured in the same setting where a
`--compare` column is of the same model.

A protocol whose runs vary along an axis shows the axis' headline value (few-shot at 10 shots,
k-NN at k = 20: protocols/measures.Axis), or the most it has. A cell is one setting, never a mean
over several: where a model ran a protocol in several other settings on a dataset (DeiT-Ti at 64
and 224 px, or in fp32 and bf16), the cell shows, by one rule for every dataset, the one at the
weights' native resolution, else the resolution nearest it, then the default precision and
decoder, then the one with the most runs (`headline_setting`), and names it (`(res=224)`); the
protocol's own section shows every setting.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from vitbench.catalog.registry import get_model
from vitbench.errors import UserError
from vitbench.protocols.base import Protocol
from vitbench.protocols.registry import protocols
from vitbench.provenance import ANY, DEFAULT_SETTINGS
from vitbench.reference import paper
from vitbench.store.query import json_field
from vitbench.views.cells import RANDOM_MARK, SMOKE_MARK, Cell, TableData
from vitbench.views.measured.axes import axis_values
from vitbench.views.measured.columns import (
    accelerator_days,
    measured_columns,
    meta_by_column,
    paper_comparable,
    per_distinct,
    seed_cell,
)
from vitbench.views.measured.columns import weights_label as _weights_label
from vitbench.views.measured.dataset_titles import title
from vitbench.views.measured.footnotes import marker_footnotes
from vitbench.views.measured.paper_match import as_values, match
from vitbench.views.tables.table import TABLE2_ROWS


@dataclass
class Summary:
    facts: list[tuple[str, str]] = field(default_factory=list)  # (what, text)
    headline: TableData = field(default_factory=TableData)


IDENTITY = ["model", "weights", "weights_sha256", "random_init"]


def identities(df: pd.DataFrame) -> pd.Series:
    """Each row's (model, weights) as the summary names it: the model, its weights' file stem and
    sha256 start, † at random init. Labelled once per distinct identity, not per row."""
    distinct = df[IDENTITY].drop_duplicates()
    labels = [
        _weights_label(m, w, s, bool(r)) + (RANDOM_MARK if r else "") for m, w, s, r in distinct.itertuples(index=False)
    ]
    keyed = distinct.assign(identity=labels)
    return df[IDENTITY].merge(keyed, on=IDENTITY, how="left")["identity"].set_axis(df.index)


def in_report_order(names) -> list[str]:
    """`names` (protocols) as the report orders them: the registry's order (frozen-feature few-shot,
    fine-tuned, the checkpoint's own head, the other probes; a plugin's after vitbench's), then any
    whose plugin is not installed here, by name."""
    order = {name: i for i, name in enumerate(protocols())}
    return sorted(set(names), key=lambda p: (order.get(p, len(order)), p))


def summarise(df: pd.DataFrame, compare: Sequence[str] = ()) -> Summary:
    out = Summary()
    if df.empty:
        return out
    out.facts = _facts(df)
    out.headline = _headline(df, compare)
    return out


def _facts(df: pd.DataFrame) -> list[tuple[str, str]]:
    runs = df.drop_duplicates("run_key")
    known = protocols()
    per_protocol = runs.groupby("protocol", sort=False)["run_key"].nunique()
    order = in_report_order(per_protocol.index)
    finished = pd.to_datetime(runs["finished_at"], errors="coerce", utc=True).dropna()
    when = (
        f", finished {finished.min():%Y-%m-%d}" + (f" to {finished.max():%Y-%m-%d}" if finished.max().date()
                                                    != finished.min().date() else "")
        if not finished.empty else ""
    )  # fmt: skip
    subset = runs.groupby("dataset", sort=False)["data_subset"].any()
    datasets = [title(str(d)) + (" (subset ‡)" if sub else "") for d, sub in subset.items()]
    hardware = runs[["device_name", "device_count"]].drop_duplicates().dropna(subset=["device_name"])
    devices = sorted(
        {
            f"{name} × {int(count)}" if count and count > 1 else str(name)
            for name, count in hardware.itertuples(index=False)
        }  # fmt: skip
    )
    versions = runs[["vitbench_version", "git_sha", "torch_version", "timm_version"]].drop_duplicates()
    code = sorted(
        {f"vitbench {v} (git {str(g)[:8]}), torch {t}, timm {m}" for v, g, t, m in versions.itertuples(index=False)}
    )
    days = accelerator_days(runs, charged=False)  # what was spent: a shared extraction once
    return [
        ("Runs", f"{len(runs):,}{when}" + (f"; {days:.2g} accelerator-days in all" if days else "")),
        ("Models", "; ".join(dict.fromkeys(identities(runs)))),
        ("Datasets", ", ".join(datasets)),
        ("Protocols", ", ".join(f"{known[p].label if p in known else p} ({per_protocol[p]:,})" for p in order)),
        ("Devices", "; ".join(devices) or "not recorded"),
        ("Code", "; ".join(code)),
    ]


def _headline(df: pd.DataFrame, compare: Sequence[str]) -> TableData:
    data = TableData(title="Headline numbers: top-1 accuracy (%)")
    m = measured_columns(df)
    if m.acc.empty:
        return data
    acc = m.acc.copy()
    acc["identity"] = identities(acc)
    acc = _at_headline(acc)
    known = protocols()
    header, shown = _axis_headers(acc, known)
    meta = meta_by_column(m.runs)
    present = [p for p in in_report_order(acc["protocol"]) if p in known]
    matched = _paper_matches(acc, compare)
    fewer: list[str] = []  # the protocols with a cell away from their headline setting
    several: set[str] = set()  # the protocols with a cell that picked one of several settings
    one_identity = acc["identity"].nunique() == 1
    if one_identity:  # said once, in the title
        data.title += f" · {acc['identity'].iloc[0]}"
    # rows: each model and weights in the views' order, its datasets in Table 2's order (ReaL under ImageNet)
    place = {ident: i for i, ident in enumerate(dict.fromkeys(acc["identity"]))}
    rank = {d: i for i, d in enumerate(TABLE2_ROWS)}
    acc = acc.assign(_i=acc["identity"].map(place), _d=acc["dataset"].map(lambda d: rank.get(d, len(rank))))
    acc = acc.sort_values(["_i", "_d", "dataset"], kind="stable")
    # one protocol, several models: a model per row, a dataset per column (the long form would repeat each model)
    by_dataset = len(present) == 1 and not one_identity and acc["dataset"].nunique() > 1
    if by_dataset:
        data.title = f"Headline numbers: {header[present[0]]} top-1 accuracy (%)"
    placed: dict[str, str] = {}  # dataset -> the row (or, by dataset, the column) that holds it
    for (ident, dataset), part in acc.groupby(["identity", "dataset"], sort=False):
        if by_dataset:
            row, columns = str(ident), {present[0]: title(str(dataset))}
            placed[str(dataset)] = columns[present[0]]
        else:
            row, columns = title(str(dataset)) if one_identity else f"{ident} · {title(str(dataset))}", header
            placed.setdefault(str(dataset), row)
        for p in present:
            data.add_column(columns[p])
        data.add_row(row)
        for p in present:
            mine = part[part["protocol"] == p]
            if mine.empty:
                continue
            col = headline_setting(mine)  # one setting per cell, by the rule in the module's docstring
            chosen = mine[mine["column"] == col]
            cell = seed_cell(chosen, meta[str(col)], include_marked=False)
            cell.rankable = False  # a row's protocols measure different things: none is "the best"
            cell.marks = (SMOKE_MARK if meta[str(col)]["smoke"] else "") + cell.marks
            if mine["column"].nunique() > 1:  # it ran in several settings: the cell names the one shown
                cell.marks += f" ({chosen['series'].iloc[0] or chosen['column'].iloc[0]})"
                several.add(p)
            axis = known[p].axis
            mixed = len(shown.get(p, [])) > 1
            if axis is not None and axis.headline is not None and mixed and mine["_axis"].iloc[0] != axis.headline:
                cell.marks += f" ({axis.text(mine['_axis'].iloc[0])})"
                fewer += [p] if p not in fewer else []
            data.cells[(row, columns[p])] = cell
            for name, paper_cell in matched.get((str(dataset), str(col)), []):
                if by_dataset:  # the paper's column becomes a row of its own
                    where = (f"{name} (paper)", columns[p])
                    data.add_row(where[0])
                else:
                    where = (row, f"{name} (paper)")
                    data.add_column(where[1], is_paper=True)
                data.cells[where] = Cell(paper_cell.value, paper_cell.std, is_paper=True)
    others = _other_models(data, acc, compare, matched, placed, by_dataset)
    _headline_footnotes(data, others, [known[p] for p in fewer])
    if several:
        data.footnotes.append(
            "(res=224) after a value: that model ran the protocol in several settings on that dataset and the cell "
            "shows this one (each setting is a column of the protocol's own table), by one rule for every dataset: "
            "the weights' native resolution where it ran there, else the resolution nearest it, then the default "
            "precision and decoder, then the setting with the most runs"
        )
    marker_footnotes(data, include_marked=False, compared=False)
    return data


def _axis_headers(acc: pd.DataFrame, known) -> tuple[dict[str, str], dict[str, list]]:
    """Each protocol's column header, and the axis values its cells show: one value, and the header
    names it (its headline, or the one every cell shows: "10-shot" titled 25-shot cells, issue 89);
    several, and each cell away from the headline names its own."""
    header = {p: known[p].label for p in known}
    shown = {p: sorted(set(part["_axis"].dropna())) for p, part in acc.groupby("protocol", sort=False)}
    for protocol in known.values():
        axis = protocol.axis
        if axis is not None and axis.headline is not None and len(shown.get(protocol.name) or [None]) == 1:
            header[protocol.name] += f", {axis.text((shown.get(protocol.name) or [axis.headline])[0])}"
    return header, shown


def headline_setting(part: pd.DataFrame) -> str:
    """Of one (model and weights, dataset, protocol)'s columns, the one its headline cell shows, by
    one rule for every dataset: at the weights' native resolution (the model's published input
    size) where it ran there, else at the resolution nearest it; then at the defaults of every other
    input setting (fp32, the references' decoder: `bf16` beside `fp32` never wins by its count of
    runs); then the one with the most runs, then the first in column order."""
    try:
        spec = get_model(str(part["model"].iloc[0]))
        native = spec.preprocessing.size if spec.preprocessing is not None else None
    except UserError:  # a model this installation does not know (a plugin's, uninstalled): no native size
        native = None
    res = pd.to_numeric(per_distinct(part["hparams"], lambda h: json_field(h).get("res")), errors="coerce")
    away = per_distinct(part["hparams"], _away_from_defaults).astype(int)
    ranked = pd.DataFrame({"column": part["column"], "res": res, "away": away}).groupby("column", sort=False).agg(
        res=("res", "first"), away=("away", "first"), runs=("res", "size"))  # fmt: skip
    distance = (ranked["res"] - native).abs() if native is not None else pd.Series(0.0, index=ranked.index)
    order = ranked.assign(distance=distance.fillna(float("inf")), position=range(len(ranked)))
    ranks = ["distance", "away", "runs", "position"]
    return str(order.sort_values(ranks, ascending=[True, True, False, True]).index[0])


def _away_from_defaults(hparams) -> int:
    """How many of a run's settings with a default are not at it (`precision=bf16`: 1)."""
    h = json_field(hparams)
    protocol_defaults = DEFAULT_SETTINGS[ANY]  # the protocol-specific ones never differ between a model's columns
    return sum(1 for name, default in protocol_defaults.items() if h.get(name, default) != default)


def _headline_footnotes(data: TableData, others: list[str], fewer: list[Protocol]) -> None:
    """What the headline's cells are: runs per cell, the paper columns of another model and of the
    same one, and the protocols shown away from their axis' headline value (`fewer`)."""
    counts = {c.n for c in data.cells.values() if not c.is_paper and c.n is not None}
    if len(counts) == 1:
        data.uniform_n = counts.pop()
    runs_said = (
        "one run each" if data.uniform_n == 1 else
        f"mean ± std over {data.uniform_n} runs (seeds) each" if data.uniform_n else "mean ± std over seeds (n runs)"
    )  # fmt: skip
    data.footnotes.append(f"measured cells: top-1 accuracy (%), {runs_said}")
    if others:
        data.footnotes.append(
            f"{', '.join(f'{name} (paper)' for name in others)}: the paper's fine-tuned cell of another model on each "
            "dataset, for reference (as `vitbench table --compare`; no Δ here)"
        )
    if set(data.paper_columns) - {f"{name} (paper)" for name in others}:
        data.footnotes.append(
            "paper columns: the --compare column's cell of the same model, in the setting measured (resolution, "
            "Polyak), beside fine-tuned and eval cells only"
        )
    for protocol in fewer:
        axis = protocol.axis
        assert axis is not None and axis.headline is not None
        data.footnotes.append(
            f"({axis.text('n')}) after a {protocol.label} value: that model has no {axis.text(axis.headline)} "
            f"runs; the most {axis.label} it has"
        )


def _at_headline(acc: pd.DataFrame) -> pd.DataFrame:
    """Each protocol with an axis at its headline value (10 shots, k = 20) where a (model and
    weights) has runs there, else at the most it has; its value on the axis in `_axis`."""
    known = protocols()
    acc = acc.assign(_axis=np.nan)
    keep = pd.Series(True, index=acc.index)
    for name, part in acc.groupby("protocol", sort=False):
        axis = known[name].axis if name in known else None
        if axis is None or axis.headline is None:
            continue
        values = pd.to_numeric(axis_values(part, axis), errors="coerce").astype("float64")  # missing: NaN
        acc.loc[part.index, "_axis"] = values
        headline = axis.headline
        chosen = values.groupby(part["identity"]).agg(lambda v, h=headline: h if (v == h).any() else v.max())
        keep[part.index] = values == part["identity"].map(chosen)
    return acc[keep]


def _other_models(
    data: TableData, acc: pd.DataFrame, compare: Sequence[str], matched: dict, placed: dict[str, str], by_dataset: bool
) -> list[str]:
    """The `compare` columns of no measured model (BiT-L beside a ViT): the paper's cell on each
    dataset shown, a column of their own (a row, where the summary has a column per dataset)."""
    same = {name for cells in matched.values() for name, _ in cells}
    others = [name for name in compare if name not in same]
    for name in others:
        values = as_values(match([name], acc, paper_comparable()), name)
        label = f"{name} (paper)"
        for dataset, value, std in values[["dataset", "value", "std"]].itertuples(index=False):
            if str(dataset) not in placed:
                continue
            where = (label, placed[str(dataset)]) if by_dataset else (placed[str(dataset)], label)
            if by_dataset:
                data.add_row(label)
            else:
                data.add_column(label, is_paper=True)
            data.cells[where] = Cell(float(value), None if pd.isna(std) else float(std), is_paper=True)
    return [name for name in others if any(c.endswith(f"{name} (paper)") for key in data.cells for c in key)]


def _paper_matches(acc: pd.DataFrame, compare: Sequence[str]) -> dict[tuple[str, str], list]:
    """(dataset, measured column) -> [(paper column name, its cell in the same setting)] for the
    `compare` columns of the same model as the measured column's."""
    found: dict[tuple[str, str], list] = {}
    comparable = acc[acc["protocol"].isin(paper_comparable())]
    for name in compare:
        same_model = comparable[comparable["model"].str.lower() == paper.model_of(name)]
        if same_model.empty:
            continue
        matches = match([name], same_model, paper_comparable())
        for (_, dataset, col), (cell, agrees) in matches.against.items():
            if agrees:
                found.setdefault((dataset, col), []).append((name, cell))
    return found

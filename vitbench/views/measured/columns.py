"""Stored runs become labelled columns: one per (model, weights, protocol, shots, setting), named
as views/measured/settings.py names what differs, or per `--group-by` fields, with the cells' mean ± std
over seeds and the markers that withhold a Δ."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from vitbench.datasets.vtab import group_means, group_tasks
from vitbench.protocols.fewshot import choose_sweep_l2
from vitbench.protocols.registry import protocols, with_metric
from vitbench.provenance import canonical_json
from vitbench.store.query import field_values, json_field
from vitbench.views.cells import RANDOM_MARK, SMOKE_MARK, SUBSET_MARK, Cell, TableData
from vitbench.views.measured import contamination
from vitbench.views.measured.axes import with_axes
from vitbench.views.measured.settings import (
    default_columns,
    differing,
    explaining,
    run_setting,
    setting_text,
    value_text,
)
from vitbench.views.measured.shot_counts import cell_effective_shots, effective_shots, fewest_shots


def paper_comparable() -> set[str]:
    """The protocols whose accuracies stand beside the paper's fine-tuned cells (a Δ is shown)."""
    return with_metric(lambda m: m.paper)


def _is_smoke(hparams) -> bool:
    return bool(json_field(hparams).get("smoke"))


def per_distinct(values: pd.Series, fn) -> pd.Series:
    """`values.map(fn)`, calling `fn` once per distinct value: the runs of one setting share their
    hparams text, so a store of 100,000 runs parses a few hundred JSON objects, not 100,000."""
    codes, uniques = pd.factorize(values, use_na_sentinel=False)
    mapped = np.empty(len(uniques), dtype=object)
    mapped[:] = [fn(u) for u in uniques]
    return pd.Series(mapped[codes], index=values.index, dtype=object)


def weights_label(model: str, weights: str, sha: str, random_init: bool) -> str:
    name = str(weights).rsplit("/", 1)[-1]
    for ext in (".safetensors", ".npz", ".pth", ".pt", ".bin"):  # the full name is in the provenance footnote
        name = name.removesuffix(ext)
    shown = "random init" if random_init else f"{name} [{str(sha)[:8]}]"
    return f"{model} ({shown})"


@dataclass
class Measured:
    """Accuracy values (one per run and row dataset) with their column, and every run behind each
    column (LR-sweep runs included) for the cost rows and the provenance footnotes."""

    acc: pd.DataFrame
    runs: pd.DataFrame
    chosen_l2: dict[int, float]
    superseded: int = 0  # earlier runs of the same setting on data whose files have changed since
    # the input settings every column shares, said once under a view (views/measured/settings.common_settings)
    common: dict[str, str] = field(default_factory=dict)


def _base_keys(runs: pd.DataFrame) -> list[tuple]:
    """Each run's column identity (model, weights, random init, protocol, shots, version): results of
    two protocol versions are never averaged (a bump means the numbers changed), so the version is
    part of it, and of the label where a store holds several."""
    cols = runs[["model", "weights_sha256", "random_init", "protocol", "shots", "protocol_version"]].to_numpy(object)
    return [
        (model, sha, bool(random_init), protocol, None if pd.isna(shots) else int(shots), version)
        for model, sha, random_init, protocol, shots, version in cols  # numpy objects: arrow strings iterate slowly
    ]


def measured_columns(
    df: pd.DataFrame,
    protocol: str | None = None,
    shots: int | None = None,
    group_by: Sequence[str] = (),
    keep: set[str] | None = None,
) -> Measured:
    """Label every run with its column. Default columns: (model, weights, protocol, shots, setting),
    where a setting splits a column by the hparams that differ in the view (views/measured/settings.py: e.g.
    `res=96` next to `res=384`, or smoke next to full); `group_by` replaces that key. `keep`: only
    these runs are shown, labelled as among all of `df` (the summary after a run: its runs, named
    as the store's other runs of those datasets tell them apart)."""
    df, chosen = choose_sweep_l2(with_axes(df))  # few-shot's --fewshot-l2 sweep: one λ per shot count
    if protocol is None:  # runs that are not transfer results (pre-training) have views of their own
        df = df[df["protocol"].isin(with_metric(lambda m: m.transfer))]
    else:
        df = df[df["protocol"] == protocol]
    if shots is not None:
        df = df[df["shots"] == shots]
    if df.empty or (keep is not None and not df["run_key"].isin(keep).any()):
        empty = df.iloc[0:0].assign(column=pd.Series(dtype=str), smoke=pd.Series(dtype=bool))
        return Measured(empty, empty.drop_duplicates("run_key"), chosen)

    df = _with_base(in_column_order(df))
    common: dict[str, str] = {}  # said under a view of default columns; --group-by names its own
    if group_by:
        values = [field_values(df, f, "--group-by").map(str) for f in group_by]
        df["column"] = [
            ", ".join(f"{f}={v}" for f, v in zip(group_by, vs, strict=True)) for vs in zip(*values, strict=True)
        ]
        df["column"] = _apart_within(df, group_by)
        marks = df.groupby("column").agg(random=("random_init", "any"), smoke=("smoke", "any"))
        df["column"] = df["column"].map(
            lambda c: (
                c + (RANDOM_MARK if marks.loc[c, "random"] else "") + (SMOKE_MARK if marks.loc[c, "smoke"] else "")
            )
        )
        df = in_column_order(df, by_label=True)
    else:
        df, common = default_labels(df)
        df = in_column_order(df, by_label=True)

    if keep is not None:
        df = df[df["run_key"].isin(keep)]
    df, superseded = _latest_data_only(df)
    if "notes" in df:
        df["effective_shots"] = effective_shots(df["notes"])
    runs = df.drop_duplicates("run_key")
    accuracy = df[df["metric"] == "accuracy"]
    real = df[df["metric"] == "accuracy_real"].assign(dataset="imagenet_real", metric="accuracy")
    acc = pd.concat([accuracy, real], ignore_index=True)
    return Measured(acc, runs, chosen, superseded, common)


def _with_base(df: pd.DataFrame) -> pd.DataFrame:
    """`df` with each run's `smoke` flag and column identity (`base`: _base_keys), worked out once
    per run, not once per metric row (a --fewshot-l2 sweep stores 30 metrics a run)."""
    first = df.drop_duplicates("run_key")
    keys = first["run_key"].to_numpy(object)
    smoke = pd.Series(per_distinct(first["hparams"], _is_smoke).to_numpy(), index=keys)
    base = pd.Series(_base_keys(first), index=keys, dtype=object)
    return df.assign(smoke=df["run_key"].map(smoke), base=df["run_key"].map(base))


def default_labels(df: pd.DataFrame) -> tuple[pd.DataFrame, dict[str, str]]:
    """`df` (stored rows, a row per run and metric, with their axes) with each run's `column`,
    `condition` and `series` as views/measured/settings.py names them among the runs of `df`, and the input
    settings every column shares. The one rule of which cells pair: two cells pair where their
    dataset and condition are the same (`vitbench table --ci`, the report, `compare --all`)."""
    if "base" not in df:
        df = _with_base(df)
    scored = set(df.loc[df["metric"].isin(["accuracy", "accuracy_real"]), "run_key"])
    runs = df.drop_duplicates("run_key")
    labels, conditions, series, common = default_columns(runs, runs["run_key"].isin(scored))
    keys = runs["run_key"].to_numpy(object)
    df = df.assign(
        column=df["run_key"].map(pd.Series(labels.to_numpy(), index=keys)),
        condition=df["run_key"].map(pd.Series(conditions.to_numpy(), index=keys)),
        series=df["run_key"].map(pd.Series(series.to_numpy(), index=keys)),
    )
    return df, common


def _apart_within(df: pd.DataFrame, group_by: Sequence[str]) -> pd.Series:
    """`--group-by` columns split by what their runs still differ in (views/measured/settings.py: a cell is a
    mean over seeds only): the protocol and its version, then the settings within one protocol
    (`data_source=folder · knn · res=64` beside `… · res=224`)."""
    grouped = {f.removeprefix("hparams.") for f in group_by}
    runs = df.drop_duplicates("run_key")
    settings = pd.Series([run_setting(h) for h in runs["hparams"]], index=runs["run_key"].to_numpy(object))
    labels = {}
    for column, part in runs.groupby("column", sort=False):
        protocols_here = part["protocol"].astype(str) + " " + part["protocol_version"].astype(str)
        for _, same in part.groupby(protocols_here, sort=False):
            found = list(settings[same["run_key"].to_numpy(object)])
            keys = explaining(differing(found) - grouped - {"smoke"}, found)
            protocol, prefix = str(same["protocol"].iloc[0]), []
            if "protocol" not in grouped and part["protocol"].nunique() > 1:
                prefix.append(protocol)
            if "protocol_version" not in grouped and protocols_here.nunique() > part["protocol"].nunique():
                prefix.append(str(same["protocol_version"].iloc[0]))
            for key, setting in zip(same["run_key"], found, strict=True):
                named = [*prefix, ", ".join(setting_text(protocol, k, value_text(setting.get(k), k)) for k in keys)]
                labels[key] = " · ".join([column, *[n for n in named if n]])
    return df["run_key"].map(labels)


def in_column_order(df: pd.DataFrame, by_label: bool = False) -> pd.DataFrame:
    """`df` (a copy) with its runs in the order their columns are shown: by model, then weights
    (trained before random init), protocol (in the registry's order), shots; `by_label`: then the
    column labels in natural order (`res=96` before `res=384`). Stable: stored order within. The
    order is worked out once per run, not per metric row (a sweep run stores 30)."""
    runs = df.drop_duplicates("run_key")
    rank = {name: i for i, name in enumerate(protocols())}
    order = pd.DataFrame(
        {
            "model": runs["model"].astype(str).to_numpy(),
            "random": runs["random_init"].fillna(False).astype(bool).to_numpy(),
            "weights": _natural_rank(runs["weights"]),  # a checkpoint series in step order: step_50 < step_1000
            "sha": runs["weights_sha256"].astype(str).to_numpy(),
            "protocol": runs["protocol"].map(rank).fillna(len(rank)).to_numpy(),
            "shots": pd.to_numeric(runs["shots"], errors="coerce").fillna(-1).to_numpy(),
        }
    )
    if by_label:
        order["label"] = _natural_rank(runs["column"])
    place = pd.Series(np.arange(len(runs)), index=runs["run_key"].to_numpy(object)[order.sort_values(
        list(order.columns), kind="mergesort").index.to_numpy()])  # fmt: skip
    return df.iloc[np.argsort(df["run_key"].map(place).to_numpy(), kind="stable")].copy()


def _natural_rank(values: pd.Series) -> np.ndarray:
    """Each value's rank among the distinct values in natural order (sorted once per distinct value)."""
    codes, uniques = pd.factorize(values.astype(str), use_na_sentinel=False)
    ranks = np.empty(len(uniques), dtype=np.int64)
    ranks[sorted(range(len(uniques)), key=lambda i: natural_order(uniques[i]))] = np.arange(len(uniques))
    return ranks[codes]


def natural_order(text: str) -> list:
    """A sort key that reads digits as numbers: `res=96` < `res=384`, `2-shot` < `10-shot`."""
    return [(0, int(piece), "") if piece.isdigit() else (1, 0, piece) for piece in re.split(r"(\d+)", text)]


def _latest_data_only(df: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """Runs that are one run but for the data's fingerprint (its files changed in between, or were
    fingerprinted by content once) are not seeds of one cell: the latest stands for them. Returns
    the runs kept and how many earlier ones were left out."""
    runs = df.drop_duplicates("run_key")
    if len(runs) < 2:
        return df, 0
    hparams = per_distinct(
        runs["hparams"], lambda h: canonical_json({k: v for k, v in json_field(h).items() if k != "test_fingerprint"})
    )
    key = ["column", "dataset", "data_source", "protocol_version", "seed", "shots", "_hparams"]
    order = runs.assign(_hparams=hparams.astype(str))
    latest = order.sort_values("finished_at", na_position="first").drop_duplicates(key, keep="last")
    left_out = len(runs) - len(latest)
    return (df[df["run_key"].isin(latest["run_key"])], left_out) if left_out else (df, 0)


def vtab_rollups(acc: pd.DataFrame) -> pd.DataFrame:
    """The VTAB mean and the group means as rows, per (column, seed), computed only where every
    task of the group has a result (unweighted, as in the paper). Each row copies the first task row
    of its (column, seed), as the table's other rows are runs."""
    tasks = acc[acc["dataset"].str.startswith("vtab/")]
    if tasks.empty:
        return acc.iloc[0:0]
    keys = ["column", "seed"]
    # a task's last row per (column, seed) stands for it, as a dict of task -> value kept the last
    values = tasks.assign(task=tasks["dataset"].str[len("vtab/") :]).drop_duplicates([*keys, "task"], keep="last")
    grid = values.pivot(index=keys, columns="task", values="value")  # (column, seed) x task, NaN where absent
    firsts = tasks.drop_duplicates(keys).set_index(keys)
    subset = tasks.groupby(keys, sort=False)["data_subset"].any()
    # only the (column, seed) that complete a group at all are rolled up (a checkpoint sweep holds
    # thousands that complete none); each with group_means, the one rule
    complete = pd.Series(False, index=grid.index)
    for keys_of_group in group_tasks().values():
        if set(keys_of_group) <= set(grid.columns):
            complete |= grid[keys_of_group].notna().all(axis=1)
    records = []
    for key in firsts.index[complete.reindex(firsts.index).to_numpy()]:  # in order of first appearance
        row = grid.loc[key]
        means = group_means({str(task): float(v) for task, v in row.items() if not pd.isna(v)})
        first = {**firsts.loc[key].to_dict(), "column": key[0], "seed": key[1]}
        for name, value in means.items():
            dataset = name if name == "vtab" else f"vtab_{name}"
            records.append({**first, "dataset": dataset, "value": value, "data_subset": bool(subset[key])})
    return pd.DataFrame(records, columns=acc.columns) if records else acc.iloc[0:0]


def meta_by_column(runs: pd.DataFrame) -> dict[str, dict]:
    meta: dict[str, dict] = {}
    distinct = runs[["column", "random_init", "smoke", "protocol"]].drop_duplicates()  # thousands of runs, few kinds
    for col, part in distinct.groupby("column", sort=False):
        meta[str(col)] = {
            "random": bool(part["random_init"].any()),
            "smoke": bool(part["smoke"].any()),
            "protocols": set(part["protocol"]),
        }
    return meta


def seed_cell(part: pd.DataFrame, column_meta: dict, include_marked: bool) -> Cell:
    """One measured cell: mean ± std over the runs (seeds) of `part`, ‡ when any ran on a subset;
    it ranks for bold only without a marker (or with --include-marked)."""
    fractions = pd.Series(part["value"].to_numpy(dtype=float))
    duplicates = part[contamination.COLUMN].max() if contamination.COLUMN in part else None
    return _cell(
        fractions, bool(part["data_subset"].any()), cell_effective_shots(part), column_meta, include_marked, duplicates
    )


def _cell(
    fractions: pd.Series, subset: bool, effective: int | None, column_meta: dict, include_marked: bool,
    duplicates: float | None = None,
) -> Cell:  # fmt: skip
    values = fractions * 100
    cell = Cell(
        mean=float(values.mean()),
        std=float(values.std(ddof=1)) if len(values) > 1 else None,
        n=len(values),
        marks=SUBSET_MARK if subset else "",
    )
    cell.rankable = include_marked or not (column_meta["random"] or column_meta["smoke"] or cell.marks)
    if effective is not None:
        cell.marks += f" [{effective}-shot]"  # after the rank rule: it says what ran, it withholds nothing
    cell.marks += contamination.mark(duplicates)  # the same: a count to weigh, not a reason to withhold
    return cell


def delta_allowed(meta: dict, cell: Cell, include_marked: bool) -> bool:
    if not meta["protocols"] <= paper_comparable():
        return False
    return include_marked or not (meta["random"] or meta["smoke"] or cell.marks)


def measured_cells(
    data: TableData,
    m: Measured,
    row_of: dict[str, str],
    include_marked: bool,
) -> dict[str, dict]:
    """Fill the measured columns' cells for the datasets in `row_of` (dataset → row label)."""
    acc = pd.concat([m.acc, vtab_rollups(m.acc)], ignore_index=True) if not m.acc.empty else m.acc
    meta = meta_by_column(m.runs)
    for col in dict.fromkeys(m.runs["column"]):
        data.add_column(str(col))
    shown = acc[acc["dataset"].isin(list(row_of))]
    # a cell at a time over plain arrays: slicing the whole frame per cell cost most of a 20,000-run table
    value = shown["value"].to_numpy(dtype=float)
    subset = shown["data_subset"].to_numpy(dtype=bool)
    shots = pd.to_numeric(shown["shots"], errors="coerce").to_numpy(dtype=float)
    effective = (shown["effective_shots"] if "effective_shots" in shown else effective_shots(shown["notes"])).to_numpy(
        dtype=float
    )
    duplicates = shown[contamination.COLUMN].to_numpy(dtype=float) if contamination.COLUMN in shown else None
    keys = shown["run_key"].astype(str).to_numpy(object)
    for (dataset, col), rows in shown.groupby(["dataset", "column"], sort=False).indices.items():
        fewest = fewest_shots(effective[rows], shots[rows])
        most = float(np.nanmax(duplicates[rows])) if duplicates is not None and (duplicates[rows] >= 0).any() else None
        cell = _cell(pd.Series(value[rows]), bool(subset[rows].any()), fewest, meta[str(col)], include_marked, most)
        cell.run_keys = tuple(dict.fromkeys(keys[rows]))
        data.cells[(row_of[str(dataset)], str(col))] = cell
    return meta


def accelerator_days(runs: pd.DataFrame, charged: bool = True) -> float | None:
    """Device-seconds × devices summed over `runs`, in days; None when no run recorded device time.
    `charged` (a table's cost row): each run's own cost where it recorded one (`notes.cost_seconds`:
    the extraction of every image it read, whoever ran it, and its solve: the same whichever run of a
    shared extraction came first), else the device time it spent; without, the device time the runs
    spent (a store's total, where a shared extraction counts once)."""
    seconds = pd.to_numeric(runs["device_seconds"], errors="coerce")
    if charged and "notes" in runs:  # read out of the text, not by parsing every run's notes (a 20,000-run table)
        cost = runs["notes"].astype(str).str.extract(r'"cost_seconds":\s*([-+0-9.eE]+)', expand=False)
        cost = pd.to_numeric(cost, errors="coerce")
        seconds = cost.where(cost.notna(), seconds)
    if not seconds.notna().any():
        return None
    return float((seconds * pd.to_numeric(runs["device_count"], errors="coerce").fillna(1)).sum()) / 86400

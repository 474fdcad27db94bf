"""How sure each cell is (docs/tables.md, "Intervals and significance"): with `--ci`, every measured
cell whose runs kept their per-image predictions gets a 95 % bootstrap interval, and every cell is
compared with its baseline's cell: by default the table's first model, at the same dataset, protocol,
shots and setting; named (`--baseline model=deit-ti/16,res=224`), the baseline's cell of the same
dataset, protocol, version and shots or k, whatever the backbone, weights or resolution (Table 2's
backbones, each at its own resolution: views/measured/settings.pairing), on the same test images
(exact McNemar for one run each, a paired bootstrap over seeds otherwise); a difference significant
after Holm's correction over the table's comparisons is marked, and the legend names each pair.
Runs without predictions (stored before they were kept) get neither, and a footnote says how many.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from vitbench.errors import UserError
from vitbench.store.predictions import IDS_AS_DIGESTS_ABOVE, read_outcomes
from vitbench.store.query import apply_where, json_field
from vitbench.views.cells import TableData
from vitbench.views.measured.columns import weights_label
from vitbench.views.measured.settings import also_differ, pairing, run_setting
from vitbench.views.statistics import methods as stats

SIGNIFICANT_MARK = "*"
# rows not scored on the kept labels: ReaL (its labels are not in the predictions) gets no interval
DERIVED_ROWS = {"imagenet_real"}
ALPHA = 0.05


def outcomes(results: Path, runs: pd.DataFrame, lost: list[str] | None = None) -> dict[str, pd.Series]:
    """run_key -> per-image correctness indexed by image id, for the runs that kept predictions. With
    `lost`, a run whose predictions file is missing, changed or unreadable is read around (its one
    line goes into `lost`); without, that line is the error. Where a run kept more than
    IDS_AS_DIGESTS_ABOVE images, every run's images are indexed by their ids' digests (one kind of
    index for the whole view, so that runs still pair)."""
    unique = runs.drop_duplicates("run_key")
    recorded = {str(r.run_key): json_field(r.notes).get("predictions") for r in unique.itertuples()}
    digests = any(isinstance(p, dict) and (p.get("rows") or 0) > IDS_AS_DIGESTS_ABOVE for p in recorded.values())
    found: dict[str, pd.Series] = {}
    for key, kept in recorded.items():
        try:
            series = read_outcomes(results, key, kept, digests)
        except UserError as e:
            if lost is None:
                raise
            lost.append(str(e))
            continue
        if series is not None:
            found[key] = series
    if digests and any(s.index.dtype.kind != "u" for s in found.values()):  # a run read by its ids after all
        return {k: read_outcomes(results, k, recorded[k]) for k in found}  # type: ignore[misc]
    return found


@dataclass
class Scored:
    """One cell's per-image correctness: a row per run in seed order (`seeds`), a column per image
    (`images`: the ids, or their digests, every run of the cell scored, in the first run's order).
    Numpy, not a DataFrame: a DataFrame of 10M image columns took seconds per index operation."""

    seeds: list[int]
    images: np.ndarray
    values: np.ndarray  # (seeds, images), bool

    @property
    def shape(self) -> tuple[int, int]:
        return self.values.shape

    def to_numpy(self) -> np.ndarray:
        return self.values


def _common(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray | slice, np.ndarray | slice]:
    """Where the images both `a` and `b` hold are in each, in `a`'s order: every position where the two
    are the same images in the same order (a test split scored twice: compared, not joined)."""
    if len(a) == len(b) and np.array_equal(a, b):
        return slice(None), slice(None)
    _, in_a, in_b = np.intersect1d(a, b, return_indices=True)
    order = np.argsort(in_a, kind="stable")
    return in_a[order], in_b[order]


def matrix(keys: list[str], seeds: list[int], kept: dict[str, pd.Series]) -> Scored | None:
    """(seed x image) correctness of one cell's runs, on the images every run scored; None when a
    run kept no predictions."""
    if not keys or any(k not in kept for k in keys):
        return None
    order = sorted(range(len(keys)), key=lambda i: seeds[i])
    first = kept[keys[order[0]]]
    images, rows = first.index.to_numpy(), [first.to_numpy(bool)]
    for i in order[1:]:
        other = kept[keys[i]]
        here, there = _common(images, other.index.to_numpy())
        images, rows = images[here], [r[here] for r in rows] + [other.to_numpy(bool)[there]]
    return Scored([seeds[i] for i in order], images, np.vstack(rows))


def _cells(m_acc: pd.DataFrame, row_of: dict[str, str]) -> dict[tuple[str, str], tuple[list[str], list[int]]]:
    cells = {}
    for (dataset, col), part in m_acc.groupby(["dataset", "column"], sort=False):
        if dataset in row_of:
            cells[(row_of[str(dataset)], str(col))] = (list(part["run_key"]), [int(s) for s in part["seed"]])
    return cells


def add_significance(
    data: TableData, acc: pd.DataFrame, row_of: dict[str, str], results: Path, baseline: Sequence[str] = ()
) -> None:
    """Intervals on the measured cells and marks on the significant differences (see the module)."""
    acc = acc[~acc["dataset"].isin(DERIVED_ROWS)] if not acc.empty else acc
    if acc.empty:
        return
    lost: list[str] = []  # one damaged file costs its own cell's interval, not the table's
    kept = outcomes(results, acc, lost)
    cells = _cells(acc, row_of)
    matrices = {where: matrix(*runs, kept) for where, runs in cells.items()}
    for where, found in matrices.items():
        if found is not None and where in data.cells:
            data.cells[where].interval = stats.bootstrap_interval(found.to_numpy())
    testable = [c for c in data.columns if any(found is not None for (_, col), found in matrices.items() if col == c)]
    against, described, notes = baseline_columns(acc, testable, baseline)
    tests = _paired_tests(data, matrices, against)
    adjusted = stats.holm([t[2].p for t in tests])
    for (where, base, result), p in zip(tests, adjusted, strict=True):
        cell = data.cells[where]
        cell.baseline, cell.p, cell.p_holm = base, result.p, p  # for `export --cells` and the report's hover
        if p < ALPHA:
            cell.marks += f" {SIGNIFICANT_MARK}"
    without = sum(found is None for found in matrices.values())
    data.footnotes.append(
        f"[lo, hi]: 95 % percentile bootstrap interval over test images (and seeds, for a mean of seeds), "
        f"{stats.SAMPLES} resamples, seed {stats.SEED}"
        + (f"; {without} cell(s) without kept predictions have none" if without else "")
    )
    data.footnotes += [f"no interval for this run: {line}" for line in lost]
    data.footnotes.append(_legend(described, tests, bool(baseline), notes))


EVERY_COLUMN = " matches every column of this table"


def _legend(described: str, tests: list, named: bool = False, notes: dict[str, list[str]] | None = None) -> str:
    """What a mark compares: the baseline, and each pair of columns tested, with what else than the
    backbone a pair differs in beside it (`named`: the baseline was named, so pairs cross settings)."""
    rule = "protocol, version and shots or k" if named else "protocol, shots and setting"
    if not tests and described.endswith(EVERY_COLUMN):  # said as it is (issue 89: "no cell has a baseline cell")
        return (
            f"{SIGNIFICANT_MARK}: --baseline {described}, so none is left to test against it; name what the "
            "baseline alone has (e.g. model=deit-ti/16 or weights=random)"
        )
    if not tests:
        return (
            f"{SIGNIFICANT_MARK}: no cell has a baseline cell ({described}) at the same dataset, {rule} "
            "with kept predictions on the same images, so none is tested (--baseline names another)"
        )
    notes = notes or {}
    said = {}
    for (_, col), base, _ in tests:
        also = notes.get(col) or []
        said.setdefault(f"[{col}] vs [{base}]" + (f" (also {', '.join(also)})" if also else ""), None)
    free = "; the backbone, weights and resolution may differ, as the labels say" if named else ""
    return (
        f"{SIGNIFICANT_MARK} differs from the baseline ({described}) at the same dataset, {rule}, on the same "
        f"test images{free}: exact McNemar (one run each) or a paired bootstrap over seeds, p < {ALPHA} after "
        f"Holm's correction over the table's {len(tests)} comparison(s); pairs: {', '.join(said)}"
    )


def baseline_columns(
    acc: pd.DataFrame, columns: Sequence[str], baseline: Sequence[str]
) -> tuple[dict[str, str], str, dict[str, list[str]]]:
    """Each of `columns` (those whose cells can be tested, in table order) -> the baseline column
    its cells are tested against; the baseline in words; and, per column, the settings other than the
    backbone's own in which it differs from its baseline (views/measured/settings.also_differ). Named by
    `baseline`'s clauses (`model=deit-ti/16,res=224`, `weights=random`), a pair is what a researcher
    compares: the same protocol, version and shots or k (views/measured/settings.pairing), the backbone,
    weights, resolution, precision or decoder free to differ (Table 2's backbones each at its own
    resolution); where several baseline columns fit, the one of the same condition, then of the same
    model. Without `baseline`: the first column's model and weights, paired within one condition
    (protocol, shots, version and every named setting) as before."""
    runs = acc.drop_duplicates(["column", "run_key"])
    backbone: dict[str, tuple] = {}
    condition: dict[str, str] = {}
    paired_by: dict[str, str] = {}
    settings: dict[str, list[dict]] = {}
    for col, part in runs.groupby("column", sort=False):
        identities = set(
            zip(part["model"], part["weights_sha256"].astype(str), part["random_init"].astype(bool), strict=True)
        )
        conditions = set(part["condition"]) if "condition" in part else {None}
        pairings = {pairing(r.protocol, r.shots, r.protocol_version, r.hparams) for r in part.itertuples()}
        if len(identities) == 1 and len(conditions) == 1 and None not in conditions and len(pairings) == 1:
            backbone[str(col)], condition[str(col)] = identities.pop(), str(conditions.pop())
            paired_by[str(col)] = pairings.pop() if baseline else condition[str(col)]
            settings[str(col)] = [run_setting(h) for h in part["hparams"]]
    ordered = [c for c in columns if c in backbone]
    if baseline:
        # none selected here: the legend says no cell is tested
        chosen = set(apply_where(runs, list(baseline), "--baseline")["column"])
        described = ",".join(baseline)
        if len(ordered) > 1 and set(ordered) <= chosen:
            described += EVERY_COLUMN
    elif ordered:
        first = runs[runs["column"] == ordered[0]].iloc[0]
        chosen = {c for c in ordered if backbone[c] == backbone[ordered[0]]}
        described = "the first model: " + weights_label(
            first.model, first.weights, first.weights_sha256, bool(first.random_init)
        )
    else:
        return {}, "none: the columns mix backbones or settings", {}
    against: dict[str, str] = {}
    notes: dict[str, list[str]] = {}
    for col in ordered:
        if col in chosen:
            continue
        fits = [b for b in ordered if b in chosen and paired_by[b] == paired_by[col]]
        if not fits:
            continue
        fits.sort(key=lambda b: (condition[b] != condition[col], backbone[b][0] != backbone[col][0]))
        against[col] = base = fits[0]
        protocol = str(runs.loc[runs["column"] == col, "protocol"].iloc[0])
        same = backbone[base][0] == backbone[col][0]
        notes[col] = also_differ(protocol, settings[col], settings[base], same)
    return against, described, notes


def _paired_tests(
    data: TableData, matrices: dict, against: dict[str, str]
) -> list[tuple[tuple[str, str], str, stats.Comparison]]:
    """Each measured cell against its baseline column's cell in the same row, on the same images."""
    tests = []
    for row in data.rows:
        for col in data.columns:
            base = against.get(col)
            if base is None or matrices.get((row, col)) is None or matrices.get((row, base)) is None:
                continue
            pair = paired_outcomes(matrices[(row, base)], matrices[(row, col)])
            if pair is not None:
                tests.append(((row, col), base, stats.compare(*pair)))
    return tests


def paired_outcomes(a: Scored, b: Scored) -> tuple[np.ndarray, np.ndarray] | None:
    """Two cells' matrices on their common images, seeds paired by number (one run each: paired as is)."""
    here, there = _common(a.images, b.images)
    if not len(a.images[here]):
        return None
    if len(a.seeds) == 1 and len(b.seeds) == 1:
        return a.values[:, here], b.values[:, there]
    seeds = sorted(set(a.seeds) & set(b.seeds))
    if not seeds:
        return None
    rows_a, rows_b = [a.seeds.index(s) for s in seeds], [b.seeds.index(s) for s in seeds]
    return a.values[rows_a][:, here], b.values[rows_b][:, there]

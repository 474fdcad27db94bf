"""How sure each cell is (docs/tables.md, "Intervals and significance"): with `--ci`, every measured
cell whose runs kept their per-image predictions gets a 95 % bootstrap interval, and every cell is
compared with the row's first measured column on the same test images (exact McNemar for one run
each, a paired bootstrap over seeds otherwise); a difference significant after Holm's correction
over the table's comparisons is marked. Runs without predictions (stored before they were kept)
get neither, and a footnote says how many.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from vitbench import stats
from vitbench.errors import UserError
from vitbench.store.predictions import read_predictions
from vitbench.store.query import apply_where, json_field
from vitbench.views.cells import SUBSET_MARK, Cell, TableData
from vitbench.views.shot_counts import cell_effective_shots

SIGNIFICANT_MARK = "*"
# rows not scored on the kept labels: ReaL (its labels are not in the predictions) gets no interval
DERIVED_ROWS = {"imagenet_real"}
ALPHA = 0.05


def outcomes(results: Path, runs: pd.DataFrame, lost: list[str] | None = None) -> dict[str, pd.Series]:
    """run_key -> per-image correctness indexed by image id, for the runs that kept predictions. With
    `lost`, a run whose predictions file is missing, changed or unreadable is read around (its one
    line goes into `lost`); without, that line is the error."""
    found: dict[str, pd.Series] = {}
    for run in runs.drop_duplicates("run_key").itertuples():
        try:
            table = read_predictions(results, str(run.run_key), json_field(run.notes).get("predictions"))
        except UserError as e:
            if lost is None:
                raise
            lost.append(str(e))
            continue
        if table is not None:
            found[str(run.run_key)] = pd.Series(table["correct"].to_numpy(), index=table["id"].astype(str))
    return found


def matrix(keys: list[str], seeds: list[int], kept: dict[str, pd.Series]) -> pd.DataFrame | None:
    """(seed x image) correctness of one cell's runs, on the images every run scored; None when a
    run kept no predictions."""
    if not keys or any(k not in kept for k in keys):
        return None
    frame = pd.concat([kept[k].rename(seed) for k, seed in zip(keys, seeds, strict=True)], axis=1, join="inner")
    return frame.T.sort_index()  # rows: seeds in order


def _cells(m_acc: pd.DataFrame, row_of: dict[str, str]) -> dict[tuple[str, str], tuple[list[str], list[int]]]:
    cells = {}
    for (dataset, col), part in m_acc.groupby(["dataset", "column"], sort=False):
        if dataset in row_of:
            cells[(row_of[str(dataset)], str(col))] = (list(part["run_key"]), [int(s) for s in part["seed"]])
    return cells


def add_significance(data: TableData, acc: pd.DataFrame, row_of: dict[str, str], results: Path) -> None:
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
    tests = _paired_tests(data, matrices)
    adjusted = stats.holm([t[2].p for t in tests])
    for (where, _, _), p in zip(tests, adjusted, strict=True):
        if p < ALPHA:
            data.cells[where].marks += f" {SIGNIFICANT_MARK}"
    without = sum(found is None for found in matrices.values())
    data.footnotes.append(
        f"[lo, hi]: 95 % percentile bootstrap interval over test images (and seeds, for a mean of seeds), "
        f"{stats.SAMPLES} resamples, seed {stats.SEED}"
        + (f"; {without} cell(s) without kept predictions have none" if without else "")
    )
    data.footnotes += [f"no interval for this run: {line}" for line in lost]
    if tests:
        data.footnotes.append(
            f"{SIGNIFICANT_MARK} differs from the row's first measured column on the same test images: exact "
            f"McNemar (one run each) or a paired bootstrap over seeds, p < {ALPHA} after Holm's correction over "
            f"the table's {len(tests)} comparison(s)"
        )


def _paired_tests(data: TableData, matrices: dict) -> list[tuple[tuple[str, str], str, stats.Comparison]]:
    """Each measured cell against the first measured cell of its row with predictions on the same images."""
    tests = []
    for row in data.rows:
        present = [(col, matrices[(row, col)]) for col in data.columns if matrices.get((row, col)) is not None]
        if len(present) < 2:
            continue
        baseline, base = present[0]
        for col, other in present[1:]:
            pair = _paired(base, other)
            if pair is not None:
                tests.append(((row, col), baseline, stats.compare(*pair)))
    return tests


def _paired(a: pd.DataFrame, b: pd.DataFrame) -> tuple[np.ndarray, np.ndarray] | None:
    """Two cells' matrices on their common images, seeds paired by number (one run each: paired as is)."""
    images = a.columns.intersection(b.columns)
    if not len(images):
        return None
    if len(a) == 1 and len(b) == 1:
        return a[images].to_numpy(), b[images].to_numpy()
    seeds = a.index.intersection(b.index)
    if not len(seeds):
        return None
    return a.loc[seeds, images].to_numpy(), b.loc[seeds, images].to_numpy()


def compare_view(df: pd.DataFrame, a: list[str], b: list[str], results: Path) -> TableData:
    """`vitbench compare A B`: per dataset that both select, B − A on the same test images, its 95 %
    interval and p-value (exact McNemar for one run each, paired bootstrap over seeds), and the
    p-value after Holm's correction over the datasets compared."""
    runs = df[df["metric"] == "accuracy"] if not df.empty else df
    clauses = {"A": a, "B": b}
    sides = {name: apply_where(runs, side) for name, side in clauses.items()}
    for name, part in sides.items():
        if part.empty:
            raise UserError(f"compare {name} ({', '.join(a if name == 'A' else b)}): selects no stored accuracy")
    kept = outcomes(results, pd.concat(sides.values()))
    rows, notes = [], []
    for dataset in sorted(set(sides["A"]["dataset"]) & set(sides["B"]["dataset"])):
        found = {n: _side(p[p["dataset"] == dataset], n, dataset, kept, clauses[n]) for n, p in sides.items()}
        pair = _paired(found["A"], found["B"])
        if pair is not None:
            rows.append((dataset, *pair, stats.compare(*pair)))
            notes += _different_test_sets(dataset, sides, found, pair[0].shape[1])
    if not rows:
        raise UserError("compare: A and B share no dataset whose runs kept per-image predictions on the same images")
    adjusted = stats.holm([r[3].p for r in rows])
    data = TableData(title=f"B − A on the same test images · A: {', '.join(a)} · B: {', '.join(b)}")
    for title in ("A top-1 (%)", "B top-1 (%)", "Δ B − A (points)", "95 % interval of Δ", "p", "p (Holm)", "test"):
        data.add_column(title)
    for (dataset, ma, mb, result), p_holm in zip(rows, adjusted, strict=True):
        data.add_row(dataset)
        a_mean, b_mean = ma.mean() * 100, mb.mean() * 100  # on the images both sides scored
        marks = {n: _marks(p[p["dataset"] == dataset]) for n, p in sides.items()}
        cells = [  # (value for CSV, text)
            (a_mean, f"{a_mean:.2f} (n={len(ma)}){marks['A']}"),
            (b_mean, f"{b_mean:.2f} (n={len(mb)}){marks['B']}"),
            (result.delta * 100, f"{result.delta * 100:+.2f}"),
            (None, f"[{result.low * 100:+.2f}, {result.high * 100:+.2f}]"),
            (result.p, result.p_text()),
            (p_holm, result.p_text(p_holm)),
            (None, result.test),
        ]
        for col, (value, text) in zip(data.columns, cells, strict=True):
            data.cells[(dataset, col)] = Cell(mean=value, text=text)
    data.footnotes += notes
    shown = " ".join(data.cells[(r, c)].text or "" for r in data.rows for c in data.columns[:2])
    if SUBSET_MARK in shown:
        data.footnotes.append(f"{SUBSET_MARK} measured on a subset of the official splits")
    if "-shot]" in shown:
        data.footnotes.append(
            "[k-shot]: the fewest training images a class had, where fewer than the shots asked for; two sides "
            "with the same k trained on the same images, so their Δ is 0 by construction"
        )
    return data


def _different_test_sets(dataset: str, sides: dict, found: dict, paired: int) -> list[str]:
    """A footnote where the two sides were not scored on one test set (a folder that grew, say):
    the comparison holds on the images both scored, and only there."""
    prints = {
        n: sorted({_test_fingerprint(r) for r in p[p["dataset"] == dataset].itertuples()}) for n, p in sides.items()
    }
    counts = {n: found[n].shape[1] for n in found}
    if prints["A"] == prints["B"] and counts["A"] == counts["B"] == paired:
        return []
    named = {n: ", ".join(f[:8] for f in fps) for n, fps in prints.items()}
    return [
        f"{dataset}: A and B were scored on different test sets (fingerprints {named['A']} and {named['B']}; A "
        f"scored {counts['A']} images, B {counts['B']}): every figure of this row is on the {paired} images both "
        "scored (an image is taken as the same where its name is)"
    ]


def _test_fingerprint(run) -> str:
    """The scored split's fingerprint: planned into hparams, or the run's data identity where the
    protocol learns nothing and scores the split it is given (eval)."""
    return str(json_field(run.hparams).get("test_fingerprint") or run.data_fingerprint)


def _marks(part: pd.DataFrame) -> str:
    """A side's marks on one dataset: ‡ (a subset), [k-shot] (fewer shots than asked for)."""
    marks = SUBSET_MARK if part["data_subset"].any() else ""
    fewest = cell_effective_shots(part)  # the rule a table cell's [k-shot] follows
    return marks + (f" [{fewest}-shot]" if fewest is not None else "")


# the fields that tell two runs of one seed apart, in the order a person would name them
DISTINGUISHING = ("model", "weights", "protocol", "shots", "protocol_version", "data_source")


def _narrowing(part: pd.DataFrame, clauses: list[str]) -> str:
    """What to add to a side that selects several runs per seed: the first field whose values differ
    among them, and the side's clauses with one that picks one of its values."""
    for field in DISTINGUISHING:
        values = sorted(part[field].dropna().astype(str).unique())
        if len(values) > 1:
            listed = ", ".join(values[:4]) + (", …" if len(values) > 4 else "")
            narrowed = ",".join([*clauses, f"{field}={values[0]}"])
            return f"they differ in {field} ({listed}): narrow it, e.g. {narrowed} (or --where for both sides)"
    return "several runs share a seed: narrow it (e.g. model=…, shots=…, protocol=…)"


def _side(part: pd.DataFrame, name: str, dataset: str, kept: dict[str, pd.Series], clauses: list[str]) -> pd.DataFrame:
    seeds = part["seed"].astype(int)
    if seeds.duplicated().any():
        narrowing = _narrowing(part, clauses)
        raise UserError(f"compare {name}: selects {part['run_key'].nunique()} runs on {dataset}; {narrowing}")
    found = matrix(list(part["run_key"]), list(seeds), kept)
    if found is None:
        raise UserError(f"compare {name}: a run on {dataset} kept no per-image predictions (stored before they were)")
    return found

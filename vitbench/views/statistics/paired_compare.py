"""`vitbench compare A B` (docs/tables.md, "Intervals and significance"): per dataset both sides
select, B − A on the same test images, its 95 % interval and p-value, Holm over the rows; with
`--all`, a row per dataset and setting. It pairs runs and tests them as `table --ci` does
(views/statistics/significance.py: outcomes, matrix, the paired test); this module is what is compare's own —
its sides, units, narrowing advice and footnotes."""

from __future__ import annotations

import logging
from pathlib import Path

import pandas as pd

from vitbench.errors import UserError
from vitbench.store.query import apply_where, json_field
from vitbench.views.cells import SUBSET_MARK, Cell, TableData
from vitbench.views.measured.axes import with_axes
from vitbench.views.measured.columns import default_labels, natural_order
from vitbench.views.measured.settings import differing, explaining, pairing, run_setting, value_text
from vitbench.views.measured.shot_counts import cell_effective_shots
from vitbench.views.statistics import methods as stats
from vitbench.views.statistics.significance import Scored, matrix, outcomes, paired_outcomes

log = logging.getLogger("vitbench")


def compare_view(df: pd.DataFrame, a: list[str], b: list[str], results: Path, every_setting: bool = False) -> TableData:
    """`vitbench compare A B`: per dataset that both select, B − A on the same test images, its 95 %
    interval and p-value (exact McNemar for one run each, paired bootstrap over seeds), and the
    p-value after Holm's correction over the rows compared. `every_setting` (`--all`): a row per
    dataset and setting (protocol, shots, version, the settings a table column names) that both
    select, so "A vs B at every shared setting" is one call."""
    df = with_axes(df)
    runs = df[df["metric"] == "accuracy"] if not df.empty else df
    clauses = {"A": a, "B": b}
    sides = {name: apply_where(runs, side) for name, side in clauses.items()}
    for name, part in sides.items():
        if part.empty:
            raise UserError(f"compare {name} ({', '.join(a if name == 'A' else b)}): selects no stored accuracy")
    alone: list[str] = []
    if every_setting:
        sides, alone = _with_settings(sides)
    else:
        sides = {n: p.assign(unit=p["dataset"]) for n, p in sides.items()}
    lost: list[str] = []  # one changed or damaged file costs its own runs, not the comparison
    kept = outcomes(results, pd.concat(sides.values()), lost)
    for line in lost:
        log.warning("%s; left out of the comparison", line)
    rows, notes = [], [f"left out: {line}" for line in lost]
    for unit in sorted(set(sides["A"]["unit"]) & set(sides["B"]["unit"]), key=natural_order):
        parts = {n: p[p["unit"] == unit] for n, p in sides.items()}
        found = {n: _side(part, n, unit, kept, clauses[n]) for n, part in parts.items()}
        pair = paired_outcomes(found["A"], found["B"])
        if pair is not None:
            rows.append((unit, *pair, stats.compare(*pair)))
            notes += _different_test_sets(unit, parts, found, pair[0].shape[1])
    if not rows:
        what = "dataset and setting" if every_setting else "dataset"
        raise UserError(f"compare: A and B share no {what} whose runs kept per-image predictions on the same images")
    adjusted = stats.holm([r[3].p for r in rows])
    data = TableData(title=f"B − A on the same test images · A: {', '.join(a)} · B: {', '.join(b)}")
    for title in ("A top-1 (%)", "B top-1 (%)", "Δ B − A (points)", "95 % interval of Δ", "p", "p (Holm)", "test"):
        data.add_column(title)
    for (unit, ma, mb, result), p_holm in zip(rows, adjusted, strict=True):
        data.add_row(unit)
        a_mean, b_mean = ma.mean() * 100, mb.mean() * 100  # on the images both sides scored
        marks = {n: _marks(p[p["unit"] == unit]) for n, p in sides.items()}
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
            data.cells[(unit, col)] = Cell(mean=value, text=text)
    data.footnotes += notes + alone
    shown = " ".join(data.cells[(r, c)].text or "" for r in data.rows for c in data.columns[:2])
    if SUBSET_MARK in shown:
        data.footnotes.append(f"{SUBSET_MARK} measured on a subset of the official splits")
    if "-shot]" in shown:
        data.footnotes.append(
            "[k-shot] after a value: its train split's smallest class has only k images, so the runs used k there "
            "(fewer than the shots the row names)"
        )
    return data


def _with_settings(sides: dict[str, pd.DataFrame]) -> tuple[dict[str, pd.DataFrame], list[str]]:
    """Each side's runs with their unit, `dataset · condition`: the condition their table column has
    among the runs of both sides (views/measured/columns.default_labels: protocol, shots, version and the
    settings that differ, `res=224`, `k=20`; not what follows from the backbone, so DeiT-Ti at 224 px
    pairs with ResNet-18 at 224 px): the rule `vitbench table --ci` pairs cells by. Conditions that
    have no partner on the other side are then paired as `--baseline` pairs (views/measured/settings.pairing:
    the same protocol, version and shots or k), where one condition of each side has that pairing on a
    dataset: `compare res=112 res=224 --all` gives a row per dataset, protocol and shot count, and a
    footnote names what the row's two sides differ in. Also the units a side still has alone."""
    labelled, _ = default_labels(pd.concat(sides.values()).drop_duplicates("run_key"))
    condition = pd.Series(labelled["condition"].to_numpy(), index=labelled["run_key"].to_numpy(object))
    out = {
        name: part.assign(unit=part["dataset"].astype(str) + " · " + part["run_key"].map(condition))
        for name, part in sides.items()
    }
    alone = {n: set(out[n]["unit"]) - set(out[o]["unit"]) for n, o in (("A", "B"), ("B", "A"))}
    notes = []
    by_pairing: dict[str, dict[tuple[str, str], set[str]]] = {"A": {}, "B": {}}
    for name, part in out.items():
        for run in part[part["unit"].isin(alone[name])].itertuples():
            key = (str(run.dataset), pairing(run.protocol, run.shots, run.protocol_version, run.hparams))
            by_pairing[name].setdefault(key, set()).add(str(run.unit))
    renamed: dict[str, dict[str, str]] = {"A": {}, "B": {}}
    for key, units_a in by_pairing["A"].items():
        units_b = by_pairing["B"].get(key, set())
        if len(units_a) == 1 and len(units_b) == 1:
            (unit_a,), (unit_b,) = units_a, units_b
            unit = " · ".join(key)
            renamed["A"][unit_a], renamed["B"][unit_b] = unit, unit
            parts = {n: u.split(" · ")[1:] for n, u in (("A", unit_a), ("B", unit_b))}
            apart = [f"{n} at {', '.join(p for p in mine if p not in parts['B' if n == 'A' else 'A']) or '—'}"
                     for n, mine in parts.items()]  # fmt: skip
            notes.append(f"{unit}: A and B paired across settings ({', '.join(apart)})")
    for name in out:
        out[name] = out[name].assign(unit=out[name]["unit"].replace(renamed[name]))
        alone[name] -= set(renamed[name])
    said = [
        f"{name} alone (no {other} run at the same setting, so no row): "
        + "; ".join(sorted(alone[name], key=natural_order))
        for name, other in (("A", "B"), ("B", "A"))
        if alone[name]
    ]
    return out, said + notes


def _different_test_sets(unit: str, parts: dict, found: dict, paired: int) -> list[str]:
    """A footnote where the two sides were not scored on one test set (a folder that grew, say):
    the comparison holds on the images both scored, and only there."""
    prints = {n: sorted({_test_fingerprint(r) for r in p.itertuples()}) for n, p in parts.items()}
    counts = {n: found[n].shape[1] for n in found}
    if prints["A"] == prints["B"] and counts["A"] == counts["B"] == paired:
        return []
    named = {n: ", ".join(f[:8] for f in fps) for n, fps in prints.items()}
    return [
        f"{unit}: A and B were scored on different test sets (fingerprints {named['A']} and {named['B']}; A "
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
    """What to add to a side that selects several runs per seed: the fields, else the settings
    (views/measured/settings.py: `res`, `knn_k`, `precision`, …), whose values differ among them, and the
    side's clauses with one that picks one of the values of the first (`res=224`)."""
    apart: dict[str, list[str]] = {}
    for field in DISTINGUISHING:
        values = sorted(part[field].dropna().astype(str).unique(), key=natural_order)
        if len(values) > 1:
            apart[field] = values
    if not apart:
        settings = list(part.drop_duplicates("run_key")["hparams"].map(run_setting))
        for key in explaining(differing(settings), settings):
            apart[key] = sorted({value_text(s.get(key), key) for s in settings}, key=natural_order)
    if not apart:
        return "several runs share a seed: narrow it (e.g. model=…, shots=…, protocol=…)"
    said = "; ".join(f"{k} ({', '.join(v[:4])}{', …' if len(v) > 4 else ''})" for k, v in apart.items())
    field, values = next(iter(apart.items()))
    narrowed = ",".join([*clauses, f"{field}={values[0]}"])
    return f"they differ in {said}: narrow it, e.g. {narrowed} (or --where for both sides, or --all for a row each)"


def _side(part: pd.DataFrame, name: str, dataset: str, kept: dict[str, pd.Series], clauses: list[str]) -> Scored:
    seeds = part["seed"].astype(int)
    if seeds.duplicated().any():
        narrowing = _narrowing(part, clauses)
        raise UserError(f"compare {name}: selects {part['run_key'].nunique()} runs on {dataset}; {narrowing}")
    found = matrix(list(part["run_key"]), list(seeds), kept)
    if found is None:
        raise UserError(f"compare {name}: a run on {dataset} kept no per-image predictions (stored before they were)")
    return found

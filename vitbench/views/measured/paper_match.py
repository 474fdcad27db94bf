"""Which of the paper's cells a measured cell is compared with: the one measured in the same
setting. A paper column can hold one dataset in several tables (ViT-L/16-I21k's ImageNet is 85.30
in Table 2, at 512 px with Polyak averaging, and 85.15 in Table 5, at 384 px without), so each
measured cell's Δ is taken against the cell whose resolution and Polyak setting match its own
runs', the paper column shows that cell where every measured column agrees, and a Δ against a
cell of another setting is flagged (≠), never hidden.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache

import pandas as pd

from vitbench.reference import paper
from vitbench.store.query import json_field
from vitbench.views.cells import Cell

SETTING_MARK = "≠"
WITHIN_MARK = "≈"  # the Δ lies within ±2 std of the paper's own runs
TABLE_NAMES = {"2": "Table 2", "5": "Table 5", "6": "Table 6"}


@dataclass(frozen=True)
class PaperCell:
    value: float
    std: float | None
    table: str
    res: int | None  # None: the table does not say
    polyak: str  # "" unstated, "none", or the decay
    note: str
    source: str

    def setting(self) -> str:
        parts = [f"{self.res} px" if self.res else "", _polyak_text(self.polyak)]
        return ", ".join(p for p in parts if p) or "setting not stated"

    def cited(self) -> str:
        return f"{TABLE_NAMES.get(self.table, 'Table ' + self.table)}'s {self.value:.2f} ({self.setting()})"


def _polyak_text(polyak: str) -> str:
    return {"": "", "none": "no Polyak"}.get(polyak, f"Polyak {polyak}")


@cache  # read once per column: the footnotes and every cell's match ask again
def paper_cells(name: str) -> dict[str, list[PaperCell]]:
    """dataset -> the column's cells for it, Table 2's first."""
    found: dict[str, list[PaperCell]] = {}
    for r in paper.cells(name).itertuples():
        std = float(r.std) if isinstance(r.std, int | float) and not math.isnan(r.std) else None
        res = int(r.res) if isinstance(r.res, int | float) and not math.isnan(r.res) else None
        cell = PaperCell(float(r.value), std, str(r.table), res, str(r.polyak), str(r.note), str(r.source))
        found.setdefault(str(r.dataset), []).append(cell)
    return found


def measured_setting(part: pd.DataFrame) -> tuple[int | None, str]:
    """(resolution, Polyak) of a measured cell's runs. Only fine-tuning knows whether it averaged;
    `eval` scores a checkpoint whose training vitbench did not see ("": unknown)."""
    hparams = json_field(part["hparams"].iloc[0]) if "hparams" in part and len(part) else {}
    res = hparams.get("res")
    polyak = "" if "polyak" not in hparams else ("none" if hparams["polyak"] is None else f"{hparams['polyak']:g}")
    return (int(res) if res else None), polyak


def choose(cells: list[PaperCell], res: int | None, polyak: str) -> tuple[PaperCell, bool]:
    """The cell measured in the setting (res, polyak), and whether it is one: an exact match, else
    one whose stated settings do not contradict it, else the first (flagged)."""
    exact = [c for c in cells if c.res == res and c.polyak == polyak]
    compatible = [
        c
        for c in cells
        if (c.res is None or res is None or c.res == res) and (not c.polyak or not polyak or c.polyak == polyak)
    ]
    chosen = (exact or compatible or cells)[0]
    return chosen, bool(exact or compatible)


@dataclass
class Matches:
    """Per paper column, the cell shown per dataset; per (dataset, measured column), the cell its
    Δ is taken against and whether the settings agree."""

    shown: dict[str, dict[str, PaperCell]] = field(default_factory=dict)
    against: dict[tuple[str, str, str], tuple[PaperCell, bool]] = field(default_factory=dict)
    settings: dict[tuple[str, str], tuple[int | None, str]] = field(default_factory=dict)

    def footnotes(self, titles: dict[str, str]) -> list[str]:
        """Which cell a paper column shows where it is not the column's usual one (its first
        table's), and the cell's note where it has one; `titles`: the rows (dataset -> label)."""
        out = []
        for name, by_dataset in self.shown.items():
            for dataset, cell in by_dataset.items():
                cells = paper_cells(name).get(dataset, [])
                if dataset not in titles or not (cell.note or cell != cells[0]):
                    continue  # not a row, or the column's usual cell without a note
                others = [c for c in cells if c != cell and c.value != cell.value]
                also = "; also " + ", ".join(c.cited() for c in others) if others else ""
                note = f" — {cell.note}" if cell.note else ""
                out.append(f"{name} (paper) · {titles[dataset]}: {cell.cited()}{note}{also}")
        return out


def match(compare: Sequence[str], acc: pd.DataFrame, comparable: set[str]) -> Matches:
    """Choose the paper cells for `compare`, given the measured rows `acc` (with their `column`);
    only columns of `comparable` protocols take part (the others get no Δ)."""
    found = Matches()
    parts = acc[acc["protocol"].isin(comparable)] if not acc.empty else acc
    for (dataset, col), part in parts.groupby(["dataset", "column"], sort=False) if not parts.empty else []:
        found.settings[(str(dataset), str(col))] = measured_setting(part)
    for name in compare:
        cells = paper_cells(name)
        found.shown[name] = {}
        for dataset in cells:
            picks = []
            for (d, col), (res, polyak) in found.settings.items():
                if d == dataset:
                    chosen, agrees = choose(cells[dataset], res, polyak)
                    found.against[(name, dataset, col)] = (chosen, agrees)
                    picks.append(chosen)
            # one shown cell: the one every measured column matched, else the column's first
            found.shown[name][dataset] = picks[0] if picks and all(p is picks[0] for p in picks) else cells[dataset][0]
    return found


def as_values(matches: Matches, name: str) -> pd.DataFrame:
    """The shown cells of one paper column in the rows `paper_columns` reads."""
    rows = [
        (d, c.value, c.std if c.std is not None else float("nan"), c.source) for d, c in matches.shown[name].items()
    ]
    return pd.DataFrame(rows, columns=["dataset", "value", "std", "source"])


def flag(cell: Cell, paper_cell: PaperCell, setting: tuple[int | None, str]) -> str:
    """Mark a Δ taken against a cell of another setting; the footnote text that says how."""
    if SETTING_MARK not in cell.marks:
        cell.marks += f" {SETTING_MARK}"
    res, polyak = setting
    measured = ", ".join(p for p in (f"{res} px" if res else "", _polyak_text(polyak)) if p) or "unknown setting"
    return f"measured {measured}; paper {paper_cell.cited()}"

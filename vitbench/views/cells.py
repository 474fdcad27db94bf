"""What every view builds: a table of cells (mean ± std over seeds, n, markers, Δ) with its row
and column labels and footnotes; views/render.py turns it into rich, Markdown, LaTeX, CSV or HTML."""

from __future__ import annotations

from dataclasses import dataclass, field

RANDOM_MARK, SUBSET_MARK, SMOKE_MARK = "†", "‡", "§"


@dataclass
class Cell:
    mean: float | None = None
    std: float | None = None
    n: int | None = None
    marks: str = ""
    delta: float | None = None
    text: str | None = None  # a preformatted value (cost rows)
    is_paper: bool = False
    rankable: bool = False  # takes part in the row's best (accuracy cells without a marker)
    interval: tuple[float, float] | None = None  # a 95 % interval of the mean (fractions), with --ci

    def value(self, pm: str = "±", show_n: bool = True, show_interval: bool = True) -> str:
        if self.text is not None:
            return self.text
        if self.mean is None:
            return ""
        out = f"{self.mean:.2f}"
        if self.std is not None:
            out += f" {pm} {self.std:.2f}"
        if self.n is not None and show_n:
            out += f" (n={self.n})"
        if self.interval is not None and show_interval:
            out += " " + self.interval_text()
        return out

    def interval_text(self) -> str:
        return f"[{self.interval[0] * 100:.2f}, {self.interval[1] * 100:.2f}]" if self.interval else ""


@dataclass
class TableData:
    rows: list[str] = field(default_factory=list)
    columns: list[str] = field(default_factory=list)
    cells: dict[tuple[str, str], Cell] = field(default_factory=dict)
    footnotes: list[str] = field(default_factory=list)
    title: str = ""
    # every measured cell has this many runs: said once in a footnote, not in each cell
    uniform_n: int | None = None
    paper_columns: set[str] = field(default_factory=set)
    lower_is_better: set[str] = field(default_factory=set)  # rows whose best cell is the lowest (ECE, NLL)

    def add_row(self, row: str) -> None:
        if row not in self.rows:
            self.rows.append(row)

    def shown(self, cell: Cell, pm: str = "±", show_interval: bool = True) -> str:
        """A cell's value as this table shows it (without its n where the table says it once)."""
        return cell.value(pm, show_n=self.uniform_n is None, show_interval=show_interval)

    def add_column(self, column: str, is_paper: bool = False) -> None:
        if column not in self.columns:
            self.columns.append(column)
        if is_paper:
            self.paper_columns.add(column)

    def best(self) -> set[tuple[str, str]]:
        """The best rankable cell(s) of each row with at least two rankable cells (bold in print): the
        highest, or the lowest in a `lower_is_better` row."""
        out: set[tuple[str, str]] = set()
        for row in self.rows:
            ranked: list[tuple[str, float]] = []
            for c in self.columns:
                cell = self.cells.get((row, c))
                if cell is not None and cell.rankable and cell.mean is not None:
                    ranked.append((c, cell.mean))
            if len(ranked) >= 2:
                top = (min if row in self.lower_is_better else max)(m for _, m in ranked)
                out |= {(row, c) for c, m in ranked if round(m, 2) == round(top, 2)}
        return out

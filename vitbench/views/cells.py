"""What every view builds: a table of cells (mean ± std over seeds, n, markers, Δ) with its row
and column labels and footnotes; views/tables/render.py turns it into rich, Markdown, LaTeX, CSV or HTML."""

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
    # with --ci, where the cell was tested against its baseline's (views/statistics/significance.py): that column,
    # the test's p-value and the p-value after Holm's correction over the table's tests
    baseline: str | None = None
    p: float | None = None
    p_holm: float | None = None
    run_keys: tuple[str, ...] = ()  # the runs a measured cell stands for (`vitbench export --cells`)

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
    # a part of a wider table (`split`) shows the whole table's best cells, not its own
    whole_best: set[tuple[str, str]] | None = None

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

    def split(self, groups: list[list[str]], notes_on_each: bool = True) -> list[TableData]:
        """This table as one table per group of its columns, nothing left out and nothing worked out
        again: each part has the rows that hold a cell among its columns, the whole table's best
        cells, marks and intervals, and a title that says which columns it shows; the footnotes
        (the whole table's) under each part, or under the last (`notes_on_each=False`)."""
        if len(groups) <= 1:
            return [self]
        best, parts = self.best(), []
        measured = [c for c in self.columns if c not in self.paper_columns]  # the paper's may repeat in parts
        for i, columns in enumerate(groups):
            rows = [r for r in self.rows if any((r, c) in self.cells for c in columns)]
            places = [measured.index(c) + 1 for c in columns if c in measured]
            shows = f": columns {places[0]}–{places[-1]} of {len(measured)}" if places else ""
            part = TableData(
                rows=rows,
                columns=list(columns),
                cells={(r, c): cell for (r, c), cell in self.cells.items() if c in columns and r in rows},
                footnotes=list(self.footnotes) if notes_on_each or i == len(groups) - 1 else [],
                title=f"{self.title} (part {i + 1} of {len(groups)}{shows})",
                uniform_n=self.uniform_n,
                paper_columns={c for c in self.paper_columns if c in columns},
                lower_is_better=set(self.lower_is_better),
                whole_best={(r, c) for r, c in best if c in columns},
            )
            parts.append(part)
        return parts

    def best(self) -> set[tuple[str, str]]:
        """The best rankable cell(s) of each row with at least two rankable cells (bold in print): the
        highest, or the lowest in a `lower_is_better` row (of the whole table, for a part of one)."""
        if self.whole_best is not None:
            return self.whole_best
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

"""Renderers of a `TableData`: the terminal (rich), Markdown, LaTeX (booktabs), CSV and a standalone
HTML page. They differ only in how a cell, its best-in-row bold and its Δ are written."""

from __future__ import annotations

import html
import io
import re

import pandas as pd

from vitbench.errors import UserError
from vitbench.files.text_safety import csv_frame, visible
from vitbench.views.cells import Cell, TableData

FORMATS = ("rich", "md", "latex", "csv", "html")


def _delta_text(delta: float) -> str:
    return f"Δ {delta:+.2f}".replace("-", "−")


def _plain(t: TableData, cell: Cell | None) -> str:
    if cell is None:
        return ""
    text = t.shown(cell) + cell.marks
    return text + (f" ({_delta_text(cell.delta)})" if cell.delta is not None else "")


# a "<" that opens an HTML tag, closing tag, comment or declaration; "< 0.0005" is left alone
_HTML_OPENING = re.compile(r"<(?=[A-Za-z/!?])")


def _md_text(text: str) -> str:
    """Text from names (folders, weights files, classes) made inert in Markdown: Markdown renderers
    draw raw HTML, so a class folder named `<img src=x onerror=...>` would run there; its "<" is
    written as the entity, which renders as the same character. A "](" is escaped (`[x](javascript:…)`
    would be a link; "[sha]" footnotes stay as they read), a newline is a space (it split a table's
    row), and control characters are shown as `\\xNN`."""
    text = visible(text.replace("\r\n", " ").replace("\n", " ").replace("\r", " "))
    return _HTML_OPENING.sub("&lt;", text).replace("](", "\\](")


def _md_cell(text: str) -> str:
    """`_md_text`, and "|" escaped: inside a table row it ends the cell."""
    return _md_text(text).replace("|", "\\|")


def to_markdown(t: TableData) -> str:
    best = t.best()

    def show(row: str, col: str) -> str:
        cell = t.cells.get((row, col))
        text = _md_cell(_plain(t, cell))
        if cell is not None and (row, col) in best:
            value = _md_cell(t.shown(cell) + cell.marks)
            text = text.replace(value, f"**{value}**", 1)
        return text

    lines = [f"**{_md_text(t.title)}**", ""] if t.title else []
    lines += ["| | " + " | ".join(_md_cell(c) for c in t.columns) + " |", "|---" * (len(t.columns) + 1) + "|"]
    lines += ["| " + _md_cell(r) + " | " + " | ".join(show(r, c) for c in t.columns) + " |" for r in t.rows]
    return "\n".join(lines + [""] + [f"- {_md_text(n)}" for n in t.footnotes]) + "\n"


_LATEX = {
    "\\": r"\textbackslash{}",
    "_": r"\_",
    "%": r"\%",
    "&": r"\&",
    "#": r"\#",
    "$": r"\$",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    "±": r"$\pm$",
    "†": r"$^\dagger$",
    "‡": r"$^\ddagger$",
    "§": r"\S{}",
    "¶": r"\P{}",
    "·": r"$\cdot$",
    "λ": r"$\lambda$",
    "Δ": r"$\Delta$",
    "×": r"$\times$",
    "–": "--",
    "−": "$-$",
    "…": r"\dots{}",
    "→": r"$\to$",
    "≥": r"$\geq$",
    "≤": r"$\leq$",
}


def latex_escape(s: str) -> str:
    return "".join(_LATEX.get(ch, ch) for ch in visible(s, one_line=True))


def _latex_header(column: str) -> str:
    """A long column label stacked on lines (model / weights / protocol), so the table fits a page."""
    parts = column.replace(" (", "\n(", 1).split(" · ")
    lines = [line for part in parts for line in part.split("\n")]
    if len(lines) == 1:
        return latex_escape(column)
    return r"\shortstack{" + r"\\".join(latex_escape(line) for line in lines) + "}"


def to_latex(t: TableData) -> str:
    """A `table` float with a booktabs tabular: the best cell of each row in bold, ± as the paper
    prints it, Δ in small type, the footnotes under the table. Needs \\usepackage{booktabs}."""
    best = t.best()

    def show(row: str, col: str) -> str:
        cell = t.cells.get((row, col))
        if cell is None:
            return ""
        value = latex_escape(t.shown(cell))
        value = rf"\textbf{{{value}}}" if (row, col) in best else value
        value += latex_escape(cell.marks)
        if cell.delta is not None:
            value += rf" {{\scriptsize $({cell.delta:+.2f})$}}"
        return value

    out = [
        r"% vitbench table: needs \usepackage{booktabs}; a wide one fits in \resizebox{\linewidth}{!}{...}",
        r"\begin{table}[t]",
        r"\centering",
        r"\footnotesize",
    ]
    if t.title:
        out.append(rf"\caption{{{latex_escape(t.title)}}}")
    out += [
        r"\begin{tabular}{l" + "r" * len(t.columns) + "}",
        r"\toprule",
        " & " + " & ".join(_latex_header(c) for c in t.columns) + r" \\",
        r"\midrule",
    ]
    out += [latex_escape(r) + " & " + " & ".join(show(r, c) for c in t.columns) + r" \\" for r in t.rows]
    out += [r"\bottomrule", r"\end{tabular}"]
    if t.footnotes:
        out += [r"\par\smallskip\raggedright"] + [latex_escape(n) + r"\par" for n in t.footnotes]
    out.append(r"\end{table}")
    return "\n".join(out) + "\n"


CSV_COLUMNS = ["row", "column", "mean", "std", "n", "marks", "delta", "best", "source"]


def to_csv(t: TableData) -> str:
    """One line per cell, numbers unformatted (cost rows: days, TPUv3-core-days or exaFLOPs)."""
    best = t.best()
    records = [
        {
            "row": row,
            "column": col,
            "mean": cell.mean,
            "std": cell.std,
            "n": cell.n,
            "marks": cell.marks,
            "delta": cell.delta,
            "best": (row, col) in best,
            "source": "paper" if cell.is_paper else "vitbench",
        }
        for row in t.rows
        for col in t.columns
        if (cell := t.cells.get((row, col))) is not None
    ]
    columns = list(CSV_COLUMNS)
    if any(c.interval is not None for c in t.cells.values()):  # --ci: the interval in percent, unformatted
        columns[4:4] = ["ci_low", "ci_high"]
        for record in records:
            interval = t.cells[(str(record["row"]), str(record["column"]))].interval
            record["ci_low"], record["ci_high"] = (interval[0] * 100, interval[1] * 100) if interval else (None, None)
    buf = io.StringIO()
    csv_frame(pd.DataFrame(records, columns=columns)).to_csv(buf, index=False, float_format="%.6g")
    return buf.getvalue()


STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; font-variant-numeric: tabular-nums; }
caption { font-weight: 600; text-align: left; padding-bottom: .5em; }
th, td { padding: .3em .8em; border-bottom: 1px solid #ddd; text-align: right; white-space: nowrap; }
th:first-child, td:first-child { text-align: left; }
span.part { white-space: nowrap; }
thead th { border-bottom: 2px solid #444; }
td.paper, th.paper { color: #0b5394; }
.pos { color: #1a7f37; } .neg { color: #cf222e; }
.delta { font-size: .85em; }
ol.notes { font-size: .85em; color: #555; max-width: 70em; }
"""


def table_fragment(t: TableData, table_id: str = "", notes: list[str] | None = None) -> str:
    """The table and its footnotes (`notes`: these instead) as HTML, no page around them. Each cell
    carries its number in `data-value` (for sorting, and for reading it back) and its whole text in
    `title` (shown on hover); a 95 % interval is a `span.ci` of its own, which a page may hide."""
    best = t.best()
    esc = html.escape

    def cell_html(row: str, col: str) -> str:
        cell = t.cells.get((row, col))
        klass = ' class="paper"' if col in t.paper_columns or (cell is not None and cell.is_paper) else ""
        if cell is None:
            return f"<td{klass}></td>"
        number = f' data-value="{cell.mean:.6g}"' if cell.mean is not None else ""
        whole = f' title="{esc(_hover(t, cell))}"' if cell.interval is not None or cell.marks.strip() else ""
        value = ""
        for i, (klass_, text, before) in enumerate(_spans(t, cell)):
            shown = f"<strong>{esc(text)}</strong>" if i == 0 and (row, col) in best else esc(text)
            value += f'{before}<span class="{klass_}">{shown}</span>'
        return f"<td{klass}{number}{whole}>{value}</td>"

    paper_th = ' class="paper"'
    head = "".join(f"<th{paper_th if c in t.paper_columns else ''}>{_wrapping(c)}</th>" for c in t.columns)
    body = "\n".join(f"<tr><th>{esc(r)}</th>" + "".join(cell_html(r, c) for c in t.columns) + "</tr>" for r in t.rows)
    notes_html = "".join(f"<li>{esc(n)}</li>" for n in (t.footnotes if notes is None else notes))
    ident = f' id="{esc(table_id)}"' if table_id else ""
    return (
        f'<table class="view"{ident}>\n<caption>{esc(t.title or "vitbench")}</caption>\n'
        f"<thead><tr><th></th>{head}</tr></thead>\n<tbody>\n{body}\n</tbody>\n</table>\n"
        + (f'<ol class="notes">{notes_html}</ol>' if notes_html else "")
    )


def to_html(t: TableData) -> str:
    """A standalone page (inline style, no scripts, well-formed XHTML syntax)."""
    title = html.escape(t.title or "vitbench")
    return (
        f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8"/>\n<title>{title}</title>\n'
        f"<style>{STYLE}</style>\n</head>\n<body>\n{table_fragment(t)}\n</body>\n</html>\n"
    )


def _wrapping(label: str) -> str:
    """A column label that a narrow column wraps between its parts (`deit-ti/16 · 1-shot ·
    precision=fp32, res=64`) and between the settings of a part, never inside one where it fits: no
    break at a hyphen (`1-shot`) or slash; a piece longer than the column (a long timm name) breaks
    inside itself rather than overflow into its neighbour (the page's style: `span.part`)."""
    return " ".join(f'<span class="part">{html.escape(piece)}</span>' for piece in label_pieces(label))


def label_pieces(label: str) -> list[str]:
    """A column label in the pieces a narrow column may put on lines of their own, each with the
    separator that follows it (`deit-ti/16 ·`, `1-shot ·`, `precision=fp32,`, `res=64`): a line
    never starts with a comma or a dot."""
    parts = label.split(" · ")
    pieces = []
    for i, part in enumerate(parts):
        settings = part.split(", ")
        for j, setting in enumerate(settings):
            pieces.append(setting + ("," if j < len(settings) - 1 else " ·" if i < len(parts) - 1 else ""))
    return pieces


def _mark_words(marks: str) -> list[str]:
    """A cell's marks in the words a line may break between: `‡`, `[2-shot]`, `(precision=fp32,`, `res=64)`."""
    return marks.split()


def _spans(t: TableData, cell: Cell) -> list[tuple[str, str, str]]:
    """A cell as the HTML writes it: (class, text, what comes before it) for each piece a narrow
    column keeps whole and may put on a line of its own (`span.v`): the value, its n, each word of
    its marks; the interval (`span.ci`, which a page may hide) and the Δ (`span.delta`)."""
    spans = [("v", cell.value(show_n=False, show_interval=False), "")]
    if cell.n is not None and cell.text is None and cell.mean is not None and t.uniform_n is None:
        spans.append(("v", f"(n={cell.n})", " "))
    if cell.interval is not None:
        spans.append(("ci", cell.interval_text(), " "))
    spans += [("v", word, " " if i else "") for i, word in enumerate(_mark_words(cell.marks))]
    if cell.delta is not None:
        spans.append((f"delta {'pos' if cell.delta >= 0 else 'neg'}", _delta_text(cell.delta), " "))
    return spans


def cell_pieces(t: TableData, cell: Cell) -> list[str]:
    """What a cell's HTML keeps whole and shows by default (`_spans` without the interval)."""
    return [text for klass, text, _ in _spans(t, cell) if klass != "ci"]


def _hover(t: TableData, cell: Cell) -> str:
    """A cell's whole text, and where it was tested against a baseline, that test (its p-values)."""
    text = _plain(t, cell)
    if cell.p is not None and cell.baseline is not None:
        text += f"; vs [{cell.baseline}]: p = {cell.p:.3g}, after Holm {cell.p_holm:.3g}"
    return text


def to_rich(t: TableData, width: int | None = None):
    """The table, then its footnotes as lines of their own: a caption would wrap them to the table's
    width (a provenance line cut into five); these wrap at the terminal's, or not at all in a pipe.
    `width`: the characters a line holds (the terminal's); a table wider than that is shown whole,
    never cut: its column labels wrapped between their parts, and where that is not enough, its
    columns in parts that each fit (views/cells.TableData.split), the footnotes under the last."""
    from rich.console import Group
    from rich.text import Text

    parts, wrapped = [t], False
    if width is not None and _width(_rich_table(t)) > width:
        wrapped = True
        if _width(_rich_table(t, wrapped=True)) > width:
            parts = t.split(_fitting(t, width), notes_on_each=False)
    shown = [piece for part in parts for piece in _titled(_rich_table(part, wrapped), part.title)]
    shown += [Text("\n".join(t.footnotes))] if t.footnotes else []
    return Group(*shown) if len(shown) > 1 else shown[0]


def _titled(table, title: str):
    """`table` under its title: rich's own (centred over it) where it fits the table's width; a
    line of its own where it is wider (rich would wrap it to the table's width, a word a line)."""
    from rich.text import Text

    if not title or _width(table) >= len(title):
        table.title = Text(title) if title else None
        return [table]
    return [Text(title), table]


def _header(column: str, wrapped: bool) -> str:
    """A column label, on one line or a line per part (`deit-ti/16 ·` / `5-shot ·` / `res=32`)."""
    return column.replace(" · ", " ·\n").replace(", ", ",\n") if wrapped else column


def _rich_table(t: TableData, wrapped: bool = False):
    from rich.table import Table
    from rich.text import Text  # Text, not markup: labels hold "[sha]" brackets

    best = t.best()
    table = Table()  # its title: `_titled`
    table.add_column("")
    for c in t.columns:
        table.add_column(Text(_header(c, wrapped)), justify="right", style="cyan" if c in t.paper_columns else None)
    for r in t.rows:
        shown = []
        for c in t.columns:
            cell = t.cells.get((r, c))
            if cell is None:
                shown.append(Text(""))
                continue
            text = Text(t.shown(cell), style="bold" if (r, c) in best else ("cyan" if cell.is_paper else ""))
            text.append(cell.marks, style="yellow")
            if cell.delta is not None:
                text.append(f" {_delta_text(cell.delta)}", style="green" if cell.delta >= 0 else "red")
            shown.append(text)
        table.add_row(Text(r), *shown)
    return table


def _width(renderable) -> int:
    """The characters `renderable` takes on one line, unconstrained."""
    from rich.console import Console

    console = Console(width=100_000)
    return console.measure(renderable, options=console.options).maximum


def _fitting(t: TableData, width: int) -> list[list[str]]:
    """`t`'s columns in order, in groups whose tables (labels wrapped, the row labels repeated) each
    fit `width`; a column wider than that alone is a group of its own."""
    alone = _width(_rich_table(TableData(rows=t.rows, uniform_n=t.uniform_n)))
    extra = {
        c: _width(_rich_table(TableData(rows=t.rows, columns=[c], cells={k: v for k, v in t.cells.items() if k[1] == c},
                                        uniform_n=t.uniform_n), wrapped=True)) - alone
        for c in t.columns
    }  # fmt: skip
    groups: list[list[str]] = [[]]
    used = alone
    for c in t.columns:
        if groups[-1] and used + extra[c] > width:
            groups.append([])
            used = alone
        groups[-1].append(c)
        used += extra[c]
    return groups


def render_text(t: TableData, fmt: str) -> str:
    renderers = {"md": to_markdown, "latex": to_latex, "csv": to_csv, "html": to_html}
    if fmt not in renderers:
        raise UserError(f"--format {fmt}: expected {', '.join(FORMATS)}")
    return renderers[fmt](t)

"""The report's HTML parts: the page around its sections (style, the one inline script and the
Content-Security-Policy that allows only it), a section, a table with the legend of the marks it
uses beside it, a figure with its one caption. Every value from a store is escaped here, once.

f-strings rather than a template engine: the page is a handful of small fragments, each escaped
where it is made, and a template would add a dependency and a file for no plainer code.
"""

from __future__ import annotations

import base64
import hashlib
import html
import re
from pathlib import Path

from vitbench.views.cells import RANDOM_MARK, SMOKE_MARK, SUBSET_MARK, TableData
from vitbench.views.measured.contamination import DUPLICATE_MARK
from vitbench.views.measured.paper_match import SETTING_MARK, WITHIN_MARK
from vitbench.views.statistics.significance import SIGNIFICANT_MARK
from vitbench.views.tables.render import STYLE, cell_pieces, label_pieces, table_fragment

SCRIPT = """
function sortBy(th) {
  const table = th.closest("table"), body = table.tBodies[0], index = [...th.parentNode.children].indexOf(th);
  const key = r => { const c = r.children[index]; const v = parseFloat(c ? c.dataset.value : "");
                     return isNaN(v) ? -Infinity : v; };
  const up = th.dataset.order !== "desc"; th.dataset.order = up ? "desc" : "asc";
  [...body.rows].sort((a, b) => up ? key(b) - key(a) : key(a) - key(b)).forEach(r => body.appendChild(r));
}
function filterRows(input) {
  const text = input.value.toLowerCase(), table = document.getElementById(input.dataset.table);
  for (const r of table.tBodies[0].rows) r.hidden = !r.textContent.toLowerCase().includes(text);
}
document.querySelectorAll("table.view thead th").forEach(th => th.addEventListener("click", () => sortBy(th)));
document.querySelectorAll("input.filter").forEach(i => i.addEventListener("input", () => filterRows(i)));
const m = location.hash.match(/^#sort=([\\w-]+):(\\d+)$/);  // a link (or a test) can ask for a sorted table
if (m) sortBy(document.getElementById(m[1]).tHead.rows[0].children[+m[2]]);
"""
# What the page may do, said to the browser: run its own script (by hash) and nothing else, no inline
# event handler, no request to any address. Values from a store are escaped everywhere; this is the
# second wall, for a value that ever slipped through (a shared results folder is enough to plant one).
CONTENT_SECURITY_POLICY = (
    f"default-src 'none'; script-src 'sha256-{base64.b64encode(hashlib.sha256(SCRIPT.encode()).digest()).decode()}'; "
    "style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'"
)
PAGE_STYLE = """
body { max-width: 1300px; line-height: 1.4; }
nav { position: sticky; top: 0; background: #fff; padding: .4em 0; border-bottom: 1px solid #ddd; z-index: 2; }
nav a { margin-right: 1em; white-space: nowrap; } section { margin: 2em 0; } h2 { border-bottom: 1px solid #ccc; }
h3 { font-size: 1.05em; margin: 1.4em 0 .4em; }
dl.facts { display: grid; grid-template-columns: max-content 1fr; gap: .2em 1em; }
dl.facts dt { font-weight: 600; } dl.facts dd { margin: 0; }
div.block { display: flex; flex-wrap: wrap; gap: .5em 2em; align-items: flex-start; }
div.scroll { overflow-x: auto; max-width: 100%; } div.scroll caption { display: none; }  /* the h3 says it */
div.scroll th:first-child { position: sticky; left: 0; background: #fff; z-index: 1; white-space: normal;
                            min-width: 10em; max-width: 24em; }
td[title] { cursor: help; }
ul.legend { font-size: .85em; color: #444; max-width: 34em; margin: 0; padding-left: 1.2em; }
ul.legend li, ul.notes li { margin-bottom: .2em; }
ul.notes { font-size: .85em; color: #555; max-width: 70em; }
.ci { display: none; color: #555; font-size: .85em; }
body:has(#show-intervals:checked) .ci { display: inline; }
thead th { cursor: pointer; } input.filter { margin: .5em 0; }
/* a column's label wraps between its parts and settings, never inside one that fits; one longer than
   the column breaks inside itself, never over its neighbour. A cell wraps between its value, n and
   marks, each kept whole: a table split into parts that fit (views/report/report.py) never scrolls */
div.scroll thead th { white-space: normal; overflow-wrap: normal; word-break: normal; vertical-align: bottom;
                      min-width: 5em; max-width: 13em; }
div.scroll thead th span.part { display: inline-block; max-width: 100%; white-space: normal;
                                overflow-wrap: anywhere; }
div.scroll td { white-space: normal; } div.scroll td span.v, div.scroll td span.ci, div.scroll td span.delta
{ white-space: nowrap; }
details { margin: .3em 0; } details table td { text-align: left; white-space: normal; overflow-wrap: anywhere; }
figure { margin: 1em 0; max-width: 900px; } figure svg, figure img { max-width: 100%; height: auto; }
figcaption { font-size: .9em; color: #333; }
@media print { nav, input.filter, label.toggle { display: none; } }
"""
# How wide a table may be drawn, in em (the body's 1300 px at 16 px a em, less a margin), what a
# character takes at the most (bold system-ui), a cell's padding and the first column's bounds (the CSS above):
# what `column_ems` and `row_label_ems` estimate, for the report to split a wide table into parts that fit
TABLE_EMS = 78.0
CHARACTER_EMS = 0.62
PADDING_EMS = 1.6
ROW_LABEL_EMS = (10.0, 24.0)
HEADER_EMS = 13.0


def column_ems(data: TableData, column: str) -> float:
    """About the least width (em) a column of `data` takes on the page: its longest word of label
    (a label's pieces wrap at their spaces too; at most HEADER_EMS: a longer one breaks inside) or
    piece of a cell (kept whole), and its padding."""
    words = [word for piece in label_pieces(column) for word in piece.split()]
    label = max((len(word) for word in words), default=0) * CHARACTER_EMS
    cells = [data.cells[(r, column)] for r in data.rows if (r, column) in data.cells]
    widest = max((len(p) for cell in cells for p in cell_pieces(data, cell)), default=0) * CHARACTER_EMS
    return max(min(label, HEADER_EMS), widest, 5.0) + PADDING_EMS


def row_label_ems(data: TableData) -> float:
    """About the least width (em) of a table's first column: a row label wraps between its words,
    so its longest word, within the column's bounds."""
    longest = max((len(word) for r in data.rows for word in r.split()), default=0) * CHARACTER_EMS
    return min(max(longest, ROW_LABEL_EMS[0]), ROW_LABEL_EMS[1]) + PADDING_EMS


# the marks a table can carry: a footnote that starts with one explains it and goes in the legend
MARK_STARTS = (RANDOM_MARK, SUBSET_MARK, SMOKE_MARK, SIGNIFICANT_MARK, WITHIN_MARK, SETTING_MARK, "[lo, hi]",
               "[k-shot]", "(k-shot)", "Δ:", DUPLICATE_MARK)  # fmt: skip
# a provenance footnote ("[col, col] weights … · data … · …"): the page's provenance section has it
PROVENANCE_NOTE = re.compile(r"^\[[^\]]+\] weights ")


def safe_id(name: str) -> str:
    """An id for a section or table named after a store's value (a plugin protocol's name): the
    name where it is letters, digits, `_` and `-`, else those of it and a hash of the rest."""
    if re.fullmatch(r"[\w-]+", name, flags=re.ASCII):
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return (re.sub(r"[^\w-]+", "-", name, flags=re.ASCII).strip("-")[:24] + "-" + digest).lstrip("-")


def section(anchor: str, heading: str, parts: list[str]) -> str:
    body = "\n".join(p for p in parts if p)
    return f'<section id="{html.escape(anchor)}">\n<h2>{html.escape(heading)}</h2>\n{body}\n</section>'


def facts(items: list[tuple[str, str]]) -> str:
    rows = "".join(f"<dt>{html.escape(k)}</dt><dd>{html.escape(v)}</dd>" for k, v in items)
    return f'<dl class="facts">{rows}</dl>'


def table(anchor: str, data: TableData, filter_box: bool = False) -> str:
    """A table under its title, the legend of its marks beside it, its other notes under it. The
    table scrolls sideways on its own where it must (the first column stays); the page never does."""
    legend = [n for n in data.footnotes if n.startswith(MARK_STARTS)]
    notes = [n for n in data.footnotes if n not in legend and not PROVENANCE_NOTE.match(n)]
    if any(PROVENANCE_NOTE.match(n) for n in data.footnotes):
        notes.append("what ran (weights, data, protocol version, seeds, hardware, code): Provenance, below")
    box = (
        f'<input class="filter" data-table="{html.escape(anchor)}" placeholder="filter rows" aria-label="filter rows"/>'
        if filter_box
        else ""
    )
    legend_html = (
        '<ul class="legend">' + "".join(f"<li>{html.escape(n)}</li>" for n in legend) + "</ul>" if legend else ""
    )
    notes_html = '<ul class="notes">' + "".join(f"<li>{html.escape(n)}</li>" for n in notes) + "</ul>" if notes else ""
    return (
        f"<h3>{html.escape(data.title)}</h3>\n{box}\n"
        f'<div class="block"><div class="scroll">{table_fragment(data, anchor, notes=[])}</div>{legend_html}</div>\n'
        f"{notes_html}"
    )


def figure(svg_file: Path, anchor: str, caption: str) -> str:
    svg = svg_file.read_text()
    svg = svg[svg.index("<svg") :]  # without matplotlib's XML prologue and DOCTYPE
    return f'<figure id="{html.escape(anchor)}">{svg}<figcaption>{html.escape(caption)}</figcaption></figure>'


def image(png_file: Path, anchor: str, caption: str) -> str:
    """A PNG inlined as a data: URI (the page fetches nothing), with its caption."""
    data = base64.b64encode(png_file.read_bytes()).decode()
    return (
        f'<figure id="{html.escape(anchor)}"><img alt="{html.escape(caption)}" src="data:image/png;base64,{data}"/>'
        f"<figcaption>{html.escape(caption)}</figcaption></figure>"
    )


def page(made: str, toggles: str, nav: list[tuple[str, str]], sections: list[str]) -> str:
    links = " ".join(f'<a href="#{html.escape(a)}">{html.escape(t)}</a>' for a, t in nav)
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8"/>\n'
        f'<meta http-equiv="Content-Security-Policy" content="{CONTENT_SECURITY_POLICY}"/>\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1"/>\n<title>vitbench report</title>\n'
        f"<style>{STYLE}{PAGE_STYLE}</style>\n</head>\n<body>\n<h1>vitbench report</h1>\n"
        f'<p class="made">{made}</p>\n{toggles}\n<nav>{links}</nav>\n'
        + "\n".join(sections)
        + f"\n<script>{SCRIPT}</script>\n</body>\n</html>\n"
    )

"""`vitbench report`: the store as one self-contained web page (docs/tables.md, "Report").

Every view the store has data for (Table 2's layout with intervals and paired-test marks, the
few-shot view, Table 9, robustness, calibration, attention distance), the figures as inline SVG,
and per measured column a drill-down of its provenance. No server, no network, no external
asset: one HTML file with its style and a few lines of script (sort a table by a column, filter
its rows) inline. It reads the store read-only, so it works while a run holds the database.
"""

from __future__ import annotations

import base64
import hashlib
import html
import re
import tempfile
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd

from vitbench import store
from vitbench.datasets.robustness import ROBUSTNESS_NAMES
from vitbench.errors import UserError
from vitbench.store.query import apply_where, json_field
from vitbench.views import attention, inspection_plots, per_class, plots, pretraining, robustness, table
from vitbench.views.cells import TableData
from vitbench.views.columns import accelerator_days, measured_columns
from vitbench.views.render import STYLE, table_fragment

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
nav a { margin-right: 1em; } section { margin: 2em 0; } h2 { border-bottom: 1px solid #ccc; }
div.scroll { overflow-x: auto; } section > div.scroll caption { display: none; }  /* the h2 says it */
div.scroll td { white-space: normal; min-width: 6em; }  /* an interval wraps under its value */
thead th { cursor: pointer; } input.filter { margin: .5em 0; }
details { margin: .3em 0; } details table td { text-align: left; white-space: normal; }
figure { margin: 1em 0; } figure svg { max-width: 100%; height: auto; }
@media print { nav, input.filter { display: none; } }
"""


def _section(anchor: str, title: str, content: str) -> str:
    return f'<section id="{anchor}">\n<h2>{html.escape(title)}</h2>\n{content}\n</section>'


def _view(anchor: str, data: TableData) -> str:
    box = f'<input class="filter" data-table="{anchor}-table" placeholder="filter rows" aria-label="filter rows"/>'
    # a wide table scrolls sideways on its own; the page does not
    wide = f'<div class="scroll">{table_fragment(data, f"{anchor}-table")}</div>'
    return _section(anchor, data.title, box + "\n" + wide)


def _views(df: pd.DataFrame, results: Path, compare: Sequence[str], protocol: str | None) -> list[str]:
    """The views this store has data for, Table 2's first."""
    out = [_view("table2", table.accuracy_view(df, compare, protocol, ci=results))] if not df.empty else []
    protocols = set(df["protocol"]) if not df.empty else set()
    if protocol is None and "fewshot" in protocols and protocols - {"fewshot"}:  # Table 2's view hides them
        fewshot = table.accuracy_view(df, (), "fewshot", ci=results)
        fewshot.title = "Few-shot linear evaluation: top-1 accuracy (%)"
        out.append(_view("fewshot", fewshot))
    if pretraining.PROTOCOL in protocols:  # runs made here from random init, beside what they bought
        out.append(_view("pretrain", pretraining.pretrain_view(df)))
    if not df.empty and df["dataset"].str.startswith("vtab/").any():
        out.append(_view("table9", table.table9_view(df, (), protocol)))
    if "eval" in protocols:
        if df["dataset"].isin(ROBUSTNESS_NAMES).any():  # a shifted test set beside ImageNet val
            out.append(_view("robustness", robustness.robustness_view(df, (), "eval")))
        if df["metric"].isin(["ece", "nll"]).any():
            out.append(_view("calibration", per_class.calibration_view(df)))
    distances = store.read_attention_distance(results)
    if not distances.empty:
        out.append(_view("attention", attention.attention_view(distances)))
    return out


def _inline(svg_file: Path, anchor: str, caption: str) -> str:
    svg = svg_file.read_text()
    svg = svg[svg.index("<svg") :]  # without matplotlib's XML prologue and DOCTYPE
    return f'<figure id="{anchor}">{svg}<figcaption>{html.escape(caption)}</figcaption></figure>'


def _attention_figures(distances: pd.DataFrame, folder: Path) -> list[str]:
    """§4.5's Fig. 7 (right) for every stored inspection: each head's mean attention distance by depth."""
    parts = []
    for i, (_key, part) in enumerate(distances.groupby("inspect_key", sort=False)):
        grid = part.pivot_table(index="layer", columns="head", values="distance_px").sort_index()
        first = part.iloc[0]
        weights = "random init" if first["random_init"] else str(first["weights"]).rsplit("/", 1)[-1]
        title = f"{first['model']} ({weights}) at {first['res']} px"
        path = inspection_plots.attention_distance(grid.to_numpy(), int(first["n_images"]), folder / f"a{i}.svg", title)
        caption = f"Mean attention distance per head and layer (Fig. 7 right): {title}, {first['n_images']} images"
        parts.append(_inline(path, f"figure-attention-{i}", caption))
    return parts


def _figures(df: pd.DataFrame, protocol: str | None, results: Path) -> str:
    """The figures the data allows, as inline SVG."""
    parts = []
    with tempfile.TemporaryDirectory() as tmp:
        makers = (
            {}
            if df.empty
            else {
                "vtab": lambda: plots.vtab_figure(df, Path(tmp), ("svg",), protocol),
                "cost": lambda: plots.cost_figure(df, Path(tmp), ("svg",), protocol, "flops"),
                "fewshot": lambda: plots.fewshot_figure(df, Path(tmp), ("svg",)),
            }
        )
        if makers and not df["dataset"].str.startswith("vtab/").any():
            del makers["vtab"]  # it would show the paper's bars only
        for name, make in makers.items():
            try:
                figure = make()
            except UserError:
                continue  # no data for it
            parts.append(_inline(figure.files[0], f"figure-{name}", figure.caption))
        distances = store.read_attention_distance(results)
        if not distances.empty:
            parts += _attention_figures(distances, Path(tmp))
    return _section("figures", "Figures", "\n".join(parts)) if parts else ""


def _provenance(df: pd.DataFrame, protocol: str | None) -> str:
    """Per measured column, everything that stands behind it."""
    # the columns of Table 2's view, then of the few-shot view where Table 2's hides them (as _views)
    shown = [protocol] + (["fewshot"] if protocol is None and "fewshot" in set(df["protocol"]) else [])
    groups = [
        (col, part)
        for p in dict.fromkeys(shown)
        for col, part in measured_columns(df, p).runs.groupby("column", sort=False)
    ]
    items = []
    for col, part in dict(groups).items():
        days = accelerator_days(part)
        rows = {
            "runs": str(part["run_key"].nunique()),
            "weights": _distinct(part, "{} (sha256 {})", "weights", "weights_sha256"),
            "data": _distinct(part, "{}: {} @ {}", "dataset", "data_source", "data_fingerprint"),
            "protocol": _distinct(part, "{}", "protocol_version"),
            "seeds": ", ".join(str(int(s)) for s in sorted(set(part["seed"]))),
            "hardware": _distinct(part, "{} × {}", "device_name", "device_count"),
            "code": _distinct(
                part, "vitbench {} (git {}), torch {}, timm {}", "vitbench_version", "git_sha", "torch_version",
                "timm_version",
            ),
            "cost": f"{days:.3g} accelerator-days" if days is not None else "not recorded",
            "settings": str(json_field(part["hparams"].iloc[0])),
        }  # fmt: skip
        body = "".join(f"<tr><th>{k}</th><td>{html.escape(v)}</td></tr>" for k, v in rows.items())
        items.append(f"<details><summary>{html.escape(str(col))}</summary><table>{body}</table></details>")
    return _section("provenance", "Provenance of each measured column", "\n".join(items)) if items else ""


def _distinct(part: pd.DataFrame, pattern: str, *fields: str) -> str:
    """The distinct values of `fields` among a column's runs, formatted and joined."""
    return "; ".join(sorted({pattern.format(*values) for values in zip(*(part[f] for f in fields), strict=True)}))


def report_html(
    results: Path,
    where: Sequence[str] | None = None,
    compare: Sequence[str] = (),
    protocol: str | None = None,
    now: datetime | None = None,
) -> str:
    now = now or datetime.now(UTC)
    df = apply_where(store.read_results(results), list(where or ()))
    made = (
        f"Made {now:%Y-%m-%d %H:%M} UTC by vitbench from {html.escape(str((results / store.DB_NAME).resolve()))}"
        f" ({df['run_key'].nunique() if not df.empty else 0} runs"
        + (f", --where {html.escape(' '.join(where))}" if where else "")
        + ")."
    )
    sections = [*_views(df, results, compare, protocol), _figures(df, protocol, results)]
    sections += [_provenance(df, protocol)] if not df.empty else []
    if not any(sections):
        empty = "<p>This store holds no results yet: run <code>vitbench run</code>.</p>"
        sections = [_section("empty", "No results", empty)]
    sections = [s for s in sections if s]
    nav = " ".join(f'<a href="#{a}">{html.escape(t)}</a>' for a, t in _anchors(sections))
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8"/>\n'
        f'<meta http-equiv="Content-Security-Policy" content="{CONTENT_SECURITY_POLICY}"/>\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1"/>\n<title>vitbench report</title>\n'
        f"<style>{STYLE}{PAGE_STYLE}</style>\n</head>\n<body>\n<h1>vitbench report</h1>\n"
        f'<p class="made">{made}</p>\n<nav>{nav}</nav>\n'
        + "\n".join(sections)
        + f"\n<script>{SCRIPT}</script>\n</body>\n</html>\n"
    )


def _anchors(sections: list[str]) -> list[tuple[str, str]]:
    return [
        (m.group(1), html.unescape(m.group(2)))
        for s in sections
        if (m := re.search(r'<section id="([^"]+)">\n<h2>([^<]*)</h2>', s))
    ]

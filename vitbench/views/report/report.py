"""`vitbench report`: the store as one self-contained web page (docs/tables.md, "Report").

A summary first (what was measured; the headline numbers per model and dataset across protocols,
beside the paper's matched cells), then a section for every protocol the store holds — few-shot,
fine-tune, eval, k-NN, linear, any plugin's, then robustness, calibration, pre-training,
attention distances and throughput — each with its tables and figures, and last, per measured
column, what stands behind it. No server, no network, no external asset: one HTML file with its
style and a few lines of script inline. It reads the store read-only, so it works while a run
holds the database. Paths on the user's disk are replaced by placeholders unless `show_paths`.
"""

from __future__ import annotations

import dataclasses
import html
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cached_property, partial
from pathlib import Path

import pandas as pd

from vitbench import store
from vitbench.errors import UserError
from vitbench.files.atomic import WriteFailed
from vitbench.protocols.registry import protocols, with_metric
from vitbench.store.query import apply_where, json_field
from vitbench.views.cells import Cell, TableData
from vitbench.views.figures import contact_sheet, inspection_plots, plots, pretraining
from vitbench.views.measured import contamination, pretraining_runs
from vitbench.views.measured.columns import accelerator_days, measured_columns
from vitbench.views.measured.footnotes import short_fingerprint
from vitbench.views.measured.settings import settings_listed
from vitbench.views.report import report_page, summary
from vitbench.views.report.private_paths import explanation, private_roots, redact
from vitbench.views.statistics.significance import SIGNIFICANT_MARK
from vitbench.views.tables import attention, bench_table, per_class, pretrain, robustness, table


@dataclass
class Section:
    anchor: str
    heading: str
    parts: list[str] = field(default_factory=list)

    def html(self) -> str:
        return report_page.section(self.anchor, self.heading, self.parts)


@dataclass
class Page:
    """What the sections are built from; `figures` is where their SVGs are drawn before inlining."""

    df: pd.DataFrame
    results: Path
    compare: Sequence[str]
    figures: Path
    baseline: Sequence[str] = ()  # what each table's significance marks compare against (--baseline)
    ids: set[str] = field(default_factory=set)

    @cached_property
    def curves(self) -> pd.DataFrame:
        """Every stored training curve, read once for the page's sections (each keeps its runs')."""
        return store.read_curves(self.results)

    def table(self, name: str, data: TableData, filter_box: bool = True, blocks: list[list[str]] | None = None) -> str:
        """`name`-table, or `name`-table-2, … where a section has several (a link can point at it);
        a table wider than the page in parts that fit (`_fitting`: of `blocks`, the columns that
        belong together, else one column at a time), each part a table of its own."""
        parts = []
        data = only_shown_marks(data)
        for part in data.split(_fitting(data, blocks), notes_on_each=False):  # the footnotes once, after the last
            anchor, n = f"{name}-table", 1
            while anchor in self.ids:
                n += 1
                anchor = f"{name}-table-{n}"
            self.ids.add(anchor)
            parts.append(report_page.table(anchor, part, filter_box))
        return "\n".join(parts)

    def figure(self, name: str, make: Callable[[], plots.Figure]) -> str:
        """The figure `make` draws, or nothing where it has no measured data to draw."""
        try:
            drawn = make()
        except WriteFailed as e:  # not "nothing to draw": a full TMPDIR ended the report 0 without its figure
            raise WriteFailed(
                f"the report's {name} figure: {e} (the report draws its figures in TMPDIR, {tempfile.gettempdir()})"
            ) from None
        except UserError:
            return ""
        return report_page.figure(drawn.files[0], f"figure-{name}", drawn.caption)


def only_shown_marks(data: TableData) -> TableData:
    """`data` without the footnotes of marks none of its cells shows: the interval's where no cell
    has one, the significance legend where no cell is marked (the report printed both under tables
    that showed neither)."""
    cells = data.cells.values()
    intervals = any(c.interval is not None for c in cells)
    marked = any(SIGNIFICANT_MARK in (c.marks or "") for c in cells)
    kept = [
        n
        for n in data.footnotes
        if not (n.startswith("[lo, hi]") and not intervals) and not (n.startswith(SIGNIFICANT_MARK) and not marked)
    ]
    return dataclasses.replace(data, footnotes=kept)


def _protocol_section(page: Page, name: str) -> Section:
    """One transfer protocol: its Table 2-layout view (the paper's columns beside where the protocol
    compares with them), split per model and weights where it would be wide; VTAB per task where
    VTAB ran; its figures."""
    protocol = protocols().get(name)
    label = protocol.label if protocol else name  # a protocol whose plugin is not installed here still has its section
    df = page.df[page.df["protocol"] == name]
    out = Section(report_page.safe_id(name), label)
    # the --compare columns beside every protocol's cells, as `vitbench table --compare` shows them (a Δ
    # only where the protocol's metric stands beside the paper's fine-tuned cells): one table, labelled,
    # marked and tested as `vitbench table --ci` does it, then split where it is wide (never worked out again)
    view = table.accuracy_view(df, page.compare, name, ci=page.results, heading=out.heading, baseline=page.baseline)
    out.parts.append(page.table(out.anchor, view, blocks=_backbones(view, df, name)))
    if df["dataset"].str.startswith("vtab/").any():
        out.parts.append(page.table(f"{out.anchor}-vtab", table.table9_view(df, (), name)))
        out.parts.append(page.figure(f"vtab-{out.anchor}", lambda: plots.vtab_figure(df, page.figures, ("svg",), name,
                                                                              plots.PAGE)))  # fmt: skip
    if protocol is not None and protocol.axis is not None:
        # the standalone figure (`vitbench plot NAME`): drawn from every protocol's runs, so that its
        # references (the linear probe of the same features) are there too
        out.parts.append(
            page.figure(name, partial(plots.axis_figure, page.df, name, page.figures, ("svg",), plots.PAGE, 2))
        )
    curves = page.curves[page.curves["run_key"].isin(df["run_key"].unique())]  # the runs that trained
    if not curves.empty:
        out.parts.append(page.figure(f"curves-{out.anchor}", lambda: plots.curves_figure(
            df, curves, page.figures, ("svg",), None, plots.PAGE)))  # fmt: skip
    return out


def _backbones(view: TableData, df: pd.DataFrame, protocol: str) -> list[list[str]]:
    """A protocol view's measured columns in blocks of one model and weights each (a column renamed
    by the view: a block of its own), in the view's order: what a part of a split table keeps together."""
    runs = measured_columns(df, protocol).runs
    backbones = zip(runs["model"], runs["weights_sha256"], runs["random_init"], strict=True)
    identity = dict(zip(runs["column"], backbones, strict=True))
    blocks: list[list[str]] = []
    for column in (c for c in view.columns if c not in view.paper_columns):
        if blocks and identity.get(column, column) == identity.get(blocks[-1][-1], blocks[-1][-1]):
            blocks[-1].append(column)
        else:
            blocks.append([column])
    return blocks


def _fitting(view: TableData, blocks: list[list[str]] | None = None) -> list[list[str]]:
    """The view's columns in groups that each fit the page (report_page.TABLE_EMS, with the row
    labels and the paper's columns, which every group repeats): `blocks` (by default a column
    each) packed together while they fit; a block that does not fit alone is split where it must."""
    paper = [c for c in view.columns if c in view.paper_columns]
    blocks = blocks or [[c] for c in view.columns if c not in view.paper_columns]
    width = {c: report_page.column_ems(view, c) for c in view.columns}
    room = report_page.TABLE_EMS - report_page.row_label_ems(view) - sum(width[c] for c in paper)
    if sum(width[c] for block in blocks for c in block) <= room:
        return [view.columns]
    groups: list[list[str]] = [[]]
    for block in blocks:
        if groups[-1] and sum(width[c] for c in groups[-1] + block) > room:
            groups.append([])  # a block that fits a part of its own starts one
        for column in block:
            if groups[-1] and sum(width[c] for c in groups[-1]) + width[column] > room:
                groups.append([])
            groups[-1].append(column)
    return [group + paper for group in groups]


def _pretraining_section(page: Page) -> Section:
    out = Section("pretrain", "Pre-training")
    out.parts.append(page.table("pretrain", pretrain.pretrain_view(page.df), filter_box=False))
    out.parts.append(page.figure("datasize", lambda: pretraining.datasize_figure(page.df, page.figures, ("svg",),
                                                                                 plots.PAGE)))  # fmt: skip
    out.parts.append(page.figure("compute", lambda: pretraining.compute_figure(page.df, page.figures, ("svg",),
                                                                               plots.PAGE)))  # fmt: skip
    pre = page.df[page.df["protocol"].isin(pretraining_runs.pretraining_protocols())]
    curves = store.read_curves(page.results, list(pre["run_key"].unique()))
    if not curves.empty:
        latest = pre.sort_values("finished_at")["run_key"].iloc[-1]
        out.parts.append(page.figure("curves-pretrain", lambda: plots.curves_figure(
            pre, curves, page.figures, ("svg",), latest, plots.PAGE)))  # fmt: skip
    return out


def _attention_section(page: Page, distances: pd.DataFrame) -> Section:
    """§4.5's Fig. 7 (right) for every stored inspection, beside its table."""
    out = Section("attention", "Attention distance")
    out.parts.append(page.table("attention", attention.attention_view(distances), filter_box=False))
    for i, (_key, part) in enumerate(distances.groupby("inspect_key", sort=False)):
        grid = part.pivot_table(index="layer", columns="head", values="distance_px").sort_index()
        first = part.iloc[0]
        weights = "random init" if first["random_init"] else str(first["weights"]).rsplit("/", 1)[-1]
        what = f"{first['model']} ({weights}) at {first['res']} px"
        path = inspection_plots.attention_distance(grid.to_numpy(), int(first["n_images"]), page.figures / f"a{i}.svg",
                                                   what)  # fmt: skip
        caption = f"Mean attention distance per head and layer (Fig. 7 right): {what}, {first['n_images']} images"
        out.parts.append(report_page.figure(path, f"figure-attention-{i}", caption))
    return out


def _sections(page: Page, only: str | None) -> list[Section]:
    df = page.df
    present = set(df["protocol"]) if not df.empty else set()
    known = protocols()
    # a protocol whose plugin is not installed here still has its section
    transfer = [p for p in summary.in_report_order(present) if p not in known or p in with_metric(lambda m: m.transfer)]
    out = []
    if not df.empty:
        head = Section("summary", "Summary")
        gist = summary.summarise(df, page.compare)
        head.parts.append(report_page.facts(gist.facts))
        if gist.headline.rows:
            head.parts.append(page.table("summary", gist.headline, filter_box=False))
        out.append(head)
    out += [_protocol_section(page, p) for p in transfer]
    if robustness.scored_under_shift(df):
        shifted = robustness.robustness_view(df, ())
        out.append(Section("robustness", "Robustness", [page.table("robustness", shifted)]))
    if not df.empty and df["metric"].isin(["ece", "nll"]).any():
        calibration = per_class.calibration_view(df)
        out.append(Section("calibration", "Calibration", [page.table("calibration", calibration, filter_box=False)]))
    if present & pretraining_runs.pretraining_protocols():
        out.append(_pretraining_section(page))
    if only is None:
        distances = store.read_attention_distance(page.results)
        if not distances.empty:
            out.append(_attention_section(page, distances))
        bench = store.read_bench(page.results)
        if not bench.empty:
            view = bench_table.bench_view(bench)
            out.append(Section("bench", "Throughput", [page.table("bench", view, filter_box=False)]))
    audits = store.read_audits(page.results) if only is None else None
    if audits is not None and not audits.empty:
        out.append(_contamination_section(page, audits))
    if not df.empty:
        out.append(_provenance(df))
    return out


def _contamination_section(page: Page, audits: pd.DataFrame) -> Section:
    """The stored near-duplicate audits (`vitbench dedup`): a row each, and each audit's contact
    sheet (the pairs, images side by side, with their files or `split:index`) where it was drawn."""
    data = TableData(title="Test images with a near-duplicate")
    for name in (*contamination.AUDIT_COLUMNS, "threshold", "audited"):
        data.add_column(name)
    sheets = []
    for audit in audits.sort_values("created_at").to_dict("records"):
        row = f"{audit['test_dataset']} {audit['test_split']} [{str(audit['audit_key'])[:8]}]"
        data.add_row(row)
        when = f"{pd.Timestamp(audit['created_at']):%Y-%m-%d %H:%M}"
        values = [*contamination.audit_cells(audit), f"{audit['threshold']:g}", when]
        for column, text in zip(data.columns, values, strict=True):
            data.cells[(row, column)] = Cell(text=text)
        sheet = contact_sheet.sheet_path(page.results, str(audit["audit_key"]))
        if audit["n_pairs"] and sheet.is_file():
            caption = (f"{row}: the nearest pairs and those nearest the threshold, each test image beside what it "
                       "was found to copy, with its file or, for images kept in arrays, split:index")  # fmt: skip
            sheets.append(report_page.image(sheet, f"sheet-{str(audit['audit_key'])[:12]}", caption))
    data.footnotes.append(
        "one row per stored `vitbench dedup` audit; a table cell's ¶N counts the test images with a near-duplicate "
        "in the train split its runs learned from, by the latest audit of those two splits at the default threshold"
    )
    if audits["n_pairs"].gt(0).any() and not sheets:
        data.footnotes.append("no contact sheet is stored: `vitbench dedup` draws one for each audit it runs")
    return Section("contamination", "Contamination", [page.table("contamination", data, filter_box=False), *sheets])


def _provenance(df: pd.DataFrame) -> Section:
    """Per measured column of every protocol, everything that stands behind it."""
    items = []
    for name in dict.fromkeys(df["protocol"]):
        runs = measured_columns(df, name).runs
        if runs.empty:  # pre-training: one row per run in its own table
            runs = df[df["protocol"] == name].drop_duplicates("run_key").assign(column=lambda r: r["model"])
        for col, part in runs.groupby("column", sort=False):
            days = accelerator_days(part)
            rows = {
                "runs": f"{part['run_key'].nunique()} ({name})",
                "weights": _distinct(part, "{} (sha256 {})", "weights", "weights_sha256"),
                "data": "; ".join(sorted({
                    f"{d}: {src} @ {short_fingerprint(fp)}" for d, src, fp in
                    zip(part["dataset"], part["data_source"], part["data_fingerprint"], strict=True)})),
                "protocol": _distinct(part, "{}", "protocol_version"),
                "seeds": ", ".join(str(int(s)) for s in sorted(set(part["seed"]))),
                "hardware": _distinct(part, "{} × {}", "device_name", "device_count"),
                "code": _distinct(
                    part, "vitbench {} (git {}), torch {}, timm {}", "vitbench_version", "git_sha", "torch_version",
                    "timm_version",
                ),
                "cost": f"{days:.3g} accelerator-days" if days is not None else "not recorded",
                "settings": settings_listed(json_field(part["hparams"].iloc[0])),
            }  # fmt: skip
            body = "".join(f"<tr><th>{k}</th><td>{html.escape(v)}</td></tr>" for k, v in rows.items())
            items.append(f"<details><summary>{html.escape(f'{col} ({name})')}</summary><table>{body}</table></details>")
    return Section("provenance", "Provenance of each measured column", items)


def _distinct(part: pd.DataFrame, pattern: str, *fields: str) -> str:
    """The distinct values of `fields` among a column's runs, formatted and joined."""
    return "; ".join(sorted({pattern.format(*values) for values in zip(*(part[f] for f in fields), strict=True)}))


def report_html(
    results: Path,
    where: Sequence[str] | None = None,
    compare: Sequence[str] = (),
    protocol: str | None = None,
    now: datetime | None = None,
    show_paths: bool = False,
    baseline: Sequence[str] = (),
) -> str:
    now = now or datetime.now(UTC)
    df = contamination.with_test_duplicates(apply_where(store.read_results(results), list(where or ())), results)
    if protocol is not None and not df.empty:
        df = df[df["protocol"] == protocol]
    roots = [] if show_paths else private_roots(df, results)
    made = (
        f"Made {now:%Y-%m-%d %H:%M} UTC by vitbench from {html.escape(str((results / store.DB_NAME).resolve()))}"
        f" ({df['run_key'].nunique() if not df.empty else 0} runs"
        + (f", --where {html.escape(' '.join(where))}" if where else "")
        + (f", --protocol {html.escape(protocol)}" if protocol else "")
        + ")."
        + (f" {html.escape(explanation(roots))}" if roots else "")
    )
    try:
        drawing = tempfile.TemporaryDirectory()
    except OSError as e:
        where, why = tempfile.gettempdir(), e.strerror or e
        raise WriteFailed(f"{where}: cannot make the report's figure folder there ({why}); TMPDIR names it") from None
    with drawing as tmp:
        page = Page(df, results, compare, Path(tmp), baseline)
        sections = _sections(page, protocol)  # an inspection or a bench alone has sections too
        if not sections:
            empty = "<p>This store holds no results yet: run <code>vitbench run</code>.</p>"
            sections = [Section("empty", "No results", [empty])]
        shown = [s.html() for s in sections]
    toggle = (
        '<label class="toggle"><input type="checkbox" id="show-intervals"/> show 95 % intervals in the tables '
        "(each cell's interval is also on hover)</label>"
        if any('class="ci"' in s for s in shown)
        else ""
    )
    text = report_page.page(made, toggle, [(s.anchor, s.heading) for s in sections], shown)
    return redact(text, roots) if roots else text

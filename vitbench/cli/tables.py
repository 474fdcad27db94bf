"""`vitbench table`, `ingest`, `export` and `plot`: the store read back as the paper's tables, files
and figures."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from vitbench import store
from vitbench.cli.app import app, err, out
from vitbench.cli.options import (
    Baseline,
    Results,
    ViewProtocol,
    Where,
    argument,
    check_choice,
    check_out_file,
    check_out_folder,
    in_panel,  # noqa: F401  (named by the text annotations @panels writes)
    option,
    panels,
    words,
)
from vitbench.cli.output import show
from vitbench.errors import UserError
from vitbench.protocols.measures import ACCURACY_VIEW
from vitbench.protocols.registry import along, get_protocol, own_view, protocols
from vitbench.views import registry


def _view_protocol(protocol: str | None, shots: int | None) -> str | None:
    """The protocol a view shows: `--protocol`, or the one whose runs have shots when `--shots` is given."""
    known = protocols()
    if protocol is not None:
        check_choice("--protocol", protocol, list(known), "or")
    if shots is None:
        return protocol
    with_shots = sorted(along("shots"))
    if protocol is not None and protocol not in with_shots:
        raise UserError(f"--shots {shots}: only {' and '.join(with_shots)} runs have shots; drop --protocol {protocol}")
    if protocol is None and len(with_shots) > 1:
        raise UserError(f"--shots {shots}: the runs of {' and '.join(with_shots)} have shots; add --protocol")
    return protocol or with_shots[0]


@app.command("table")
@panels(
    {
        "What to show": ("view", "which", "compare", "delta_to", "all_rows", "per_class_of", "bench"),
        "Which runs": ("protocol", "shots", "where", "group_by", "include_marked"),
        "Statistics": ("ci", "baseline"),
        "Output": ("fmt", "out_file", "results"),
    }
)
def table_cmd(
    names: Annotated[
        list[str] | None, argument(help="More paper columns after --compare (`--compare bit-l vit-l/16-i21k`).")
    ] = None,
    compare: Annotated[
        list[str] | None, option("--compare", help="Paper column(s) to add, e.g. bit-l (`vitbench ls models`).")
    ] = None,
    which: Annotated[str, option("--table", help="2 (default), 5, 6 or 9: the paper table's layout.")] = "2",
    protocol: ViewProtocol = None,
    shots: Annotated[int | None, option("--shots", help="Only this few-shot count.")] = None,
    group_by: Annotated[
        list[str] | None,
        option("--group-by", help="Columns by these stored fields instead of (model, weights), e.g. data_source."),
    ] = None,
    where: Where = None,
    include_marked: Annotated[
        bool, option("--include-marked", help="Give random-init, subset and smoke cells a Δ and a bold too.")
    ] = False,
    delta_to: Annotated[
        str | None, option("--delta-to", help="The --compare column Δ is taken against (default: the first).")
    ] = None,
    fmt: Annotated[str, option("--format", "-f", help="rich, md, latex, csv or html.")] = "rich",
    out_file: Annotated[Path | None, option("--out", "-o", help="Write to this file instead of stdout.")] = None,
    view: Annotated[
        str | None,
        option(
            "--view",
            help=f"{registry.views_help()}. [default: accuracy; with --protocol, that protocol's own view]",
        ),
    ] = None,
    bench: Annotated[
        bool, option("--bench", help="The throughput measurements of `vitbench bench` instead of accuracy.")
    ] = False,
    ci: Annotated[
        bool,
        option("--ci", help="95 % intervals; * where a cell differs from its --baseline cell (Holm-significant)."),
    ] = False,
    baseline: Baseline = None,
    all_rows: Annotated[
        bool, option("--all-rows", help="Table 2's seven rows even where only the paper's columns fill them.")
    ] = False,
    per_class_of: Annotated[
        str | None, option("--per-class", help="Per-class accuracy on this dataset (kept predictions).")
    ] = None,
    results: Results = Path("results"),
) -> None:
    """Stored results in the paper's layouts, beside the paper's own numbers."""
    from vitbench.store import query

    if names and not compare:
        raise UserError(f"unexpected argument {names[0]!r}: paper columns follow --compare (--compare {names[0]})")
    chosen = registry.TABLES["bench"] if bench else registry.TABLES["per-class"] if per_class_of else None
    shown = _view_protocol(protocol, shots)  # (checked first: an unknown --protocol is one line)
    found = chosen or registry.table_view(view or (own_view(get_protocol(shown)) if shown else ACCURACY_VIEW))
    inputs = registry.Inputs(
        results, where, shown, [*(compare or ()), *(names or ())], which, shots,
        query.split_fields(group_by), include_marked, delta_to, ci, list(words(baseline)), all_rows, per_class_of,
    )  # fmt: skip
    found.check(inputs)
    data = found.build(inputs)
    if found.empty and not data.rows:
        err.print(found.empty.format(db=results / store.DB_NAME))
        return
    show(data, fmt, results, out_file)


@app.command("ingest")
def ingest_cmd(
    rebuild: Annotated[
        bool,
        option(
            "--rebuild",
            help="Build a new database from the run shards beside the old one and swap it in last (inspect "
            "and bench rows copied over where the old file reads; the old file kept under a name of its own, "
            "unchanged): for a damaged file, or one that is not vitbench's own plain tables.",
        ),
    ] = False,
    results: Results = Path("results"),
) -> None:
    """Merge result shards (from cluster jobs, concurrent or interrupted runs) into the results database."""
    folder = store.shard_dir(results)
    if not folder.is_dir():
        raise UserError(f"--results {results}: no runs/ folder of result shards there")
    if rebuild:
        aside, merged, copied = store.rebuild(results)
        if aside is not None and copied is None:
            why = "not vitbench's own plain tables, never read" if ".refused-" in aside.name else "unreadable"
            out.print(
                f"set {results / store.DB_NAME} aside as {aside} ({why}: its inspect and bench rows, and the "
                "dedup audits stored before audits had shards, stay there; audits with a shard are rebuilt)"
            )
        elif aside is not None:
            out.print(
                f"set {results / store.DB_NAME} aside as {aside}; {copied} inspect, bench and dedup row(s) copied over"
            )
    else:
        merged = store.sync(results, strict=True)
    out.print(f"merged {merged} new run(s) into {results / store.DB_NAME} ({len(store.shard_keys(results))} shards)")


@app.command("export")
def export_cmd(
    fmt: Annotated[str, option("--format", "-f", help="parquet, csv or json.")] = "parquet",
    out_file: Annotated[
        Path | None, option("--out", "-o", help="The file to write (default vitbench-runs.<format>).")
    ] = None,
    predictions: Annotated[
        bool,
        option("--predictions", help="The runs' per-image predictions (id, label, top-5, correct) instead."),
    ] = False,
    cells: Annotated[
        bool,
        option(
            "--cells",
            help="The cells `vitbench table --ci` shows instead: a row per cell, a column per setting, mean, std, "
            "n, the 95 % interval and the p-value against the --baseline cell.",
        ),
    ] = False,
    baseline: Baseline = None,
    protocol: ViewProtocol = None,
    where: Where = None,
    results: Results = Path("results"),
) -> None:
    """Every stored run × metric with its provenance, as Parquet or CSV (for pandas), or as JSON: one
    document per run, its fields, hparams and metrics nested (docs/results-schema.md)."""
    from vitbench.store.export import RUN_DOCUMENT, export, export_cells, export_predictions

    if (baseline or protocol) and not cells:
        raise UserError("--baseline and --protocol choose the cells of `export --cells`: give --cells too")
    if cells and predictions:
        raise UserError("--cells and --predictions are two exports: give one")
    if out_file is not None:
        check_out_file(out_file)  # a regular file or none yet, in a folder that exists
    if cells:
        from vitbench.views.tables.cell_export import cells_frame

        _view_protocol(protocol, None)  # an unknown --protocol is one line naming the known ones

        path = out_file or Path(f"vitbench-cells.{fmt}")
        rows = export_cells(results, fmt, path, where, lambda df: cells_frame(df, results, protocol, words(baseline)))
        out.print(f"wrote {rows} cell(s) (one row each: setting, mean, std, n, interval, p-value) to {path}")
        return
    if predictions:
        path = out_file or Path(f"vitbench-predictions.{fmt}")
        rows, runs = export_predictions(results, fmt, path, where)
        out.print(f"wrote {rows} rows (run × image) of {runs} run(s) to {path}")
        return
    path = out_file or Path(f"vitbench-runs.{fmt}")
    rows = export(results, fmt, path, where)
    if not rows:  # as `table` says it, and ends 0: the file holds the columns only
        said = "no stored run fits --where" if where and store.read_results(results).shape[0] else "no results yet"
        empty = "no documents ([])" if fmt == "json" else "its columns only"
        out.print(f"{said} in {results}: wrote {path} with {empty}", soft_wrap=True)
        return
    if fmt == "json":
        out.print(f"wrote {rows} run(s) (one document each, schema {RUN_DOCUMENT}) to {path}", soft_wrap=True)
        return
    out.print(f"wrote {rows} rows (run × metric, with provenance) to {path}")


@app.command("plot")
def plot_cmd(
    figures: Annotated[
        list[str] | None,
        argument(help=registry.figures_help()),
    ] = None,
    out_dir: Annotated[Path, option("--out", "-o", help="Folder for the figures.")] = Path("plots"),
    formats: Annotated[str, option("--formats", help="Comma-separated: png, svg.")] = "png,svg",
    cost: Annotated[str, option("--cost", help="The cost axis of `cost`: flops or days.")] = "flops",
    run: Annotated[
        str | None,
        option("--run", help="`curves`: a fine-tuning run's run_key (or its start); `confusion`: any run's."),
    ] = None,
    protocol: ViewProtocol = None,
    where: Where = None,
    results: Results = Path("results"),
) -> None:
    """The paper's figures from the store: VTAB groups, accuracy vs cost, few-shot vs shots, fine-tuning curves."""
    chosen = [registry.figure_view(name) for name in figures] if figures else registry.default_figures()
    exts = tuple(f.strip().lower() for f in formats.split(",") if f.strip())
    if not exts or any(e not in ("png", "svg") for e in exts):
        raise UserError(f"--formats {formats}: expected png, svg or png,svg")
    out_dir = check_out_folder(out_dir)
    inputs = registry.Inputs(
        results, where, protocol, out_dir=out_dir, formats=exts, cost=cost, run=run, named=bool(figures)
    )
    for view in chosen:
        try:
            fig = view.draw(inputs)
        except UserError as e:
            if figures:  # asked for by name: the reason is the error
                raise
            err.print(f"{view.name}: skipped, {e}", markup=False, highlight=False)
            continue
        out.print(f"[bold]{', '.join(str(f) for f in fig.files)}[/bold]")
        out.print(fig.caption, markup=False, highlight=False)

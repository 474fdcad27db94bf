"""What commands print or write: the summary table after a run, a rendered view to the terminal or
to a file (atomically)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

from vitbench import store
from vitbench.cli.app import err, print_table, table_width
from vitbench.cli.options import check_choice, check_out_file
from vitbench.errors import UserError
from vitbench.files.atomic import write_atomic
from vitbench.protocols.registry import own_view, protocols
from vitbench.views import registry

if TYPE_CHECKING:  # the views (pandas, DuckDB) load when something is shown, not for `--help`
    from vitbench.views.cells import TableData


def print_summary_table(results: Path, run_keys: set[str] | None = None) -> None:
    """The summary after `vitbench run`: each protocol's own view of its runs where it declares one
    (pre-training: beside its transfer results), then the accuracy view of every other run, only
    the rows that have results, its columns named as the store's other runs of those datasets and
    protocols tell them apart. `run_keys`: only these runs (the ones the command planned)."""
    from vitbench.views.tables import table

    stored = store.read_results(results)
    df = stored[stored["run_key"].isin(run_keys)] if run_keys is not None else stored
    known = protocols()
    for view in dict.fromkeys(own_view(known[p]) for p in df["protocol"].unique() if p in known):
        found = registry.TABLES[view]
        if found.shows is None or df.empty:
            continue
        shown = found.shows(df)
        print_view(found.build(registry.Inputs(results, runs=df)))
        df = df[~df["run_key"].isin(shown)]
    if df.empty:
        return
    # labelled among the store's runs of the same datasets and protocols: a bf16 run beside stored fp32
    # runs says `precision=bf16`, as `vitbench table` would
    context = stored[stored["dataset"].isin(set(df["dataset"])) & stored["protocol"].isin(set(df["protocol"]))]
    data = table.accuracy_view(context, keep=set(df["run_key"]))
    if data.rows:
        print_view(data)


def print_view(data: TableData) -> None:
    """A view on stdout as a rich table that fits the terminal (or COLUMNS): split, never cut."""
    from vitbench.views.tables import render

    print_table(render.to_rich(data, table_width()))


def _demo_hint(results: Path) -> str:
    """Where the demo's runs are, when they are all a results folder holds (they live apart)."""
    demo = results / "demo"
    return f" (the demo's runs are in {demo}: --results {demo})" if (demo / store.DB_NAME).exists() else ""


def _nothing_shown(results: Path) -> str:
    """Why a view is empty: the store is, or what was asked for (--where, --protocol, …) selects
    none of what it holds."""
    stored = store.read_results(results)
    if stored.empty:
        return f"no results in {results / store.DB_NAME} yet; try `vitbench run`{_demo_hint(results)}"
    runs = stored["run_key"].nunique()
    if runs == 1:
        held, shown = f"the one run in {results} does not fit", "it"
    else:
        held, shown = f"none of the {runs} runs in {results} fits", "them all"
    return (
        f"{held} what was asked for (--where, --protocol, --shots, --view); "
        f"`vitbench table --results {results}` shows {shown}"
    )


def emit(text: str, out_file: Path | None) -> None:
    if out_file is None:
        sys.stdout.write(text)
        return
    write_atomic(check_out_file(out_file), text)
    err.print(f"wrote {out_file}", soft_wrap=True, markup=False, highlight=False)  # a path is never broken across lines


def show(data: TableData, fmt: str, results: Path, out_file: Path | None = None) -> None:
    """`data` in `fmt` on the terminal (rich) or as text to stdout or `out_file`."""
    from vitbench.views.tables import render

    check_choice("--format", fmt, render.FORMATS)
    if not data.rows:
        err.print(_nothing_shown(results), markup=False, soft_wrap=True)
        return
    if fmt == "rich":
        if out_file is not None:
            raise UserError("--out needs a file format: --format md, latex, csv or html")
        print_view(data)
    else:
        emit(render.render_text(data, fmt), out_file)


def ended_well(summary) -> None:
    """A command whose runs did not all land says so in its last line, with a non-zero exit: runs
    whose protocol failed (each already named in a `failed:` line), or results the database could
    not take (kept as shards: nothing is lost, and the next command merges them)."""
    if summary.failed:
        raise UserError(
            f"{len(summary.failed)} protocol(s) failed (see the `failed:` line(s) above); the other runs are "
            "stored, and running the same command again retries only what has no result"
        )
    if summary.store_problem:
        raise UserError(summary.store_problem)

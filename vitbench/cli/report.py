"""`vitbench report`: the store as one self-contained HTML page."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from vitbench.cli.app import app, out
from vitbench.cli.options import Baseline, Results, ViewProtocol, Where, check_choice, option, words
from vitbench.cli.output import emit
from vitbench.protocols.registry import protocols


@app.command("report")
def report_cmd(
    out_file: Annotated[Path, option("--out", "-o", help="The HTML file to write.")] = Path("report.html"),
    compare: Annotated[
        list[str] | None, option("--compare", help="Paper column(s) beside the measured ones, e.g. bit-l.")
    ] = None,
    protocol: ViewProtocol = None,
    where: Where = None,
    baseline: Baseline = None,
    show_paths: Annotated[
        bool,
        option(
            "--show-paths",
            help="Show the data, weights and results folders in full (by default they are placeholders such as "
            "<data-dir>, so the page can be forwarded without your disk's layout).",
        ),
    ] = False,
    results: Results = Path("results"),
) -> None:
    """A summary, then every protocol's tables and figures and each column's provenance, in one HTML
    file (no server, no network). Open it in any browser; forward it as it is."""
    if protocol is not None:
        check_choice("--protocol", protocol, list(protocols()), "or")
    from vitbench.views.report.report import report_html

    page = report_html(results, where, compare or (), protocol, show_paths=show_paths, baseline=words(baseline))
    emit(page, out_file)
    out.print(f"{len(page.encode()) / 1e6:.2f} MB, open it in any browser (it needs no network)")

"""`vitbench compare A B`: two sets of stored runs compared on the same test images."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from vitbench import store
from vitbench.cli.app import app
from vitbench.cli.options import Results, Where, argument, option, words
from vitbench.cli.output import show


@app.command("compare")
def compare_cmd(
    a: Annotated[str, argument(help="Runs A: --where clauses, comma-separated (e.g. 'shots=10').")],
    b: Annotated[str, argument(help="Runs B, the same way (e.g. 'shots=25').")],
    every_setting: Annotated[
        bool,
        option(
            "--all",
            help="A row per dataset and setting both select (protocol, shots, k, …): A vs B at every shared "
            "setting, Holm over them all (e.g. `compare weights=random 'weights=deit*' --all`).",
        ),
    ] = False,
    fmt: Annotated[str, option("--format", "-f", help="rich, md, latex, csv or html.")] = "rich",
    where: Where = None,
    results: Results = Path("results"),
) -> None:
    """B − A per dataset on the same test images: Δ, its 95 % interval and a paired p-value."""
    from vitbench.store import query
    from vitbench.views.statistics.paired_compare import compare_view

    store.sync(results)
    df = query.apply_where(store.read_results(results), where)
    clauses = [list(words(side)) for side in (a, b)]
    show(compare_view(df, clauses[0], clauses[1], results, every_setting), fmt, results)

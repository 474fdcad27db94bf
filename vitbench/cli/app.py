"""The Typer application and the two consoles every command prints to."""

from __future__ import annotations

import os
from typing import Annotated

import typer
from rich.console import Console, RenderableType

from vitbench.version import __version__

app = typer.Typer(
    help="Reproduce the transfer protocols of 'An Image is Worth 16x16 Words' (ViT) for any backbone.",
    context_settings={"help_option_names": ["-h", "--help"]},
    no_args_is_help=False,
    pretty_exceptions_enable=False,
    add_completion=False,
)
out = Console()
err = Console(stderr=True)
# wide enough for any table vitbench draws; a pipe or a file gets the table's own width, not 80 columns
UNWRAPPED = 10_000


def table_width() -> int | None:
    """The characters a line of a table may take: the terminal's width; piped or redirected, the
    COLUMNS the user set, else none (the table's own width)."""
    if out.is_terminal:
        return out.width
    columns = os.environ.get("COLUMNS", "")
    return int(columns) if columns.isdigit() and int(columns) > 0 else None


def print_table(renderable: RenderableType) -> None:
    """A rich table on stdout: fitted to the terminal where there is one; piped or redirected (not a
    terminal), at its full natural width (or the COLUMNS the user set), so no cell is cut to `rand…`
    by a default of 80 columns."""
    if out.is_terminal:
        out.print(renderable)
        return
    natural = out.measure(renderable, options=out.options.update_width(UNWRAPPED)).maximum
    # a console of that width, or of the COLUMNS the user set: Console.print(width=) is capped at the
    # console's own width
    Console(file=out.file, width=max(min(natural, table_width() or natural), 1)).print(renderable)


def _version(value: bool) -> None:
    if value:
        out.print(f"vitbench {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")
    ] = False,
) -> None:
    pass

"""The Typer application and the two consoles every command prints to."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console

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

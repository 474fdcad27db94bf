"""The Typer application and the two consoles every command prints to."""

from __future__ import annotations

import os
from typing import Annotated

import typer
from rich.console import Console, ConsoleRenderable, RenderableType, RenderHook
from rich.measure import Measurement
from rich.segment import Segment

from vitbench.execution.machine_load import Stopwatch
from vitbench.files.text_safety import visible
from vitbench.version import __version__

app = typer.Typer(
    help="Reproduce the transfer protocols of 'An Image is Worth 16x16 Words' (ViT) for any backbone.",
    context_settings={"help_option_names": ["-h", "--help"]},
    no_args_is_help=False,
    pretty_exceptions_enable=False,
    add_completion=False,
)


class _Shown:
    """A renderable whose text reaches the terminal with its control characters shown as `\\xNN`:
    names from the store are data (an OSC 52 sequence in a file's name wrote the clipboard and
    cleared the screen). rich's own control codes (styles, cursor moves) pass as rich made them."""

    def __init__(self, inner: RenderableType):
        self.inner = inner

    def __rich_console__(self, console, options):
        for segment in console.render(self.inner, options):
            yield segment if segment.control else Segment(visible(segment.text), segment.style)

    def __rich_measure__(self, console, options):
        return Measurement.get(console, options, self.inner)


class _ShowControls(RenderHook):
    def process_renderables(self, renderables: list[ConsoleRenderable]) -> list[ConsoleRenderable]:
        return [_Shown(r) for r in renderables]


_process_start: list[Stopwatch] = []  # where `vitbench` is the process: when it started (cli.main marks it)


def mark_process_start(at: Stopwatch) -> None:
    """cli.main's mark: the first command of a process counts from `at`, the process's start; a later
    one in the same process (the README walk's, a notebook's) from its own call."""
    _process_start[:] = [Stopwatch.start() if _process_start else at]


def command_began() -> Stopwatch:
    """When the command began: the process's start where `vitbench` is the process, its imports
    included; else (a command called in a running process: a notebook, a test's CliRunner) now. A
    dry run counts its start-up from here, as a quiet machine would take it (Stopwatch.seconds)."""
    return _process_start[0] if _process_start else Stopwatch.start()


def console(**settings) -> Console:
    """A Console that shows control characters in what it prints (see `_Shown`)."""
    made = Console(**settings)
    made.push_render_hook(_ShowControls())
    return made


out = console()
err = console(stderr=True)
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
    console(file=out.file, width=max(min(natural, table_width() or natural), 1)).print(renderable)


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

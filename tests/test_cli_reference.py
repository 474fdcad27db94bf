"""docs/cli.md is the command line's own reference: generated from the Typer app
(tests/cli_reference.py), so an option added, renamed or re-explained shows there at once."""

from __future__ import annotations

from cli_reference import PAGE, render


def test_the_cli_reference_is_what_the_command_line_says():
    assert PAGE.read_text() == render(), "docs/cli.md is out of date: run `python tests/cli_reference.py`"


def test_every_option_and_argument_is_explained():
    """No row of the reference without its words: a user reading --help or the page learns what each does."""
    rows = [line.split(" | ") for line in render().splitlines() if line.startswith("| `")]
    assert len(rows) > 100  # every command's options, not an empty page
    unexplained = [row[0] for row in rows if not row[1].strip()]
    assert not unexplained, unexplained

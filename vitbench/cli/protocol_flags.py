"""`vitbench run`'s flags for the options protocols declare (protocols/options.py), a plugin's
among them: each a typer option in its declared `--help` panel, and their command-line values
(comma lists as text) back as typed values for `Request.options`."""

from __future__ import annotations

import inspect
from typing import Annotated, Any

from vitbench.cli.options import int_list, option, words
from vitbench.errors import UserError
from vitbench.protocols.options import LEADING_PANELS, TRAILING_PANELS, Declared
from vitbench.protocols.registry import option_table


def parameters() -> list[inspect.Parameter]:
    """One keyword parameter per protocol option, as typer reads a command's signature. Not given
    on the command line, each is None (False for a switch): the protocol's own default applies."""
    found = []
    for name, (d, _) in option_table().items():
        shown = d.default_text()  # (in the help's words: typer would show a text default in parentheses)
        text = d.help if shown is None else f"{d.help} [default: {shown}]"
        info = option(d.flag, panel=d.panel, help=text, show_default=False)
        kind: Any = bool if d.kind is bool and not d.many else (str if d.many else d.kind) | None
        default = False if kind is bool else None
        found.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default,
                                       annotation=Annotated[kind, info]))  # fmt: skip
    return found


def panel_rank(panel: str | None) -> float:
    """Where a panel shows in `run --help`: what to run and the data, then the panels the
    protocols' options name in the registry's order (a plugin's own after the built-ins'), then
    devices, nodes, cluster jobs and output."""
    fixed = (*LEADING_PANELS, *TRAILING_PANELS)
    protocols = [p for p in dict.fromkeys(d.panel for d, _ in option_table().values()) if p not in fixed]
    order = [*LEADING_PANELS, *protocols, *TRAILING_PANELS]
    return order.index(panel) if panel in order else len(LEADING_PANELS) + len(protocols) - 0.5


def values(given: dict[str, Any]) -> dict[str, Any]:
    """The protocol options given on the command line (or in a config), as typed values."""
    found = {}
    for name, (d, _) in option_table().items():
        value = given.get(name)
        if value is None or (value is False and d.kind is bool):
            continue
        found[name] = _typed(d, value) if d.many else value
    return found


def _typed(d: Declared, text: Any) -> tuple:
    """A comma list as the declaration's type of value."""
    if d.kind is int:
        return int_list(d.flag, str(text)) or ()
    if d.kind is float:
        try:
            return tuple(float(v) for v in str(text).split(",") if v.strip())
        except ValueError:
            raise UserError(f"{d.flag} {text}: expected comma-separated numbers") from None
    return words(str(text))

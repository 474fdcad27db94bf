"""`vitbench run`'s flags for the options protocols declare (protocols/options.py), a plugin's
among them: each a typer option in its declared `--help` panel, a comma list parsed by its
declaration into a tuple of its kind as click reads it (a `--config` file's array, through the
same parameter, arrives as that tuple too)."""

from __future__ import annotations

import inspect
from typing import Annotated, Any

from vitbench.cli.options import option
from vitbench.protocols.options import LEADING_PANELS, TRAILING_PANELS
from vitbench.protocols.registry import option_table


def parameters() -> list[inspect.Parameter]:
    """One keyword parameter per protocol option, as typer reads a command's signature. Not given
    on the command line, each is None (False for a switch): the protocol's own default applies."""
    found = []
    for name, (d, _) in option_table().items():
        shown = d.default_text()  # (in the help's words: typer would show a text default in parentheses)
        text = d.help if shown is None else f"{d.help} [default: {shown}]"
        parsed = {"parser": d.parse, "metavar": f"<{d.kind.__name__} list>"} if d.many else {}
        info = option(d.flag, panel=d.panel, help=text, show_default=False, **parsed)
        kind: Any = bool if d.kind is bool and not d.many else (Any if d.many else d.kind) | None
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

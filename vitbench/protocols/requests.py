"""A Request from keyword options, as the Python API, the command line and a config file give
them: the fields every run shares go to the Request, the options a protocol declares to
`Request.options`, each checked against its declaration before any work."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Any

from vitbench.errors import UserError
from vitbench.protocols.base import Request
from vitbench.protocols.bounds import MAX_VALUES
from vitbench.protocols.registry import option_table

SHARED = tuple(f.name for f in fields(Request) if f.name != "options")
SHARED_LISTS = ("datasets", "tracker")


def known_options() -> list[str]:
    return [*SHARED, *option_table()]


def make_request(where: str = "vitbench.run", **given: Any) -> Request:
    """The Request of these keyword options (`where` names the caller in an error). A list option
    takes a tuple, a list, a range or one value; None leaves an option at its default."""
    table = option_table()
    unknown = sorted(set(given) - set(SHARED) - set(table))
    if unknown:
        expected = ", ".join(sorted(known_options()))
        raise UserError(f"{where}: unknown option {unknown[0]!r}; expected one of {expected}")
    for key in SHARED_LISTS:
        if given.get(key) is not None:
            given[key] = _as_tuple(given[key])
    for key in ("results", "data_dir", "tensorboard"):
        if given.get(key) is not None:
            if key == "results" and not str(given[key]).strip():
                raise UserError(f"{where}: results is empty; expected a folder for the results (default: results)")
            given[key] = Path(given[key])
    options = {}
    for name, value in given.items():
        if name not in table or value is None:
            continue
        declaration = table[name][0]
        if declaration.many:
            value = _as_tuple(value)
        if why := declaration.problem(value):
            raise UserError(why)
        options[name] = value
    return Request(**{k: v for k, v in given.items() if k in SHARED}, options=options)


def _as_tuple(value: Any) -> Any:
    """One value, a list or a range as a tuple (a range longer than any list may be is refused by
    its count, never expanded)."""
    if isinstance(value, str | int | float):
        return (value,)
    if isinstance(value, list) or (isinstance(value, range) and len(value) <= MAX_VALUES):
        return tuple(value)
    return value

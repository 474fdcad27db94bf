"""A Request from keyword options, as the Python API, the command line and a config file give
them: the fields every run shares go to the Request, the options a protocol declares to its
options object (`Request.options`), made and so checked before any work."""

from __future__ import annotations

import os
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from vitbench.catalog.registry import get_suite
from vitbench.errors import UserError
from vitbench.protocols.base import Request
from vitbench.protocols.bounds import MAX_VALUES
from vitbench.protocols.options import Given, declared
from vitbench.protocols.registry import BUILTIN, option_classes, option_table

SHARED = tuple(f.name for f in fields(Request) if f.name != "options")
SHARED_LISTS = ("datasets", "tracker")
COMMA_LISTS = ("model", "protocol", "weights")  # one text, a comma list (`--weights a.pth,random`): a list joins


def options_doc() -> str:
    """The keyword options of `vitbench.run` and `vitbench.plan`, for their docstrings (`help()`):
    each shared field with its type and default, then each built-in protocol's options as it
    declares them. Generated from the declarations, so it cannot fall behind them."""
    lines = ["", "Keyword options (the names of `vitbench run`'s flags; a list as a list, tuple or range; "
             "a path as str or Path):", ""]  # fmt: skip
    for f in fields(Request):
        if f.name == "options":
            continue
        kind = str(f.type).replace("tuple[str, ...]", "list[str]")
        joins = f" (a list joins as --{f.name}'s comma list)" if f.name in COMMA_LISTS else ""
        default = str(f.default) if isinstance(f.default, Path) else repr(f.default)
        lines.append(f"    {f.name}: {kind}{joins} = {default}")
    seen: set[str] = set()
    for protocol in BUILTIN:
        for d in declared(protocol.Options):
            if d.name in seen:
                continue
            seen.add(d.name)
            kind = f"list[{d.kind.__name__}]" if d.many else d.kind.__name__
            lines.append(f"    {d.name}: {kind} = {d.default!r}  {d.help}")
    lines += ["", "A plugin protocol's options are keywords too (`vitbench ls protocols`; `vitbench run --help`)."]
    return "\n".join(lines)


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
            names = _as_tuple(given[key])
            if not isinstance(names, tuple) or not all(isinstance(n, str) for n in names):
                raise UserError(f"{where}: {key}={given[key]!r}: expected a name or a list of names")
            given[key] = names
    for key in COMMA_LISTS:
        if isinstance(given.get(key), list | tuple):
            given[key] = ",".join(str(item) for item in given[key])  # a path, "random", a paper name
        elif isinstance(given.get(key), os.PathLike):  # weights=Path("w.safetensors"): its text
            given[key] = os.fspath(given[key])
        elif given.get(key) is not None and not isinstance(given[key], str):
            raise UserError(f"{where}: {key}={given[key]!r}: expected a name (or a list of names)")
    for key in ("results", "data_dir", "tensorboard"):
        if given.get(key) is not None and not isinstance(given[key], str | os.PathLike):
            raise UserError(f"{where}: {key}={given[key]!r:.40}: expected a folder (a str or Path)")
        if given.get(key) is not None:
            if key == "results" and not str(given[key]).strip():
                raise UserError(f"{where}: results is empty; expected a folder for the results (default: results)")
            given[key] = Path(given[key])
    # each protocol's options object, made (and so checked) here, once
    given_options = {name: table[name][0].parse(_as_tuple(value) if table[name][0].many else value)
                     for name, value in given.items() if name in table and value is not None}  # fmt: skip
    options = Given.made(given_options, option_classes())
    return _with_suite_defaults(Request(**{k: v for k, v in given.items() if k in SHARED}, options=options))


def request_of(req: object, options: dict, where: str) -> Request:
    """The Request given, or made from keyword options; both at once is refused (the options were
    ignored: `run(request(res=32), res=64)` ran at 32), as is anything else in the Request's place."""
    if req is None:
        return make_request(where, **options)
    if not isinstance(req, Request):
        raise UserError(f"{where}({req!r:.40}): expected a Request (vitbench.request(...)) or keyword options")
    if options:
        raise UserError(
            f"{where}: a Request and keyword options ({', '.join(sorted(options))}) at once; put them in the "
            "Request instead: vitbench.request(..., name=value)"
        )
    return req


def _with_suite_defaults(req: Request) -> Request:
    """The request with its suite's defaults wherever the user left an option at its default (the
    demo's model, weights, steps, transfer datasets and results folder); explicit datasets run
    without a suite. Applied here, where every Request made from options is made (the command
    line, a config file, `vitbench.run(**options)`), and nowhere else."""
    if req.datasets:
        return req
    suite, unset, table = get_suite(req.suite or "demo"), Request(), option_table()
    changes = {k: v for k, v in suite.defaults.items() if k not in table and getattr(req, k) == getattr(unset, k)}
    options = {k: v for k, v in suite.defaults.items() if k in table and k not in req.options}
    if options:
        changes["options"] = Given.made({**options, **req.options.values()}, option_classes())
    return replace(req, **changes) if changes else req


def _as_tuple(value: Any) -> Any:
    """One value, a list or a range as a tuple (a range longer than any list may be is refused by
    its count, never expanded)."""
    if isinstance(value, str | int | float):
        return (value,)
    if isinstance(value, list) or (isinstance(value, range) and len(value) <= MAX_VALUES):
        return tuple(value)
    return value

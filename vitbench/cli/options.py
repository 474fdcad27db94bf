"""Every command-line option, declared once, and the checks their values share. Choices are
checked against the constants the code already has (devices.PIPELINES,
devices.PRECISIONS, views.tables.render.FORMATS, …) with vitbench's one-line errors."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, get_args

import typer
from rich.markup import escape

from vitbench.errors import UserError, listed
from vitbench.files.out_paths import check_out_file, check_out_folder
from vitbench.host.devices import PIPELINES, PRECISIONS
from vitbench.protocols.registry import BUILTIN

# the choices commands check against (o.PIPELINES) and the checks of output paths (o.check_out_file)
__all__ = ["PIPELINES", "PRECISIONS", "check_out_file", "check_out_folder"]


def option(*names: str, help: str, panel: str | None = None, **settings: Any) -> Any:
    """typer.Option with its help shown as written: rich markup would take `[default: 0,1,2]` or
    `[suites.NAME]` for a style tag and print nothing in its place. `panel`: the group of options
    `--help` shows it in."""
    return typer.Option(*names, help=escape(help), rich_help_panel=panel, **settings)


def in_panel(shared: Any, panel: str) -> Any:
    """An option other commands share (declared below), shown in `panel` of one command's `--help`:
    a copy, so each command groups its own."""
    kind, info = get_args(shared)
    placed = copy.copy(info)
    placed.rich_help_panel = panel
    return Annotated[kind, placed]


def panels(groups: dict[str, tuple[str, ...]]) -> Callable:
    """A decorator (under `@app.command`) that shows a command's options in `--help` panels,
    `{panel: (parameter name, …)}`, in that order: a long list read by what each option is for.
    The annotations stay text, evaluated when typer reads them (as the command's other ones are):
    a help text made from the registry (`--view`'s) then names the plugins' entries too. The
    command's module imports `in_panel`, the name that text calls."""

    def group(command: Callable) -> Callable:
        if command.__globals__.get("in_panel") is not in_panel:
            raise TypeError(f"{command.__module__} must import in_panel to group {command.__name__}'s options")
        for panel, names in groups.items():
            for name in names:
                annotation = command.__annotations__[name]
                if not isinstance(annotation, str):
                    raise TypeError(f"{command.__name__}: annotations as text (from __future__ import annotations)")
                command.__annotations__[name] = f"in_panel({annotation}, {panel!r})"
        return command

    return group


def argument(*, help: str, **settings: Any) -> Any:
    """typer.Argument with its help shown as written (see `option`)."""
    return typer.Argument(help=escape(help), **settings)


def check_choice(option: str, value: str, choices, joiner: str = "") -> str:
    """`value` if it is one of `choices`, else `OPTION VALUE: expected a, b or c` (joiner "or") or
    `expected a, b, c`."""
    if value not in choices:
        named = listed(choices, joiner) if joiner else ", ".join(choices)
        raise UserError(f"{option} {value}: expected {named}")
    return value


def words(text: str | None) -> tuple[str, ...]:
    """A comma list's items, stripped, empty ones dropped (`a, b,` -> ("a", "b")). A comma inside
    braces belongs to its item: `wds:/d/{train,validation}-{000..143}.tar` is one shard pattern
    (braceexpand's alternatives), not two datasets; braces that do not close leave the rest as one
    item, for its reader to name."""
    items, depth, current = [], 0, []
    for char in text or "":
        depth += (char == "{") - (char == "}" and depth > 0)
        if char == "," and depth == 0:
            items.append("".join(current))
            current = []
        else:
            current.append(char)
    items.append("".join(current))
    return tuple(w.strip() for w in items if w.strip())


def check_data_dir(data_dir: Path | None) -> Path | None:
    if data_dir is None:
        return None
    if not data_dir.exists():
        raise UserError(f"--data-dir {data_dir}: no such folder")
    if not data_dir.is_dir():
        raise UserError(f"--data-dir {data_dir}: is a file, expected the folder that holds the datasets")
    return data_dir


# --- shared by several commands ------------------------------------------------------------------

DataDir = Annotated[
    Path | None,
    option("--data-dir", envvar="VITBENCH_DATA", help="Root holding datasets in torchvision's layout."),
]


def results_folder(text: str | Path) -> Path:
    """`--results`: an empty value would be the current directory (Path("") is "."): refused."""
    if isinstance(text, Path):  # the default
        return text
    if not text.strip():
        raise UserError("--results: empty; expected a folder for the results (default: results)")
    return Path(text)


Results = Annotated[
    Path,
    option(
        "--results",
        envvar="VITBENCH_RESULTS",
        parser=results_folder,
        help="Results folder: vitbench.duckdb, runs/, cache/.",
    ),
]
Device = Annotated[str, option("--device", help="auto, cpu, cuda or cuda:N.")]
Where = Annotated[
    list[str] | None,
    option(
        "--where",
        help="Keep runs matching FIELD OP VALUE (OP: = != > < >= <= ~), repeatable: model=vit-b/16, "
        "weights=deit*, data_source~cifar, 'date>=2026-11-01', hparams.res=384.",
    ),
]


def _transfer_protocols() -> str:
    """The built-in protocols whose runs the tables show side by side, named as the registry orders them
    (a plugin's joins them once installed: help loads no plugin)."""
    names = [p.name for p in BUILTIN if any(m.transfer for m in p.metrics)]
    return listed(names)


Baseline = Annotated[
    str | None,
    option(
        "--baseline",
        help="What --ci's marks (and the report's) compare each cell with: the cell of the same test images, "
        "protocol and shots or k whose runs match these --where clauses, comma-separated (model=deit-ti/16,res=224; "
        "weights=random); backbone, weights and resolution may differ. [default: the table's first model and "
        "weights, at the same setting]",
    ),
]

ViewProtocol = Annotated[
    str | None,
    option(
        "--protocol",
        help=f"Only this protocol's runs: {_transfer_protocols()} (default: every one, side by side).",
    ),
]

"""docs/cli.md, generated from the command line itself: every command with its help and every option
in the panel `--help` shows it in, its default and what it does. The docs test
(tests/test_cli_reference.py) generates it again and compares, so the page cannot drift from the
code; `python tests/cli_reference.py` rewrites it after a change to an option."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

PAGE = Path(__file__).resolve().parents[1] / "docs" / "cli.md"
HEADER = """# Command-line reference

Every `vitbench` command and option, generated from the command line itself
(`python tests/cli_reference.py`; the docs test, `tests/test_cli_reference.py`, keeps this page
equal to it). `vitbench COMMAND --help` shows the same, grouped the same way. The options of
`vitbench run` are also the keyword arguments of `vitbench.run(...)` and the keys of a `--config`
file ([architecture](architecture.md)).
"""


def render() -> str:
    import typer

    from vitbench.cli import app

    # typer's own click (it vendors one): its objects are used by their click API, duck-typed
    root = typer.main.get_command(app)
    parts = [HEADER]
    for name, command in _commands(root, root.context_class(root, info_name="vitbench"), "vitbench"):
        parts.append(_command(name, command))
    return "\n".join(parts)


def _commands(group: Any, context: Any, prefix: str):
    """(full name, command) in the order `--help` lists them, a group's commands in its place."""
    for name in group.list_commands(context):
        command = group.get_command(context, name)
        if command is None or command.hidden:
            continue
        full = f"{prefix} {name}"
        if hasattr(command, "list_commands"):  # a group: `vitbench weights inspect`, …
            yield from _commands(command, command.context_class(command, info_name=name, parent=context), full)
        else:
            yield full, command


def _command(name: str, command: Any) -> str:
    arguments = [p for p in command.params if p.param_type_name == "argument"]
    usage = " ".join((p.metavar or p.name.upper()) for p in arguments)
    lines = [f"## `{name}{' ' + usage if usage else ''}`", "", _text(command.help or ""), ""]
    if arguments:
        lines += ["| argument | what it is |", "|---|---|"]
        lines += [f"| `{(p.metavar or p.name.upper())}` | {_cell(getattr(p, 'help', None) or '')} |" for p in arguments]
        lines.append("")
    panels: dict[str, list[Any]] = {}
    for p in command.params:
        if p.param_type_name == "option" and not p.hidden and "--help" not in p.opts:
            panels.setdefault(getattr(p, "rich_help_panel", None) or "Options", []).append(p)
    for panel, options in panels.items():
        lines += [f"**{panel}**", "", "| option | what it does | default |", "|---|---|---|"]
        lines += [f"| {_names(p)} | {_cell(p.help or '')} | {_default(p)} |" for p in options]
        lines.append("")
    return "\n".join(lines)


def _names(option: Any) -> str:
    names = sorted(option.opts + option.secondary_opts, key=lambda n: (n.startswith("--") is False, n))
    return ", ".join(f"`{n}`" for n in names)


def _default(option: Any) -> str:
    if option.is_flag and not option.default:
        return ""
    if option.default is None or option.show_default is False or callable(option.default):
        return ""
    value = option.default
    if isinstance(value, (list, tuple)):
        value = ",".join(str(v) for v in value)
    return _cell(f"`{value}`") if str(value) != "" else ""


def _text(text: str) -> str:
    """A command's help as Markdown paragraphs (click's `\\b` no-rewrap marks dropped)."""
    return _unescape("\n".join(line for line in text.strip().splitlines() if line.strip() != "\b"))


def _cell(text: str) -> str:
    """One table cell: one line, its pipes escaped, rich's escaped brackets as they are shown."""
    return " ".join(_unescape(text).split()).replace("|", "\\|")


def _unescape(text: str) -> str:
    return text.replace("\\[", "[")


def main() -> None:
    PAGE.write_text(render())
    print(f"wrote {PAGE} ({len(PAGE.read_text().splitlines())} lines)", file=sys.stderr)


if __name__ == "__main__":
    main()

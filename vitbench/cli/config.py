"""`vitbench run --config exp.toml` and `--print-config`: an experiment as a file.

A config holds `vitbench run`'s options by their names, the Python API's keywords (`model`,
`weights`, `datasets`, `suite`, `protocol`, `seeds`, `shots`, `lr`, …: `--extraction-batch` is
`extraction_batch` in both; lists where the option takes a comma list) and user-defined
suites (`[suites.mine] datasets = [...]`). Options given on the command line win over the file.
`--print-config` prints the fully resolved options of any command line as such a file, so a
command becomes a file and back (tests/test_config.py checks the round trip). Every run stores the
resolved config and its sha256 in its notes. Mistakes are one line naming the file, the key and
what was expected.
"""

from __future__ import annotations

import difflib
import logging
import tomllib
import typing
from pathlib import Path

from vitbench.catalog.registry import get_dataset, get_model, get_suite
from vitbench.catalog.suites import SUITES, Suite
from vitbench.cli.options import words
from vitbench.errors import UserError
from vitbench.protocols.bounds import MAX_VALUES
from vitbench.protocols.registry import get_protocol, option_table

log = logging.getLogger("vitbench")

# options that take a comma list on the command line: a TOML array (or one value) in a config
# (and every list option a protocol declares: `lists()`)
LISTS = {"model": str, "weights": str, "datasets": str, "protocol": str, "tracker": str}
# the names configs written before the CLI, the config and the API shared one vocabulary used
RENAMED = {"dataset": "datasets", "batch_size": "extraction_batch", "compile_model": "compile"}
# keys that are no option any more, with what to do instead
REMOVED = {"executor": "cluster jobs are `vitbench submit` now (same options, plus the jobs'); drop the key"}
PROTOCOL_TABLES = "protocols"  # [protocols.knn] knn_k = [10, 20]: one protocol's options


def lists() -> dict[str, type]:
    return {**LISTS, **{name: d.kind for name, (d, _) in option_table().items() if d.many}}


# what an experiment is not: how this one command runs
NOT_CONFIG = {"config", "print_config", "dry_run", "explain", "rerun", "assume_mfu", "price_on"}
MAX_CONFIG_BYTES = 1_000_000  # an experiment's options are a few hundred bytes; more is not a config
SUITE_KEYS = {"datasets": list, "protocol": str, "description": str, "model": str, "weights": str}


def option_kinds(command) -> dict[str, str]:
    """A command's options in order, each as bool, int, float or str (from its type hints)."""
    kinds = {}
    for name, hint in typing.get_type_hints(command, include_extras=True).items():
        if name in ("return", "ctx"):
            continue
        base = typing.get_args(hint)[0] if typing.get_origin(hint) is typing.Annotated else hint
        found = [t for t in (typing.get_args(base) or (base,)) if t is not type(None)]
        kinds[name] = {bool: "bool", int: "int", float: "float", Path: "path"}.get(found[0] if found else str, "str")
    return kinds


def _check(where: str, key: str, value, kind: str):
    """The value as the command line's parameter takes it (a protocol's list as the array), or a
    one-line error."""
    if key in (listed := lists()):
        items = value if isinstance(value, list) else [value]
        if len(items) > MAX_VALUES:
            raise UserError(f"{where}: key '{key}': {len(items):,} values; expected at most {MAX_VALUES:,}")
        want = listed[key]
        if not all(isinstance(v, want) and not isinstance(v, bool) for v in items):
            what = {int: "integers", float: "numbers"}.get(want, "strings")
            raise UserError(f"{where}: key '{key}': expected {what} or a list of them")
        # a protocol's list goes to its flag's parser as the array it is; the shared lists are comma text
        return ",".join(str(v) for v in items) if key in LISTS else items
    ok = {
        "bool": isinstance(value, bool),
        "int": isinstance(value, int) and not isinstance(value, bool),
        "float": isinstance(value, int | float) and not isinstance(value, bool),
        "str": isinstance(value, str),
        "path": isinstance(value, str),
    }[kind]
    if not ok:
        what = {"int": "an integer", "path": "a path (a string)"}.get(kind, f"a {kind}")
        raise UserError(f"{where}: key '{key}': expected {what}, got {value!r}")
    return Path(value) if kind == "path" else value


def load(path: Path, kinds: dict[str, str], elsewhere: dict[str, str] | None = None) -> dict:
    """The file's options, checked (keys, types, names), as command-line values; its suites
    registered. `elsewhere`: keys another command takes (key -> the command), named in the error."""
    data = _parse(path)
    _register_suites(path, data.pop("suites", {}))
    data = _with_protocol_tables(path, _renamed(path, data))
    known = [k for k in kinds if k not in NOT_CONFIG]
    values = {}
    for key, value in data.items():
        if key in REMOVED:
            raise UserError(f"{path}: key '{key}': {REMOVED[key]}")
        if key in (elsewhere or {}):
            raise UserError(f"{path}: key '{key}' is an option of `{(elsewhere or {})[key]}`, not of this command")
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f"; did you mean '{close[0]}'?" if close else f"; expected one of {', '.join(known)}"
            raise UserError(f"{path}: unknown key '{key}'{hint}")
        values[key] = _check(str(path), key, value, kinds[key])
    _check_names(path, values)
    return values


def _renamed(path: Path, data: dict) -> dict:
    """The file's keys by today's names: an older config (its `dataset`, `batch_size`,
    `compile_model`) still loads, with a note naming the key to write instead."""
    for old, new in RENAMED.items():
        if old in data:
            if new in data:
                why = f"keys '{old}' and '{new}' are one option ('{old}': its old name); give '{new}'"
                raise UserError(f"{path}: {why}")
            log.warning("%s: key '%s' is now '%s' (as in the Python API); read as '%s'", path, old, new, new)
            data[new] = data.pop(old)
    return data


def _parse(path: Path) -> dict:
    """The file as TOML, or one line saying why not: never a traceback, never a wait on a pipe."""
    try:
        if not path.is_file():  # a FIFO or a device would block the read forever
            what = "a folder" if path.is_dir() else "not a regular file" if path.exists() else "no such file"
            raise UserError(f"--config {path}: {what}; expected a TOML file")
        raw = path.read_bytes() if path.stat().st_size <= MAX_CONFIG_BYTES else b""
    except OSError as e:
        raise UserError(f"--config {path}: cannot read it ({e.strerror})") from None
    if not raw and path.stat().st_size:
        raise UserError(f"{path}: {path.stat().st_size:,} bytes; a config holds options, expected at most 1 MB")
    try:
        # utf-8-sig: a byte-order mark (Windows editors write one) is read past, as TOML's text
        return tomllib.loads(raw.decode("utf-8-sig"))
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: not UTF-8 text (byte {e.start}); a TOML file is UTF-8") from None
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"{path}: not valid TOML ({e})") from None
    except RecursionError:
        raise UserError(f"{path}: nested too deeply for a config (arrays or tables within each other)") from None


def _with_protocol_tables(path: Path, data: dict) -> dict:
    """`[protocols.NAME]` tables' options beside the file's top-level keys (one name is one option,
    so each may be given once, at the top level or in the table of a protocol that reads it)."""
    tables = data.pop(PROTOCOL_TABLES, {})
    if not isinstance(tables, dict) or not all(isinstance(t, dict) for t in tables.values()):
        raise UserError(f"{path}: key '{PROTOCOL_TABLES}': expected tables, e.g. [protocols.knn] with knn_k = [10, 20]")
    table = option_table()
    for name, values in tables.items():
        where = f"{path}: [{PROTOCOL_TABLES}.{name}]"
        _named(where, "protocol", lambda n=name: get_protocol(n))
        own = get_protocol(name).Options.names()
        for key, value in values.items():
            if key not in own:
                readers = table[key][1] if key in table else ()
                hint = (
                    f"; {', '.join(readers)} reads it"
                    if readers
                    else f"; {name} reads {', '.join(sorted(own)) or 'none'}"
                )
                raise UserError(f"{where}: key '{key}' is not an option of {name}{hint}")
            if key in data:
                raise UserError(f"{where}: key '{key}' is given at the top level too; give it once")
            data[key] = value
    return data


def _register_suites(path: Path, suites) -> None:
    if not isinstance(suites, dict):
        raise UserError(f"{path}: key 'suites': expected tables, e.g. [suites.mine] with datasets = [...]")
    for name, spec in suites.items():
        where = f"{path}: suite '{name}'"
        if name in SUITES and SUITES.source(name) != "register()":
            # before: dropped with a plugin's warning, and the built-in ran instead of the file's suite
            raise UserError(
                f"{where}: a suite vitbench has is named so (`vitbench ls suites`); name yours otherwise, "
                f"e.g. [suites.my-{name}]"
            )
        if not isinstance(spec, dict) or not isinstance(spec.get("datasets"), list) or not spec["datasets"]:
            raise UserError(f'{where}: expected datasets = ["name", ...]')
        unknown = sorted(set(spec) - set(SUITE_KEYS))
        if unknown:
            raise UserError(f"{where}: unknown key '{unknown[0]}'; expected one of {', '.join(SUITE_KEYS)}")
        for dataset in spec["datasets"]:
            _named(where, "datasets", lambda d=dataset: get_dataset(str(d)))
        protocol = str(spec.get("protocol", "fewshot"))
        _named(where, "protocol", lambda p=protocol: get_protocol(p))
        defaults = {k: spec[k] for k in ("model", "weights") if k in spec}
        for key, value in defaults.items():  # `model = 5` was an AttributeError deep in the planner
            if not isinstance(value, str) or not value.strip():
                raise UserError(
                    f"{where}: key '{key}': expected a name in quotes (e.g. {key} = \"vit-b/16\"), found {value!r}"
                )
        description = str(spec.get("description", f"defined in {path.name}"))
        SUITES.register(Suite(name, tuple(str(d) for d in spec["datasets"]), protocol, description, defaults))


def _named(where: str, key: str, check) -> None:
    try:
        check()
    except UserError as e:
        raise UserError(f"{where}: key '{key}': {e}") from None


def _check_names(path: Path, values: dict) -> None:
    """Models, datasets, the suite and the protocol must exist: said with the file and the key."""
    if values.get("suite"):
        _named(str(path), "suite", lambda: get_suite(str(values["suite"])))
    for key, known in (("model", get_model), ("datasets", get_dataset), ("protocol", get_protocol)):
        for name in words(str(values.get(key) or "")):  # (lists: each of their names)
            _named(str(path), key, lambda n=name, k=known: k(n))


# TOML basic strings escape these; every other character, non-ASCII included, is written as itself
_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


def toml_string(text: str, strict: bool = True) -> str:
    """`text` as a TOML basic string that reads back as `text` (JSON's escapes are not TOML's: JSON
    writes a character beyond U+FFFF as two surrogates, which TOML refuses). A file name that was
    not UTF-8 (Python keeps its bytes as lone surrogates) cannot be TOML: an error where the file
    must load back (`--print-config`), else written with U+FFFD in their place (a run's record)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        if strict:
            raise UserError(f"--print-config: {text!r} is not UTF-8 text; a TOML file cannot hold it") from None
        text = text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    escaped = "".join(_ESCAPES.get(c) or (f"\\u{ord(c):04X}" if ord(c) < 0x20 or ord(c) == 0x7F else c) for c in text)
    return f'"{escaped}"'


def _toml_value(key: str, value, strict: bool) -> str:
    if key in (listed := lists()):
        items = value if isinstance(value, tuple | list) else words(str(value))
        return "[" + ", ".join(str(v) if listed[key] in (int, float) else toml_string(v, strict) for v in items) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return toml_string(str(value), strict)


def to_toml(given: dict, kinds: dict[str, str], strict: bool = True) -> str:
    """The resolved options (every one with a value) as a config file, and the suite they name if
    it is a user-defined one (`strict`: see toml_string)."""
    lines = ["# vitbench run --config: the resolved options of one command (`vitbench run --print-config`)"]
    for key in kinds:
        if key in NOT_CONFIG or given.get(key) is None:
            continue
        lines.append(f"{key} = {_toml_value(key, given[key], strict)}")
    suite = SUITES.get(str(given.get("suite")))
    # a suite a config defined (registered in this process, whatever its description) travels with it
    if suite is not None and SUITES.source(suite.name) == "register()":
        datasets = ", ".join(toml_string(d, strict) for d in suite.datasets)
        lines += ["", f"[suites.{toml_string(suite.name, strict)}]", f"datasets = [{datasets}]"]
        lines.append(f"protocol = {toml_string(suite.protocol, strict)}")
        lines += [f"{k} = {toml_string(str(v), strict)}" for k, v in suite.defaults.items()]
        lines.append(f"description = {toml_string(suite.description, strict)}")
    return "\n".join(lines) + "\n"

"""Protocol options: each protocol declares the options only it reads as a frozen dataclass of
`option(...)` fields (default, help, help panel, choices, range), and everything else is made
from those declarations.

    @dataclass(frozen=True)
    class KnnOptions(ProtocolOptions):
        knn_k: tuple[int, ...] = option((20,), "knn: neighbour counts", kind=int, many=True,
                                        bound=limits(int, 1, INT32_MAX), panel=FEWSHOT_PANEL)

`vitbench run` grows a `--knn-k` flag in that panel whose comma list arrives as a tuple of ints
(cli/protocol_flags.py, with `Declared.parse`), a `--config` file takes `knn_k` as an array (at
its top level or in a `[protocols.knn]` table), the Python API takes `knn_k=...`. All three make
one `KnnOptions` object, checked when it is made (`__post_init__`, the only check), carried in the
Request (`Request.options`, a `Given`), and the protocol reads it as `KnnOptions.of(req).knn_k`.
One name means one option across protocols (fine-tuning's and pre-training's `steps` are one
`--steps`), so two declarations of a name must agree on its type.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import MISSING, dataclass, field, fields, replace
from typing import Any, Self

from vitbench.errors import UserError
from vitbench.protocols.bounds import MAX_VALUES, Bound, problem

# `vitbench run --help`'s panels: what to run and the data first, then the panels the protocols'
# options name, in the protocol registry's order (cli/protocol_flags.panel_rank: a plugin's own
# after the built-ins'), then how and where it runs
WHAT_PANEL = "What to run"
DATA_PANEL = "Data"
FEWSHOT_PANEL = "Few-shot, k-NN, linear probe and eval"
FINETUNE_PANEL = "Fine-tuning (--protocol finetune)"
PRETRAIN_PANEL = "Pre-training (--protocol pretrain)"
DEVICES_PANEL = "Devices and precision"
NODES_PANEL = "Several nodes (torchrun)"
CLUSTER_PANEL = "Cluster jobs (submitit)"
OUTPUT_PANEL = "Output"
LEADING_PANELS = (WHAT_PANEL, DATA_PANEL)
TRAILING_PANELS = (DEVICES_PANEL, NODES_PANEL, CLUSTER_PANEL, OUTPUT_PANEL)

_META = "vitbench.option"


@dataclass(frozen=True)
class Declared:
    """One protocol option, as its declaration gives it."""

    name: str  # the dataclass field: the API keyword and the config key
    kind: type  # int, float, str or bool (of each value, for a list)
    many: bool  # a comma list on the command line, a TOML array, a tuple in the API
    default: Any
    help: str
    panel: str
    choices: tuple[str, ...] = ()
    bound: Bound | None = None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def default_text(self) -> str | None:
        """The default as `--help` shows it, or None where the help text says it."""
        if self.default is None or self.default is False or "[default" in self.help:
            return None
        return ",".join(map(str, self.default)) if self.many else str(self.default)

    def parse(self, given: Any) -> Any:
        """A list option's value from the command line's comma list (a config's array passes
        through, its items' types checked by the config): a tuple of the declared kind. Ranges
        are the options dataclass's to check, when the object is made."""
        if not self.many or given is None:
            return given
        if isinstance(given, list | tuple):
            return tuple(given)
        if not isinstance(given, str):
            return given  # a range: refused by its count, never expanded, if too long
        text = given
        items = [v.strip() for v in text.split(",") if v.strip()]
        if self.kind is int:
            try:
                values = tuple(int(v) for v in items)
            except ValueError:
                values = ()
            if not values or any(v < 0 for v in values):
                raise UserError(f"{self.flag} {text}: expected comma-separated non-negative integers, e.g. 0,1,2")
            return values
        if self.kind is float:
            try:
                return tuple(float(v) for v in items)
            except ValueError:
                raise UserError(f"{self.flag} {text}: expected comma-separated numbers") from None
        return tuple(items)

    def problem(self, value: Any) -> str | None:
        """Why `value` cannot be this option's value, or None."""
        if value is None and self.default is None:
            return None
        if self.many:
            if not isinstance(value, tuple | list | range):
                return f"{self.flag}: expected a list of {_plural(self.kind)}, got {value!r}"
            if len(value) > MAX_VALUES:
                return f"{self.flag}: {len(value):,} values; expected at most {MAX_VALUES:,}"
            if not len(value) and tuple(self.default or ()) != ():  # `shots=[]` planned nothing, in silence
                return f"{self.flag}: an empty list; expected at least one of the {_plural(self.kind)} it runs along"
            if why := next((why for v in value if (why := self._one(v))), None):
                return why
            given = list(value)
            repeated = next((v for i, v in enumerate(given) if v in given[:i]), None)
            if repeated is not None:  # `--seeds 0,0,0` planned three runs of one key, two "running elsewhere"
                return f"{self.flag} {','.join(map(str, given))}: {repeated} is given {given.count(repeated)} times"
            return None
        return self._one(value)

    def _one(self, value: Any) -> str | None:
        if self.choices and value not in self.choices:
            return f"{self.flag} {value}: expected {', '.join(self.choices[:-1])} or {self.choices[-1]}"
        if self.bound is not None:
            return problem(self.bound, value)
        if self.kind is bool and not isinstance(value, bool):
            return f"{self.flag} {value!r}: expected true or false"
        if self.kind is str and not isinstance(value, str):
            return f"{self.flag} {value!r}: expected a string"
        return None


def _plural(kind: type) -> str:
    return {int: "integers", float: "numbers", str: "strings"}.get(kind, "values")


def limits(kind: type, low: float, high: float = math.inf, *, low_open: bool = False, high_open: bool = False) -> Bound:
    """A numeric option's range; the declaration fills in its flag."""
    return Bound("", kind, low, high, low_open, high_open)


def option(
    default: Any,
    help: str,
    *,
    panel: str,
    kind: type | None = None,
    many: bool = False,
    choices: tuple[str, ...] = (),
    bound: Bound | None = None,
) -> Any:
    """A field of a ProtocolOptions dataclass: its default, `--help` text and panel, and what it accepts.
    `kind` is the type of one value (taken from the default where it has one)."""
    if kind is None:
        sample = default[0] if many and default else default
        kind = type(sample) if sample is not None else str
    meta = {"help": help, "panel": panel, "kind": kind, "many": many, "choices": choices, "bound": bound}
    return field(default=default, metadata={_META: meta})


_declared: dict[type, tuple[Declared, ...]] = {}


def declared(cls: type) -> tuple[Declared, ...]:
    """The options a ProtocolOptions dataclass declares, in field order (read once per class)."""
    if cls in _declared:
        return _declared[cls]
    found = []
    for f in fields(cls):
        meta = f.metadata.get(_META)
        if meta is None or f.default is MISSING:
            raise TypeError(f"{cls.__name__}.{f.name}: declare protocol options with options.option(...)")
        d = Declared(f.name, meta["kind"], meta["many"], f.default, meta["help"], meta["panel"], meta["choices"])
        found.append(d if meta["bound"] is None else replace(d, bound=replace(meta["bound"], option=d.flag)))
    _declared[cls] = tuple(found)
    return _declared[cls]


@dataclass(frozen=True)
class ProtocolOptions:
    """The options one protocol reads (none: this class itself). Subclasses are frozen dataclasses
    of `option(...)` fields; building one checks every value."""

    def __post_init__(self) -> None:
        for d in declared(type(self)):
            value = getattr(self, d.name)
            if why := d.problem(value):
                raise UserError(why)
            if d.many and isinstance(value, list | range):
                object.__setattr__(self, d.name, tuple(value))

    @classmethod
    def of(cls, given: Any) -> Self:
        """This protocol's options in a Request (or its `Given`): the object made when the request
        was, or the declared defaults where none of its options was given."""
        return getattr(given, "options", given).of(cls)

    @classmethod
    def names(cls) -> frozenset[str]:
        return frozenset(d.name for d in declared(cls))


@dataclass(frozen=True)
class Given:
    """The protocol options a request was given: one options object per class that declares a
    given name (the given values, its declared defaults for the rest), each checked once, when it
    was made; and the names given (a suite's defaults fill only the others; a name no protocol of
    the run reads is said to be ignored)."""

    objects: tuple[ProtocolOptions, ...] = ()
    names: frozenset[str] = frozenset()

    @classmethod
    def made(cls, values: Mapping[str, Any], classes: Iterable[type[ProtocolOptions]]) -> Given:
        """The options objects of `classes` that declare a name in `values`."""
        objects = []
        for options in dict.fromkeys(classes):
            mine = {name: values[name] for name in options.names() if name in values}
            if mine:
                objects.append(options(**mine))
        return cls(tuple(objects), frozenset(values))

    def of(self, options: type[ProtocolOptions]) -> Any:
        """The object of class `options`; for a class others extend (`TrainingOptions`, the fields
        fine-tuning and pre-training share), one of theirs, which holds the same given values."""
        exact = next((o for o in self.objects if type(o) is options), None)
        return exact or next((o for o in self.objects if isinstance(o, options)), None) or options()

    def values(self) -> dict[str, Any]:
        """The given values by name (as a config file or a next request takes them)."""
        return {name: getattr(o, name) for o in self.objects for name in type(o).names() if name in self.names}

    def __contains__(self, name: object) -> bool:
        return name in self.names

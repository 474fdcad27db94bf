"""Plugins from other packages: the entry-point groups vitbench reads from installed metadata.

`vitbench.backends` (lists of ModelSpec), `vitbench.protocols` (Protocol instances or classes),
`vitbench.datasets` (lists of DatasetSpec, or of DatasetFormat: a parametric `PREFIX:<argument>`
dataset) and `vitbench.views` (lists of views.registry.TableView and FigureView: `vitbench table
--view NAME`, `vitbench plot NAME`). Listing reads metadata only; a target is imported on first
use. `VITBENCH_DISABLE_PLUGIN_AUTOLOAD=1` keeps only vitbench's own built-ins (hermetic tests).
"""

from __future__ import annotations

import difflib
import importlib
import logging
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import TypeVar

from vitbench.errors import UserError

log = logging.getLogger("vitbench")

BACKENDS, PROTOCOLS, DATASETS = "vitbench.backends", "vitbench.protocols", "vitbench.datasets"
VIEWS = "vitbench.views"
GROUPS = (BACKENDS, PROTOCOLS, DATASETS, VIEWS)
AUTOLOAD_ENV = "VITBENCH_DISABLE_PLUGIN_AUTOLOAD"
BUILTIN_DIST = "vitbench"


@dataclass(frozen=True)
class PluginInfo:
    name: str
    target: str  # "module:attr", not imported
    distribution: str
    version: str
    group: str = BACKENDS

    @property
    def builtin(self) -> bool:
        return self.distribution == BUILTIN_DIST


def autoload_disabled() -> bool:
    return os.environ.get(AUTOLOAD_ENV, "") not in ("", "0")


def plugins(group: str) -> list[PluginInfo]:
    """Entry points of `group`, from metadata alone (nothing is imported). With autoload off only
    vitbench's own built-ins remain."""
    found = []
    for ep in entry_points(group=group):
        dist = ep.dist.name if ep.dist else "?"
        info = PluginInfo(ep.name, ep.value, dist, ep.dist.version if ep.dist else "?", group)
        if info.builtin or not autoload_disabled():
            found.append(info)
    return sorted(found, key=lambda p: (not p.builtin, p.name))


def load_target(target: str, default_attr: str) -> object:
    """The object an entry point names (`module:attr`, or `module` and `default_attr`); a callable
    other than a class is called (a factory)."""
    module_name, _, attr = target.partition(":")
    obj = getattr(importlib.import_module(module_name), attr or default_attr)
    return obj() if callable(obj) and not isinstance(obj, type) else obj


def load_group(group: str, default_attr: str, kind: type | tuple[type, ...]) -> list:
    """Every `kind` object the group's plugins define (a plugin may give one or a list), in
    order: vitbench's own first (its built-in backends register through the same group,
    pyproject.toml's `[project.entry-points]`), then the others'. A plugin that fails to load is
    skipped with a warning: it must not take the built-ins down."""
    targets = [(p.name, p.target) for p in plugins(group)]
    found = []
    for name, target in targets:
        try:
            obj = load_target(target, default_attr)
            items = obj if isinstance(obj, list | tuple) else [obj]
            items = [item() if isinstance(item, type) else item for item in items]
            if not all(isinstance(item, kind) for item in items):
                kinds = kind if isinstance(kind, tuple) else (kind,)
                named = " or ".join(f"{k.__module__}.{k.__name__}" for k in kinds)
                raise TypeError(f"{target} must give {named} objects")
        except Exception as e:
            log.warning("plugin %s (%s) failed to load and is skipped: %s", name, target, e)
            continue
        found += [(name, item) for item in items]
    return found


T = TypeVar("T")


class Registry(Mapping[str, T]):
    """Name -> T, the one registry every extension point uses (models, datasets, dataset formats,
    protocols, table views): the built-ins in their order, then what other packages register
    through an entry-point group (`plugins`: (plugin name, object) pairs, read once, on first use),
    then what this process registers (`register`, for a notebook or a test). An entry may not
    replace one already there: it is skipped with a warning. `find` is the lookup a user's word
    goes through: a one-line error (`unknown`) where it names nothing."""

    def __init__(
        self,
        kind: str,
        key: Callable[[T], str],
        builtins: Callable[[], Iterable[T]],
        plugins: Callable[[], Iterable[tuple[str, object]]] = tuple,
        of_type: type | tuple[type, ...] = object,
        unknown: Callable[[str, list[str]], str] | None = None,
        reserved: frozenset[str] = frozenset(),  # names no plugin may take
    ):
        self.kind, self.key, self._builtins, self._plugins = kind, key, builtins, plugins
        self.of_type, self.reserved = of_type, reserved
        self._unknown = unknown or self._suggest
        self._registered: dict[str, T] = {}
        self._found: dict[str, T] | None = None
        self._sources: dict[str, str] = {}  # name -> the plugin that gave it ("register()" for a process's own)

    def _all(self) -> dict[str, T]:
        if self._found is None:
            found = {self.key(item): item for item in self._builtins()}
            self._sources = {}
            later = [*self._plugins(), *(("register()", item) for item in self._registered.values())]
            for source, item in later:
                if not isinstance(item, self.of_type):
                    continue  # (a group that gives two kinds: the datasets' gives datasets and formats)
                name = self.key(item)  # type: ignore[arg-type]
                if name in found or name in self.reserved:
                    log.warning("plugin %s redefines %s %s; keeping the first definition", source, self.kind, name)
                    continue
                found[name] = item  # type: ignore[assignment]
                self._sources[name] = source
            self._found = found
        return self._found

    def __getitem__(self, name: str) -> T:
        return self._all()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())

    def source(self, name: str) -> str | None:
        """The plugin that gave the entry named `name` (its entry point's name, or "register()"
        for one registered in this process); None for a built-in."""
        self._all()
        return self._sources.get(name)

    def register(self, item: T) -> T:
        """Make `item` available by its name in this process."""
        self._registered[self.key(item)] = item
        self._found = None
        return item

    def unregister(self, name: str) -> None:
        """Forget what `register` made available under `name` (a built-in or a plugin's stays)."""
        self._registered.pop(name, None)
        self._found = None

    def find(self, name: str) -> T:
        """The entry named `name`, or a one-line error (UserError) that says what was expected."""
        found = self._all()
        if name not in found:
            raise UserError(self._unknown(name, list(found)))
        return found[name]

    def _suggest(self, name: str, known: list[str]) -> str:
        close = difflib.get_close_matches(name.lower(), known, n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(close)}?" if close else f"; see `vitbench ls {self.kind}s`"
        return f"unknown {self.kind} '{name}'{hint}"

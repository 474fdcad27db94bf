"""Plugins from other packages: the entry-point groups vitbench reads from installed metadata.

`vitbench.backends` (lists of ModelSpec), `vitbench.protocols` (Protocol instances or classes) and
`vitbench.datasets` (lists of DatasetSpec, or of DatasetFormat: a parametric
`PREFIX:<argument>` dataset). Listing reads metadata only; a target is imported on
first use. `VITBENCH_DISABLE_PLUGIN_AUTOLOAD=1` keeps only vitbench's own built-ins (hermetic tests).
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from importlib.metadata import entry_points

log = logging.getLogger("vitbench")

BACKENDS, PROTOCOLS, DATASETS = "vitbench.backends", "vitbench.protocols", "vitbench.datasets"
GROUPS = (BACKENDS, PROTOCOLS, DATASETS)
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


def load_group(
    group: str, default_attr: str, kind: type | tuple[type, ...], builtin_targets: Sequence[tuple[str, str]] = ()
) -> list:
    """Every `kind` object the group's plugins define (a plugin may give one or a list), in
    order: `builtin_targets` first where vitbench itself was never pip-installed (a source tree),
    then the entry points. A plugin that fails to load is skipped with a warning: it must not take
    the built-ins down."""
    infos = plugins(group)
    targets = [(p.name, p.target) for p in infos]
    if not any(p.builtin for p in infos):
        targets = list(builtin_targets) + targets
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

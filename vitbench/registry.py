"""Name -> model / dataset / suite. Backends are discovered through the `vitbench.backends`
entry-point group, lazily: listing plugins reads package metadata only; models are imported on
first use. A built-in backend registers exactly like a third-party package."""

from __future__ import annotations

import difflib
import importlib
import logging
import os
from dataclasses import dataclass
from functools import cache
from importlib.metadata import entry_points

from vitbench.backend import ModelSpec
from vitbench.errors import UserError

log = logging.getLogger("vitbench")

GROUP = "vitbench.backends"
AUTOLOAD_ENV = "VITBENCH_DISABLE_PLUGIN_AUTOLOAD"
BUILTIN_DIST = "vitbench"
BUILTIN_MODULES = ("vitbench_plugins.vit", "vitbench_plugins.hybrid", "vitbench_plugins.bit")

# Models that exist only as paper rows: their weights were never released.
REFERENCE_ONLY = [
    ModelSpec(
        "bit-l",
        "resnetv2_152x4_bit",
        None,
        summary="BiT-L ResNet152x4 (JFT-300M), Table 2",
        reference_only="BiT-L was pre-trained on the private JFT-300M; its weights were never released",
    ),
    ModelSpec(
        "vit-h/14-jft",
        "vit_huge_patch14_224",
        None,
        summary="ViT-H/14 pre-trained on JFT-300M, Table 2",
        reference_only="the JFT-300M ViT-H/14 weights were never released (vision_transformer #14, #133)",
    ),
    ModelSpec(
        "vit-l/16-jft",
        "vit_large_patch16_224",
        None,
        summary="ViT-L/16 pre-trained on JFT-300M, Table 2",
        reference_only="the JFT-300M ViT-L/16 weights were never released",
    ),
    ModelSpec(
        "noisy-student",
        "tf_efficientnet_l2",
        None,
        summary="Noisy Student EfficientNet-L2, Table 2",
        reference_only="Noisy Student is a paper baseline only; vitbench has no EfficientNet backend",
    ),
]


@dataclass(frozen=True)
class PluginInfo:
    name: str
    target: str  # "module:attr", not imported
    distribution: str
    version: str

    @property
    def builtin(self) -> bool:
        return self.distribution == BUILTIN_DIST


def autoload_disabled() -> bool:
    return os.environ.get(AUTOLOAD_ENV, "") not in ("", "0")


def plugins() -> list[PluginInfo]:
    """Entry points of the group, from metadata alone (nothing is imported). With autoload off
    only vitbench's own built-ins remain."""
    found = []
    for ep in entry_points(group=GROUP):
        dist = ep.dist.name if ep.dist else "?"
        info = PluginInfo(ep.name, ep.value, dist, ep.dist.version if ep.dist else "?")
        if info.builtin or not autoload_disabled():
            found.append(info)
    return sorted(found, key=lambda p: (not p.builtin, p.name))


def _load_target(target: str) -> list[ModelSpec]:
    module_name, _, attr = target.partition(":")
    obj = getattr(importlib.import_module(module_name), attr or "MODELS")
    specs = obj() if callable(obj) else obj
    if not all(isinstance(s, ModelSpec) for s in specs):
        raise TypeError(f"{target} must be a list of vitbench.backend.ModelSpec")
    return list(specs)


@cache
def models() -> dict[str, ModelSpec]:
    targets = [(p.name, p.target) for p in plugins()]
    if not any(p.builtin for p in plugins()):  # a source tree that was never pip-installed
        targets = [(m.rsplit(".", 1)[1], f"{m}:MODELS") for m in BUILTIN_MODULES] + targets
    found: dict[str, ModelSpec] = {}
    for name, target in targets:
        try:
            specs = _load_target(target)
        except Exception as e:  # a broken third-party plugin must not take the built-ins down
            log.warning("plugin %s (%s) failed to load and is skipped: %s", name, target, e)
            continue
        for spec in specs:
            if spec.name in found:
                log.warning("plugin %s redefines model %s; keeping the first definition", name, spec.name)
                continue
            found[spec.name] = spec
    for spec in REFERENCE_ONLY:
        found.setdefault(spec.name, spec)
    return found


def lookup(kind: str, name: str, choices: dict):
    """choices[name], or a one-line error that suggests the closest names."""
    if name in choices:
        return choices[name]
    close = difflib.get_close_matches(name.lower(), list(choices), n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(close)}?" if close else f"; see `vitbench ls {kind}s`"
    raise UserError(f"unknown {kind} '{name}'{hint}")


def get_model(name: str, runnable: bool = True) -> ModelSpec:
    spec: ModelSpec = lookup("model", name, models())
    if runnable and spec.reference_only:
        raise UserError(f"model {name} is a paper reference only and cannot be run: {spec.reference_only}")
    return spec


def get_dataset(name: str):
    """A dataset of the table, or `folder:<path>` (any ImageFolder tree with train/ and test/)."""
    from vitbench.datasets import DATASETS
    from vitbench.datasets.folder import PREFIX, folder_spec

    if name.startswith(PREFIX):
        return folder_spec(name)
    return lookup("dataset", name, DATASETS)


def get_suite(name: str):
    from vitbench.suites import SUITES

    return lookup("suite", name, SUITES)

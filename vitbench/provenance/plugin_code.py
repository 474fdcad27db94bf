"""Which code a plugin backbone ran: its distribution's version and a hash of its package's source.
A run of a plugin's model records it in its hparams (so in its key and its features' cache entry):
before, `--rerun` after the plugin's code changed read back the features the old code had cached
(17.82 % against 17.57 % fresh), and an editable install's changes left no trace at all. vitbench's
own backends are the code version every run records already (git_sha), so they record nothing here."""

from __future__ import annotations

import hashlib
import importlib.metadata
import sys
from functools import cache
from pathlib import Path

BUILT_IN = "vitbench_plugins"  # plugins/: vitbench's own backends, registered as a plugin's would be
MAX_FILES = 500  # a package's .py files hashed at most (a plugin is a few modules, not a tree)


def plugin_code(model) -> dict[str, str]:
    """{"backend_code": "<distribution> <version>, source sha256 <16 hex>"} for a plugin's backend;
    {} for vitbench's own and for models without a backend class of their own (timm:<arch>)."""
    backend = getattr(model, "backend", None)
    if backend is None:
        return {}
    package = type(backend).__module__.split(".")[0]
    if package in (BUILT_IN, "vitbench"):
        return {}
    return {"backend_code": _described(package)}


@cache
def _described(package: str) -> str:
    """Read once a process: the code does not change under a running command."""
    names = importlib.metadata.packages_distributions().get(package, [])
    version = f"{names[0]} {importlib.metadata.version(names[0])}" if names else f"{package} (not installed)"
    return f"{version}, source sha256 {_source_hash(package)}"


def _source_hash(package: str) -> str:
    module = sys.modules.get(package)
    where = getattr(module, "__file__", None)
    if where is None:
        return "unknown"
    path = Path(where)
    files = sorted(path.parent.rglob("*.py"))[:MAX_FILES] if path.name == "__init__.py" else [path]
    digest = hashlib.sha256()
    for file in files:
        digest.update(file.name.encode())
        try:
            digest.update(file.read_bytes())
        except OSError:
            digest.update(b"unreadable")
    return digest.hexdigest()[:16]

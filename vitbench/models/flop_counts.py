"""The forward FLOPs of a (backbone family, architecture, image size), counted once per machine
(and, beside them, the width of its representation: backend.py `representation_width`).

A count builds the network on the meta device and runs torch's FlopCounterMode over it, and a
ViT-H at 518 px takes a while to count. The number depends only on the code that builds and runs
the network, so it is kept in the user's cache (`downloads.cache_root()`: VITBENCH_CACHE, else
$XDG_CACHE_HOME/vitbench), keyed by that code: the backend's class, the timm architecture, the size,
the torch and timm versions and the sha256 of the files that define the backend (an edit to them
counts again). A backend that builds its own network (a plugin's `create`, an nn.Module of its own)
is counted anew in each process: its network's code is its own to change. The file is read with a
size bound and checked entry by entry; one that cannot be read is only a cache: counted again, and
rewritten.
"""

from __future__ import annotations

import hashlib
import inspect
import logging
from collections.abc import Callable
from pathlib import Path

from vitbench.files.atomic import keep_json, read_json_object
from vitbench.files.downloads import cache_root

log = logging.getLogger("vitbench")
FILE = "flop-counts.json"
MAX_BYTES = 2_000_000  # some thousands of (architecture, size) counts: far more than one machine makes
MAX_FLOPS = 10**18  # per image: ViT-H/14 at 518 px is about 1.6e12


def source_key(*classes: type) -> str:
    """The sha256 (start) of the files that define `classes`: what an edit to them changes."""
    digest = hashlib.sha256()
    for path in sorted({inspect.getsourcefile(c) or "" for c in classes}):
        digest.update(Path(path).read_bytes() if path else b"")
    return digest.hexdigest()[:16]


def counted(key: str, count: Callable[[], int]) -> int:
    """The count kept under `key`, else `count()`, kept for the next process (where the cache can
    be written: a read-only home only counts again)."""
    path = cache_root() / FILE
    kept = _read(path)
    if key in kept:
        return kept[key]
    value = count()
    if not keep_json(path, {**_read(path), key: value}):  # another process may have added its own meanwhile
        log.debug("%s: not written; the count is made again next time", path)
    return value


def _read(path: Path) -> dict[str, int]:
    """The kept counts, those of the right shape; {} where there is no file or it is not one."""
    table = read_json_object(path, MAX_BYTES)
    return {
        str(k): int(v)
        for k, v in table.items()
        if isinstance(v, int) and not isinstance(v, bool) and 0 < v <= MAX_FLOPS
    }

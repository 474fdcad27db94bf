"""Files that readers see whole or not at all: results shards, checkpoints, caches, exports."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path


def write_atomic(path: Path, text: str | Callable[[Path], object]) -> None:
    """Readers see the old file or the new one, never half of one (temp file + os.replace).
    `text` is the content, or a function that writes the file it is given (e.g. torch.save)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    if isinstance(text, str):
        tmp.write_text(text)
    else:
        text(tmp)
    os.replace(tmp, path)

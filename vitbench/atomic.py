"""Files that readers see whole or not at all: results shards, checkpoints, caches, exports."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import stat
import threading
from collections.abc import Callable
from pathlib import Path

from vitbench.errors import UserError


def write_atomic(path: Path, text: str | Callable[[Path], object]) -> None:
    """Readers see the old file or the new one, never half of one (temp file + os.replace).
    `text` is the content, or a function that writes the file it is given (e.g. torch.save).
    A write that fails (a full disk) leaves no temp file behind and is one line naming the file."""
    # The thread too: two threads of one process writing one file (two `vitbench.run` calls
    # extracting the same features) each need a temp file of their own, or one moves the other's.
    tmp = temp_beside(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(text, str):
            tmp.write_text(text)
        else:
            text(tmp)
        os.replace(tmp, path)
    except OSError as e:
        _discard(tmp)
        raise UserError(f"{path}: cannot write it ({e.strerror or e}); nothing was written") from None
    except BaseException:
        _discard(tmp)  # an interruption or a library's own error: no half-written file either
        raise


def _discard(tmp: Path) -> None:
    """The temp file gone, where there is one: under a folder that is a file (VITBENCH_CACHE naming a
    file) removing it fails as writing it did, and the write's own error is the one to say."""
    with contextlib.suppress(OSError):
        tmp.unlink(missing_ok=True)


NAME_MAX = 255  # bytes in one file name, on Linux's and macOS's file systems


def temp_beside(path: Path) -> Path:
    """The hidden temp file `path` is written through, in its folder. A name that leaves no room
    for the temp file's own (a valid 236-255-byte --out) gets its hash instead: before, such a name
    was refused, and the error named the temp file, not the user's."""
    suffix = f".{os.getpid()}.{threading.get_native_id()}.tmp"
    name = f".{path.name}{suffix}"
    if len(name.encode()) > NAME_MAX:
        name = f".{hashlib.sha256(path.name.encode()).hexdigest()[:16]}{suffix}"
    return path.with_name(name)


def read_regular(path: Path) -> bytes:
    """A regular file's bytes. Opened without blocking and checked before reading: a FIFO or a
    device under a file's name would otherwise block the read forever (OSError: not a regular file)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read()
    finally:
        os.close(fd)


def read_json_object(path: Path, max_bytes: int) -> dict:
    """A small JSON object a cache keeps (FLOP counts, micro-benchmark rates): {} where there is no
    file, it is past `max_bytes` (read whole otherwise: a 250 MB one took 2.1 GB), not a regular
    file, not JSON or not an object. The caller checks each entry: a cache is made again, never trusted."""
    try:
        if path.stat().st_size > max_bytes:
            return {}
        found = json.loads(read_regular(path))
    except (OSError, ValueError):  # absent, a FIFO, damaged (UnicodeDecodeError is a ValueError)
        return {}
    return found if isinstance(found, dict) else {}


def keep_json(path: Path, value: dict) -> bool:
    """Write a cache's JSON object whole, where it can be: a cache that cannot be written (a
    read-only home, a full disk) only means computing again next time. True when written."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(value, indent=0, sort_keys=True))
    except (OSError, UserError):  # write_atomic names the file in a UserError
        return False
    return True

"""Files that readers see whole or not at all: results shards, checkpoints, caches, exports."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import socket
import stat
import threading
from collections.abc import Callable
from pathlib import Path

from vitbench.errors import UserError


class WriteFailed(UserError):
    """A file could not be written (a full disk, a read-only folder): nothing of it was."""


def write_atomic(path: Path, text: str | Callable[[Path], object]) -> None:
    """Readers see the old file or the new one, never half of one (temp file + os.replace).
    `text` is the content, or a function that writes the file it is given (e.g. torch.save).
    A write that fails (a full disk) leaves no temp file behind and is one line naming the file."""
    # The thread too: two threads of one process writing one file (two `vitbench.run` calls
    # extracting the same features) each need a temp file of their own, or one moves the other's.
    tmp = temp_beside(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        remove_dead_writers_temps(path.parent)
        if isinstance(text, str):
            tmp.write_text(text)
        else:
            text(tmp)
        os.replace(tmp, path)
    except OSError as e:
        _discard(tmp)
        raise WriteFailed(f"{path}: cannot write it ({e.strerror or e}); nothing was written") from None
    except BaseException:
        _discard(tmp)  # an interruption or a library's own error: no half-written file either
        raise


def _discard(tmp: Path) -> None:
    """The temp file gone, where there is one: under a folder that is a file (VITBENCH_CACHE naming a
    file) removing it fails as writing it did, and the write's own error is the one to say."""
    with contextlib.suppress(OSError):
        tmp.unlink(missing_ok=True)


NAME_MAX = 255  # bytes in one file name, on Linux's and macOS's file systems


# this host in a temp file's name (letters, digits and dashes: the name is split at its dots), so that on
# shared storage a writer removes only the temp files of dead processes of its own host
HOST = re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname())[:63] or "host"
# (`.wal`: DuckDB's log of a database being built under a temp name, store/rebuild.py)
_TEMP = re.compile(r"\..*\.(?P<host>[A-Za-z0-9-]+)\.(?P<pid>[0-9]+)\.[0-9]+\.tmp(\.wal)?")


def temp_beside(path: Path) -> Path:
    """The hidden temp file `path` is written through, in its folder, named for this host, process and
    thread. A name that leaves no room for the temp file's own (a valid 236-255-byte --out) gets its
    hash instead: before, such a name was refused, and the error named the temp file, not the user's."""
    suffix = f".{HOST}.{os.getpid()}.{threading.get_native_id()}.tmp"
    name = f".{path.name}{suffix}"
    if len(name.encode()) > NAME_MAX:
        name = f".{hashlib.sha256(path.name.encode()).hexdigest()[:16]}{suffix}"
    return path.with_name(name)


_SWEPT: set[Path] = set()  # the folders this process has cleared of dead writers' temp files


def remove_dead_writers_temps(folder: Path) -> int:
    """Remove the temp files in `folder` of writers that died mid-write (SIGKILL, the OOM killer, a
    pre-empted job): each stayed for good, a whole feature-cache entry at a time. Only this host's,
    of a process that no longer runs; once per folder per process (the first write there). Returns
    how many went."""
    if folder in _SWEPT:
        return 0
    _SWEPT.add(folder)
    removed = 0
    try:
        with os.scandir(folder) as entries:
            names = [e.name for e in entries if e.name.endswith((".tmp", ".tmp.wal")) and e.name.startswith(".")]
    except OSError:
        return 0
    for name in names:
        found = _TEMP.fullmatch(name)
        if found and found["host"] == HOST and not _running(int(found["pid"])):
            with contextlib.suppress(OSError):  # (another writer removed it first)
                (folder / name).unlink()
                removed += 1
    return removed


def _running(pid: int) -> bool:
    """Whether a process `pid` runs on this host (one of another user's counts: it may be the writer)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True
    return True


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

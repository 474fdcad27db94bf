"""The object-store filesystems vitbench reads through, on an event loop of its own that a library
call ends when it returns.

fsspec's asynchronous filesystems (s3fs, gcsfs, http) run on one process-wide loop by default, in a
thread (`fsspecIO`) that fsspec starts on first use and never stops, with that loop's resolver
threads beside it: after `vitbench.run` over `wds:s3://…` returned, both were still running in
the researcher's process (issue 89, goal 3). Here each filesystem is made (outside fsspec's
instance cache) on vitbench's own loop and kept for the calls that follow, the remote files read by
row are kept open here too (`kept_open`, never in a container a caller's plan may keep), and
`opened_here()` closes the files, the sessions, the loop and its threads that a block opened. A loop
whose filesystem something still holds is left running: its session closes on it when it goes.
A forked DataLoader worker starts its own loop: the parent's thread does not exist in it."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import threading
import traceback
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from vitbench.errors import UserError

# seconds to close the sessions and the loop's executor at the end of a call: the loop then stops
# regardless (a store that stopped answering must not hold a returning call)
CLOSE_SECONDS = 10.0
KEEP_OPEN = 8  # remote files kept open for reads by row


class _Clients:
    """vitbench's loop, its thread and the filesystems made on it (by protocol and options)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="vitbench-store-io", daemon=True)
        self.thread.start()
        self.filesystems: dict[tuple[str, str], Any] = {}
        self.files: dict[str | tuple, Any] = {}  # remote files kept open for reads by row (kept_open), oldest first

    def close(self) -> None:
        """The filesystems' sessions closed on the running loop (s3fs closes its session when the
        filesystem is collected: a session left to a stopped loop said "Unclosed client session"),
        then the loop's executor, the loop and its thread. A filesystem something still holds keeps
        the loop running, for its session's sake."""
        files, self.files = list(self.files.values()), {}
        while files:  # (a name left bound to the last file would keep its filesystem past the check below)
            with contextlib.suppress(Exception):
                files.pop().close()
        made = [weakref.ref(fs) for fs in self.filesystems.values()]
        self.filesystems.clear()
        gc.collect()  # the filesystems (and the files that hold them) go, their sessions closed on the loop
        if any(fs() is not None for fs in made):
            return
        with contextlib.suppress(Exception):
            ended = asyncio.run_coroutine_threadsafe(self.loop.shutdown_default_executor(), self.loop)
            ended.result(CLOSE_SECONDS)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(CLOSE_SECONDS)
        if not self.thread.is_alive():
            self.loop.close()


_lock = threading.RLock()
_clients: _Clients | None = None


def _forget_in_child() -> None:
    """In a forked process: the parent's loop thread is not there, so its loop is not used."""
    global _clients, _lock
    _clients, _lock = None, threading.RLock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


def filesystem(url: str, options: dict[str, Any]):
    """(fsspec filesystem, path) for `url`: an asynchronous filesystem on vitbench's loop, made
    once for its protocol and options; any other as fsspec makes it."""
    import fsspec
    from fsspec.asyn import AsyncFileSystem

    protocol = url.split("://", 1)[0]
    if not issubclass(fsspec.get_filesystem_class(protocol), AsyncFileSystem):
        return fsspec.core.url_to_fs(url, **options)
    with _lock:
        clients = _running()
        key = (protocol, repr(sorted(options.items())))
        fs = clients.filesystems.get(key)
        if fs is None:
            fs, path = fsspec.core.url_to_fs(url, loop=clients.loop, skip_instance_cache=True, **options)
            clients.filesystems[key] = fs
            return fs, path
    return fs, fs._strip_protocol(url)


def _running() -> _Clients:
    global _clients
    with _lock:
        if _clients is None:
            _clients = _Clients()
        return _clients


def kept_open(url: str | tuple, opener: Callable[[], Any]):
    """`url` (or a key naming it) opened by `opener` once and kept open for the reads that follow (a container read by
    row seeks within a few files), the KEEP_OPEN most recently opened ones. They are vitbench's,
    not a container's: a plan or split a caller keeps holds no open file, and so no session."""
    with _lock:
        files = _running().files
        file = files.get(url)
        if file is None or getattr(file, "closed", False):
            while len(files) >= KEEP_OPEN:
                with contextlib.suppress(Exception):
                    files.pop(next(iter(files))).close()
            file = files[url] = opener()
        return file


def close() -> None:
    """Every filesystem made so far closed, with vitbench's loop and its threads (made again on next use)."""
    global _clients
    with _lock:
        clients, _clients = _clients, None
    if clients is not None:
        clients.close()


@contextlib.contextmanager
def opened_here() -> Iterator[None]:
    """The block's object-store clients closed at its end, however it ends; those open before it are
    left open. A user's mistake (UserError) is raised with its finished frames' locals let go of,
    so that the failed read's filesystem is not kept alive by the traceback a notebook holds on to."""
    was_open = _clients is not None
    try:
        yield
    except UserError as e:
        if not was_open:  # the failed read's finished frames held its file and filesystem: no use to a user's mistake
            _let_go_of_locals(e)
        raise
    finally:
        if not was_open:
            close()


def _let_go_of_locals(error: BaseException) -> None:
    """The locals of the finished frames of `error`'s traceback and of every exception it was raised from."""
    seen: set[int] = set()
    pending: list[BaseException | None] = [error]
    while pending:
        raised = pending.pop()
        if raised is None or id(raised) in seen:
            continue
        seen.add(id(raised))
        traceback.clear_frames(raised.__traceback__)
        pending += [raised.__context__, raised.__cause__]

"""The object-store filesystems vitbench reads through, on an event loop of its own that a library
call ends when it returns.

fsspec's asynchronous filesystems (s3fs, gcsfs, http) run on one process-wide loop by default, in a
thread (`fsspecIO`) that fsspec starts on first use and never stops, with that loop's resolver
threads beside it: after `vitbench.run` over `wds:s3://…` returned, both were still running in
the researcher's process (issue 89, goal 3). Here each filesystem is made (outside fsspec's
instance cache) on vitbench's own loop and kept for the calls that follow, and `opened_here()`
closes the sessions, the loop and its threads that a block opened. A forked DataLoader worker
starts its own loop: the parent's thread does not exist in it."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import threading
from collections.abc import Iterator
from typing import Any

# seconds to close the sessions and the loop's executor at the end of a call: the loop then stops
# regardless (a store that stopped answering must not hold a returning call)
CLOSE_SECONDS = 10.0


class _Clients:
    """vitbench's loop, its thread and the filesystems made on it (by protocol and options)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="vitbench-store-io", daemon=True)
        self.thread.start()
        self.filesystems: dict[tuple[str, str], Any] = {}

    def close(self) -> None:
        """The filesystems' sessions closed on the running loop (s3fs closes its session when the
        filesystem is collected: a session left to a stopped loop said "Unclosed client session"),
        then the loop's executor, the loop and its thread."""
        self.filesystems.clear()
        gc.collect()  # the filesystems (and the files that hold them) go, their sessions closed on the loop
        with contextlib.suppress(Exception):
            ended = asyncio.run_coroutine_threadsafe(self.loop.shutdown_default_executor(), self.loop)
            ended.result(CLOSE_SECONDS)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(CLOSE_SECONDS)
        if not self.thread.is_alive():
            self.loop.close()


_lock = threading.Lock()
_clients: _Clients | None = None


def _forget_in_child() -> None:
    """In a forked process: the parent's loop thread is not there, so its loop is not used."""
    global _clients, _lock
    _clients, _lock = None, threading.Lock()


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
    global _clients
    with _lock:
        if _clients is None:
            _clients = _Clients()
        clients = _clients
        key = (protocol, repr(sorted(options.items())))
        fs = clients.filesystems.get(key)
        if fs is None:
            fs, path = fsspec.core.url_to_fs(url, loop=clients.loop, skip_instance_cache=True, **options)
            clients.filesystems[key] = fs
            return fs, path
    return fs, fs._strip_protocol(url)


def close() -> None:
    """Every filesystem made so far closed, with vitbench's loop and its threads (made again on next use)."""
    global _clients
    with _lock:
        clients, _clients = _clients, None
    if clients is not None:
        clients.close()


@contextlib.contextmanager
def opened_here() -> Iterator[None]:
    """The block's object-store clients closed at its end, however it ends; those open before it are left open."""
    was_open = _clients is not None
    try:
        yield
    finally:
        if not was_open:
            close()

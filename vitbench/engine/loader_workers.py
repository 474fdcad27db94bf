"""What every DataLoader vitbench starts gives its worker processes at start-up (`worker_init_fn`), and
how the main process starts them (`started`) so that an interrupt never lands halfway.

A worker hands each batch's tensors to the main process by file descriptor, through multiprocessing's
resource sharer: a thread in the worker that the main process connects to. When the command is
interrupted (Ctrl-C, SIGTERM, SIGHUP) the main process stops reading mid-batch and shuts the workers
down; a connection it had begun is then cut, and the worker's sharer thread printed a traceback
(`answer_challenge … recv_bytes`) after the command's own "interrupted" line (the thread hands its
exceptions to `sys.excepthook` itself). The worker is vitbench's own process, so its hook is set
here, and only for that thread's cut connections: anything else is printed as before.

torch's multi-process iterator starts its workers in `__init__` and only then sets the state its
`__del__` reads; an interrupt in between (SIGTERM sent the moment a worker appeared) left a
half-built iterator whose `__del__` printed "Exception ignored … no attribute '_workers_status'"
after the "interrupted" line (the workers were still reaped). The vitbench command's handler
(`interrupt`, set in its own entry) therefore holds a signal that arrives while `started` builds the
iterator and raises it once the iterator is whole. In a program that imports vitbench its own
handlers stay as they are, and `started` is a plain `iter`.

The same hold (`held`) covers the import of a native extension that cannot take an interrupt while it
initialises (HELD_IMPORTS: DuckDB's, half a second): a SIGTERM whose KeyboardInterrupt landed inside
it was printed by the extension itself, a "Critical …" traceback before the command's "interrupted"
line (`plot` 0.5 s after its handlers were set, in CI). `HeldImports`, put on `sys.meta_path` by the
command's own entry, runs such an import whole and raises the signal after it."""

from __future__ import annotations

import contextlib
import importlib.abc
import os
import signal
import sys
import threading
from collections.abc import Iterable, Iterator

from vitbench.engine import stopping

SHARER = "multiprocessing/resource_sharer.py"


def worker_options(workers: int) -> dict:
    """A DataLoader's worker arguments: `init_worker` and, with workers, a multiprocessing context of
    its own in the process's start method (or the platform's default). Without one, torch's loader
    asks multiprocessing for its default context, which fixes the process's start method for good:
    a host that then chose `spawn` was refused (issue 89)."""
    if workers <= 0:
        return {"num_workers": 0, "worker_init_fn": init_worker}
    import multiprocessing

    method = multiprocessing.get_start_method(allow_none=True) or multiprocessing.get_all_start_methods()[0]
    return {"num_workers": workers, "worker_init_fn": init_worker, "multiprocessing_context": method}


def init_worker(worker_id: int) -> None:
    """`worker_init_fn`: a cut connection in the worker's resource-sharer thread passes quietly; in a
    cluster job the scheduler's USR2 and SIGTERM, which Slurm sends to every process of the job, are
    left to the main process (which checkpoints, then stops the workers): a worker that acted on them
    itself died, and the main process failed on its death (engine/stopping.py)."""
    if stopping.armed:
        for signum in (signal.SIGUSR2, signal.SIGTERM):
            signal.signal(signum, signal.SIG_IGN)
    before = sys.excepthook

    def quiet_when_cut(kind, value, tb) -> None:
        if issubclass(kind, (ConnectionError, EOFError, OSError)) and _raised_in_sharer(tb):
            return
        before(kind, value, tb)

    sys.excepthook = quiet_when_cut


def _raised_in_sharer(tb) -> bool:
    while tb is not None:
        if tb.tb_frame.f_code.co_filename.replace("\\", "/").endswith(SHARER):
            return True
        tb = tb.tb_next
    return False


_starting_in: int | None = None  # the process whose main thread is inside `started` (a forked worker is not)
_held = False  # whether a signal came meanwhile


_last_signal: list[int] = []  # the signal `interrupt` last turned into a KeyboardInterrupt


def interrupt(signum: int, frame) -> None:
    """The vitbench command's handler for SIGINT, SIGTERM and SIGHUP: Ctrl-C's KeyboardInterrupt, held
    while `started` builds a DataLoader's iterator in this process."""
    global _held
    _last_signal[:] = [signum]
    if _starting_in == os.getpid():
        _held = True
        return
    raise KeyboardInterrupt


def interrupted_code() -> int:
    """The exit code of a command an interruption ended: 128 + the signal's number, as a shell and a
    scheduler record it (143 for SIGTERM, 129 for SIGHUP); 130 (SIGINT's) for Ctrl-C, or a
    KeyboardInterrupt no signal raised."""
    return 128 + (_last_signal[0] if _last_signal else signal.SIGINT)


def forget_interruption() -> None:
    """A new command in this process: an earlier one's signal is not its own."""
    _last_signal.clear()


def started(batches: Iterable) -> Iterator:
    """`iter(batches)`, its workers all started and its state set before an interrupt is raised."""
    global _starting_in, _held
    if threading.current_thread() is not threading.main_thread():  # handlers run in the main thread only
        return iter(batches)
    _starting_in = os.getpid()
    try:
        running = iter(batches)
    finally:
        _starting_in = None
    if _held:
        _held = False
        del running  # a whole iterator: its `__del__` shuts its workers down
        raise KeyboardInterrupt
    return running


@contextlib.contextmanager
def held() -> Iterator[None]:
    """The block runs whole: a signal the command's handler takes meanwhile is raised as its
    KeyboardInterrupt once the block is done (as `started` does; in the main thread only, and inside
    an outer hold the outer one raises it)."""
    global _starting_in, _held
    if threading.current_thread() is not threading.main_thread() or _starting_in == os.getpid():
        yield
        return
    _starting_in = os.getpid()
    try:
        yield
    except BaseException as e:
        _starting_in = None
        if _held:
            _held = False
            raise KeyboardInterrupt from e
        raise
    _starting_in = None
    if _held:
        _held = False
        raise KeyboardInterrupt


HELD_IMPORTS = ("duckdb", "_duckdb")  # native extensions whose initialisation an interrupt must not cut


class HeldImports(importlib.abc.MetaPathFinder):
    """Imports `names` (packages and their submodules) with signals held (`held`): found by the other
    finders, executed by their own loaders."""

    def __init__(self, names: tuple[str, ...] = HELD_IMPORTS) -> None:
        self.names = names

    def find_spec(self, fullname, path, target=None):
        if fullname.partition(".")[0] not in self.names:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _HeldLoader(spec.loader)
                return spec
        return None


class _HeldLoader(importlib.abc.Loader):
    """A module's own loader, `create_module` (where an extension's native init runs) and
    `exec_module` under `held`; everything else is the loader's."""

    def __init__(self, loader) -> None:
        self.loader = loader

    def create_module(self, spec):
        with held():
            return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        with held():
            self.loader.exec_module(module)

    def __getattr__(self, name: str):
        return getattr(self.loader, name)

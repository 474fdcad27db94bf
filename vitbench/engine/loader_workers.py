"""What every DataLoader vitbench starts gives its worker processes at start-up (`worker_init_fn`).

A worker hands each batch's tensors to the main process by file descriptor, through multiprocessing's
resource sharer: a thread in the worker that the main process connects to. When the command is
interrupted (Ctrl-C, SIGTERM, SIGHUP) the main process stops reading mid-batch and shuts the workers
down; a connection it had begun is then cut, and the worker's sharer thread printed a traceback
(`answer_challenge … recv_bytes`) after the command's own "interrupted" line (the thread hands its
exceptions to `sys.excepthook` itself). The worker is vitbench's own process, so its hook is set
here, and only for that thread's cut connections: anything else is printed as before."""

from __future__ import annotations

import sys

SHARER = "multiprocessing/resource_sharer.py"


def init_worker(worker_id: int) -> None:
    """`worker_init_fn`: a cut connection in the worker's resource-sharer thread passes quietly."""
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

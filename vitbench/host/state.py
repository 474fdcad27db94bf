"""A library call leaves its host as it found it: what a run changes of the process it runs in
(the global random generators, which random-init weights and torch's DataLoader draw from; the
SIGCHLD handler torch's DataLoader installs) is put back when `vitbench.run`, `plan` or `results`
returns, so a seeded notebook's next `torch.rand` is what it would have been without vitbench; the
object-store clients a call opened (their event loop and its threads) are closed
(datasets/store_clients.py).

What is better not changed at all is not: DataLoaders are given a multiprocessing context of their
own (engine/loader_workers.py) instead of fixing the process's start method."""

from __future__ import annotations

import functools
import random
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from vitbench.datasets.store_clients import opened_here

# the handlers a run may touch: torch's SIGCHLD (its DataLoader), a cluster job's USR2 and SIGTERM
KEPT_SIGNALS = tuple(
    getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGCHLD", "SIGUSR1", "SIGUSR2")
    if hasattr(signal, name)
)  # fmt: skip

F = TypeVar("F", bound=Callable)


@contextmanager
def host_kept() -> Iterator[None]:
    """The host's random states (torch's CPU and initialised CUDA generators, numpy's, Python's) and
    signal handlers, as they were before the block, and no object-store client it opened, once it
    ends however it ends."""
    import numpy as np
    import torch

    python_state, numpy_state = random.getstate(), np.random.get_state()
    in_main = threading.current_thread() is threading.main_thread()  # only the main thread may set handlers
    handlers = {s: signal.getsignal(s) for s in KEPT_SIGNALS} if in_main else {}
    cuda = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    try:
        with torch.random.fork_rng(devices=cuda), opened_here():
            yield
    finally:
        random.setstate(python_state)
        np.random.set_state(numpy_state)
        for signum, handler in handlers.items():
            if handler is not None and signal.getsignal(signum) is not handler:
                signal.signal(signum, handler)


def leaves_no_trace(call: F) -> F:
    """`call` run inside `host_kept`."""

    @functools.wraps(call)
    def kept(*args, **kwargs):
        with host_kept():
            return call(*args, **kwargs)

    return kept  # type: ignore[return-value]

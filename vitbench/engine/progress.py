"""Progress for long loops: a rich bar on a terminal, plain log lines otherwise (CI, pipes, files)."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")
log = logging.getLogger("vitbench")


def track(items: Iterable[T], total: int, description: str) -> Iterator[T]:
    if sys.stderr.isatty():
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
        with Progress(*columns, transient=True) as progress:
            task = progress.add_task(description, total=total)
            for item in items:
                yield item
                progress.advance(task)
        return
    start, step, last = time.perf_counter(), max(1, total // 4), 0
    log.info("%s: %d batches", description, total)
    for i, item in enumerate(items, 1):
        yield item
        if i - last >= step or i == total:
            last = i
            log.info("%s: %d/%d batches (%.0fs)", description, i, total, time.perf_counter() - start)

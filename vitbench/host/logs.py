"""vitbench's log lines: plain messages on whatever stderr is at the time of writing."""

from __future__ import annotations

import logging
import sys

from vitbench.files.text_safety import visible

log = logging.getLogger("vitbench")


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever sys.stderr is now (not the one at start-up), so redirection works."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


class _Shown(logging.Formatter):
    """The message with its control characters shown as `\\xNN` (a file's name is data, never a
    terminal sequence: vitbench/files/text_safety.py)."""

    def format(self, record: logging.LogRecord) -> str:
        return visible(super().format(record))


class _OncePerCommand(logging.Filter):
    """A warning is shown once per command: a request over several protocols or stages loads the
    same splits again, and the same subset warning printed once for each (issue 45: four times on
    a resumed run). Information lines (progress) pass every time."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        message = record.getMessage()
        if message in self.seen:
            return False
        self.seen.add(message)
        return True


def configure_logging() -> None:
    """INFO lines as bare messages on stderr, each warning once per command (called at the start of
    every command: in-process callers, such as the tests, run several)."""
    handler = next((h for h in log.handlers if isinstance(h, _StderrHandler)), None)
    if handler is None:
        handler = _StderrHandler()
        handler.setFormatter(_Shown("%(message)s"))
        handler.addFilter(_OncePerCommand())
        log.addHandler(handler)
    for once in handler.filters:
        if isinstance(once, _OncePerCommand):
            once.seen.clear()
    log.setLevel(logging.INFO)

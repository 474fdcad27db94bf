"""vitbench's log lines: plain messages on whatever stderr is at the time of writing."""

from __future__ import annotations

import logging
import sys

log = logging.getLogger("vitbench")


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever sys.stderr is now (not the one at start-up), so redirection works."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


def configure_logging() -> None:
    """INFO lines as bare messages on stderr (once per process)."""
    if not any(isinstance(h, _StderrHandler) for h in log.handlers):
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(handler)
    log.setLevel(logging.INFO)

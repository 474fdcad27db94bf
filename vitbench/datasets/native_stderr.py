"""TensorFlow's start-up chatter kept off the `vitbench` command's stderr. Its C++ writes lines to
file descriptor 2 while it is imported, before absl's logging is set up, whatever
TF_CPP_MIN_LOG_LEVEL says (`WARNING: All log messages before absl::InitializeLog() …`, `I0000 …
oneDNN custom operations are on`, `Could not find cuda drivers`): a `tfds:` run printed five such
lines (issue 89). Only where the command owns its process (`claim()`, from cli.entry): a program
that imports vitbench keeps its stderr as it is, every byte of it."""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Iterator

_owned: list[bool] = []
# what the import prints that says nothing to a vitbench user: absl's pre-initialisation notice and
# its INFO lines (`I<mmdd> <time> <thread> <file>:<line>] …`)
CHATTER = re.compile(r"^(WARNING: All log messages before absl::InitializeLog\(\)|I\d{4} [\d:.]+ +\d+ \S+:\d+\])")


def claim() -> None:
    """The `vitbench` command's own process: native start-up chatter may be held back."""
    _owned[:] = [True]


@contextlib.contextmanager
def held_back() -> Iterator[None]:
    """File descriptor 2 into a temporary file while the block runs (an import), then back; what was
    written there, less the chatter, written out after. Outside the command's process: nothing."""
    if not _owned:
        yield
        return
    sys.stderr.flush()
    with tempfile.TemporaryFile() as caught:
        saved = os.dup(2)
        os.dup2(caught.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            kept = [line for line in caught.read().decode("utf-8", "replace").splitlines() if not CHATTER.match(line)]
            if kept:
                sys.stderr.write("\n".join(kept) + "\n")

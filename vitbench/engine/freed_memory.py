"""Memory a pass over images has freed, given back to the operating system.

glibc keeps what a process frees in its heap for reuse. A pass frees a great deal in pieces: each
batch's images, activations and outputs, a few MB each, which come from the heap once glibc's
dynamic mmap threshold has risen to their size. After a k-NN pass over 200,000 images, 140 MB of
the heap was free but still resident. The search that followed peaked 140 MB above the same search
over cached features (issue 89, item 10). `malloc_trim(0)` returns those pages. It changes no
setting of the process, so a host that imported vitbench keeps its allocator as it was. On other C
libraries (musl, macOS, Windows) nothing is done."""

from __future__ import annotations

import ctypes
import functools
import sys
from collections.abc import Callable


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None).malloc_trim  # glibc's; musl has none
    except (OSError, AttributeError):
        return None


def give_back() -> None:
    """The heap's free pages returned to the operating system, where the C library can."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)

"""The checks of every path vitbench is asked to write to (`--out` of each command, `weights convert`'s
output, the files inside an output folder), made before any work: vitbench writes a regular file of
its own name, or refuses in one line, and never replaces what is not a file it may write (issue 71)."""

from __future__ import annotations

import re
import stat
from pathlib import Path

from vitbench.errors import UserError
from vitbench.files.atomic import write_atomic
from vitbench.files.text_safety import visible


def check_out_file(path: Path, option: str = "--out") -> Path:
    """An output file's path, checked before any work: a regular file or none yet, in a folder that
    exists. What is there and not a regular file — a symbolic link, a FIFO, a device (`/dev/null`), a
    folder — is never replaced by the file written over it, and no folder is made that the user did
    not (a path the file system refuses for another reason is one line when it is written:
    atomic.write_atomic). Nor is a read-only file, whose mode says it is not to be replaced; `-` and a
    URL (`s3://…`, which a path would make a local `s3:/…`) are names vitbench writes no file under."""
    _check_not_a_stream_or_url(path, option, "a file name")
    if path.is_symlink():
        raise UserError(f"{option} {path}: is a symbolic link; name the file itself (it would be replaced by a file)")
    if path.is_dir():
        raise UserError(f"{option} {path}: is a folder, expected a file name")
    if path.exists() and not path.is_file():
        raise UserError(f"{option} {path}: is not a regular file (a FIFO or a device), expected a file to write")
    if path.is_file() and not path.stat().st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH):
        raise UserError(f"{option} {path}: is read-only; vitbench does not replace it (name another file)")
    _check_parent(path, option)
    return path


def check_out_folder(path: Path, option: str = "--out") -> Path:
    """An output folder's path (figures, attention maps), checked before any work: a folder, or none
    yet in a folder that exists (vitbench makes the one it was asked to write into, no more). A
    symbolic link to a folder is written through, never replaced."""
    _check_not_a_stream_or_url(path, option, "a folder")
    if path.exists() and not path.is_dir():
        kind = "a file" if path.is_file() else "not a folder (a FIFO or a device)"
        raise UserError(f"{option} {path}: is {kind}, expected a folder to write into")
    if path.is_symlink() and not path.exists():
        raise UserError(f"{option} {path}: is a symbolic link to nothing; name a folder")
    _check_parent(path, option)
    return path


URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+:/")  # s3://, gs://, https://: two letters or more (not C:/)


def _check_not_a_stream_or_url(path: Path, option: str, expected: str) -> None:
    if str(path) == "-":
        raise UserError(f"{option} -: expected {expected}; vitbench writes nothing to standard output through --out")
    if URL.match(str(path)):
        raise UserError(f"{option} {path}: a URL; expected {expected} here (vitbench writes local files only)")


def _check_parent(path: Path, option: str) -> None:
    above = next((p for p in path.parents if p.exists()), None)
    if above is not None and not above.is_dir():
        raise UserError(f"{option} {path}: {above} is a file, not a folder")
    if not path.parent.exists():
        raise UserError(
            f"{option} {path}: no folder {path.parent}; make it first (vitbench makes none it was not asked to)"
        )


def write_figure(fig, path: Path, option: str = "--out", **savefig) -> Path:
    """A matplotlib figure saved as `path` (its format from the suffix) after `check_out_file`, whole
    or not at all (a temp file renamed over it): a link or a FIFO of that name inside an output
    folder is refused like one named by --out, never written through."""
    check_out_file(path, option)
    no_mathtext(fig)
    write_atomic(path, lambda tmp: fig.savefig(tmp, format=path.suffix.lstrip("."), **savefig))
    return path


def no_mathtext(fig) -> None:
    """Every text of the figure drawn as written: matplotlib reads `$…$` as mathtext, so a dataset
    named `m$\\undefinedcmd{$x` ended `report` and every `plot` in a traceback, and `$` pairs in
    names set them in italics. The tick labels are matplotlib's own (a log axis writes its powers of
    ten in mathtext) and keep it. Control characters are shown as `\\xNN`, as on a terminal."""
    from matplotlib.text import Text

    ticks = {
        id(label)
        for axes in fig.axes
        for axis in (axes.xaxis, axes.yaxis)
        for tick in axis.get_major_ticks() + axis.get_minor_ticks()
        for label in (tick.label1, tick.label2)
    }
    for text in fig.findobj(Text):
        if id(text) not in ticks:
            text.set_parse_math(False)
            text.set_text(visible(text.get_text()))  # no font has a glyph for ESC: shown as \x1b

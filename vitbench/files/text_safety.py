"""Names from the store (models, weights files, datasets, classes, image files) made safe for the
medium they reach. A name is data, never an instruction to a terminal or a spreadsheet:

- terminal (and every text format): control characters shown as `\\xNN`, never sent raw (an OSC 52
  sequence in a corrupt file's name wrote the clipboard and cleared the screen);
- CSV: a text cell that starts with `=`, `+`, `-`, `@`, a tab or a carriage return is a formula to a
  spreadsheet; it is written behind an apostrophe (OWASP's advice), which spreadsheets show as text.
"""

from __future__ import annotations

import os
import re
import unicodedata

# Unicode's bidirectional controls: a class named with U+202E (RIGHT-TO-LEFT OVERRIDE) drew the rest of
# its line backwards on the terminal, and in the report
_BIDI = "\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
# C0 controls but tab and newline, DEL, and C1 controls (U+0080..U+009F: CSI is one of them)
_CONTROL = re.compile(f"[\\x00-\\x08\\x0b-\\x1f\\x7f-\\x9f{_BIDI}]")
_CONTROL_ONE_LINE = re.compile(f"[\\x00-\\x1f\\x7f-\\x9f{_BIDI}]")
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def visible(text: str, one_line: bool = False) -> str:
    """`text` with its control characters written as `\\xNN` or `\\uNNNN` (newlines and tabs kept,
    unless `one_line`); in text not in Unicode's composed form (NFC), its combining marks too: "café"
    spelt with a combining accent (NFD, as macOS names files) and "café" read alike, two rows that
    looked like one."""
    pattern = _CONTROL_ONE_LINE if one_line else _CONTROL
    text = pattern.sub(lambda m: _escaped(m.group()), text)
    if not text.isascii() and unicodedata.normalize("NFC", text) != text:
        text = "".join(_escaped(ch) if unicodedata.combining(ch) else ch for ch in text)
    return text


def _escaped(character: str) -> str:
    code = ord(character)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def visible_name(name: str) -> str:
    """A name as a table's row or cell shows it: `visible`, and quoted where it starts or ends with white
    space ("cat" and "cat " were two rows that read alike)."""
    shown = visible(name, one_line=True)
    return repr(shown) if shown != shown.strip() else shown


def csv_text(value: object) -> object:
    """A CSV cell: text that a spreadsheet would run as a formula behind an apostrophe, and its
    control characters visible (a newline or a tab inside a quoted cell is CSV's own: kept);
    numbers and everything else as they are."""
    if not isinstance(value, str):
        return value
    value = visible(value)
    return "'" + value if value.startswith(FORMULA_STARTS) and not _is_number(value) else value


def _is_number(text: str) -> bool:
    """ "-0.5" and "+3" are numbers a spreadsheet reads as such, not formulas."""
    try:
        float(text)
    except ValueError:
        return False
    return True


def csv_frame(frame):
    """A DataFrame's text cells through `csv_text` (a copy; numeric columns untouched)."""
    from pandas.api.types import is_object_dtype, is_string_dtype

    frame = frame.copy()
    for column in frame.columns:
        if is_object_dtype(frame[column]) or is_string_dtype(frame[column]):
            frame[column] = frame[column].map(csv_text)
    return frame


def non_utf8_byte(text: str) -> str | None:
    """The first byte (as hex) of a name read from the file system that is not UTF-8 (Python keeps it as
    a lone surrogate, which DuckDB, JSON and hashes of the name refuse), or None where it is all UTF-8."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return os.fsencode(text[e.start : e.start + 1]).hex()
    return None

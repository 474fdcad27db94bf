"""Names from the store (models, weights files, datasets, classes, image files) made safe for the
medium they reach. A name is data, never an instruction to a terminal or a spreadsheet:

- terminal (and every text format): control characters shown as `\\xNN`, never sent raw (an OSC 52
  sequence in a corrupt file's name wrote the clipboard and cleared the screen);
- CSV: a text cell that starts with `=`, `+`, `-`, `@`, a tab or a carriage return is a formula to a
  spreadsheet; it is written behind an apostrophe (OWASP's advice), which spreadsheets show as text.
"""

from __future__ import annotations

import re

# C0 controls but tab and newline, DEL, and C1 controls (U+0080..U+009F: CSI is one of them)
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_CONTROL_ONE_LINE = re.compile(r"[\x00-\x1f\x7f-\x9f]")
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def visible(text: str, one_line: bool = False) -> str:
    """`text` with its control characters written as `\\xNN` (newlines and tabs kept, unless `one_line`)."""
    pattern = _CONTROL_ONE_LINE if one_line else _CONTROL
    return pattern.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


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

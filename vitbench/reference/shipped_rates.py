"""Rates vitbench ships, measured with `vitbench bench` on GPUs (results/measured/gpu-rates.csv: model,
resolution, precision, batch, inference or training, images/s, the date and the section of
docs/performance.md each row comes from): `--dry-run --price-on h100` prices a plan on a GPU one
does not have from what was measured on one, and names the rows' source and date. A configuration
never measured there is priced by `--assume-mfu` where given, else left unpriced and said so."""

from __future__ import annotations

import csv
import sys
from dataclasses import dataclass
from pathlib import Path

from vitbench.errors import UserError

FILE = "gpu-rates.csv"


@dataclass(frozen=True)
class ShippedRow:
    kind: str  # what --price-on names: h100, h200
    device: str
    model: str
    res: int
    precision: str
    batch: int
    mode: str  # inference or train
    images_per_second: float
    measured: str
    source: str


def measured_dir() -> Path:
    """The source tree's results/measured, else the installed copy (as the paper's tables)."""
    candidates = [
        Path(__file__).resolve().parents[2] / "results" / "measured",
        Path(sys.prefix) / "share" / "vitbench" / "measured",
    ]
    for path in candidates:
        if (path / FILE).is_file():
            return path
    raise UserError(f"cannot find vitbench's measured GPU rates (results/measured/{FILE})")


def shipped_rows() -> list[ShippedRow]:
    """The file's rows; a damaged file (not UTF-8, a column missing, a number that is not one) is
    one line naming it and the line, not a ValueError, KeyError or UnicodeDecodeError."""
    path = measured_dir() / FILE
    try:
        with open(path, newline="", encoding="utf-8") as f:
            return [_row(r, path, line) for line, r in enumerate(csv.DictReader(f), start=2)]
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: not UTF-8 text (byte {e.start}); reinstall vitbench to restore it") from None
    except (OSError, csv.Error) as e:
        raise UserError(f"{path}: cannot be read ({e}); reinstall vitbench to restore it") from None


def _row(r: dict, path: Path, line: int) -> ShippedRow:
    try:
        row = ShippedRow(
            r["kind"], r["device"], r["model"], int(r["res"]), r["precision"], int(r["batch"]), r["mode"],
            float(r["images_per_second"]), r["measured"], r["source"],
        )  # fmt: skip
    except (KeyError, TypeError, ValueError) as e:
        raise UserError(
            f"{path}:{line}: not a rate row ({type(e).__name__}: {e}); reinstall vitbench to restore it"
        ) from None
    if not row.images_per_second > 0 or row.images_per_second == float("inf"):
        raise UserError(f"{path}:{line}: images_per_second {row.images_per_second} is not a rate")
    return row


def rows_for(kind: str) -> list[ShippedRow]:
    """The rows measured on `kind` (case-insensitive); a kind never measured is one line naming those that were."""
    rows = [r for r in shipped_rows() if r.kind == kind.strip().lower()]
    if not rows:
        kinds = sorted({r.kind for r in shipped_rows()})
        raise UserError(f"--price-on {kind}: no rates measured there ship with vitbench; expected {', '.join(kinds)}")
    return rows

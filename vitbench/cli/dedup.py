"""`vitbench dedup`: near-duplicates between a dataset's train and test splits, or between a
pre-training set and downstream test sets (the ViT paper's §4.1 de-duplication)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated

from rich.table import Table

from vitbench.cli import options as o
from vitbench.cli.app import app, command_began, out, print_table
from vitbench.cli.options import (
    in_panel,  # noqa: F401  (named by the text annotations @panels writes)
    option,
)
from vitbench.cli.run_options import DataSource
from vitbench.errors import UserError
from vitbench.execution.estimate import duration
from vitbench.files.atomic import write_atomic
from vitbench.files.text_safety import csv_frame
from vitbench.store.dedup_method import Method

DEFAULT_THRESHOLD = Method.threshold  # (dedup_method.py loads no torch: --help stays light)

DedupDataset = Annotated[
    str,
    option(
        "--dataset",
        "-d",
        help="The dataset audited: its train (and dev) splits against its own test split; with --against,"
        " every image of it (a pre-training set) against those datasets' test splits.",
    ),
]
Against = Annotated[
    str | None,
    option("--against", help="Comma list of datasets whose test images are searched for in --dataset's images."),
]
OutCsv = Annotated[
    Path | None,
    option("--out", help="Write every pair to this CSV: test_image, duplicate, distance and the method's settings."),
]
Threshold = Annotated[
    float,
    option(
        "--threshold",
        help="Verified correlation (of the 32 px thumbnails, over small shifts and scales) at or above which a"
        " pair is a near-duplicate; distance = 1 - correlation.",
    ),
]
Examples = Annotated[int, option("--examples", min=0, help="Example pairs shown per audit.")]
Workers = Annotated[int, option("--workers", min=0, help="DataLoader worker processes decoding image files.")]
Rerun = Annotated[bool, option("--rerun", help="Search again even where the same audit is stored.")]
DryRun = Annotated[
    bool,
    option(
        "--dry-run",
        help="List the audits with the time each will take here (thumbnails and search, measured on a sample)"
        " and stop: nothing searched or written.",
    ),
]


@app.command("dedup")
@o.panels(
    {
        "What to audit": ("dataset", "against", "threshold", "examples", "rerun", "dry_run"),
        "Data": ("data_dir", "data_source", "workers"),
        "Output": ("out_csv", "results"),
    }
)
def dedup_cmd(
    dataset: DedupDataset,
    against: Against = None,
    data_dir: o.DataDir = None,
    data_source: DataSource = None,
    out_csv: OutCsv = None,
    threshold: Threshold = DEFAULT_THRESHOLD,
    examples: Examples = 3,
    workers: Workers = 2,
    rerun: Rerun = False,
    results: o.Results = Path("results"),
    dry_run: DryRun = False,
) -> None:
    """Near-duplicates of test images (re-encoded, resized, cropped, shifted or colour-shifted
    copies) in a dataset's train split, or in a pre-training set (--against): a summary per test
    set, every pair stored (and written with --out)."""
    from vitbench import api

    tests = o.words(against)
    if against is not None and not tests:  # `--against ,,` ran the self-audit
        raise UserError(f"--against {against!r}: expected a comma list of dataset names (e.g. cifar10,pets)")
    if out_csv is not None and not dry_run:  # before the search, not after it
        o.check_out_file(out_csv)
    began = command_began()
    audits = api.dedup(
        dataset, tests, data_dir=o.check_data_dir(data_dir), results=results, threshold=threshold,
        workers=workers, rerun=rerun, data_source=data_source, dry_run=dry_run,
    )  # fmt: skip
    if dry_run:
        print_priced(audits, began.seconds(), rerun)
        return
    print_table(summary_table(audits))
    for audit in audits:
        if audit.get("sheet"):
            out.print(
                f"  contact sheet of {audit['test_dataset']}'s pairs: {audit['sheet']}", markup=False, highlight=False
            )
        shown = audit["pairs"].drop_duplicates("test_index").head(examples)
        for pair in shown.itertuples():
            out.print(
                f"  {audit['test_dataset']} {pair.test_image}  ~  {pair.duplicate}  (distance {pair.distance:.3f}"
                f"{', exact copy' if pair.exact else ''})",
                markup=False,
                highlight=False,
            )
    if out_csv is not None:
        frame = pairs_csv(audits)
        write_atomic(
            out_csv, csv_frame(frame).to_csv(index=False)
        )  # a path it cannot write: one line (the audit is stored)
        out.print(f"{len(frame)} pair(s) written to {out_csv}", markup=False, highlight=False)


def print_priced(priced: list, startup: float, rerun: bool) -> None:
    """`--dry-run`: each audit with its images and estimated time, then the whole wait and its parts."""
    for p in priced:
        state = "stored" if p.stored and not rerun else f"todo  ≈ {duration(p.seconds(rerun))}"
        out.print(f"{p.audit}: {p.n_test:,} test x {p.n_audited:,} images  {state}", markup=False, highlight=False)
    todo = [p for p in priced if rerun or not p.stored]
    thumbnails, search = sum(p.thumbnails for p in todo), sum(p.search for p in todo)
    out.print(
        f"{len(todo)} audit(s) to do, estimated time {duration(thumbnails + search + startup)}: thumbnails "
        f"{duration(thumbnails)}, search {duration(search)}, start-up {duration(startup)} (an estimate, measured "
        "here: thumbnails timed on a sample of each split's own files, the search on random thumbnails, start-up "
        "this command's own; not storing the pairs or drawing their contact sheets)",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )


def summary_table(audits: list[dict]) -> Table:
    table = Table(title="Near-duplicates of test images")
    from vitbench.views.measured.contamination import AUDIT_COLUMNS, audit_cells

    for name in ("test set", *AUDIT_COLUMNS, "images/s", "audit"):
        table.add_column(name, justify="right" if name in ("test images", "pairs", "images/s") else "left")
    for a in audits:
        rate = a["images_per_second"]
        table.add_row(
            f"{a['test_dataset']} {a['test_split']}",
            *audit_cells(a),
            "" if rate is None or math.isnan(rate) else f"{rate:,.0f}",
            "stored before" if a["stored"] else "searched now",
        )
    threshold = audits[0]["threshold"] if audits else DEFAULT_THRESHOLD
    table.caption = (
        f"threshold {threshold:g} (correlation of 32 px thumbnails over ±3 px shifts and 0.9-1.1 scales, colour and "
        "detail); audit: searched now, or stored before (an identical audit read back; --rerun searches again)"
    )
    return table


def pairs_csv(audits: list[dict]):
    """Every pair of every audit (a DataFrame): test_image, duplicate, distance, exact, where each
    came from, and the method's settings (one column each)."""
    import pandas as pd

    frames = []
    for a in audits:
        method = a["method"] if isinstance(a["method"], dict) else json.loads(a["method"])
        frame = a["pairs"][["test_image", "duplicate", "distance", "exact"]].copy()
        frame.insert(0, "test_set", f"{a['test_dataset']} {a['test_split']}")
        frame.insert(1, "audited_set", f"{a['audited_dataset']} {a['audited_split']}")
        for key, value in method.items():
            frame[f"method_{key}"] = json.dumps(value) if isinstance(value, list) else value
        frame["audit_key"] = a["audit_key"]
        frames.append(frame)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=["test_image", "duplicate"])

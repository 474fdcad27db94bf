"""Footnotes every view shares: what the markers mean, and what stands behind each measured column."""

from __future__ import annotations

import re

from vitbench.views.cells import RANDOM_MARK, SMOKE_MARK, SUBSET_MARK, TableData
from vitbench.views.measured import contamination
from vitbench.views.measured.columns import Measured
from vitbench.views.measured.coverage import class_coverage, fewer_classes_text, has_top5
from vitbench.views.measured.paper_match import WITHIN_MARK
from vitbench.views.measured.settings import common_text


def marker_footnotes(data: TableData, include_marked: bool, compared: bool, runs=None) -> None:
    """The markers' footnotes, each only where its marker appears; `runs` (the view's runs): the
    subset footnote names the datasets scored on fewer than all their classes, with their chance."""
    texts = " ".join([*data.columns, *(c.marks for c in data.cells.values()), *data.rows])
    left_out = "" if include_marked or not compared else "; no Δ, never bold (--include-marked to include)"
    if RANDOM_MARK in texts:
        data.footnotes.append(
            f"{RANDOM_MARK} random-init weights: a baseline (the architecture untrained), not a pretrained "
            f"backbone{left_out}"
        )
    if SUBSET_MARK in texts:
        fewer = fewer_classes_text(class_coverage(runs), top5=has_top5(runs)) if runs is not None else ""
        data.footnotes.append(
            f"{SUBSET_MARK} measured on a subset of the official splits: not comparable with the paper{left_out}"
            + (f"; scored on fewer classes than the dataset has: {fewer}" if fewer else "")
        )
    if WITHIN_MARK in " ".join(c.marks for c in data.cells.values()):
        data.footnotes.append(
            f"{WITHIN_MARK} the Δ lies within the paper's own spread: at most 2 std of its fine-tuning runs "
            "(Table 2: three)"
        )
    if "-shot]" in " ".join(c.marks for c in data.cells.values()):
        data.footnotes.append(
            "[k-shot] after a value: its train split's smallest class has only k images, so the run used k there "
            "(fewer than the column's shot count)"
        )
    if contamination.DUPLICATE_MARK in " ".join(c.marks for c in data.cells.values()):
        data.footnotes.append(contamination.FOOTNOTE)
    if SMOKE_MARK in texts:
        data.footnotes.append(
            f"{SMOKE_MARK} --smoke: a few steps at a small resolution, a pipeline check, not a result{left_out}"
        )


def short_fingerprint(fingerprint) -> str:
    """A hash's first 8 hex digits; a fingerprint that is a name (`sklearn-1.9.1-digits-0:1000`)
    whole, since any cut of it would name something else."""
    text = str(fingerprint)
    return text[:8] if re.fullmatch(r"[0-9a-f]{9,}", text) else text


def provenance_footnotes(data: TableData, m: Measured) -> None:
    """What stands behind each measured column: weights fingerprint, data source, protocol, seeds,
    hardware and code version — one footnote per distinct provenance, naming the columns it covers;
    first, the input settings every column shares (no label names them: none is left to a default)."""
    shared = common_text(m.common)
    if shared:
        data.footnotes.append(shared)
    covers: dict[str, list[str]] = {}
    # each distinct provenance once: a column of a checkpoint sweep holds thousands of runs that share it
    fields = ["column", "weights", "weights_sha256", "random_init", "dataset", "data_source", "data_fingerprint",
              "data_subset", "seed", "vitbench_version", "git_sha", "device_name", "protocol_version"]  # fmt: skip
    for col, part in m.runs[fields].drop_duplicates().astype(object).groupby("column", sort=False):
        weights = sorted(
            {
                "random init (seeded)" if r else f"{str(w).rsplit('/', 1)[-1]} sha256 {str(s)[:12]}"
                for w, s, r in zip(part["weights"], part["weights_sha256"], part["random_init"], strict=True)
            }
        )
        data_sources = sorted(
            {
                f"{d}: {src}@{short_fingerprint(fp)}" + (" (subset)" if sub else "")
                for d, src, fp, sub in zip(
                    part["dataset"], part["data_source"], part["data_fingerprint"], part["data_subset"], strict=True
                )
            }
        )
        seeds = ",".join(str(int(s)) for s in sorted(set(part["seed"])))
        code = sorted(
            {f"vitbench {v} (git {str(g)[:8]})" for v, g in zip(part["vitbench_version"], part["git_sha"], strict=True)}
        )
        devices = sorted({str(d) for d in part["device_name"] if d is not None})
        text = (
            f"weights {'; '.join(weights)} · data {'; '.join(data_sources)} · "
            f"{', '.join(sorted(set(part['protocol_version'])))} · seeds {seeds} · {'; '.join(devices)} · "
            f"{'; '.join(code)}"
        )
        covers.setdefault(text, []).append(str(col))
    for text, cols in covers.items():
        data.footnotes.append(f"[{', '.join(cols)}] {text}")

"""`vitbench dedup --dry-run`: each planned audit with the time it will take here, measured, not
assumed: making thumbnails (a sample of each split's own files decoded and shrunk as the audit's
workers do, engine/dedup.py `_Thumbnailed`) and the search (engine/dedup.py `Search` timed on
random thumbnails, scaled by the test x audited images it compares). An audit stored for the same
files and settings is read back, not searched: it costs nothing."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from vitbench import store
from vitbench.datasets import Split
from vitbench.engine import dedup
from vitbench.execution.dedup import Audit, audit_key
from vitbench.execution.overheads import seconds_per_item

SEARCH_SAMPLE = (256, 2048)  # test x audited random thumbnails the search is timed on (fewer where the audit has)
BLOCK = 8192  # audited images per block, as engine/dedup.py `audit` is called


@dataclass(frozen=True)
class PricedAudit:
    """One planned audit, its images and its estimated seconds (0 where it is stored)."""

    audit: Audit
    n_test: int
    n_audited: int
    stored: bool  # read back, not searched (unless --rerun)
    thumbnails: float  # seconds making both splits' thumbnails
    search: float  # seconds comparing them

    def seconds(self, rerun: bool = False) -> float:
        return 0.0 if self.stored and not rerun else self.thumbnails + self.search


def thumbnail_seconds(split: Split) -> float:
    """One core's seconds per image making the split's thumbnails, timed on a sample spread over it."""
    return seconds_per_item(len(split), dedup._Thumbnailed(split).__getitem__) if len(split) else 0.0


def search_seconds(n_test: int, n_audited: int, method: dedup.Method) -> float:
    """Seconds the search of `n_test` test thumbnails among `n_audited` takes here: timed on random
    thumbnails (at most SEARCH_SAMPLE of each), holding the test images scaled by their number and
    comparing them scaled by the pairs compared."""
    if not n_test or not n_audited:
        return 0.0
    sample_test, sample_audited = min(n_test, SEARCH_SAMPLE[0]), min(n_audited, SEARCH_SAMPLE[1])
    generator = torch.Generator().manual_seed(0)

    def thumbnails(n: int, first: int) -> dedup.Thumbnails:
        pixels = torch.randint(0, 256, (n, 3, dedup.THUMB, dedup.THUMB), dtype=torch.uint8, generator=generator)
        indices = np.arange(first, first + n)
        return dedup.Thumbnails(pixels, indices, indices, np.full(n, dedup.THUMB))

    start = time.perf_counter()
    search = dedup.Search(thumbnails(sample_test, 0), method)
    held = time.perf_counter() - start
    search.add(thumbnails(sample_audited, sample_test))
    search.pairs()
    compared = time.perf_counter() - start - held
    return held * n_test / sample_test + compared * (n_test * n_audited) / (sample_test * sample_audited)


def price(audits: list[Audit], splits, results: Path | str, method: dedup.Method, workers: int) -> list[PricedAudit]:
    """Each audit priced: `splits(dataset, split_name)` loads a split (as the audit would); one
    stored already is read back (by `vitbench dedup` without --rerun) and priced so.
    Thumbnails: a split's images at its measured pace, a block of BLOCK images per DataLoader worker
    (one block, one worker: a split under BLOCK images is made by one), a split of 32 px arrays in
    the main process; the test split's again for every audit, as `dedup.audit` makes them."""
    results = Path(results)
    stored = set(store.read_audits(results)["audit_key"]) if results.is_dir() else set()
    pace: dict[tuple[str, str], float] = {}
    priced = []
    for audit in audits:
        test = splits(audit.test_dataset, audit.test_split)
        audited = splits(audit.audited_dataset, audit.audited_split)
        seconds = 0.0
        for split in (test, audited):
            if (split.dataset, split.name) not in pace:
                pace[split.dataset, split.name] = thumbnail_seconds(split)
            parallel = max(1, min(workers, math.ceil(len(split) / BLOCK)))
            seconds += pace[split.dataset, split.name] * len(split) / parallel
        key = audit_key(test, audited, method)
        search = search_seconds(len(test), len(audited), method)
        priced.append(PricedAudit(audit, len(test), len(audited), key in stored, seconds, search))
    return priced

"""`vitbench dedup` and pre-training's `--dedup-against`: which (test split, audited split) pairs a
request means, each searched by engine/dedup.py and stored with its provenance (one audit row and
its pairs); an audit already stored for the same files and settings is read back, not repeated."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd
import torch

from vitbench import store
from vitbench.catalog import registry
from vitbench.datasets import DatasetSpec, Split
from vitbench.engine import dedup
from vitbench.engine.progress import track
from vitbench.errors import UserError
from vitbench.execution import recorder
from vitbench.execution.lease import Lease
from vitbench.host.devices import device_name
from vitbench.provenance import canonical_json, environment, sha256_text

log = logging.getLogger("vitbench")


@dataclass(frozen=True)
class Audit:
    """One test split searched for near-duplicates among one audited split."""

    test_dataset: DatasetSpec
    test_split: str
    audited_dataset: DatasetSpec
    audited_split: str

    def __str__(self) -> str:
        return f"{self.test_dataset.name} {self.test_split} in {self.audited_dataset.name} {self.audited_split}"


def plan(dataset: str, against: tuple[str, ...] = ()) -> list[Audit]:
    """`--dataset D`: D's other on-disk splits (train, and val/dev where D has its own) against D's
    test split. `--dataset P --against D1,D2`: every on-disk split of P against each Di's test split."""
    audited = registry.get_dataset(dataset)
    if not against:
        test = audited.test_split
        others = [s for s in audited.official_sizes if s != test]
        if test not in audited.official_sizes or not others:
            raise UserError(f"dataset {audited.name} has no train and test splits to audit against each other")
        return [Audit(audited, test, audited, s) for s in others]
    # a name given twice is one audit (as `run` folds repeated names): before, each ran twice
    tests = [registry.get_dataset(name) for name in dict.fromkeys(against)]
    return [Audit(t, t.test_split, audited, s) for t in tests for s in audited.official_sizes]


def image_names(split: Split) -> list[str]:
    """How an audit names a split's images: file paths, or `split:index` for images held in arrays."""
    if split.paths is not None:
        return list(split.paths)
    if split.records is not None:
        return [split.location(i) for i in range(len(split))]
    return [f"{split.name}:{i}" for i in range(len(split))]


def audit_key(test: Split, audited: Split, method: dedup.Method) -> str:
    return sha256_text(
        canonical_json(
            {
                "test": [test.dataset, test.name, test.source, test.fingerprint],
                "audited": [audited.dataset, audited.name, audited.source, audited.fingerprint],
                "method": method.describe(),
            }
        )
    )[:16]


def run(
    audits: list[Audit],
    data_dir: Path | None,
    results: Path,
    method: dedup.Method,
    workers: int = 0,
    rerun: bool = False,
    verify: bool = False,
    source: str | None = None,
) -> list[dict]:
    """Each audit, stored (or read back where stored): its row (store.AUDIT_COLUMNS) with `pairs`
    (a DataFrame of store.PAIR_COLUMNS), `stored` (whether it was read back) and `splits` (the test
    and audited splits, for a contact sheet)."""
    store.sync(results)  # audits an earlier command kept as shards (the database was held or full)
    stored = store.read_audits(results)
    split = split_loader(data_dir, source, verify)
    rows = []
    for audit in audits:
        test, audited = split(audit.test_dataset, audit.test_split), split(audit.audited_dataset, audit.audited_split)
        key = audit_key(test, audited, method)
        if not rerun and key in set(stored["audit_key"]):
            rows.append(_read_back(results, stored, key, (test, audited)))
            continue
        with _audit_lease(results, key, str(audit)) as taken:
            if not taken:  # another process searched it meanwhile: its result, read back
                rows.append(_read_back(results, store.read_audits(results), key, (test, audited)))
                continue
            found = measure(audit, test, audited, key, method, workers, data_dir, results)
        rows.append({**found, "stored": False, "splits": (test, audited)})
    return rows


def split_loader(data_dir: Path | None, source: str | None, verify: bool) -> Callable[[DatasetSpec, str], Split]:
    """`load(dataset, split_name)`: each split loaded once, however many audits read it."""
    loaded: dict[tuple[str, str], Split] = {}

    def load(spec: DatasetSpec, name: str) -> Split:
        if (spec.name, name) not in loaded:
            loaded[spec.name, name] = spec.load_split(data_dir, name, source, verify)
        return loaded[spec.name, name]

    return load


def _read_back(results: Path, stored: pd.DataFrame, key: str, splits: tuple[Split, Split]) -> dict:
    row = stored[stored["audit_key"] == key].iloc[0].to_dict()
    return {**row, "pairs": store.read_pairs(results, [key]), "stored": True, "splits": splits}


WAIT_SECONDS = 2.0  # how often a second `dedup` of the same pair looks whether the first has finished


@contextlib.contextmanager
def _audit_lease(results: Path, key: str, what: str):
    """The audit's lease, as a run's (execution/lease.py): True once taken. Where another live process
    holds it, this one waits for it to finish (two `dedup`s of one pair both searched the whole
    pair); False when that process stored the audit meanwhile, so it is read back, not searched again."""
    lease = Lease(results, f"audit-{key}", what="audit")
    told = False
    while not lease.acquire():
        if not told:
            holder = lease.holder()
            log.info("dedup %s: being searched by process %s on %s; waiting for it", what, holder.get("pid", "?"),
                     holder.get("host", "?"))  # fmt: skip
            told = True
        time.sleep(WAIT_SECONDS)
    try:
        store.sync(results)  # the other process's audit, if it stored one while this one waited
        if told and key in set(store.read_audits(results)["audit_key"]):
            yield False
        else:
            yield True
    finally:
        lease.release()


def measure(
    audit: Audit, test: Split, audited: Split, key: str, method: dedup.Method, workers: int,
    data_dir: Path | None, results: Path,
) -> dict:  # fmt: skip
    """One audit searched and stored."""
    started = time.perf_counter()
    same = test.dataset == audited.dataset and test.name == audited.name
    checkpoint = results / "dedup" / f"{key}.pt"  # an interrupted audit continues from its last block
    pairs, bad, seen, test_unreadable = dedup.audit(
        test, audited, method, workers, same_split=same,
        progress=lambda blocks, total: track(blocks, total, f"dedup {audit}"), checkpoint=checkpoint,
    )  # fmt: skip
    seconds = time.perf_counter() - started
    test_names, audited_names = image_names(test), image_names(audited)
    frame = pd.DataFrame(
        [
            [key, p.test, test_names[p.test], p.duplicate, audited_names[p.duplicate], p.distance, p.exact]
            for p in pairs
        ],
        columns=store.PAIR_COLUMNS,
    )
    row = {
        "audit_key": key,
        "created_at": datetime.now(UTC).replace(tzinfo=None),
        "test_dataset": test.dataset,
        "test_split": test.name,
        "test_source": test.source,
        "test_fingerprint": test.fingerprint,
        "n_test": len(test),
        "audited_dataset": audited.dataset,
        "audited_split": audited.name,
        "audited_source": audited.source,
        "audited_fingerprint": audited.fingerprint,
        "n_audited": seen,
        "method": method.describe(),
        "threshold": method.threshold,
        "n_pairs": len(pairs),
        "n_test_flagged": len({p.test for p in pairs}),
        "skipped_images": len(bad),
        "seconds": seconds,
        "images_per_second": (len(test) + len(audited)) / seconds if seconds > 0 else None,
        "data_dir": str(data_dir.resolve()) if data_dir else None,
        "device_name": device_name(torch.device("cpu")),
        **environment(),
        "notes": {"skipped": [why for _, why in bad][:20], "test_unreadable": test_unreadable} if bad else {},
    }
    if bad:
        log.warning("dedup %s: skipped %d unreadable image(s), first: %s", audit, len(bad), bad[0][1])
    # its shard first; the checkpoint goes only once the audit is on disk; then the database
    recorder.record_audit(results, row, frame.to_dict("records"), lambda: checkpoint.unlink(missing_ok=True))
    return {**row, "pairs": frame}

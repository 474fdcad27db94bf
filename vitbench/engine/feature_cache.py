"""The feature cache (`<results>/cache/features/`): one entry per split of a model's frozen
representations (or logits), keyed on everything that changes them, checked before it is used;
what the run reads and grows (engine/features.py) and what a dry run looks in (execution/estimate.py)."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np

from vitbench.datasets import Split
from vitbench.engine.distributed import broadcast, world
from vitbench.engine.inference import Outputs
from vitbench.files.atomic import write_atomic
from vitbench.host.devices import Runtime
from vitbench.provenance import ANY, canonical_json, keyed_hparams, sha256_text
from vitbench.store.shards import quarantine

# 3: kept indices and skipped corrupt images; 4: one entry per split that grows with what each protocol
# needs (few-shot's drawn images, then k-NN's rest), with the positions found unreadable
FEATURES_VERSION = "features/4"


class FeatureCache:
    """Representations on disk (`<results>/cache/features/`), keyed on everything that changes
    them: the weights fingerprint, the model and resolution, the dataset, its source and
    fingerprint, the split, the preprocessing and the representation. One entry per split, shared
    by every protocol, shot count, seed and λ; it may hold part of the split (the images few-shot
    drew) and grows with what a later protocol needs."""

    def __init__(self, root: Path):
        self.root = root

    @staticmethod
    def key(**parts: object) -> str:
        return sha256_text(canonical_json({"version": FEATURES_VERSION, **parts}))

    def path(self, key: str) -> Path:
        return self.root / f"{key}.npz"

    def load(self, key: str, split: Split, width: int | None = None) -> Outputs | None:
        """The cached outputs of `split`, or None (recompute) when absent, or when they do not fit
        the split they claim to be (rows, labels, finite values, and `width` where it is known):
        such a file is quarantined, never used."""
        path = self.path(key)
        try:
            with np.load(path, allow_pickle=False) as f:
                skipped = [str(s) for s in f["skipped"]]
                seconds = f["seconds"] if "seconds" in f.files else np.empty(0, np.float64)
                found = Outputs(f["features"], f["labels"], f["indices"], skipped, f["unreadable"], seconds)
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
            found = None  # damaged (a full disk, a killed write)
        problem = "unreadable" if found is None else _mismatch(found, split, width)
        if problem:
            self.discard(key, problem)
            return None
        return found

    def shared_load(self, key: str, split: Split, width: int | None = None) -> Outputs | None:
        """`load` by one process, its outputs sent to every process of a torchrun world: all of
        them then agree on what is still to extract (another node need not see this folder)."""
        w = world()
        return broadcast(self.load(key, split, width) if w.is_main else None, w)

    def discard(self, key: str, problem: str) -> None:
        if world().is_main and self.path(key).exists():  # under torchrun, one process moves it aside
            quarantine(self.path(key), f"cached outputs {problem}; recomputing", results=self.root.parent.parent)

    def save(self, key: str, found: Outputs) -> None:
        if not world().is_main:  # under torchrun every process holds the same outputs; one writes them
            return
        skipped = np.asarray(found.skipped, dtype=str)

        def write(tmp: Path) -> None:
            with open(tmp, "wb") as f:  # a file object: np.savez would add ".npz" to a name
                np.savez(
                    f, features=found.values, labels=found.labels, indices=found.indices, skipped=skipped,
                    unreadable=found.unreadable, seconds=found.seconds,
                )  # fmt: skip

        write_atomic(self.path(key), write)


def _mismatch(found: Outputs, split: Split, width: int | None) -> str | None:
    """What makes cached outputs unusable for `split`, or None."""
    values, indices = found.values, found.indices
    if values.ndim != 2 or not len(values) == len(found.labels) == len(indices):
        return f"of shape {values.shape} for {len(found.labels)} labels"
    if width is not None and values.shape[1] != width:
        return f"{values.shape[1]} wide, {width} expected"
    if len(indices) and (indices.min() < 0 or indices.max() >= len(split)):
        return "index images the split does not have"
    if len(found.unreadable) and (found.unreadable.min() < 0 or found.unreadable.max() >= len(split)):
        return "name unreadable images the split does not have"
    if not np.array_equal(found.labels, split.labels[indices]):
        return "labelled unlike the split"
    # finite, checked 65,536 rows at a time: a whole (N, D) mask was 38 MB at 200,000 ViT-Ti features
    if not all(np.isfinite(values[i : i + 65536]).all() for i in range(0, len(values), 65536)):
        return "not finite"
    if len(found.seconds) not in (0, len(indices)):
        return f"with {len(found.seconds)} extraction times for {len(indices)} rows"
    return None


def cache_key(group, split_name: str, runtime: Runtime, cache_parts: dict) -> tuple[FeatureCache, str]:
    split, spec = group.splits[split_name], group.specs[0]
    cache = FeatureCache(runtime.cache_root / "features")
    key = cache.key(
        model=group.model.name,
        arch=group.model.arch,
        weights=spec.weights_sha256,
        res=group.res,
        dataset=group.dataset.name,
        source=split.source,
        fingerprint=split.fingerprint,
        split=split_name,
        preprocessing=spec.hparams["preprocessing"],
        gelu=spec.hparams["gelu"],
        init_seed=spec.hparams.get("init_seed"),
        skip_corrupt=runtime.skip_corrupt,
        **cache_parts,
    )
    return cache, key


def feature_parts(recorded: dict) -> dict:
    """What of a run's hparams keys its features' cache entry (defaults left out, as entries were first keyed)."""
    kept = ("representation", "precision", "decoder", "backend_code")
    return keyed_hparams(ANY, {k: v for k, v in recorded.items() if k in kept})


def cache_entry(group, split_name: str) -> Path:
    """The file of the cache entry `frozen_features` reads and grows for this group's split: what a
    dry run looks in (what it holds is not extracted again) and shares between protocols."""
    cache, key = cache_key(group, split_name, group.runtime, feature_parts(group.specs[0].hparams))
    return cache.path(key)


def held_images(path: Path) -> int:
    """How many images a cache entry holds (0: none, or not readable: the run extracts them again)."""
    try:
        with np.load(path, allow_pickle=False) as f:
            return len(f["indices"])
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
        return 0

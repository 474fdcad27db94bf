"""Frozen representations (or logits) of a split, computed once and cached on disk, and the model
behind them built only when something is not cached."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from vitbench.datasets import Split
from vitbench.engine import device_data, freed_memory, stopping
from vitbench.engine.distributed import world
from vitbench.engine.feature_cache import cache_key, feature_parts
from vitbench.engine.inference import Outputs, run_over_parts
from vitbench.errors import UserError
from vitbench.host.devices import Clock, Runtime, autocast
from vitbench.weights import build_model

log = logging.getLogger("vitbench")

IN21K_WITHOUT_PRE_LOGITS = (
    "ImageNet-21k ViT weights without the pre_logits layer: the representation is LN(CLS), not the paper's "
    "tanh(Dense(LN(CLS))) (timm's in21k tags drop it; the original .npz checkpoints keep it)"
)
# a pass over more images than this is saved as it goes: an interrupted one resumes from its last chunk
CHUNK_IMAGES = 4096


class LazyModel:
    """The model, built (and compiled, if asked) on first use only: a fully cached group never builds it."""

    def __init__(self, build: Callable[[], torch.nn.Module], compile: bool = False):
        self.build, self.compile = build, compile
        self.model: torch.nn.Module | None = None

    def __call__(self) -> torch.nn.Module:
        if self.model is None:
            self.model = self.build()
            if self.compile:
                self.model = torch.compile(self.model)  # type: ignore[assignment]
        assert self.model is not None
        return self.model


def _computed(group, split_name: str, runtime: Runtime, clock: Clock, fn, model: LazyModel, chunks: list[np.ndarray]):
    """The outputs over the split's images at the positions of each of `chunks`, chunk by chunk
    (indexed by split position), from one pass over them all: one DataLoader for the split, its
    workers started once, however many chunks the cache keeps. Under torchrun each process
    extracts a contiguous share of each chunk, none twice and none padded in, and every process gets
    all of a chunk, in split order: the same outputs as one process computes (an image's features
    do not depend on its batch, tests/test_reproducibility.py)."""
    split, w = group.splits[split_name], world()
    shares = [np.array_split(np.sort(chunk), w.size)[w.rank] for chunk in chunks]
    mine = np.concatenate(shares) if shares else np.empty(0, np.int64)
    parts = _passes(group, split.subset(split_name, mine), split_name, runtime, fn, model,
                    np.cumsum([len(share) for share in shares]))  # fmt: skip
    for _ in chunks:
        with clock:  # the chunk's share of the pass: device-seconds, each row's part of it kept
            before = clock.seconds
            found = next(parts)
        found.seconds = np.full(len(found.indices), (clock.seconds - before) / max(len(found.indices), 1))
        found.indices, found.unreadable = mine[found.indices], mine[found.unreadable]  # subset -> split positions
        if w.size > 1:
            gathered: list = [None] * w.size
            torch.distributed.all_gather_object(gathered, found)
            found = functools.reduce(_merge, gathered)
        yield found


def _passes(group, part: Split, split_name: str, runtime: Runtime, fn, model, ends):
    """The model's outputs over `part` in one pass, handed out at each of `ends` (inference.run_over_parts)."""
    if not len(part):  # a process whose share is empty (more processes than images)
        yield from (_nothing(part) for _ in ends)
        return
    yield from run_over_parts(
        fn,
        model(),
        part,
        group.preprocessing,
        runtime.device,
        runtime.extraction_batch,
        runtime.workers,
        f"{group.model.name} · {group.dataset.name} {split_name}",
        ends,
        runtime.skip_corrupt,
        runtime.input_pipeline,
    )


def _nothing(split: Split) -> Outputs:
    return Outputs(np.empty((0, 0), np.float32), split.labels[:0], np.empty(0, np.int64))


def _extend(group, split_name: str, runtime: Runtime, clock: Clock, fn, model, cache_key, have: Outputs, positions):
    """`have` and the outputs of the split `positions` it lacks (neither extracted nor known to be
    unreadable), computed a chunk at a time, the entry saved after each: an interrupted pass
    resumes from its last finished chunk. `cache_key`: (the cache, the entry's key). Returns
    (outputs, whether any were computed)."""
    cache, key = cache_key
    missing = np.setdiff1d(positions, np.concatenate([have.indices, have.unreadable]))
    room: _Room | None = None  # where a pass's chunks are written in place
    for new in _computed(group, split_name, runtime, clock, fn, model, _chunks(missing, len(have.indices))):
        check_features(new.values, group, split_name)  # before it is cached or solved on
        have, room = _appended(have, new, len(have.indices) + len(missing), room)
        cache.save(key, have)
        if world().size == 1:  # under torchrun every rank would have to agree first: a training step's way
            stopping.reached(f"extracting {group.dataset.name} {split_name} ({len(have.indices):,} images kept)")
    if len(missing):
        freed_memory.give_back()  # what the pass's batches left free in the heap: the solve comes next
    return have, bool(len(missing))


def checked_batch(out, images: int, model: str) -> torch.Tensor:
    """A backend's features for a batch: a (batch, width) tensor, or one line naming the model (a
    plugin's list or a 3-D tensor was an AttributeError or a shape error from the ridge solve)."""
    if not isinstance(out, torch.Tensor):
        raise UserError(f"{model}: its backend's features() returned a {type(out).__name__}; expected a tensor")
    if out.ndim != 2 or out.shape[0] != images:
        raise UserError(
            f"{model}: its backend's features() returned shape {tuple(out.shape)} for {images} images; "
            f"expected ({images}, width)"
        )
    return out


def check_features(values: np.ndarray, group, split_name: str) -> None:
    """A number that cannot be right is never stored: features with a NaN or an infinity (one is
    enough to make a solve's every prediction chance), or of zero width, stop the run in one line,
    before they are cached or solved on."""
    weights = "random init" if group.weights.random else group.weights.path
    where = f"{group.model.name} ({weights}) on {group.dataset.name} {split_name}"
    if values.ndim != 2 or (len(values) and values.shape[1] == 0):
        raise UserError(
            f"{where}: the backbone's features are {values.shape[1:]} wide, expected one value or more; nothing stored"
        )
    bad = ~np.isfinite(values).all(axis=1) if len(values) else np.zeros(0, bool)
    if bad.any():
        raise UserError(
            f"{where}: {int(bad.sum()):,} of {len(values):,} images have non-finite features (NaN or inf), "
            f"the first at image {int(np.flatnonzero(bad)[0])}; nothing stored (diverged weights, or --precision "
            f"overflowing: try fp32)"
        )


def _chunks(missing: np.ndarray, held: int) -> list[np.ndarray]:
    """`missing` in the chunks an entry is saved after: CHUNK_IMAGES, or a quarter of what the
    entry will hold by then where that is more (rewriting it stays linear in its size)."""
    chunks, done = [], 0
    while done < len(missing):
        size = max(CHUNK_IMAGES, held // 4)
        chunks.append(missing[done : done + size])
        held += len(chunks[-1])
        done += size
    return chunks


def outputs_over(
    group,
    split_name: str,
    runtime: Runtime,
    clock: Clock,
    cache_parts: dict,
    fn,
    model: LazyModel,
    distrust: str | int | None = None,
):
    """The model's outputs over one whole split of a protocol group: what the cache entry holds
    (checked against the split), the rest computed now (timed on `clock`) and added to it.
    `distrust`: the width the outputs must have, or why the cached entry is not to be used (it is
    quarantined). Returns (outputs, how many images went through the model now)."""
    split = group.splits[split_name]
    cache, key = cache_key(group, split_name, runtime, cache_parts)
    if isinstance(distrust, str):
        cache.discard(key, distrust)
    have = (None if isinstance(distrust, str) else cache.shared_load(key, split, distrust)) or _nothing(split)
    found, _ = _extend(group, split_name, runtime, clock, fn, model, (cache, key), have, np.arange(len(split)))
    if not len(found.indices):
        raise UserError(f"{split.dataset} {split.name}: no readable images")
    return found, len(found.indices) - len(have.indices)


def sampled_outputs(group, split_name: str, runtime: Runtime, clock: Clock, cache_parts: dict, fn, model, wanted):
    """The outputs of the images a few-shot plan draws: `wanted(present)` gives the split positions
    the runs sample when the images outside the boolean mask `present` are unreadable (None: all
    readable). What the split's cache entry lacks of them is extracted and added to it, an
    unreadable one (--skip-corrupt) replaced by the next of its permutation until every wanted
    image was read. Returns (outputs, how many images went through the model now): the entry, which
    holds the rows a full pass would give the sampler. tests/test_fewshot.py compares the two on
    real data."""
    split = group.splits[split_name]
    cache, key = cache_key(group, split_name, runtime, cache_parts)
    have = cache.shared_load(key, split) or _nothing(split)
    held, more = len(have.indices), True
    while more:
        unreadable = np.zeros(len(split), dtype=bool)
        unreadable[have.unreadable] = True
        want = wanted(~unreadable if unreadable.any() else None)
        have, more = _extend(group, split_name, runtime, clock, fn, model, (cache, key), have, want)
    return have, len(have.indices) - held


@dataclass
class _Room:
    """Arrays sized once for every row a pass can add to what is held: the outputs so far are
    views of their first rows."""

    values: np.ndarray
    labels: np.ndarray
    indices: np.ndarray
    seconds: np.ndarray
    held: int = 0  # the rows written

    @classmethod
    def around(cls, have: Outputs, new: Outputs, rows: int) -> _Room:
        width, dtype = new.values.shape[1], new.values.dtype
        room = cls(np.empty((rows, width), dtype), np.empty(rows, new.labels.dtype), np.empty(rows, np.int64),
                   np.empty(rows, np.float64))  # fmt: skip
        if len(have.indices):  # (an empty one is (0, 0) wide)
            room.write(have)
        return room

    def write(self, part: Outputs) -> None:
        end = self.held + len(part.indices)
        self.values[self.held : end], self.labels[self.held : end] = part.values, part.labels
        self.indices[self.held : end], self.seconds[self.held : end] = part.indices, part.seconds
        self.held = end

    def outputs(self, skipped: list[str], unreadable: np.ndarray) -> Outputs:
        n = self.held
        return Outputs(self.values[:n], self.labels[:n], self.indices[:n], skipped, unreadable, self.seconds[:n])


def _appended(have: Outputs, new: Outputs, rows: int, room: _Room | None) -> tuple[Outputs, _Room | None]:
    """`have` and a pass's next chunk `new` as one, in split order, and the room they are held in.
    A chunk that comes after all of `have` (a pass's, always) is written into `room`, made on the
    first chunk for `rows` rows (what is held, and every image still missing): the last chunk of a
    200,000-image pass is no longer a copy of every feature before it (concatenating held them
    twice: issue 89, item 10). Anything else is merged (_merge) and the room given up."""
    kept = room is not None and room.held == len(have.indices)  # `have` is the room's
    if len(new.indices):
        wide = not len(have.indices) or have.values.shape[1:] == new.values.shape[1:]
        fits = wide and len(have.indices) + len(new.indices) <= rows
        if not (fits and _timed(have, new) and _follows(have, new)):
            return _merge(have, new), None
        room = room if kept else _Room.around(have, new, rows)
        room.write(new)
    elif not kept:  # unreadable images only, and no room yet
        return _merge(have, new), None
    assert room is not None
    unreadable = np.union1d(have.unreadable, new.unreadable).astype(np.int64)
    return room.outputs(have.skipped + new.skipped, unreadable), room


def _timed(a: Outputs, b: Outputs) -> bool:
    """Whether both know each row's device-seconds (a cache entry from before they were kept does not)."""
    return len(a.seconds) == len(a.indices) and len(b.seconds) == len(b.indices)


def _follows(a: Outputs, b: Outputs) -> bool:
    """Whether `b`'s rows come after all of `a`'s, in split order: a pass's next chunk."""
    return (not len(a.indices) or not len(b.indices) or a.indices[-1] < b.indices[0]) and bool(
        np.all(np.diff(b.indices) > 0)
    )


def _merge(a: Outputs, b: Outputs) -> Outputs:
    """Two passes' outputs as one, in split order."""
    unreadable = np.union1d(a.unreadable, b.unreadable).astype(np.int64)
    if not len(a.indices) or not len(b.indices):
        kept = b if len(b.indices) else a
        return Outputs(kept.values, kept.labels, kept.indices, a.skipped + b.skipped, unreadable, kept.seconds)
    timed = _timed(a, b)  # else unknown for all
    # a pass's next chunk, in split order after what is held: one copy and no gather (3x the features at the end)
    if _follows(a, b):
        return Outputs(
            np.concatenate([a.values, b.values]), np.concatenate([a.labels, b.labels]),
            np.concatenate([a.indices, b.indices]), a.skipped + b.skipped, unreadable,
            np.concatenate([a.seconds, b.seconds]) if timed else np.empty(0, np.float64),
        )  # fmt: skip
    order = np.argsort(np.concatenate([a.indices, b.indices]), kind="stable")
    return Outputs(
        np.concatenate([a.values, b.values])[order],
        np.concatenate([a.labels, b.labels])[order],
        np.concatenate([a.indices, b.indices])[order],
        a.skipped + b.skipped,
        unreadable,
        np.concatenate([a.seconds, b.seconds])[order] if timed else np.empty(0, np.float64),
    )


def group_model(group, keep_head: bool, compile: bool = False) -> LazyModel:
    """The group's backbone with its weights, built on first use (`keep_head`: the checkpoint's own classifier)."""
    gelu = group.specs[0].hparams["gelu"]
    # a kept classifier has the outputs it was trained with (ImageNet's 1000 for the robustness sets)
    classes = group.dataset.head_size if keep_head else group.dataset.num_classes
    return LazyModel(lambda: build_model(group.model, classes, group.res, group.weights.path, gelu, keep_head), compile)


def representation_hparams(group, runtime: Runtime) -> dict:
    """What a frozen-feature protocol records about its features (and keys its runs on): the
    representation (LN(CLS), or tanh(Dense(LN(CLS))) where the weights carry `pre_logits`) and
    the extraction precision when it is not fp32 (fp32 stays out of the key): bf16 autocast on a
    GPU unless --precision fp32, fp32 on a CPU."""
    assert group.model.backend is not None
    pre_logits = group.weights.pre_logits
    found = {"representation": group.model.backend.representation_name(pre_logits)}
    if not pre_logits and group.model.backend.in21k_without_pre_logits and group.weights.in21k:
        # timm's in21k tags drop the upstream pre_logits layer: the paper's representation is not there
        found["representation_note"] = IN21K_WITHOUT_PRE_LOGITS
        log.warning("%s: %s", group.weights, IN21K_WITHOUT_PRE_LOGITS)
    if runtime.precision == "bf16":
        found["precision"] = "bf16"
    # nvjpeg's pixels are not the reference's: their own runs, and their own cache entries
    return found | device_data.decoder_hparams(
        runtime.input_pipeline, runtime.device, group.preprocessing, [*group.splits.values()]
    )


@dataclass
class FrozenFeatures:
    """A group's frozen representations of its train and test splits."""

    train: Outputs
    test: Outputs
    # images that went through the model now (0 from the cache): a later protocol that grows an entry
    # counts only what it added, so a command's runs count each image once in their FLOPs
    images: int
    seconds: float  # device-seconds the extraction took (0 from the cache)

    @property
    def extracted(self) -> bool:
        """Computed now, not (only) read from the cache."""
        return self.images > 0

    @property
    def skipped(self) -> list[str]:
        return self.train.skipped + self.test.skipped

    def cost(self, train_rows: np.ndarray | None = None) -> tuple[float, int] | None:
        """(device-seconds, images) of extracting what a run reads — the train rows it uses (all
        where None) and the test split — at the rate their passes ran, whether this command
        extracted them or read them from the cache: a run's cost that does not depend on which run
        sharing the extraction came first. None where a cache entry kept no times (written before)."""
        train, test = self.train.seconds, self.test.seconds
        if len(train) != len(self.train.indices) or len(test) != len(self.test.indices):
            return None
        used = train if train_rows is None else train[train_rows]
        return float(used.sum() + test.sum()), len(used) + len(test)


def frozen_features(group, runtime: Runtime, split_names: tuple[str, ...], wanted=None) -> FrozenFeatures:
    """The representation of every image of the two splits, from the cache where it is there: the
    few-shot, k-NN and linear-probe protocols read the same cache entries (one extraction serves
    all three), keyed on what the runs' hparams record about the features. With `wanted` (see
    `sampled_outputs`), only the train images the runs draw are extracted."""
    assert group.model.backend is not None
    backend = group.model.backend
    recorded = group.specs[0].hparams
    precision, device = recorded["precision"], runtime.device
    # the cache entry's key: what the features depend on, defaults left out as entries were first keyed
    parts = feature_parts(recorded)

    def features(m: torch.nn.Module, images: torch.Tensor) -> torch.Tensor:
        with autocast(device, precision):
            out = backend.features(m, images)
        return checked_batch(out, len(images), group.model.name)

    clock = Clock(device, world().size)  # device-seconds: every process of a torchrun world extracts
    model = group_model(group, keep_head=False, compile=runtime.compile)
    train_split, test_split = split_names  # (a DatasetSpec's transfer_splits: learned from, scored on)

    def train_outputs(distrust: str | None = None):
        if wanted is None:
            return outputs_over(group, train_split, runtime, clock, parts, features, model, distrust)
        if distrust:
            cache, key = cache_key(group, train_split, runtime, parts)
            cache.discard(key, distrust)
        return sampled_outputs(group, train_split, runtime, clock, parts, features, model, wanted)

    train, train_new = train_outputs()
    test, test_new = outputs_over(group, test_split, runtime, clock, parts, features, model)
    if train.values.shape[1] != test.values.shape[1]:  # one model, one width: a cached file is not its features
        problem = f"{train.values.shape[1]} wide for train, {test.values.shape[1]} for test"
        if not train_new:
            train, train_new = train_outputs(problem)
        if not test_new:
            test, test_new = outputs_over(group, test_split, runtime, clock, parts, features, model, problem)
    return FrozenFeatures(train, test, train_new + test_new, clock.seconds)

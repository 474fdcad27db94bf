"""A Split as a torch Dataset: the input pipeline's view of a split (torch loads only here, where
images are read, not where datasets are listed)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, cast

import torch

from vitbench.datasets.base import CorruptImage, Split


class BatchTransform(Protocol):
    """A transform that finishes a whole batch at once (preprocessing's TensorFlow-style resize)."""

    def pixels(self, image) -> torch.Tensor: ...

    def batch(self, images: list[torch.Tensor]) -> torch.Tensor: ...


class TransformedSplit(torch.utils.data.Dataset):
    """A Split with a preprocessing transform applied per item, in the DataLoader worker.

    A corrupt image does not raise inside the worker (PyTorch would wrap it in a traceback): the
    item comes back as (None, label, "path: reason") and `collate` sets it aside for the caller,
    who stops with a one-line error or, with --skip-corrupt, counts it."""

    def __init__(self, split: Split, transform: Callable, batched: bool = False):
        """`batched`: the transform has `pixels` (per image, in `__getitem__`) and `batch` (per
        batch, in `collate_batch`), as the TensorFlow-style resize does: a batch of one size is
        resized in one call."""
        self.split, self.transform = split, transform
        self.batch_transform = cast(BatchTransform, transform) if batched else None

    def __len__(self) -> int:
        return len(self.split)

    def __getitem__(self, index: int):
        label = int(self.split.labels[index])
        try:
            image = self.split.image(index)
            pixels = self.batch_transform.pixels(image) if self.batch_transform else self.transform(image)
            return pixels, label, index, None
        except CorruptImage as e:
            return None, label, index, str(e)

    @staticmethod
    def collate(batch):
        good, bad = _good_and_bad(batch)
        if not good:
            return None, None, torch.empty(0, dtype=torch.long), bad
        # default_collate builds the batch in shared memory inside a worker: no extra copy on the way back
        images, labels, indices = torch.utils.data.default_collate([b[:3] for b in good])
        return images, labels, indices, bad

    def collate_batch(self, batch):
        """`collate`, the transform finished on the whole batch where it is `batched`."""
        if self.batch_transform is None:
            return self.collate(batch)
        good, bad = _good_and_bad(batch)
        if not good:
            return None, None, torch.empty(0, dtype=torch.long), bad
        labels, indices = torch.utils.data.default_collate([b[1:3] for b in good])
        return self.batch_transform.batch([b[0] for b in good]), labels, indices, bad


def _good_and_bad(batch: list[tuple]) -> tuple[list[tuple], list[tuple[int, str]]]:
    """The items that were read, and (index, message) of those that were not."""
    return [b for b in batch if b[0] is not None], [(b[2], b[3]) for b in batch if b[0] is None]

"""A Split as a torch Dataset: the input pipeline's view of a split (torch loads only here, where
images are read, not where datasets are listed)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from vitbench.datasets.base import CorruptImage, Split


class TransformedSplit(torch.utils.data.Dataset):
    """A Split with a preprocessing transform applied per item, in the DataLoader worker.

    A corrupt image does not raise inside the worker (PyTorch would wrap it in a traceback): the
    item comes back as (None, label, "path: reason") and `collate` sets it aside for the caller,
    who stops with a one-line error or, with --skip-corrupt, counts it."""

    def __init__(self, split: Split, transform: Callable):
        self.split, self.transform = split, transform

    def __len__(self) -> int:
        return len(self.split)

    def __getitem__(self, index: int):
        label = int(self.split.labels[index])
        try:
            return self.transform(self.split.image(index)), label, index, None
        except CorruptImage as e:
            return None, label, index, str(e)

    @staticmethod
    def collate(batch):
        good = [b for b in batch if b[0] is not None]
        bad = [(b[2], b[3]) for b in batch if b[0] is None]
        if not good:
            return None, None, torch.empty(0, dtype=torch.long), bad
        # default_collate builds the batch in shared memory inside a worker: no extra copy on the way back
        images, labels, indices = torch.utils.data.default_collate([b[:3] for b in good])
        return images, labels, indices, bad

"""CIFAR-10/100: the original python pickles, read with a restricted unpickler, held in memory as a
uint8 tensor (N, 32, 32, 3)."""

from __future__ import annotations

import io
import pickle
from pathlib import Path

import numpy as np

from vitbench.datasets.base import Split, require
from vitbench.errors import UserError, one_line
from vitbench.files.atomic import read_regular
from vitbench.provenance import fingerprint_files


class _CifarUnpickler(pickle.Unpickler):
    """Admit only what CIFAR batches contain (dicts, lists, bytes, numpy arrays): a pickle can
    run arbitrary code on load, and a data directory is not a trusted place."""

    ALLOWED = {
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy.core.multiarray", "scalar"),
        ("numpy._core.multiarray", "scalar"),
        ("_codecs", "encode"),
    }

    def __init__(self, file, path: Path):
        super().__init__(file, encoding="latin1")
        self.path = path

    def find_class(self, module: str, name: str):
        if (module, name) not in self.ALLOWED:
            raise UserError(
                f"{self.path}: refusing to unpickle {module}.{name}; a CIFAR batch holds only dicts, "
                "lists, bytes and numpy arrays (is this file really a CIFAR batch?)"
            )
        if module.startswith("numpy.core") and int(np.__version__.split(".")[0]) >= 2:
            module = module.replace("numpy.core", "numpy._core", 1)  # avoid numpy 2's deprecation shim
        return super().find_class(module, name)


def read_cifar_batch(path: Path, label_key: str) -> tuple[np.ndarray, np.ndarray]:
    """(N, 32, 32, 3) uint8 images and (N,) labels from one original CIFAR pickle."""
    try:
        raw = read_regular(path)  # a FIFO under a batch's name blocked `run`, `dedup` and `doctor`
    except OSError as e:
        raise UserError(f"{path}: cannot be read ({e.strerror or e}), expected a CIFAR batch file") from None
    try:
        batch = _CifarUnpickler(io.BytesIO(raw), path).load()
        data = _integers(np.asarray(batch["data"]), path, "data", 0, 255).astype(np.uint8)
        labels = _integers(np.asarray(batch[label_key]), path, label_key, 0, None).astype(np.int64)
    except UserError:
        raise
    except (pickle.UnpicklingError, EOFError, KeyError, TypeError, ValueError, IndexError, AttributeError) as e:
        raise UserError(f"{path}: not a readable CIFAR batch ({type(e).__name__}: {one_line(e, 120)})") from None
    if data.ndim != 2 or data.shape[1] != 3072 or len(data) != len(labels):
        raise UserError(f"{path}: expected 'data' of shape (N, 3072) matching '{label_key}', got {data.shape}")
    return data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1), labels  # CHW rows -> NHWC


def _integers(values: np.ndarray, path: Path, key: str, low: int, high: int | None) -> np.ndarray:
    """`values` if they are integers within [low, high]: pixels of int64 above 255 were wrapped into
    uint8 in silence (k-NN then scored 14.50 %), and a list holding 300 was an OverflowError traceback."""
    if values.dtype.kind not in "iu":
        raise UserError(f"{path}: '{key}' holds {values.dtype} values, expected integers (uint8 pixels, int labels)")
    if values.size and (values.min() < low or (high is not None and values.max() > high)):
        span = f"from {low} to {high}" if high is not None else f"of at least {low}"
        raise UserError(f"{path}: '{key}' holds values from {values.min()} to {values.max()}, expected integers {span}")
    return values


def cifar_loader(name: str, train_files: list[str], test_file: str, label_key: str):
    def load(root: Path | None, split: str) -> Split:
        assert root is not None
        if not root.is_dir():
            raise UserError(f"missing {name} folder: {root} (expected under --data-dir, torchvision's layout)")
        if split == "train":
            # the shared subsets (and quick experiments) ship only the first batches: load what is there
            files = [root / f for f in train_files if (root / f).exists()]
            if not files:
                raise UserError(f"missing {name} train batch: {root / train_files[0]}")
        else:
            files = [require(root / test_file, f"{name} test batch")]
        parts = [read_cifar_batch(f, label_key) for f in files]
        images = np.ascontiguousarray(np.concatenate([p[0] for p in parts]))
        labels = np.concatenate([p[1] for p in parts])
        fingerprint = fingerprint_files(root, files, content=True)
        return Split(name, split, labels, "cifar-pickle", fingerprint, images=images, label_file=files[-1])

    return load

"""The paper's closed-form linear few-shot evaluation, exactly as big_vision's `fewshot_lsr`.

Frozen representations of every train and test image are extracted once and cached on disk;
each (seed, shots) then takes, per class, the first `shots` of a seeded permutation, whitens with
the train statistics, appends a bias feature of 100, and solves ridge regression onto {-1, 1}
targets in closed form (PROTOCOLS.md §3.2). Accuracy is on the full test split.
"""

from __future__ import annotations

import logging
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vitbench.errors import UserError
from vitbench.inference import Outputs
from vitbench.provenance import canonical_json, sha256_text

log = logging.getLogger("vitbench")

PROTOCOL = "fewshot"
VERSION = "fewshot-lsr/2"  # bump when a change alters the numbers (2: vit_jax pos-emb resize)
SHOTS = (1, 5, 10, 25)
SEEDS = (0, 1, 2)
DEFAULT_L2 = 2.0**10  # big_vision's l2_reg
L2_GRID = tuple(2.0**i for i in range(-10, 20))  # the older sweep: 2^-10 .. 2^19
BIAS_CONSTANT = 100.0  # "large so it's almost unregularized"
FEATURES_VERSION = "features/3"  # 3: kept indices and skipped corrupt images


def parse_l2(text: str) -> tuple[str, tuple[float, ...]]:
    """`--fewshot-l2`: a number (1024, 2^10) or `sweep` for the 2^-10..2^19 grid."""
    if text == "sweep":
        return "sweep", L2_GRID
    try:
        value = float(2.0 ** float(text[2:])) if text.startswith("2^") else float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise UserError(f"--fewshot-l2 {text}: expected a positive number (e.g. 1024 or 2^10) or 'sweep'")
    return f"{value:g}", (value,)


# --- the solve ------------------------------------------------------------------------------------


def sample_indices(labels: np.ndarray, num_classes: int, shots: int, seed: int) -> np.ndarray:
    """Per class, the first `shots` of a seeded permutation (big_vision: one permutation per class
    per seed, shared by every shot count, so the 1-shot set is inside the 5-shot set)."""
    rng = np.random.default_rng(seed)
    class_indices = [rng.permutation(np.flatnonzero(labels == c)) for c in range(num_classes)]
    return np.concatenate([idx[:shots] for idx in class_indices])


@dataclass
class RidgeSolver:
    """Closed-form ridge on whitened features, in float64.

    With N points of D' = D + 1 dims the primal form solves (XᵀX + λI) W = XᵀY when N >= D', the
    kernel form W = Xᵀ (XXᵀ + λI)⁻¹ Y otherwise (the same solution). For one λ a direct
    linear solve is fastest; for many (the sweep), big_vision's eigen-decomposition
    is computed once and each λ costs one matrix product: W = lhs · diag(1 / (eigs + λ)) · rhs.
    """

    mean: np.ndarray
    std: np.ndarray
    x: np.ndarray  # (N, D') whitened, with the bias feature
    targets: np.ndarray  # (N, K) in {-1, 1}
    eig: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None  # (eigs, lhs, rhs), for many λ

    @classmethod
    def fit(cls, x: np.ndarray, y: np.ndarray, num_classes: int, many_l2: bool = False) -> RidgeSolver:
        x = x.astype(np.float64)
        mean = x.mean(axis=0, keepdims=True)
        std = x.std(axis=0, keepdims=True) + 1e-5  # population std, as jnp.std
        solver = cls(mean, std, _with_bias((x - mean) / std), 2.0 * np.eye(num_classes)[y] - 1.0)
        if many_l2:
            solver.eig = solver._eigen()
        return solver

    def _eigen(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        x, targets = self.x, self.targets
        if x.shape[0] >= x.shape[1]:
            eigs, q = np.linalg.eigh(x.T @ x)
            return eigs, q, q.T @ (x.T @ targets)
        eigs, q = np.linalg.eigh(x @ x.T)
        return eigs, x.T @ q, q.T @ targets

    def weights(self, l2: float) -> np.ndarray:
        """(D', K) regression weights for ridge strength `l2`."""
        if self.eig is not None:
            eigs, lhs, rhs = self.eig
            return (lhs * (1.0 / (eigs + l2))[None, :]) @ rhs
        x, targets = self.x, self.targets
        if x.shape[0] >= x.shape[1]:
            gram = x.T @ x + l2 * np.eye(x.shape[1])
            return np.linalg.solve(gram, x.T @ targets)
        gram = x @ x.T + l2 * np.eye(x.shape[0])
        return x.T @ np.linalg.solve(gram, targets)

    def accuracy(self, x_test: np.ndarray, y_test: np.ndarray, l2: float) -> float:
        x = _with_bias((x_test.astype(np.float64) - self.mean) / self.std)
        return float(np.mean(np.argmax(x @ self.weights(l2), axis=1) == y_test))


def _with_bias(x: np.ndarray) -> np.ndarray:
    return np.pad(x, ((0, 0), (0, 1)), constant_values=BIAS_CONSTANT)


def fewshot_accuracies(
    train: tuple[np.ndarray, np.ndarray],
    test: tuple[np.ndarray, np.ndarray],
    num_classes: int,
    shots: int,
    seed: int,
    l2s: tuple[float, ...],
) -> tuple[dict[float, float], int]:
    """{λ: test accuracy} for one (shots, seed), and the number of train points actually used."""
    idx = sample_indices(train[1], num_classes, shots, seed)
    if len(idx) == 0:
        raise UserError("few-shot: the train split has no images")
    solver = RidgeSolver.fit(train[0][idx], train[1][idx], num_classes, many_l2=len(l2s) > 1)
    return {l2: solver.accuracy(test[0], test[1], l2) for l2 in l2s}, len(idx)


# --- representations ------------------------------------------------------------------------------


class FeatureCache:
    """Representations on disk, keyed on everything that changes them: the weights fingerprint,
    the model and resolution, the dataset, its source and fingerprint, the split, the preprocessing
    and the representation. Shared by every shot count, seed and λ."""

    def __init__(self, root: Path):
        self.root = root

    @staticmethod
    def key(**parts: object) -> str:
        return sha256_text(canonical_json({"version": FEATURES_VERSION, **parts}))

    def path(self, key: str) -> Path:
        return self.root / f"{key}.npz"

    def load(self, key: str) -> Outputs | None:
        try:
            with np.load(self.path(key)) as f:
                return Outputs(f["features"], f["labels"], f["indices"], [str(s) for s in f["skipped"]])
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
            return None  # absent or damaged (a full disk, a killed write): recompute

    def save(self, key: str, found: Outputs) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.root / f".{key}.{os.getpid()}.tmp.npz"
        skipped = np.asarray(found.skipped, dtype=str)
        np.savez(tmp, features=found.values, labels=found.labels, indices=found.indices, skipped=skipped)
        os.replace(tmp, self.path(key))

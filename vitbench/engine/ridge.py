"""The few-shot linear solve, exactly as big_vision's `fewshot_lsr`: per class the first `shots`
of a seeded permutation, whitening with the train statistics, a bias feature of 100, and ridge
regression onto {-1, 1} targets in closed form (docs/protocols.md, "Few-shot")."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from vitbench.errors import UserError
from vitbench.store.predictions import TOP, top_classes

BIAS_CONSTANT = 100.0  # "large so it's almost unregularized"


def sample_indices(
    labels: np.ndarray, num_classes: int, shots: int, seed: int, present: np.ndarray | None = None
) -> np.ndarray:
    """Per class, the first `shots` of a seeded permutation of its images (big_vision: one
    permutation per class per seed, shared by every shot count, so the 1-shot set is inside the
    5-shot set). `present`: a boolean mask over the split of the images that can be used (None:
    all); one left out (unreadable, with --skip-corrupt) is replaced by the next of its permutation.
    Each class's images are found by one stable sort, not a pass over the split per class (21,843
    passes over ImageNet-21k's 14M labels); in ascending order as before, so the draws are the same."""
    labels = np.asarray(labels)
    rng = np.random.default_rng(seed)
    by_class = np.argsort(labels, kind="stable")
    bounds = np.searchsorted(labels[by_class], np.arange(num_classes + 1), side="left")
    chosen = []
    for c in range(num_classes):
        order = rng.permutation(by_class[bounds[c] : bounds[c + 1]])
        chosen.append((order if present is None else order[present[order]])[:shots])
    return np.concatenate(chosen) if chosen else np.zeros(0, dtype=np.int64)


Array = np.ndarray | torch.Tensor


def _on(a: Array, device: torch.device | None, dtype: torch.dtype | None = None) -> torch.Tensor:
    return torch.as_tensor(a, device=device, dtype=dtype)


SCORED_VALUES = 2**21  # test rows x classes scored at once (16 MB of float64): memory bounded at any class count


@dataclass
class RidgeSolver:
    """Closed-form ridge on whitened features, in float64, on whatever device the features are on
    (an accelerator solves CIFAR-100's 2,500 x 769 system in milliseconds).

    With N points of D' = D + 1 dims the primal form solves (XᵀX + λI) W = XᵀY when N >= D', the
    kernel form W = Xᵀ (XXᵀ + λI)⁻¹ Y otherwise (the same solution). For one λ a direct
    linear solve is fastest; for many (the sweep), big_vision's eigen-decomposition
    is computed once and each λ costs one matrix product: W = lhs · diag(1 / (eigs + λ)) · rhs.

    Memory is bounded by the work, not by the class count K squared: the {-1, 1} targets Y (N x K)
    are never made in the primal form, where XᵀY is summed per class (K x D'), and only in the kernel
    form, where N < D'; test rows are scored SCORED_VALUES at a time. (Y as rows of a K x K identity
    took 4.7 GB for 18 images of ImageNet-21k's 21,843 classes.)
    """

    mean: torch.Tensor
    std: torch.Tensor
    x: torch.Tensor  # (N, D') whitened, with the bias feature
    targets: torch.Tensor  # XᵀY (D', K) in the primal form (N >= D'), Y (N, K) in {-1, 1} in the kernel form
    eig: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None  # (eigs, lhs, rhs), for many λ

    @property
    def primal(self) -> bool:
        return self.x.shape[0] >= self.x.shape[1]

    @classmethod
    def fit(cls, x: Array, y: Array, num_classes: int, many_l2: bool = False) -> RidgeSolver:
        x64 = _on(x, None, torch.float64)  # stays on the features' device
        labels = _on(y, x64.device, torch.long)
        mean = x64.mean(dim=0, keepdim=True)
        std = x64.std(dim=0, keepdim=True, unbiased=False) + 1e-5  # population std, as jnp.std
        whitened = _with_bias((x64 - mean) / std)
        solver = cls(mean, std, whitened, _targets(whitened, labels, num_classes))
        if many_l2:
            solver.eig = solver._eigen()
        return solver

    def _eigen(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x, targets = self.x, self.targets
        if self.primal:
            eigs, q = torch.linalg.eigh(x.T @ x)
            return eigs, q, q.T @ targets
        eigs, q = torch.linalg.eigh(x @ x.T)
        return eigs, x.T @ q, q.T @ targets

    def weights(self, l2: float) -> torch.Tensor:
        """(D', K) regression weights for ridge strength `l2`."""
        if self.eig is not None:
            eigs, lhs, rhs = self.eig
            return (lhs * (1.0 / (eigs + l2))[None, :]) @ rhs
        x, targets = self.x, self.targets
        eye = torch.eye(min(x.shape), dtype=x.dtype, device=x.device)
        if self.primal:
            return torch.linalg.solve(x.T @ x + l2 * eye, targets)
        return x.T @ torch.linalg.solve(x @ x.T + l2 * eye, targets)

    def scores(self, x_test: Array, l2: float) -> torch.Tensor:
        """(N, K) regression outputs for the test features: the prediction is their argmax."""
        return self._scored(_on(x_test, self.x.device, torch.float64), self.weights(l2))

    def _scored(self, x_test: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        return _with_bias((x_test.to(torch.float64) - self.mean) / self.std) @ weights

    def accuracy(self, x_test: Array, y_test: Array, l2: float) -> float:
        return self.evaluate(x_test, y_test, (l2,))[0][l2]

    def evaluate(
        self, x_test: Array, y_test: Array, l2s: tuple[float, ...], top: int = 0
    ) -> tuple[dict[float, float], np.ndarray | None]:
        """{λ: test accuracy}, and where `top` > 0 the first λ's `top` best classes of each test image
        (best first, ties to the lower class): scored SCORED_VALUES at a time, never all N x K."""
        features = _on(x_test, self.x.device)
        labels = _on(y_test, self.x.device, torch.long)
        accs: dict[float, float] = {}
        # made before the chunks are scored: a small array kept from each chunk, between the freed
        # chunks on glibc's heap, kept them from being returned (20,000 rows of 21,843 classes: 3.4 GB)
        best = np.zeros((len(features), min(top, self.targets.shape[-1])), dtype=np.int64) if top else None
        for i, l2 in enumerate(l2s):  # one λ's weights (D' x K) at a time
            weights = self.weights(l2)
            rows = max(1, SCORED_VALUES // max(weights.shape[1], 1))
            correct = 0
            for start in range(0, len(features), rows):
                scored = self._scored(features[start : start + rows], weights)
                correct += int((torch.argmax(scored, dim=1) == labels[start : start + rows]).sum())
                if best is not None and i == 0:  # ranked in float32, as the stored predictions always were
                    best[start : start + rows] = top_classes(scored.float().cpu().numpy(), top)
            accs[l2] = correct / len(features) if len(features) else float("nan")
        return accs, best


def _targets(x: torch.Tensor, labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """The regression's targets, Y in {-1, 1} (N x K: 1 at each image's class), as the form needs
    them: XᵀY = 2 · (each class's sum of rows)ᵀ - (the sum of all rows) where N >= D' (K x D' summed,
    Y never made), Y itself where N < D'."""
    if x.shape[0] >= x.shape[1]:
        per_class = torch.zeros(num_classes, x.shape[1], dtype=x.dtype, device=x.device).index_add_(0, labels, x)
        return 2.0 * per_class.T - x.sum(dim=0)[:, None]
    targets = torch.full((x.shape[0], num_classes), -1.0, dtype=x.dtype, device=x.device)
    return targets.index_put_((torch.arange(len(labels), device=x.device), labels), torch.tensor(1.0, dtype=x.dtype))


def _with_bias(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.pad(x, (0, 1), value=BIAS_CONSTANT)


def fewshot_accuracies(
    train: tuple[Array, np.ndarray],
    test: tuple[Array, Array],
    num_classes: int,
    shots: int,
    seed: int,
    l2s: tuple[float, ...],
    rows: np.ndarray | None = None,
    split_labels: np.ndarray | None = None,
    keep_top: list | None = None,
) -> tuple[dict[float, float], int]:
    """{λ: test accuracy} for one (shots, seed), and the number of train points actually used.
    Features may be numpy arrays or tensors already on the accelerator (the solve runs there).
    `rows`: the split position of each train feature row (sorted; the rows present, e.g. only the
    images a plan draws), with `split_labels` the whole split's labels; None: row i is image i.
    `keep_top`: a list the first λ's (N, TOP) best classes of each test image are appended to."""
    labels = np.asarray(train[1])
    all_labels = labels if split_labels is None else np.asarray(split_labels)
    present = None
    if rows is not None:
        present = np.zeros(len(all_labels), dtype=bool)
        present[rows] = True
    idx = sample_indices(all_labels, num_classes, shots, seed, present)
    if len(idx) == 0:
        raise UserError("few-shot: the train split has no images")
    if rows is not None:
        idx = np.searchsorted(rows, idx)  # split positions -> feature rows
    features = train[0]
    chosen = (
        features[torch.from_numpy(idx).to(features.device)] if isinstance(features, torch.Tensor) else features[idx]
    )
    solver = RidgeSolver.fit(chosen, labels[idx], num_classes, many_l2=len(l2s) > 1)
    accs, best = solver.evaluate(test[0], test[1], l2s, top=TOP if keep_top is not None else 0)
    if keep_top is not None:  # the first λ's top classes of each test image, for the run's predictions
        keep_top.append(best)
    return accs, len(idx)

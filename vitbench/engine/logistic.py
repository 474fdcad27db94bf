"""Multinomial logistic regression on frozen features: the linear probe of CLIP (Radford et al.
2021, App. A.3): "scikit-learn's L-BFGS implementation, with maximum 1,000 iterations", the L2
strength λ "using a hyperparameter sweep on the validation sets over the range between 10^-6 and
10^6, with 96 logarithmically spaced steps", on the raw features.

λ is CLIP's, i.e. scikit-learn's C = 1/λ: LogisticRegression(C) minimises C · Σ CE + ½ ||W||², the
same optimum as the mean cross-entropy + λ_mean/2 · ||W||² minimised here (the bias is not
penalised) for λ_mean = λ / n, n the fitting images.

The solver is the reference's (since linear/4). On the CPU it is scikit-learn's
`LogisticRegression(solver="lbfgs")` itself, at its default tolerance (CLIP names no other). On
a GPU, where the features already are, torch's L-BFGS in float64 minimises the same objective and
stops by scikit-learn's rule (scipy's L-BFGS-B: the largest gradient entry of the mean objective
≤ 1e-4, or a relative decrease ≤ 64 ulp). Like scikit-learn, it fits the classes present in the
fitting set, and two classes as one binary logistic regression. Before linear/4 torch's L-BFGS ran
to a 1e-9 gradient tolerance on every device: 20x scikit-learn's time where few images per class
are nearly separable (issue 46). Warm starts along the λ path were tried and left out: at small λ,
where neither solver's stopping rule is reached near the optimum, a warm start moved the validation
accuracy by up to 5 points from scikit-learn's cold fit at the same λ.

The 96 steps (8 per decade) are reached as a search, not 96 fits: every decade from 10^-6 to
10^6, then the best so far refined x/÷ 10^(1/2), 10^(1/4), 10^(1/8): 19 fits that end on the same
eighth-of-a-decade grid, never outside CLIP's range (since linear/6: a best at 10^6 had been refined
to 7.5 x 10^6). Standardised (z-scored) features are an option (`--linear-features
standardized`), not CLIP's."""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from vitbench.store.predictions import top_classes

log = logging.getLogger("vitbench")

COARSE = tuple(10.0**e for e in range(-6, 7))  # CLIP's range, one per decade: 1e-6 .. 1e6
REFINE_STEPS = (10**0.5, 10**0.25, 10**0.125)  # then λ* x/÷ each around the best so far: 8 steps per decade
FITS = len(COARSE) + 2 * len(REFINE_STEPS) + 1  # a probe's fits: the sweep's (at most) and the refit at the best λ
MAX_ITER = 1000  # CLIP's (scikit-learn's max_iter)
TOL = 1e-4  # scikit-learn's default `tol` (its L-BFGS-B `gtol`), which CLIP keeps
FTOL = 64 * float(np.finfo(float).eps)  # the relative decrease scikit-learn's L-BFGS-B stops at
NEVER = -1e30  # the bias of a class absent from the fitting set: never predicted, as scikit-learn does
# Below this much work (fitting images x feature dims x classes) features on a GPU are solved on the
# CPU by scikit-learn: each torch L-BFGS iteration costs kernel launches and host round trips
# whatever the size. Measured on an H200 beside 16 cores (benchmarks/gpu.py --steps probe): 240 x 192
# features of 20 classes (0.9 M) swept in 0.79 s on the GPU against 0.23 s in scikit-learn; 1,000 x
# 384 of 10 (3.8 M) in 0.72 s against 4.6 s; 10,000 x 768 of 10 in 0.71 s against 25.6 s.
GPU_MIN_WORK = 1_500_000
# Above this many logits (fitting images x classes) scikit-learn is not used on the CPU either: its
# full-batch multinomial L-BFGS holds several N x K float64 arrays (1-shot ImageNet-21k: 21,843 x
# 21,843, 3.8 GB each), where the torch L-BFGS below sums its loss over row chunks.
SKLEARN_MAX_LOGITS = 2**24
CHUNK_LOGITS = 2**21  # rows x classes scored at once (16 MB of float64): memory bounded at any class count
FLOAT64_CHUNK = 2**16  # rows gathered into float64 at once (float64_rows)


@dataclass
class LinearProbe:
    weight: torch.Tensor  # (D, K)
    bias: torch.Tensor  # (K,)
    mean: torch.Tensor  # (1, D) the fitting set's feature mean and std ("standardized"), else 0 and 1
    std: torch.Tensor

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.scores(part).argmax(dim=1) for part in _row_chunks(x, self.weight.shape[1])])

    def scores(self, x: torch.Tensor) -> torch.Tensor:
        """(N, K) logits of the probe (for a few rows: `top` ranks any number in bounded memory)."""
        return ((x.double() - self.mean) / self.std) @ self.weight + self.bias

    def top(self, x: torch.Tensor) -> np.ndarray:
        """(N, TOP) each row's best classes, best first, scored a chunk of rows at a time."""
        parts = [top_classes(self.scores(part).float().cpu().numpy()) for part in _row_chunks(x, self.weight.shape[1])]
        return np.concatenate(parts) if parts else np.zeros((0, 0), dtype=np.int64)

    def accuracy(self, x: torch.Tensor, y: torch.Tensor) -> float:
        return float((self.predict(x) == y).double().mean())


def _row_chunks(x, classes: int) -> list:
    """`x` in row chunks whose logits hold at most CHUNK_LOGITS values."""
    rows = max(1, CHUNK_LOGITS // max(classes, 1))
    return [x[i : i + rows] for i in range(0, len(x), rows)]


@dataclass(frozen=True)
class Solution:
    """A fit in the reference's own parametrisation: coef (C', D) for the C' classes present (one
    row for two classes: scikit-learn's binary model), intercept (C',), float64 on the CPU."""

    classes: np.ndarray
    coef: np.ndarray
    intercept: np.ndarray

    def accuracy(self, z: np.ndarray, y: np.ndarray) -> float:
        """On (standardised) features as the fit saw them, in numpy: the sweep's 19 validation
        scores cost no device round trips. The same predictions as `probe(...).predict`."""
        right = 0
        for part, labels in zip(_row_chunks(z, len(self.classes)), _row_chunks(y, len(self.classes)), strict=True):
            logits = part @ self.coef.T + self.intercept
            picked = (logits[:, 0] > 0).astype(np.int64) if len(self.classes) == 2 else logits.argmax(axis=1)
            right += int((self.classes[picked] == labels).sum())
        return right / len(y)

    def probe(self, num_classes: int, mean: torch.Tensor, std: torch.Tensor) -> LinearProbe:
        """The K-class softmax with the same predictions and probabilities (a binary model's
        logits are [0, w·x + b])."""
        device = mean.device
        weight = torch.zeros(self.coef.shape[1], num_classes, dtype=torch.float64)
        bias = torch.full((num_classes,), NEVER, dtype=torch.float64)
        index = torch.from_numpy(self.classes)
        if len(self.classes) == 2:
            weight[:, index[1]] = torch.from_numpy(self.coef[0])
            bias[index] = torch.tensor([0.0, float(self.intercept[0])], dtype=torch.float64)
        else:
            weight[:, index] = torch.from_numpy(self.coef.T.copy())
            bias[index] = torch.from_numpy(self.intercept)
        return LinearProbe(weight.to(device), bias.to(device), mean, std)


def fit(
    x: torch.Tensor,
    y: torch.Tensor,
    num_classes: int,
    l2: float,
    features: str = "raw",
    max_iter: int | None = None,
) -> LinearProbe:
    """The L2-regularised logistic regression at CLIP's λ (scikit-learn's 1/C)."""
    return solve(x, y, l2, features, max_iter)[0].probe(num_classes, *_standardizer(x, features))


def solve(
    x: torch.Tensor, y: torch.Tensor, l2: float, features: str = "raw", max_iter: int | None = None
) -> tuple[Solution, int]:
    """(the fit, its iterations): scikit-learn on the CPU, torch's L-BFGS where the features are on
    a GPU and the problem is large enough for the GPU to be faster (`GPU_MIN_WORK`); a small one
    goes to scikit-learn, the same fit the CPU makes. `max_iter`: MAX_ITER, CLIP's, unless given."""
    return _solver(x, y, features)(l2, max_iter)


def _solver(x: torch.Tensor, y: torch.Tensor, features: str) -> Callable[..., tuple[Solution, int]]:
    """`solve` at any λ for one fitting set, its features prepared once (float64, standardised
    where asked, copied to the host where scikit-learn solves): the sweep fits 19 λ on the same set.
    Float64 features (`float64_rows`) are used as they are, not copied."""
    z = x.double()
    if features == "standardized":  # raw features go as they are (no copy: the fits are milliseconds)
        mean, std = _standardizer(z, features)
        z = (z - mean) / std
    classes = int(y.max()) + 1
    small = z.shape[0] * classes <= SKLEARN_MAX_LOGITS
    if small and (z.device.type == "cpu" or z.shape[0] * z.shape[1] * classes < GPU_MIN_WORK):
        z_host, y_host = z.cpu().numpy(), y.cpu().numpy()
        return lambda l2, max_iter=None: _sklearn(z_host, y_host, l2, max_iter or MAX_ITER)
    return lambda l2, max_iter=None: _torch(z, y, l2, max_iter or MAX_ITER)


def float64_rows(x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """`x[rows]` in float64, the solver's precision, gathered a chunk of rows at a time: never a
    float32 copy of the rows beside the float64 one (`x[rows].double()` held both: 138 MB of float32
    for 180,000 fitting rows of 192 features)."""
    out = torch.empty(len(rows), x.shape[1], dtype=torch.float64, device=x.device)
    for start in range(0, len(rows), FLOAT64_CHUNK):
        out[start : start + FLOAT64_CHUNK] = x[rows[start : start + FLOAT64_CHUNK]]
    return out


def _standardizer(x: torch.Tensor, features: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean, std) of the fitting set's features in float64 ("standardized"), else 0 and 1 (no copy of `x`)."""
    if features == "standardized":
        z = x.double()
        return z.mean(dim=0, keepdim=True), z.std(dim=0, unbiased=False, keepdim=True) + 1e-5
    zero = torch.zeros(1, x.shape[1], dtype=torch.float64, device=x.device)
    return zero, zero + 1


def _sklearn(z: np.ndarray, y: np.ndarray, l2: float, max_iter: int) -> tuple[Solution, int]:
    import warnings

    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression

    model = LogisticRegression(C=1 / l2, max_iter=max_iter, tol=TOL)
    # BLAS on one thread: a dot product split over threads sums in another order, and where L-BFGS
    # stops short of the optimum (a small λ) that moved 1 of digits' 797 test predictions between 1
    # and 2 threads on the same features (issue 46, goal 5)
    with warnings.catch_warnings(), _blas().limit(limits=1, user_api="blas"):
        warnings.simplefilter("ignore", ConvergenceWarning)  # CLIP's cap of 1,000 iterations is the protocol
        model.fit(z, y)
    return Solution(model.classes_, model.coef_, model.intercept_), int(model.n_iter_[0])


@functools.cache
def _blas():
    """threadpoolctl's view of the loaded BLAS libraries, made once (after scikit-learn has loaded
    scipy's): `threadpool_limits` scans them at every call, 5 ms, a third of a small fit."""
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


def _torch(z: torch.Tensor, y: torch.Tensor, l2: float, max_iter: int) -> tuple[Solution, int]:
    """scikit-learn's objective and stopping rule, on the features' device (the CPU's too above
    SKLEARN_MAX_LOGITS)."""
    classes, target = torch.unique(y, return_inverse=True)
    binary = len(classes) == 2
    rows = 1 if binary else len(classes)
    coef = torch.zeros(rows, z.shape[1], dtype=torch.float64, device=z.device, requires_grad=True)
    intercept = torch.zeros(rows, dtype=torch.float64, device=z.device, requires_grad=True)
    l2_mean = l2 / len(z)  # scikit-learn's C = 1/λ on the summed loss, over n
    optimizer = torch.optim.LBFGS(
        [coef, intercept], lr=1.0, max_iter=max_iter, tolerance_grad=TOL, tolerance_change=FTOL, history_size=10,
        line_search_fn="strong_wolfe",
    )  # fmt: skip
    loss_of: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    if binary:
        loss_of = lambda logits, t: torch.nn.functional.binary_cross_entropy_with_logits(logits[:, 0], t.double())  # noqa: E731
    else:
        loss_of = lambda logits, t: torch.nn.functional.cross_entropy(logits, t)  # noqa: E731

    chunks = list(zip(_row_chunks(z, rows), _row_chunks(target, rows), strict=True))

    def closure() -> torch.Tensor:
        """The mean loss and its gradient, summed over row chunks: never all N x K logits at once."""
        optimizer.zero_grad()
        total = torch.zeros((), dtype=torch.float64, device=z.device)
        for part, labels in chunks:
            loss = loss_of(part @ coef.T + intercept, labels) * (len(part) / len(z))
            loss.backward()
            total += loss.detach()
        penalty = 0.5 * l2_mean * (coef**2).sum()
        penalty.backward()
        return total + penalty.detach()

    optimizer.step(closure)
    iterations = int(optimizer.state[coef]["n_iter"])
    found = Solution(classes.cpu().numpy(), coef.detach().cpu().numpy(), intercept.detach().cpu().numpy())
    return found, iterations


def sweep(
    train: tuple[torch.Tensor, torch.Tensor],
    val: tuple[torch.Tensor, torch.Tensor],
    num_classes: int,
    features: str = "raw",
    description: str = "linear probe",
    iterations: dict[float, int] | None = None,
) -> tuple[float, dict[float, float]]:
    """(the best λ, {λ: validation accuracy} for every λ tried): every decade, then finer steps
    around the best; the larger λ wins a tie (the simpler model). A log line per fit says where
    the sweep is (a long sweep looked hung). `iterations`: filled with each λ's L-BFGS iterations."""
    scores: dict[float, float] = {}
    x, y = train
    mean, std = _standardizer(x, features)
    val_z, val_y = ((val[0].double() - mean) / std).cpu().numpy(), val[1].cpu().numpy()
    planned = len(COARSE) + 2 * len(REFINE_STEPS)
    fit_at = _solver(x, y, features)

    def score(l2: float) -> None:
        l2 = _on_grid(l2)
        if l2 in scores or not COARSE[0] <= l2 <= COARSE[-1]:  # CLIP's range: a best at its edge refines inward only
            return
        found, made = fit_at(l2)
        scores[l2] = found.accuracy(val_z, val_y)
        if iterations is not None:
            iterations[l2] = made
        log.info(
            "%s: λ %.3g (%d/%d), %d iterations, validation accuracy %.2f%%",
            description, l2, len(scores), planned, made, 100 * scores[l2],
        )  # fmt: skip

    for l2 in COARSE:
        score(l2)
    for step in REFINE_STEPS:
        best = _best(scores)
        for l2 in (best / step, best * step):
            score(l2)
    return _best(scores), scores


def _on_grid(l2: float) -> float:
    """λ rounded to the exact eighth-of-a-decade grid point (products of float steps drift)."""
    return 10.0 ** (round(8 * math.log10(l2)) / 8)


def _best(scores: dict[float, float]) -> float:
    return max(scores, key=lambda l2: (scores[l2], l2))

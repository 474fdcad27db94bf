"""Multinomial logistic regression on frozen features: the linear probe of CLIP (Radford et al.
2021, App. A.3): "scikit-learn's L-BFGS implementation, with maximum 1,000 iterations", the L2
strength λ "using a hyperparameter sweep on the validation sets over the range between 10^-6 and
10^6, with 96 logarithmically spaced steps", on the raw features.

λ is CLIP's, i.e. scikit-learn's C = 1/λ: LogisticRegression(C) minimises C · Σ CE + ½ ||W||², the
same optimum as the mean cross-entropy + λ_mean/2 · ||W||² minimised here (the bias is not
penalised) for λ_mean = λ / n, n the fitting images. Float64, full batch, torch's L-BFGS with a
strong-Wolfe line search, on whatever device the features are on.

The 96 steps (8 per decade) are reached as a search, not 96 fits: every decade from 10^-6 to 10^6,
then the best so far refined x/÷ 10^(1/2), 10^(1/4), 10^(1/8): 19 fits that end on the same
eighth-of-a-decade grid. Standardised (z-scored) features are an option (`--linear-features
standardized`), not CLIP's."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

COARSE = tuple(10.0**e for e in range(-6, 7))  # CLIP's range, one per decade: 1e-6 .. 1e6
REFINE_STEPS = (10**0.5, 10**0.25, 10**0.125)  # then λ* x/÷ each around the best so far: 8 steps per decade
MAX_ITER = 1000  # CLIP's (scikit-learn's max_iter)


@dataclass
class LinearProbe:
    weight: torch.Tensor  # (D, K)
    bias: torch.Tensor  # (K,)
    mean: torch.Tensor  # (1, D) the fitting set's feature mean and std ("standardized"), else 0 and 1
    std: torch.Tensor

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        return self.scores(x).argmax(dim=1)

    def scores(self, x: torch.Tensor) -> torch.Tensor:
        """(N, K) logits of the probe."""
        return ((x.double() - self.mean) / self.std) @ self.weight + self.bias

    def accuracy(self, x: torch.Tensor, y: torch.Tensor) -> float:
        return float((self.predict(x) == y).double().mean())


def fit(
    x: torch.Tensor,
    y: torch.Tensor,
    num_classes: int,
    l2: float,
    features: str = "raw",
    max_iter: int = MAX_ITER,
) -> LinearProbe:
    """The L2-regularised multinomial logistic regression at CLIP's λ (scikit-learn's 1/C)."""
    x = x.double()
    if features == "standardized":
        mean = x.mean(dim=0, keepdim=True)
        std = x.std(dim=0, unbiased=False, keepdim=True) + 1e-5
    else:
        mean, std = torch.zeros_like(x[:1]), torch.ones_like(x[:1])
    z = (x - mean) / std  # (N, D)
    l2_mean = l2 / len(x)  # the same optimum as scikit-learn's C = 1/λ on the summed loss
    weight = torch.zeros(z.shape[1], num_classes, dtype=torch.float64, device=z.device, requires_grad=True)
    bias = torch.zeros(num_classes, dtype=torch.float64, device=z.device, requires_grad=True)
    optimizer = torch.optim.LBFGS(
        [weight, bias],
        lr=1.0,
        max_iter=max_iter,
        tolerance_grad=1e-9,
        tolerance_change=1e-12,
        history_size=20,
        line_search_fn="strong_wolfe",
    )

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(z @ weight + bias, y) + 0.5 * l2_mean * (weight**2).sum()
        loss.backward()
        return loss

    optimizer.step(closure)
    return LinearProbe(weight.detach(), bias.detach(), mean, std)


def sweep(
    train: tuple[torch.Tensor, torch.Tensor],
    val: tuple[torch.Tensor, torch.Tensor],
    num_classes: int,
    features: str = "raw",
) -> tuple[float, dict[float, float]]:
    """(the best λ, {λ: validation accuracy} for every λ tried): every decade, then finer steps
    around the best; the larger λ wins a tie (the simpler model)."""
    scores: dict[float, float] = {}

    def score(l2: float) -> None:
        l2 = _on_grid(l2)
        if l2 not in scores:
            scores[l2] = fit(*train, num_classes, l2, features).accuracy(*val)

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

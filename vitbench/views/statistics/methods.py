"""Statistics over per-image predictions: how sure a cell is, and whether two cells differ.

- `bootstrap_interval`: percentile bootstrap of the accuracy; one run resamples its test images,
  a mean of seeds resamples seeds and images (runs of different seeds score the same images, so an
  image is drawn for every seed at once). Seeded: the same store gives the same interval.
- `mcnemar_exact`: two runs scored on the same images, the exact (binomial) McNemar test on the
  discordant images, as statsmodels' `mcnemar(exact=True)`.
- `paired_bootstrap`: two cells of several seeds each, seeds paired by their number and images by
  their id; the difference of means resampled as above; its interval and a two-sided p-value.
- `holm`: Holm's step-down adjustment of a family of p-values (the cells of one table).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SAMPLES = 2000  # bootstrap resamples
SEED = 0  # the bootstrap's seed (recorded in every table that shows an interval)
LEVEL = 0.95
_CHUNK = 64
SMALLEST_P = 1e-300  # what a p-value that underflowed (McNemar over millions of images) is said to be below


BY_COUNTS_ABOVE = 250_000  # images: beyond, resamples are drawn by counts (below), in memory O(patterns)


def _resampled_means(correct: np.ndarray, samples: int, rng: np.random.Generator) -> np.ndarray:
    """(samples,) accuracies of bootstrap resamples of an (S seeds, N images) 0/1 matrix."""
    runs, n = correct.shape
    if n > BY_COUNTS_ABOVE:
        return _resampled_means_by_counts(correct, samples, rng)
    out = np.empty(samples)
    for start in range(0, samples, _CHUNK):
        m = min(_CHUNK, samples - start)
        images = rng.integers(0, n, (m, n))
        seeds = rng.integers(0, runs, (m, runs)) if runs > 1 else np.zeros((m, 1), dtype=np.int64)
        per_image = correct[seeds].mean(axis=1)  # (m, N): each image's mean over the drawn seeds
        out[start : start + m] = np.take_along_axis(per_image, images, axis=1).mean(axis=1)
    return out


def _resampled_means_by_counts(correct: np.ndarray, samples: int, rng: np.random.Generator) -> np.ndarray:
    """`_resampled_means` drawn by counts, for a test split of millions of images: each image is one
    of a few outcome patterns over the seeds (2^S for 0/1, 3^S for a paired difference), so drawing
    N images uniformly is drawing how many fall on each pattern (a multinomial), and a resample's
    seeds weigh each pattern by how often each seed was drawn. The same distribution as drawing N
    indices, in memory and time independent of N after one pass: the index draws were a
    64 x N matrix per chunk (10M-row predictions: killed at 23.8 GB; 1M rows: 260 s)."""
    runs, n = correct.shape
    patterns, counts = _patterns(correct)
    out = np.empty(samples)
    for i in range(samples):
        seeds = np.bincount(rng.integers(0, runs, runs), minlength=runs) if runs > 1 else np.ones(1)
        value = patterns @ seeds / runs  # each pattern's mean over the drawn seeds
        out[i] = rng.multinomial(n, counts / n) @ value / n
    return out


def _patterns(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct columns of an (S, N) matrix, (P, S), and how many columns are each, (P,). Outcomes
    over {-1, 0, 1} (0/1 or a paired difference) are counted as base-3 numbers, one per image, in one
    pass: `np.unique(axis=0)` sorted 10M rows as records, 2 s per call."""
    runs = values.shape[0]
    if runs <= 39 and np.isin(values, (-1.0, 0.0, 1.0)).all():  # 3^39 < 2^63
        places = 3 ** np.arange(runs, dtype=np.int64)
        codes = places @ (values + 1).astype(np.int64)
        found, counts = np.unique(codes, return_counts=True) if runs > 12 else _bincount(codes, 3**runs)
        digits = (found[:, None] // places[None, :]) % 3
        return digits.astype(np.float64) - 1, counts
    return np.unique(values.T, axis=0, return_counts=True)


def _bincount(codes: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    counts = np.bincount(codes, minlength=size)
    found = np.flatnonzero(counts)
    return found, counts[found]


def bootstrap_interval(
    correct: np.ndarray, samples: int = SAMPLES, seed: int = SEED, level: float = LEVEL
) -> tuple[float, float]:
    """The `level` percentile interval of the accuracy of (S, N) or (N,) 0/1 outcomes."""
    matrix = np.atleast_2d(np.asarray(correct, dtype=np.float64))
    means = _resampled_means(matrix, samples, np.random.default_rng(seed))
    tail = (1 - level) / 2 * 100
    return float(np.percentile(means, tail)), float(np.percentile(means, 100 - tail))


def mcnemar_exact(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sided exact McNemar p-value of two 0/1 outcome vectors on the same images."""
    from scipy import stats as sps  # here: its import takes most of a second; tables need it only with --ci

    a, b = np.asarray(a, dtype=bool), np.asarray(b, dtype=bool)
    only_a, only_b = int((a & ~b).sum()), int((~a & b).sum())
    if only_a + only_b == 0:
        return 1.0
    return float(min(1.0, 2 * sps.binom.cdf(min(only_a, only_b), only_a + only_b, 0.5)))


@dataclass(frozen=True)
class Comparison:
    delta: float  # mean accuracy of b minus a (fractions)
    low: float  # the interval of the difference
    high: float
    p: float
    test: str
    floor: float = 0.0  # the smallest p the test can give (a bootstrap: 1 / resamples)

    def p_text(self, p: float | None = None) -> str:
        """`p` (default the test's) as text; at the floor, an upper bound ("< 0.0005")."""
        value = self.p if p is None else p
        if value <= self.floor:  # an exact test's p below a double's range is 0.0: "< 0" said nothing
            return f"< {max(self.floor, SMALLEST_P):.2g}"
        return f"{value:.3g}"


def paired_bootstrap(a: np.ndarray, b: np.ndarray, samples: int = SAMPLES, seed: int = SEED) -> Comparison:
    """Compare two (S, N) 0/1 matrices paired by seed (row) and image (column)."""
    a2 = np.atleast_2d(np.asarray(a, dtype=np.float64))
    b2 = np.atleast_2d(np.asarray(b, dtype=np.float64))
    diff = b2 - a2  # per (seed, image): resampling it resamples both cells the same way
    deltas = _resampled_means(diff, samples, np.random.default_rng(seed))
    tail = (1 - LEVEL) / 2 * 100
    # two-sided: twice the smaller tail; a resample count bounds it below (no resample crossed 0)
    p = max(1.0 / samples, min(1.0, 2 * min(float((deltas <= 0).mean()), float((deltas >= 0).mean()))))
    low, high = float(np.percentile(deltas, tail)), float(np.percentile(deltas, 100 - tail))
    test = f"paired bootstrap over {len(a2)} seed(s) x images ({samples} resamples, seed {seed})"
    return Comparison(float(diff.mean()), low, high, p, test, floor=1.0 / samples)


def compare(a: np.ndarray, b: np.ndarray) -> Comparison:
    """One run each: exact McNemar (with a bootstrap interval of the difference); several seeds:
    the paired bootstrap."""
    a2, b2 = np.atleast_2d(a), np.atleast_2d(b)
    if len(a2) == 1 and len(b2) == 1:
        boot = paired_bootstrap(a2, b2)
        return Comparison(boot.delta, boot.low, boot.high, mcnemar_exact(a2[0], b2[0]), "exact McNemar")
    return paired_bootstrap(a2, b2)


def holm(pvalues: list[float]) -> list[float]:
    """Holm-adjusted p-values, in the order given (reject where adjusted < alpha)."""
    order = np.argsort(pvalues, kind="stable")
    m = len(pvalues)
    adjusted = np.empty(m)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        adjusted[i] = running
    return adjusted.tolist()

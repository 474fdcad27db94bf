"""Scoring a classifier's logits: top-1 and top-5 on the dataset's labels; on ImageNet val also
ReaL (Beyer et al. 2020) with the rule timm and big_vision share (docs/protocols.md, "ReaL"):
images without ReaL labels are not scored, and a prediction is a hit when it is any of the
image's ReaL labels. Used by the eval protocol and by fine-tuning's evaluation."""

from __future__ import annotations

import numpy as np

from vitbench.store.predictions import Predictions

__all__ = ["Predictions", "calibration", "image_ids", "pool_classes", "scores", "scores_over_the_head"]

TOP_K = 5


def image_ids(split, indices: np.ndarray) -> list[str]:
    """The ids of a split's images at `indices`: their paths where they are files, their container's
    file and member where they are records, else the index."""
    if split.paths is not None or split.records is not None:
        return [split.location(int(i)) for i in indices]
    return [str(int(i)) for i in indices]


def calibration(logits: np.ndarray, labels: np.ndarray, bins: int = 15) -> dict[str, float]:
    """Expected calibration error over `bins` equal-width bins of the top-1 softmax probability
    (Guo et al. 2017: sum over bins of |accuracy - confidence| x the bin's share of images) and
    the negative log-likelihood of the labels, both on float64 softmax of the logits."""
    x = logits.astype(np.float64)
    x = x - x.max(axis=1, keepdims=True)
    log_probs = x - np.log(np.exp(x).sum(axis=1, keepdims=True))
    probs = np.exp(log_probs)
    confidence, predicted = probs.max(axis=1), probs.argmax(axis=1)
    correct = predicted == labels
    edges = np.linspace(0.0, 1.0, bins + 1)
    which = np.clip(np.searchsorted(edges, confidence, side="left") - 1, 0, bins - 1)  # (lo, hi] bins
    ece = 0.0
    for b in range(bins):
        in_bin = which == b
        if in_bin.any():
            ece += in_bin.mean() * abs(correct[in_bin].mean() - confidence[in_bin].mean())
    return {"ece": float(ece), "nll": float(-log_probs[np.arange(len(labels)), labels].mean())}


def pool_classes(logits: np.ndarray, class_map: list[list[int]] | None) -> np.ndarray:
    """(N, K) logits of a classifier -> (N, len(class_map)): each of the dataset's classes takes the
    max over the classifier's classes mapped to it. The robustness sets: ImageNet-R/-A restrict an
    ImageNet-1k head to their 200 classes (one each); ObjectNet pools several ImageNet classes into
    one of its own (wise-ft's `project_logits`). None: the classifier's classes are the dataset's."""
    if class_map is None:
        return logits
    return np.stack([logits[:, classes].max(axis=1) for classes in class_map], axis=1)


def with_other(logits: np.ndarray, class_map: list[list[int]]) -> np.ndarray:
    """(N, K + 1): the pooled logits, then the best logit of the head's classes no dataset class maps
    to: the arg-max is the whole head's top-1 (an "other" prediction is a miss, as no label is K)."""
    mapped = sorted({c for classes in class_map for c in classes})
    others = np.setdiff1d(np.arange(logits.shape[1]), mapped)
    other = logits[:, others].max(axis=1, keepdims=True) if len(others) else np.full((len(logits), 1), -np.inf)
    return np.concatenate([pool_classes(logits, class_map), other], axis=1)


def scores_over_the_head(logits: np.ndarray, labels: np.ndarray, class_map: list[list[int]]) -> dict[str, float]:
    """ObjectNet's own convention (Barbu et al. 2019's evaluation code): the top-k over all of the
    head's classes (ImageNet's 1,000), each mapped to the dataset class it belongs to; a prediction
    of a class outside the dataset is a miss. Never higher than scoring the restricted logits."""
    owner = np.full(logits.shape[1], -1)
    for index, classes in enumerate(class_map):
        owner[classes] = index
    return _top_k_scores(owner[_top_k(logits)], labels)  # the head's top k as dataset classes, -1: outside


def _top_k(logits: np.ndarray) -> np.ndarray:
    """(N, min(5, K)) class indices, best first (ties in class order)."""
    return np.argsort(-logits, axis=1, kind="stable")[:, : min(TOP_K, logits.shape[1])]


def _top_k_scores(top: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """Top-1 and top-k accuracy and the counts behind them, from each image's top k classes."""
    correct = top[:, 0] == labels
    return {
        "accuracy": float(correct.mean()),
        f"accuracy_top{top.shape[1]}": float((top == labels[:, None]).any(axis=1).mean()),
        "n_correct": float(correct.sum()),
        "n_scored": float(len(labels)),
    }


def scores(logits: np.ndarray, labels: np.ndarray, real: list[list[int]] | None = None) -> dict[str, float]:
    """Metrics (fractions) and the counts behind them, for (N, K) logits and (N,) labels; `real` is
    aligned with the rows (one label list per image) or None where the dataset has no ReaL labels."""
    top = _top_k(logits)
    out = _top_k_scores(top, labels)
    scored = [i for i, r in enumerate(real or []) if r]
    if real is not None and scored:
        hits = sum(int(top[i, 0]) in real[i] for i in scored)
        out |= {
            "accuracy_real": hits / len(scored),
            "n_correct_real": float(hits),
            "n_scored_real": float(len(scored)),
        }
    return out

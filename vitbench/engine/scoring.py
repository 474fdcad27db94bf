"""Scoring a classifier's logits: top-1 and top-5 on the dataset's labels; on ImageNet val also
ReaL (Beyer et al. 2020) with the rule timm and big_vision share (docs/protocols.md, "ReaL"):
images without ReaL labels are not scored, and a prediction is a hit when it is any of the
image's ReaL labels. Used by the eval protocol and by fine-tuning's evaluation."""

from __future__ import annotations

import numpy as np

TOP_K = 5


def pool_classes(logits: np.ndarray, class_map: list[list[int]] | None) -> np.ndarray:
    """(N, K) logits of a classifier -> (N, len(class_map)): each of the dataset's classes takes the
    max over the classifier's classes mapped to it. The robustness sets: ImageNet-R/-A restrict an
    ImageNet-1k head to their 200 classes (one each); ObjectNet pools several ImageNet classes into
    one of its own (wise-ft's `project_logits`). None: the classifier's classes are the dataset's."""
    if class_map is None:
        return logits
    return np.stack([logits[:, classes].max(axis=1) for classes in class_map], axis=1)


def scores(logits: np.ndarray, labels: np.ndarray, real: list[list[int]] | None = None) -> dict[str, float]:
    """Metrics (fractions) and the counts behind them, for (N, K) logits and (N,) labels; `real` is
    aligned with the rows (one label list per image) or None where the dataset has no ReaL labels."""
    k = min(TOP_K, logits.shape[1])
    top = np.argsort(-logits, axis=1, kind="stable")[:, :k]
    correct = top[:, 0] == labels
    in_top_k = (top == labels[:, None]).any(axis=1)
    out = {
        "accuracy": float(correct.mean()),
        f"accuracy_top{k}": float(in_top_k.mean()),
        "n_correct": float(correct.sum()),
        "n_scored": float(len(labels)),
    }
    scored = [i for i, r in enumerate(real or []) if r]
    if real is not None and scored:
        hits = sum(int(top[i, 0]) in real[i] for i in scored)
        out |= {
            "accuracy_real": hits / len(scored),
            "n_correct_real": float(hits),
            "n_scored_real": float(len(scored)),
        }
    return out

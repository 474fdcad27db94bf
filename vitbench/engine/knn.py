"""Weighted k-nearest-neighbour classification on frozen features, as DINO's `eval_knn.py`
(facebookresearch/dino, `knn_classifier`): features L2-normalised, cosine similarity to every train
image, the k most similar vote for their class with weight exp(similarity / T)."""

from __future__ import annotations

import torch

TEMPERATURE = 0.07  # DINO's default `--temperature`
TEST_CHUNK = 256  # test images per similarity block (DINO: imgs_per_chunk = num_test_images // 100)
# Memory bounded by the work, not the memory bank: a block holds at most this many similarities (32 MB
# of float64; fewer test rows a block above 16,384 train images), and the train features are
# normalised in float64 a chunk at a time (a whole float64 copy of 200,000 x 192 took 307 MB).
SIMILARITIES = 2**22
TRAIN_CHUNK = 2**14


def knn_accuracies(
    train: torch.Tensor,
    train_labels: torch.Tensor,
    test: torch.Tensor,
    test_labels: torch.Tensor,
    num_classes: int,
    ks: tuple[int, ...],
    temperature: float = TEMPERATURE,
    weighted: bool = True,
    rankings: dict[int, list[torch.Tensor]] | None = None,
) -> dict[int, tuple[float, float]]:
    """{k: (top-1, top-5 accuracy)} for every k, from one similarity pass: the neighbours of the
    largest k, sorted by similarity, give every smaller k as a prefix. `weighted=False` gives every
    neighbour one vote (scikit-learn's uniform KNeighborsClassifier). `rankings`: filled with each k's
    (M, min(5, k)) top classes per test image, in blocks, for the run's per-image predictions."""
    test = torch.nn.functional.normalize(test.double(), dim=1)  # (M, D)
    largest = min(max(ks), len(train))
    hits = {k: [0, 0] for k in ks}
    rows = max(1, min(TEST_CHUNK, SIMILARITIES // max(len(train), 1)))
    for start in range(0, len(test), rows):
        block = _similarities(test[start : start + rows], train)  # (B, N) cosine similarities
        similarity, index = block.topk(largest, dim=1)  # (B, K), most similar first
        votes_all = torch.exp(similarity / temperature) if weighted else torch.ones_like(similarity)
        neighbour_labels = train_labels[index]  # (B, K)
        truth = test_labels[start : start + rows]
        for k in ks:
            votes = torch.zeros(len(block), num_classes, dtype=votes_all.dtype, device=block.device)
            votes.scatter_add_(1, neighbour_labels[:, :k], votes_all[:, :k])  # (B, C)
            # a stable sort: tied classes in class order (scikit-learn's vote takes the first too).
            # Top-5 ranks min(5, k) classes, as DINO's eval_knn.py does: below 5 neighbours the
            # rest would be classes no neighbour voted for, in index order, counted as hits
            ranked = votes.sort(dim=1, descending=True, stable=True).indices[:, : min(5, k)]  # (B, ≤5)
            hits[k][0] += int((ranked[:, 0] == truth).sum())
            hits[k][1] += int((ranked == truth[:, None]).any(dim=1).sum())
            if rankings is not None:
                rankings.setdefault(k, []).append(ranked.cpu())
    return {k: (top1 / len(test), top5 / len(test)) for k, (top1, top5) in hits.items()}


def _similarities(test: torch.Tensor, train: torch.Tensor) -> torch.Tensor:
    """(B, N) cosine similarities of normalised test rows to every train image, the train features
    normalised in float64 a chunk at a time (up to TRAIN_CHUNK images: one product, as before)."""
    if len(train) <= TRAIN_CHUNK:
        return test @ torch.nn.functional.normalize(train.double(), dim=1).T
    block = torch.empty(len(test), len(train), dtype=torch.float64, device=test.device)
    for start in range(0, len(train), TRAIN_CHUNK):
        chunk = train[start : start + TRAIN_CHUNK].double()  # normalised in place: F.normalize's own operations
        chunk /= chunk.norm(dim=1, keepdim=True).clamp_min(1e-12)
        block[:, start : start + TRAIN_CHUNK] = test @ chunk.T
    return block

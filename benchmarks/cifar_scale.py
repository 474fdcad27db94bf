"""Issue 46, goal 4: the frozen-feature protocols at the paper's test-set size, against a bare script.

`write_cifar_jpegs` writes a CIFAR-sized image folder (50,000 train + 10,000 test 32x32 JPEGs,
10 classes, each a colour layout plus noise so that accuracies are above chance);
`benchmarks/test_cifar_scale.py` and `benchmarks/gpu.py --steps cifar` time `vitbench run` on it
against this file run as a script: the bare timm + numpy / scikit-learn code a researcher would
write for the same work, with no caching, storing or provenance:

    python benchmarks/cifar_scale.py PROTOCOL[,PROTOCOL] --data FOLDER --arch ARCH --weights W.safetensors
        --res R --batch B --workers N [--device cuda]        (prints a JSON line per protocol)

- fewshot: sample first (the union of every seed's 25-shot draw, big_vision's per-class
  permutations), extract those and the test split, then per (seed, shots) big_vision's closed-form
  ridge (whitened, bias feature 100, {-1, 1} targets, λ 1024);
- knn: extract train and test, DINO's weighted k-NN (cosine, k 20, T 0.07);
- linear: extract train and test, 10 % of train held out (vitbench's dev hold-out), scikit-learn's
  LogisticRegression over the decade-then-refine λ search (19 fits), refit on train at the best λ,
  score test.

The images are decoded by PIL in DataLoader workers and resized on the model's device as big_vision's
few-shot evaluator does (a squashed resize to res / 0.875, bilinear without antialiasing, the
central crop, values in [-1, 1]): the preprocessing vitbench records for the paper's ViTs."""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np

CLASSES = 10
SHOTS, SEEDS, RIDGE_L2 = (1, 5, 10, 25), (0, 1, 2), 1024.0
KNN_K, KNN_T = 20, 0.07
COARSE = [10.0**e for e in range(-6, 7)]
REFINE = (10**0.5, 10**0.25, 10**0.125)


def write_cifar_jpegs(root: Path, train: int, test: int) -> Path:
    """An ImageFolder tree (train/, test/) of 32x32 JPEGs; written once per root."""
    from PIL import Image

    if (root / "done").exists():
        return root
    rng = np.random.default_rng(0)
    layouts = rng.normal(128, 12, (CLASSES, 4, 4, 3))  # classes close to each other: accuracies below 100 %
    for split, n in (("train", train), ("test", test)):
        labels = np.arange(n) % CLASSES
        for c in range(CLASSES):
            (root / split / f"class{c}").mkdir(parents=True, exist_ok=True)
        coarse = np.repeat(np.repeat(layouts[labels], 8, axis=1), 8, axis=2)  # (n, 32, 32, 3)
        pixels = np.clip(coarse + rng.normal(0, 48, coarse.shape), 0, 255).astype(np.uint8)
        for i, (image, c) in enumerate(zip(pixels, labels, strict=True)):
            Image.fromarray(image).save(root / split / f"class{c}" / f"{i:05d}.jpg", quality=90)
    (root / "done").touch()
    return root


def write_random_weights(path: Path, arch: str, res: int) -> Path:
    """A random-init checkpoint both sides load, made at `res` (its position embeddings on that
    grid, so neither side resamples them): the same features, so the same accuracies."""
    import timm
    import torch
    from safetensors.torch import save_file

    if not path.exists():
        torch.manual_seed(0)
        model = timm.create_model(arch, pretrained=False, num_classes=0, img_size=res)
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return path


# --- the bare script --------------------------------------------------------------------------------


def _split(root: Path, split: str) -> tuple[list[Path], np.ndarray]:
    classes = sorted(p.name for p in (root / split).iterdir() if p.is_dir())
    paths, labels = [], []
    for c, name in enumerate(classes):
        files = sorted((root / split / name).iterdir())
        paths += files
        labels += [c] * len(files)
    return paths, np.array(labels)


class _Decode:
    def __init__(self, paths: list[Path]):
        self.paths = paths

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int):
        import torch
        from PIL import Image

        with Image.open(self.paths[i]) as image:
            return torch.from_numpy(np.asarray(image.convert("RGB")).copy()).permute(2, 0, 1)


def extract(model, paths: list[Path], res: int, batch: int, workers: int, device) -> np.ndarray:
    """Pre-logit features after big_vision's few-shot preprocessing (resize(256)|central_crop(224)|
    value_range(-1, 1) at 224: the resize squashed to res / 0.875, bilinear without antialiasing)."""
    import torch
    import torch.nn.functional as F

    scale = math.floor(res / 0.875)
    offset = (scale - res) // 2
    loader = torch.utils.data.DataLoader(
        _Decode(paths), batch_size=batch, num_workers=workers, pin_memory=device.type == "cuda"
    )
    out = []
    with torch.inference_mode(), torch.autocast(device.type, torch.bfloat16, enabled=device.type == "cuda"):
        for images in loader:
            x = images.to(device, non_blocking=True).float()
            x = F.interpolate(x, size=(scale, scale), mode="bilinear", align_corners=False, antialias=False)
            x = x[:, :, offset : offset + res, offset : offset + res]
            out.append(model(x / 127.5 - 1).float())
    return torch.cat(out).cpu().numpy()


def fewshot(features, labels, test_features, test_labels) -> dict:
    """features: {train index: feature} of the drawn images; big_vision's fewshot_lsr per (seed, shots)."""
    accuracies = {}
    for seed in SEEDS:
        orders = _orders(labels, seed)
        for shots in SHOTS:
            idx = np.concatenate([o[:shots] for o in orders])
            x = np.stack([features[i] for i in idx]).astype(np.float64)
            mean, std = x.mean(0, keepdims=True), x.std(0, keepdims=True) + 1e-5
            z = np.hstack([(x - mean) / std, np.full((len(x), 1), 100.0)])
            y = 2.0 * np.eye(CLASSES)[labels[idx]] - 1
            if len(z) >= z.shape[1]:
                w = np.linalg.solve(z.T @ z + RIDGE_L2 * np.eye(z.shape[1]), z.T @ y)
            else:
                w = z.T @ np.linalg.solve(z @ z.T + RIDGE_L2 * np.eye(len(z)), y)
            zt = np.hstack([(test_features - mean) / std, np.full((len(test_features), 1), 100.0)])
            accuracies[f"{shots}-shot seed {seed}"] = float(((zt @ w).argmax(1) == test_labels).mean())
    return accuracies


def _orders(labels: np.ndarray, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.permutation(np.flatnonzero(labels == c)) for c in range(CLASSES)]


def knn(train, train_labels, test, test_labels, device) -> float:
    import torch

    train_t = torch.nn.functional.normalize(torch.from_numpy(train).to(device).double(), dim=1)
    test_t = torch.nn.functional.normalize(torch.from_numpy(test).to(device).double(), dim=1)
    labels_t, hits = torch.from_numpy(train_labels).to(device), 0
    for start in range(0, len(test_t), 256):
        similarity, index = (test_t[start : start + 256] @ train_t.T).topk(KNN_K, dim=1)
        votes = torch.zeros(len(similarity), CLASSES, dtype=torch.float64, device=device)
        votes.scatter_add_(1, labels_t[index], torch.exp(similarity / KNN_T))
        hits += int((votes.argmax(1).cpu().numpy() == test_labels[start : start + 256]).sum())
    return hits / len(test)


def linear(train, train_labels, test, test_labels) -> dict:
    import warnings

    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression

    held = np.random.default_rng(0).permutation(len(train))  # the last tenth of a seed-0 permutation, as vitbench
    fit, val = held[: round(0.9 * len(train))], held[round(0.9 * len(train)) :]
    scores: dict[float, float] = {}

    def score(l2: float) -> None:
        l2 = 10.0 ** (round(8 * math.log10(l2)) / 8)
        if l2 not in scores:
            model = LogisticRegression(C=1 / l2, max_iter=1000).fit(train[fit], train_labels[fit])
            scores[l2] = float((model.predict(train[val]) == train_labels[val]).mean())

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        for l2 in COARSE:
            score(l2)
        for step in REFINE:
            best = max(scores, key=lambda k: (scores[k], k))
            score(best / step)
            score(best * step)
        best = max(scores, key=lambda k: (scores[k], k))
        model = LogisticRegression(C=1 / best, max_iter=1000).fit(train, train_labels)
    return {"accuracy": float((model.predict(test) == test_labels).mean()), "l2": best, "fits": len(scores) + 1}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("protocol", help="fewshot, knn or linear; a comma list runs each in turn")
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--arch", required=True)
    parser.add_argument("--weights", type=Path, required=True)
    parser.add_argument("--res", type=int, required=True)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()

    import timm
    import torch
    from safetensors.torch import load_file

    device = torch.device(args.device)
    model = timm.create_model(args.arch, pretrained=False, num_classes=0, img_size=args.res)
    model.load_state_dict(load_file(str(args.weights)))
    model = model.to(device).eval()
    train_paths, train_labels = _split(args.data, "train")
    test_paths, test_labels = _split(args.data, "test")

    def features(paths: list[Path]) -> np.ndarray:
        return extract(model, paths, args.res, args.batch, args.workers, device)

    for protocol in args.protocol.split(","):  # each alone: its own extraction, as its own script would
        begun = time.perf_counter()
        if protocol == "fewshot":  # sample first: only the drawn images are extracted
            drawn = sorted({int(i) for seed in SEEDS for o in _orders(train_labels, seed) for i in o[: max(SHOTS)]})
            drawn_features = dict(zip(drawn, features([train_paths[i] for i in drawn]), strict=True))
            found: dict = fewshot(drawn_features, train_labels, features(test_paths), test_labels)
            images = len(drawn) + len(test_paths)
        else:
            train, test = features(train_paths), features(test_paths)
            images = len(train_paths) + len(test_paths)
            if protocol == "knn":
                found = {"accuracy": knn(train, train_labels, test, test_labels, device)}
            else:
                found = linear(train, train_labels, test, test_labels)
        seconds = time.perf_counter() - begun  # the process's own start is timed from outside
        print(json.dumps({"protocol": protocol, "images": images, "seconds": seconds, **found}), flush=True)


if __name__ == "__main__":
    main()

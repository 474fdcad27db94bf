"""benchmarks/gpu.py's steps that time the solves on frozen features: the linear probe's λ sweep on the
device against scikit-learn on the CPU (`probe`), and k-NN and the probe's fits on CIFAR-10-sized
features against scikit-learn and a bare torch loop (`frozen`)."""

from __future__ import annotations

import os
import time

import numpy as np
from gpu_runner import Suite


def probe_step(s: Suite) -> dict:
    """`logistic.sweep` (19 fits) on the device against scikit-learn's LogisticRegression(lbfgs) over
    the λ the sweep visited, on the same features: a few images per class (nearly separable), a
    hundred, a thousand. Wall seconds, and the largest accuracy difference over the λ."""
    import warnings

    import torch
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression

    from vitbench.engine import logistic

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    sizes = [(20, 12, 192), (10, 100, 384)] if s.quick else [(20, 12, 192), (10, 100, 384), (10, 1000, 768)]
    figures: dict = {"device": str(device), "sizes": []}
    for classes, per_class, dims in sizes:
        rng = np.random.default_rng(0)
        centres = rng.normal(size=(classes, dims)) * (6 / dims**0.5)
        y, y_val = np.repeat(np.arange(classes), per_class), np.repeat(np.arange(classes), max(6, per_class // 5))
        x = np.maximum(centres[y] + rng.normal(size=(len(y), dims)), 0)
        x_val = np.maximum(centres[y_val] + rng.normal(size=(len(y_val), dims)), 0)
        train = (torch.from_numpy(x).float().to(device), torch.from_numpy(y).to(device))
        val = (torch.from_numpy(x_val).float().to(device), torch.from_numpy(y_val).to(device))
        logistic.solve(*train, 1e6)  # warm-up (kernels, not timed): a strong λ converges at once
        start = time.perf_counter()
        _, ours = logistic.sweep(train, val, classes)
        ours_s = time.perf_counter() - start
        theirs: dict[float, float] = {}
        start = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            for l2 in ours:
                # float64, as vitbench fits: where the fit stops short of the optimum (small λ), float32
                # features stop elsewhere (5.8 points apart at one λ on the smallest set)
                model = LogisticRegression(C=1 / l2, max_iter=logistic.MAX_ITER).fit(x, y)
                theirs[l2] = float((model.predict(x_val) == y_val).mean())
        theirs_s = time.perf_counter() - start
        row = {
            "classes": classes, "train": len(y), "dims": dims, "fits": len(ours), "vitbench_seconds": round(ours_s, 3),
            "sklearn_cpu_seconds": round(theirs_s, 3), "ratio_sklearn_over_vitbench": round(theirs_s / ours_s, 2),
            "max_accuracy_difference_points": round(100 * max(abs(ours[k] - theirs[k]) for k in ours), 2),
        }  # fmt: skip
        figures["sizes"].append(row)
        s.say(f"probe sweep {row}")
    return figures


def frozen_step(s: Suite) -> dict:
    """k-NN (k=20) and logistic-regression fits over CIFAR-10-sized features (50,000 train, 10,000
    test, 768 dims, 10 classes, a Gaussian mixture) on the GPU, against scikit-learn on the CPU and
    a bare torch loop; each timed once after a warm-up, wall seconds."""
    import torch
    from sklearn.linear_model import LogisticRegression
    from sklearn.neighbors import KNeighborsClassifier

    from vitbench.engine import knn, logistic

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    n, m, d, c = (2000, 500, 64, 10) if s.quick else (50_000, 10_000, 768, 10)
    g = torch.Generator().manual_seed(0)
    # centres ~2.8 noise-sigmas apart: classes overlap as real features' do (not 100 % for everyone),
    # which is what makes the small-λ fits work hard
    centres = torch.randn(c, d, generator=g) * (2.0 / d**0.5)
    ytr, yte = torch.randint(0, c, (n,), generator=g), torch.randint(0, c, (m,), generator=g)
    xtr = centres[ytr] + torch.randn(n, d, generator=g)
    xte = centres[yte] + torch.randn(m, d, generator=g)

    def timed(fn):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        value = fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start, value

    figures: dict = {"shape": {"train": n, "test": m, "dims": d, "classes": c}, "device": str(device)}
    gx, gy, tx, ty = xtr.to(device), ytr.to(device), xte.to(device), yte.to(device)
    knn.knn_accuracies(gx[:1000], gy[:1000], tx[:256], ty[:256], c, (20,))  # warm-up
    seconds, acc = timed(lambda: knn.knn_accuracies(gx, gy, tx, ty, c, (20,)))
    figures["knn_vitbench"] = {"seconds": round(seconds, 3), "top1": acc[20][0]}

    def bare_knn():
        a = torch.nn.functional.normalize(gx.float(), dim=1)
        b = torch.nn.functional.normalize(tx.float(), dim=1)
        sim, idx = (b @ a.T).topk(20, dim=1)
        votes = torch.zeros(m, c, device=device).scatter_add_(1, gy[idx], torch.exp(sim / 0.07))
        return float((votes.argmax(1) == ty).float().mean())

    bare_knn()
    seconds, acc = timed(bare_knn)
    figures["knn_bare_torch_fp32"] = {"seconds": round(seconds, 3), "top1": acc}
    start = time.perf_counter()
    neighbours = KNeighborsClassifier(20, metric="cosine", weights="distance", n_jobs=-1).fit(xtr.numpy(), ytr.numpy())
    acc = float((neighbours.predict(xte.numpy()) == yte.numpy()).mean())
    figures["knn_sklearn_cpu"] = {
        "seconds": round(time.perf_counter() - start, 3),
        "top1": acc,
        "cores": os.cpu_count(),
    }
    # the probe: one fit per λ (CLIP's λ, scikit-learn's C = 1/λ), each capped at the same iterations
    fits = []
    for l2 in (1e-2, 1e1, 1e4) if not s.quick else (1e1,):
        seconds, probe = timed(lambda l2=l2: logistic.fit(gx, gy, c, l2))
        ours = {"seconds": round(seconds, 2), "test_accuracy": probe.accuracy(tx, ty)}
        start = time.perf_counter()
        clf = LogisticRegression(C=1 / l2, max_iter=logistic.MAX_ITER).fit(xtr.numpy(), ytr.numpy())
        theirs = {
            "seconds": round(time.perf_counter() - start, 2),
            "test_accuracy": float((clf.predict(xte.numpy()) == yte.numpy()).mean()),
            "iterations": int(clf.n_iter_[0]),
        }
        fits.append({"l2": l2, "vitbench_gpu" if device.type == "cuda" else "vitbench": ours, "sklearn_cpu": theirs})
        s.say(f"probe λ={l2}: {fits[-1]}")
    figures["linear_fits"] = fits
    return figures

"""De-duplication at CIFAR-10's size (issue 47): `vitbench dedup --dataset cifar10` over generated
CIFAR-10 pickles (50,000 train + 10,000 test 32x32 images, tests/planted.py: coloured 1/f noise
with shared class layouts) in which copies of 50 test images of each kind (exact, re-encoded,
resized, cropped, shifted, colour-shifted) are planted in train. One whole process, wall time
(the target: 5 minutes on 2 cores), its recall and false flags against the planted truth, images/s,
and what the same search would cost at ImageNet-21k's size (14.2 M images) against the test splits
of the 19 VTAB tasks and the paper's 5 other datasets, extrapolated from this run: the candidate
products scale with audited x test images, the thumbnails with the audited images."""

from __future__ import annotations

import pickle
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from planted import KINDS, planted_set  # noqa: E402

from vitbench import store  # noqa: E402
from vitbench.catalog import registry

IMAGENET21K = 14_197_122  # images in ImageNet-21k (fall 2011), the paper's pre-training set
TARGET_SECONDS = 300  # issue 47: CIFAR-10 whole within 5 minutes on 2 cores


def write_cifar10(root: Path, train: np.ndarray, train_labels, test: np.ndarray, test_labels) -> Path:
    """The arrays as CIFAR-10's python pickles (N x 3072 CHW rows), five train batches and the test batch."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)

    def dump(name: str, images: np.ndarray, labels) -> None:
        rows = images.transpose(0, 3, 1, 2).reshape(len(images), -1)
        batch = {"batch_label": name, "labels": [int(y) for y in labels], "data": rows,
                 "filenames": [f"{name}_{i}.png" for i in range(len(images))]}  # fmt: skip
        with open(folder / name, "wb") as f:
            pickle.dump(batch, f, protocol=2)

    for i, part in enumerate(np.array_split(np.arange(len(train)), 5), 1):
        dump(f"data_batch_{i}", train[part], np.asarray(train_labels)[part])
    dump("test_batch", test, test_labels)
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump({"label_names": [f"class{i}" for i in range(10)]}, f, protocol=2)
    return root


def paper_test_images() -> int:
    """Test images of the 19 VTAB-1k tasks and the paper's five other datasets, from their official sizes."""
    names = [*registry.get_suite("vtab").datasets, "imagenet", "cifar10", "cifar100", "pets", "flowers102"]
    total = 0
    for name in dict.fromkeys(names):
        spec = registry.get_dataset(name)
        total += spec.official_sizes.get(spec.test_split) or 0
    return total


@pytest.fixture(scope="module")
def planted_cifar(request, tmp_path_factory):
    quick = request.config.getoption("benchmark_disable")  # CI: a small set, to keep the path working
    n_train, n_test, per_kind = (2_000, 400, 5) if quick else (50_000, 10_000, 50)
    planted = planted_set(n_train, n_test, per_kind=per_kind, seed=7)
    root = write_cifar10(tmp_path_factory.mktemp("dedup"), planted.train, planted.train_labels, planted.test,
                         planted.test_labels)  # fmt: skip
    return planted, root


def test_dedup_at_cifar_size(benchmark, planted_cifar, tmp_path, capsys):
    planted, root = planted_cifar
    results = tmp_path / "results"

    def run() -> float:
        start = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "vitbench", "dedup", "--dataset", "cifar10", "--data-dir", str(root),
             "--results", str(results), "--rerun", "--workers", "0"],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        return time.perf_counter() - start

    seconds = benchmark.pedantic(run, rounds=1, iterations=1)
    seconds = seconds if seconds is not None else benchmark.stats.stats.mean
    audit = store.read_audits(results).iloc[-1]
    pairs = store.read_pairs(results, [audit["audit_key"]])
    found = set(zip(pairs["test_index"], pairs["duplicate_index"], strict=True))
    recall = {
        kind: np.mean([(t, d) in found for t, (d, k) in planted.duplicates.items() if k == kind]) for kind in KINDS
    }
    false = set(pairs["test_index"]) - set(planted.duplicates)
    clean = len(planted.test) - len(planted.duplicates)
    images = len(planted.train) + len(planted.test)
    scale = IMAGENET21K * paper_test_images() / (len(planted.train) * len(planted.test))
    benchmark.extra_info.update(
        seconds=seconds, images_per_second=images / seconds, recall=recall, false_flags=len(false),
        false_flag_rate=len(false) / clean, imagenet21k_core_hours=seconds * scale * 2 / 3600,
    )  # fmt: skip
    with capsys.disabled():
        print(
            f"\n  dedup, {len(planted.test):,} test vs {len(planted.train):,} train (CIFAR-10 pickles, 2 cores): "
            f"{seconds:.1f} s, {images / seconds:,.0f} images/s; recall "
            + ", ".join(f"{k} {v:.0%}" for k, v in recall.items())
            + f"; false flags {len(false)} of {clean:,} ({len(false) / clean:.2%})"
            f"\n  at ImageNet-21k size ({IMAGENET21K:,} images) against {paper_test_images():,} test images of the"
            f" 19 VTAB + 5 paper datasets: about {seconds * scale * 2 / 3600:,.0f} core-hours (this run x "
            f"{scale:,.0f}, the candidate products dominating)"
        )
    assert min(recall.values()) >= 0.95 and len(false) <= 0.01 * clean
    if not benchmark.disabled:
        assert seconds <= TARGET_SECONDS

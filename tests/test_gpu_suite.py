"""benchmarks/gpu.py, the one command that re-measures docs/performance.md's GPU figures: on a CPU
its --quick mode runs the same steps at toy sizes, so the script keeps working between GPU sessions."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np

from vitbench.datasets import DATASETS

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "gpu.py"


def gpu_module():
    if str(SCRIPT.parent) not in sys.path:  # its runner and steps, imported as the script's own folder's modules
        sys.path.insert(0, str(SCRIPT.parent))
    spec = importlib.util.spec_from_file_location("gpu_suite", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_suite_writes_its_figures_and_archives_only_what_is_stored(tmp_path):
    out = tmp_path / "out"
    env = {"VITBENCH_GPU_WORK": str(tmp_path / "work")}
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(out), "--quick", "--steps", "env,frozen,finetune"],
        capture_output=True, text=True, cwd=ROOT, env={**__import__("os").environ, **env}, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"]["env"]["ok"] and summary["steps"]["env"]["torch"]
    frozen = summary["steps"]["frozen"]
    # the same weighted vote as the bare loop; scikit-learn weighs by 1 / distance: near, not equal
    assert frozen["ok"] and abs(frozen["knn_vitbench"]["top1"] - frozen["knn_bare_torch_fp32"]["top1"]) < 0.005
    assert (
        frozen["knn_vitbench"]["top1"] > 0.3
        and abs(frozen["knn_vitbench"]["top1"] - frozen["knn_sklearn_cpu"]["top1"]) < 0.06
    )
    fit = frozen["linear_fits"][0]  # one optimum: the same test accuracy as scikit-learn's fit
    assert abs(fit["vitbench"]["test_accuracy"] - fit["sklearn_cpu"]["test_accuracy"]) <= 0.01
    assert summary["steps"]["finetune"] == {"ok": False, "error": "needs --weights and --data-dir"}
    assert (out / "log.txt").read_text().count("=== ") == 2

    gpu = gpu_module()
    results = tmp_path / "results"
    for name in ("vitbench.duckdb", "runs/k.json", "runs/k/checkpoint.pt", "cache/features/x.npy"):
        (results / name).parent.mkdir(parents=True, exist_ok=True)
        (results / name).write_text("x")
    with tarfile.open(tmp_path / "r.tar.gz", "w:gz") as tar:
        tar.add(results, arcname="results", filter=gpu._stored_only)
    with tarfile.open(tmp_path / "r.tar.gz") as tar:
        kept = {m.name for m in tar.getmembers() if m.isfile()}
    assert kept == {"results/vitbench.duckdb", "results/runs/k.json"}


def test_the_generated_cifar10_is_read_as_cifar10(tmp_path):
    gpu_module().write_cifar10(tmp_path, 500, 100)
    train = DATASETS["cifar10"].load_split(tmp_path, "train")
    test = DATASETS["cifar10"].load_split(tmp_path, "test")
    assert train.images.shape == (500, 32, 32, 3) and len(test) == 100
    assert set(np.unique(train.labels)) == set(range(10))

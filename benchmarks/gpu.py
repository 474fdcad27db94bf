"""Every GPU measurement of docs/performance.md's GPU section, in one command (`nox -s gpu OUT`, or
`python benchmarks/gpu.py OUT` where nox is not installed, as on a bare GPU machine).

Each step runs vitbench as a user does (its CLI, in a subprocess, with a time limit) and writes
its figures into OUT: `summary.json` (every step's figures, command lines, wall times and
errors), `bench.csv` (the `bench` table: images/s, MFU, peak memory, micro-batch), `log.txt` (every
command's output) and `results.tar.gz` (the results folder the commands stored into, to ingest
or table elsewhere). A step that fails is recorded as failed and the next one runs.

Steps (`--steps` picks; the default runs all that their inputs allow):
  env       the device, driver, versions, a bf16 matrix product's TFLOP/s (the measured ceiling)
  tests     the GPU-marked tests (tests/test_finetune_gpu.py)
  eval      `vitbench run --protocol eval` with every default, DeiT-Ti on the 500 shared ImageNet
            val images (--data-dir): the reference's 353/500 (70.60 %, ReaL 76.63 %) is expected
  conformance  tests/conformance.py --device cuda: eval, few-shot, k-NN and the linear probe through
            every input pipeline and precision, per-image predictions against the CPU's (--data-dir)
  pipelines `vitbench bench --mode inference` from camera-sized JPEGs through the device pipeline
            (PIL decodes, the GPU resizes with PIL's arithmetic), the workers and nvjpeg, DeiT-Ti and
            ViT-B/16 at 224 px: what the exact resize costs
  bench     ViT-B/16 at 224 and 384 px, bf16: vitbench's train step and extraction on a
            synthetic batch, through the real input pipeline (JPEGs written to disk here), a
            bare loop and timm's benchmark.py (--timm-benchmark)
  floor     extraction against the hardware (issue 46, goal 3): DeiT-Ti and ViT-B/16 at 224 px,
            `vitbench bench --mode inference` end to end from JPEG files beside a bare forward on
            random tensors and the device's measured matrix-product peak, eager and compiled
            (files decoded by PIL in the workers, resized on the GPU: auto); then nvjpeg
            (--input-pipeline nvjpeg) and the workers' own resize (--input-pipeline workers)
  probe     the linear probe's λ sweep on GPU features against scikit-learn's LogisticRegression
            on the CPU over the same λ, at three data sizes (issue 46, goal 1)
  fewshot   `vitbench run` few-shot, ViT-B/16, 1/5/10/25 shots x 3 seeds on a generated CIFAR-10-
            sized set (50,000 + 10,000 32x32 images in CIFAR's pickle format), cold cache, wall time
  cifar     few-shot, k-NN and the linear probe at ViT-B/16 224 px on 50,000 + 10,000 generated
            32x32 JPEGs, each against a bare timm + numpy / scikit-learn script, then all three in
            one command against the extraction floor (issue 46, goal 4: benchmarks/test_cifar_scale.py)
  big       ViT-L/16 @384 and ViT-H/14 @392 (384 is not a multiple of 14) at batch 512: the
            micro-batch and checkpointing vitbench chooses, peak memory, images/s
  frozen    k-NN and the linear probe's fits on GPU-resident CIFAR-10-sized features against
            scikit-learn on the CPU and a bare torch loop
  finetune  `vitbench run --protocol finetune` of the given weights on the given datasets at the
            paper's setting (--weights, --data-dir, --finetune-datasets)

`--quick` shrinks every step (a tiny model, small data, few steps) so the script itself can be
checked on a CPU; its figures mean nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
STEPS = (
    "env", "tests", "eval", "conformance", "pipelines", "bench", "floor", "probe", "fewshot", "cifar", "big", "frozen",
    "finetune",
)  # fmt: skip


class Suite:
    """Runs the steps, keeps their figures and the log, writes both after every step (a machine
    taken back mid-way still leaves what was measured)."""

    def __init__(self, out: Path, quick: bool, deadline: float):
        self.out = out
        self.deadline = time.monotonic() + deadline  # a machine lent for a while: stop each command in time
        self.quick = quick
        self.profile = False  # --profile: the few-shot runs under cProfile, stats into OUT
        self.results = out / "results"
        self.work = Path(os.environ.get("VITBENCH_GPU_WORK", "/tmp/vitbench-gpu"))
        self.work.mkdir(parents=True, exist_ok=True)
        self.summary: dict = {"started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "quick": quick, "steps": {}}
        self.log = open(out / "log.txt", "a")  # noqa: SIM115 (open for the whole suite)

    def say(self, text: str) -> None:
        print(text, flush=True)
        self.log.write(text + "\n")
        self.log.flush()

    def sh(self, args: list[str], limit: float, env: dict | None = None) -> dict:
        """One command, its output to the log; {command, rc, seconds, tail}."""
        self.say("$ " + " ".join(args))
        limit = min(limit, self.deadline - time.monotonic() - 20)  # 20 s left to archive what was stored
        if limit <= 0:
            return {"command": " ".join(args), "rc": 124, "seconds": 0, "tail": "not started: --deadline reached"}
        start = time.perf_counter()
        try:
            done = subprocess.run(
                args, cwd=ROOT, capture_output=True, text=True, timeout=limit, env={**os.environ, **(env or {})}
            )
            rc, text = done.returncode, done.stdout + done.stderr
        except subprocess.TimeoutExpired as e:
            rc = 124
            text = (e.stdout or b"").decode(errors="replace") + (e.stderr or b"").decode(errors="replace")
            text += f"\n[stopped after {limit:.0f} s]"
        seconds = time.perf_counter() - start
        self.log.write(text + f"\n[rc {rc}, {seconds:.1f} s]\n")
        self.log.flush()
        print(text[-3000:], flush=True)
        return {"command": " ".join(args), "rc": rc, "seconds": round(seconds, 2), "tail": text[-600:]}

    def step(self, name: str, fn) -> None:
        self.say(f"\n=== {name} ===")
        start = time.perf_counter()
        try:
            figures = fn()
            ok = all(c.get("rc", 0) == 0 for c in figures.get("commands", []))
            self.summary["steps"][name] = {"ok": ok, **figures}
        except Exception as e:  # one step's failure must not cost the others' figures
            self.summary["steps"][name] = {"ok": False, "error": f"{type(e).__name__}: {e}"}
            self.say(f"{name} failed: {type(e).__name__}: {e}")
        self.summary["steps"][name]["wall_seconds"] = round(time.perf_counter() - start, 1)
        self.save()

    def save(self) -> None:
        (self.out / "summary.json").write_text(json.dumps(self.summary, indent=1, default=str))

    def vitbench(self, *args: str, limit: float, profile: str | None = None) -> dict:
        """`vitbench ARGS`; under cProfile when `profile` names the stats file (in OUT)."""
        prefix = ["-m", "cProfile", "-o", str(self.out / profile)] if profile else []
        return self.sh([sys.executable, *prefix, "-m", "vitbench", *args], limit)


# --- inputs the steps make ------------------------------------------------------------------------


def write_jpeg_folder(root: Path, train: int, test: int, classes: int = 10) -> Path:
    """An ImageFolder tree of camera-sized JPEGs (500 x 375, quality 90), the real pipeline's input."""
    from PIL import Image

    if (root / "done").exists():
        return root
    rng = np.random.default_rng(0)
    base = rng.integers(0, 256, (classes, 3), dtype=np.uint8)
    for split, n in (("train", train), ("test", test)):
        for i in range(n):
            c = i % classes
            folder = root / split / f"class{c:02d}"
            folder.mkdir(parents=True, exist_ok=True)
            # smooth structure plus noise: JPEG sizes like a photo's, not like flat colour or pure noise
            small = rng.integers(0, 256, (12, 16, 3), dtype=np.uint8) // 2 + base[c] // 2
            image = Image.fromarray(small).resize((500, 375), Image.BICUBIC)
            noise = rng.integers(-12, 13, (375, 500, 3))
            pixels = np.clip(np.asarray(image, dtype=np.int16) + noise, 0, 255).astype(np.uint8)
            Image.fromarray(pixels).save(folder / f"{i:06d}.jpg", quality=90)
    (root / "done").touch()
    return root


def write_cifar10(root: Path, train: int, test: int) -> Path:
    """CIFAR-10's python pickles (data_batch_1..5, test_batch, batches.meta) of generated images:
    each class a colour layout plus noise, so the few-shot accuracies are above chance."""
    folder = root / "cifar-10-batches-py"
    if (folder / "test_batch").exists():
        return root
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    layouts = rng.integers(0, 256, (10, 3, 4, 4)).astype(np.float32)

    def batch(n: int, label: str) -> dict:
        labels = rng.integers(0, 10, n)
        coarse = np.repeat(np.repeat(layouts[labels], 8, axis=2), 8, axis=3)  # (n, 3, 32, 32)
        data = np.clip(coarse + rng.normal(0, 40, coarse.shape), 0, 255).astype(np.uint8)
        return {"batch_label": label, "labels": labels.tolist(), "data": data.reshape(n, 3072)}

    per = train // 5
    for b in range(5):
        with open(folder / f"data_batch_{b + 1}", "wb") as f:
            pickle.dump(batch(per, f"training batch {b + 1} of 5"), f)
    with open(folder / "test_batch", "wb") as f:
        pickle.dump(batch(test, "testing batch 1 of 1"), f)
    names = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump({"label_names": names, "num_cases_per_batch": per, "num_vis": 3072}, f)
    return root


# --- the steps -------------------------------------------------------------------------------------


def env_step(s: Suite) -> dict:
    import platform

    import torch

    figures: dict = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda_available": torch.cuda.is_available(),
    }
    for name in ("timm", "torchvision", "duckdb", "pandas", "numpy", "sklearn", "PIL"):
        try:
            figures[name] = __import__(name).__version__
        except ImportError as e:
            figures[name] = f"missing ({e})"
    smi = shutil.which("nvidia-smi")
    if smi:
        q = "name,driver_version,memory.total,clocks.max.sm,power.limit"
        figures["nvidia_smi"] = subprocess.run(
            [smi, f"--query-gpu={q}", "--format=csv,noheader"], capture_output=True, text=True
        ).stdout.strip()
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        figures["device"] = props.name
        figures["sms"] = props.multi_processor_count
        from vitbench.engine.bench import matmul_peak

        figures["bf16_matmul_tflops_8192"] = round(matmul_peak(torch.device("cuda"), "bf16") / 1e12, 1)
    return figures


def tests_step(s: Suite) -> dict:
    junit = s.work / "gpu-tests.xml"
    run = s.sh(
        [sys.executable, "-m", "pytest", "tests/test_finetune_gpu.py", "tests/test_device_data.py", "-q", "-rA",
         "-p", "no:cacheprovider", "--junitxml", str(junit)],
        limit=300,
    )  # fmt: skip
    return {"commands": [run]}


def bench_step(s: Suite, timm_script: Path | None) -> dict:
    jpegs = write_jpeg_folder(s.work / "jpegs", *((64, 32) if s.quick else (1500, 500)))
    configs = ["vit-ti/16@64"] if s.quick else ["vit-b/16@224", "vit-b/16@384"]
    args = ["bench", "--dataset", f"folder:{jpegs}", "--results", str(s.results)]
    for c in configs:
        args += ["-c", c]
    args += ["--batch", "16", "--steps", "5", "--warmup", "1", "--rounds", "1"] if s.quick else [
        "--batch", "256", "--steps", "10", "--warmup", "3", "--rounds", "3"]  # fmt: skip
    if timm_script:
        args += ["--timm-benchmark", str(timm_script)]
    return {"commands": [s.vitbench(*args, limit=420)]}


def floor_step(s: Suite, timm_script: Path | None) -> dict:
    """Extraction end to end from JPEGs against a bare forward and the matmul peak (the `real /
    bare` and `real / matmul peak` columns of `table --bench`), eager then compiled."""
    jpegs = write_jpeg_folder(s.work / "jpegs", *((64, 32) if s.quick else (1500, 500)))
    configs = ["vit-ti/16@64"] if s.quick else ["deit-ti/16@224", "vit-b/16@224"]
    args = ["bench", "--mode", "inference", "--dataset", f"folder:{jpegs}", "--results", str(s.results)]
    for c in configs:
        args += ["-c", c]
    sizes = ["--batch", "16", "--steps", "2", "--warmup", "1"] if s.quick else [
        "--batch", "256", "--steps", "10", "--warmup", "3"]  # fmt: skip
    eager = [*args, *sizes, "--rounds", "1" if s.quick else "3"]
    if timm_script:
        eager += ["--timm-benchmark", str(timm_script)]
    # compiled: one round (each round compiles its model afresh)
    compiled = s.vitbench(*args, *sizes, "--compile", limit=300)
    # the eager and compiled rows run under auto: PIL (libjpeg) decodes in the workers, as the
    # references do, and the GPU resizes; nvjpeg (4:2:0 colour planes repeated) and the workers'
    # own resize are measured beside, one round each
    others = [
        s.vitbench(*args, *sizes, "--input-pipeline", pipeline, "--workers", "2" if s.quick else "8",
                   "--rounds", "1", limit=300)
        for pipeline in ("nvjpeg", "workers")
    ]  # fmt: skip
    return {"commands": [s.vitbench(*eager, limit=300), compiled, *others]}


def eval_step(s: Suite, weights: Path, data_dir: Path) -> dict:
    """The README's eval with every default (auto pipeline, auto precision) on the GPU, tabled."""
    results = s.work / "eval-defaults"
    run = s.vitbench(
        "run", "--model", "deit-ti/16", "--weights", str(weights), "--dataset", "imagenet", "--data-dir", str(data_dir),
        "--protocol", "eval", "--results", str(results), limit=300,
    )  # fmt: skip
    table = s.vitbench("table", "--protocol", "eval", "--results", str(results), "--format", "md", limit=60)
    return {"commands": [run, table]}


def conformance_step(s: Suite, data_dir: Path) -> dict:
    out = s.work / "conformance"
    env = {"VITBENCH_SHARED_DATA": str(data_dir)}
    run = s.sh([sys.executable, "tests/conformance.py", str(out), "--device", "cuda", "--workers", "8"], 420, env)
    for name in ("conformance.json", "conformance.md"):
        if (out / name).exists():
            shutil.copy(out / name, s.out / name)
    return {"commands": [run]}


def pipelines_step(s: Suite) -> dict:
    """Extraction from camera-sized JPEGs through each pipeline, one round each (the floor step's
    figures, fewer of them): the device pipeline's exact resize against the workers' and nvjpeg."""
    jpegs = write_jpeg_folder(s.work / "jpegs", *((64, 32) if s.quick else (1500, 500)))
    args = ["bench", "--mode", "inference", "--dataset", f"folder:{jpegs}", "--results", str(s.results)]
    configs = ["-c", "vit-ti/16@64"] if s.quick else ["-c", "deit-ti/16@224", "-c", "vit-b/16@224"]
    sizes = ["--batch", "16", "--steps", "2", "--warmup", "1"] if s.quick else [
        "--batch", "256", "--steps", "10", "--warmup", "3"]  # fmt: skip
    return {"commands": [
        s.vitbench(*args, *configs, *sizes, "--input-pipeline", pipeline, "--workers", "2" if s.quick else "16",
                   "--rounds", "1", limit=240)
        for pipeline in ("device", "workers", "nvjpeg")
    ]}  # fmt: skip


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


def fewshot_step(s: Suite) -> dict:
    data = write_cifar10(s.work / "cifar", *((1000, 500) if s.quick else (50_000, 10_000)))
    model = "vit-ti/16" if s.quick else "vit-b/16"
    figures: dict = {"commands": []}
    for batch in ("64", "512"):  # 64: run's default; 512: a GPU-sized extraction batch
        results = s.work / f"fewshot-{batch}"
        shutil.rmtree(results, ignore_errors=True)  # a cold cache: nothing extracted yet
        run = s.vitbench(
            "run", "--model", model, "--weights", "random", "--dataset", "cifar10", "--data-dir", str(data),
            "--protocol", "fewshot", "--extraction-batch", batch, "--results", str(results),
            limit=240, profile=f"fewshot-{batch}.prof" if s.profile else None,
        )  # fmt: skip
        figures["commands"].append(run)
        figures[f"wall_seconds_batch_{batch}"] = run["seconds"]
    return figures


def cifar_step(s: Suite) -> dict:
    """benchmarks/test_cifar_scale.py at ViT-B/16 224 px: few-shot, k-NN and the linear probe on
    50,000 + 10,000 generated 32x32 JPEGs, each against a bare timm + numpy / scikit-learn script,
    then all three in one command against the extraction floor; figures into OUT/cifar-scale.json."""
    report = s.out / "cifar-scale.json"
    run = s.sh(
        [sys.executable, "-m", "pytest", "benchmarks/test_cifar_scale.py", "-q", "-s", "-p", "no:cacheprovider",
         *(["--benchmark-disable"] if s.quick else ["--benchmark-only", "--benchmark-json", str(report)])],
        limit=540,
        env={"VITBENCH_CIFAR_MODEL": "vit-ti/16@32" if s.quick else "vit-b/16@224",
             "VITBENCH_CIFAR_DIR": str(s.work / "cifar-jpegs"),
             # the bare scikit-learn sweep over 45,000 x 768 outlasted a 5-minute call (2026-11-26)
             "VITBENCH_CIFAR_COMPARE": "fewshot,knn"},
    )  # fmt: skip
    figures: dict = {"commands": [run]}
    if report.exists():
        figures["figures"] = json.loads(report.read_text())["benchmarks"][0]["extra_info"]
    return figures


def big_step(s: Suite) -> dict:
    jpegs = write_jpeg_folder(s.work / "jpegs", *((64, 32) if s.quick else (1500, 500)))
    configs = ["vit-ti/16@64"] if s.quick else ["vit-l/16@384", "vit-h/14@392"]
    args = ["bench", "--mode", "train", "--dataset", f"folder:{jpegs}", "--results", str(s.results)]
    for c in configs:
        args += ["-c", c]
    args += ["--batch", "32" if s.quick else "512", "--steps", "2", "--warmup", "1", "--rounds", "1"]
    return {"commands": [s.vitbench(*args, limit=420)]}


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


def finetune_step(s: Suite, weights: Path, data_dir: Path, datasets: str) -> dict:
    run = s.vitbench(
        "run", "--protocol", "finetune", "--model", "deit-ti/16", "--weights", str(weights), "--dataset", datasets,
        "--data-dir", str(data_dir), "--results", str(s.results), *(["--smoke"] if s.quick else []),
        limit=3000,
    )  # fmt: skip
    table = s.vitbench("table", "--protocol", "finetune", "--results", str(s.results), "--format", "md", limit=60)
    return {"commands": [run, table]}


def _stored_only(member: tarfile.TarInfo) -> tarfile.TarInfo | None:
    """What the results folder stores (database, shards, predictions), without the feature cache
    or a fine-tune's resume checkpoints: an archive with those (tens of MB a run) was too large to
    come back from a lent machine, and the runs went with it."""
    parts = Path(member.name).parts
    if "cache" in parts[:2] or member.name.endswith((".pt", ".pt.tmp")):
        return None
    return member


def collect(s: Suite) -> None:
    """bench.csv from the store, and the results folder as one archive."""
    if (s.results / "vitbench.duckdb").exists() or (s.results / "shards").exists():
        try:
            from vitbench import store

            frame = store.read_bench(s.results)
            frame.to_csv(s.out / "bench.csv", index=False)
        except Exception as e:  # the archive below still carries everything
            s.say(f"bench.csv not written: {type(e).__name__}: {e}")
        with tarfile.open(s.out / "results.tar.gz", "w:gz") as tar:
            tar.add(s.results, arcname="results", filter=_stored_only)
        shutil.rmtree(s.results)  # only the archive goes back (OUT's files are counted)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="folder for summary.json, bench.csv, log.txt, results.tar.gz")
    parser.add_argument("--steps", default=",".join(STEPS), help=f"comma list of {', '.join(STEPS)}")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: checks the script on a CPU")
    parser.add_argument("--timm-benchmark", type=Path, help="timm's benchmark.py (its repository's)")
    parser.add_argument("--weights", type=Path, help="finetune, eval: the checkpoint (DeiT-Ti)")
    parser.add_argument("--data-dir", type=Path, help="finetune, eval, conformance: the data root (../shared/data)")
    parser.add_argument("--finetune-datasets", default="pets,flowers102")
    parser.add_argument(
        "--deadline", type=float, default=3600, help="seconds for the whole suite; commands stop in time"
    )
    parser.add_argument("--profile", action="store_true", help="fewshot: cProfile stats of each run into OUT")
    args = parser.parse_args()
    chosen = [x.strip() for x in args.steps.split(",") if x.strip()]
    unknown = sorted(set(chosen) - set(STEPS))
    if unknown:
        parser.error(f"--steps: unknown {', '.join(unknown)}; expected some of {', '.join(STEPS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    s = Suite(args.out, args.quick, args.deadline)
    s.profile = args.profile
    runners = {
        "env": lambda: env_step(s),
        "tests": lambda: tests_step(s),
        "eval": lambda: eval_step(s, args.weights, args.data_dir),
        "conformance": lambda: conformance_step(s, args.data_dir),
        "pipelines": lambda: pipelines_step(s),
        "bench": lambda: bench_step(s, args.timm_benchmark),
        "floor": lambda: floor_step(s, args.timm_benchmark),
        "probe": lambda: probe_step(s),
        "fewshot": lambda: fewshot_step(s),
        "cifar": lambda: cifar_step(s),
        "big": lambda: big_step(s),
        "frozen": lambda: frozen_step(s),
        "finetune": lambda: finetune_step(s, args.weights, args.data_dir, args.finetune_datasets),
    }
    for name in chosen:
        if name in ("finetune", "eval", "conformance") and not (args.weights and args.data_dir):
            s.summary["steps"][name] = {"ok": False, "error": "needs --weights and --data-dir"}
            continue
        s.step(name, runners[name])
    collect(s)
    s.summary["finished"] = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    s.save()
    s.say(json.dumps({k: {"ok": v.get("ok"), "wall": v.get("wall_seconds")} for k, v in s.summary["steps"].items()}))


if __name__ == "__main__":
    main()

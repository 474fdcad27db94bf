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
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from gpu_runner import Suite, write_cifar10, write_jpeg_folder
from gpu_solves import frozen_step, probe_step

STEPS = (
    "env", "tests", "eval", "conformance", "pipelines", "bench", "floor", "probe", "fewshot", "cifar", "big", "frozen",
    "finetune",
)  # fmt: skip


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

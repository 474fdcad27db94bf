"""Cross-device conformance: the same weights and images through every input pipeline and precision
a device offers, each run's per-image predictions compared with the CPU reference (PIL decoding and
resizing in DataLoader workers, fp32: what timm's and big_vision's own evaluation compute).

    python tests/conformance.py OUT [--device cuda] [--cifar-cut 1102,1017]   (nox -s conformance)

It runs `vitbench run` (the Python API, as a user's script does) for DeiT-Ti from ../shared/data:
eval on the 500 ImageNet val images, few-shot (1/5/10/25 shots x 3 seeds), k-NN (k = 20) and the
linear probe on the CIFAR-10 subset, once per path into its own results folder, then writes
OUT/conformance.json and prints a Markdown table: per path and protocol, the images whose top-1
differs from the reference's (summed over the protocol's runs), whether the run keys are the
reference's, and the accuracy. A path whose pixels and arithmetic are the reference's must share its
keys and give its predictions; one that differs in either must have keys of its own
(tests/test_conformance.py asserts both on the CPU, where CI runs it).
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

# ../shared/data beside the checkout, or where VITBENCH_SHARED_DATA says (a GPU machine's copy)
SHARED_DATA = Path(os.environ.get("VITBENCH_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
DEIT_WEIGHTS = SHARED_DATA / "weights" / "deit_tiny_patch16_224.safetensors"
REFERENCE = ("cpu", "workers", "fp32")


@dataclass(frozen=True)
class Route:
    """One way through the pipeline: the device, the input pipeline, the precision."""

    device: str
    pipeline: str
    precision: str

    @property
    def name(self) -> str:
        return f"{self.device}-{self.pipeline}-{self.precision}"


def paths_on(device: str) -> list[Route]:
    """The reference first, then every pipeline and precision `device` offers (bf16 on a CPU is
    left out: slow there, and no one's reference)."""
    if device == "cpu":
        return [Route(*REFERENCE), Route("cpu", "device", "fp32")]
    return [Route(*REFERENCE)] + [
        Route(device, pipeline, precision)
        for pipeline in ("workers", "device", "nvjpeg")
        for precision in ("fp32", "bf16")
    ]


def cut_cifar10(source: Path, target: Path, n_train: int, n_test: int) -> Path:
    """The shared CIFAR-10 pickles cut to their first images (the same layout): a data dir."""
    folder = target / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "batches.meta").write_bytes((source / "batches.meta").read_bytes())
    for name, n in (("data_batch_1", n_train), ("test_batch", n_test)):
        with open(source / name, "rb") as f:
            batch = pickle.load(f, encoding="latin1")
        cut = {k: (v[:n] if k in ("data", "labels", "filenames") else v) for k, v in batch.items()}
        with open(folder / name, "wb") as f:
            pickle.dump(cut, f, protocol=2)
    return target


def run_path(path: Route, out: Path, imagenet_dir: Path | None, cifar_dir: Path | None, workers: int) -> Path:
    """Every protocol of the suite through one path, into OUT/<path>; returns that results folder."""
    import vitbench

    results = out / path.name
    common = dict(model="deit-ti/16", weights=str(DEIT_WEIGHTS), device=path.device, input_pipeline=path.pipeline,
                  precision=path.precision, workers=workers, results=results)  # fmt: skip
    if imagenet_dir is not None:
        vitbench.run(datasets="imagenet", protocol="eval", data_dir=imagenet_dir, **common)
    if cifar_dir is not None:
        vitbench.run(datasets="cifar10", protocol="fewshot,knn,linear", data_dir=cifar_dir, **common)
    return results


def stored_runs(results: Path) -> dict[tuple, dict]:
    """{(protocol, dataset, axis value, seed): {run_key, accuracy, top1 by image id}}."""
    import vitbench
    from vitbench.store.predictions import read_predictions

    frame = vitbench.results(results, where="metric=accuracy", long=True)
    found = {}
    for row in frame.itertuples():
        axis = row.hparams.get("shots", row.hparams.get("knn_k"))
        predictions = read_predictions(results, row.run_key, row.notes.get("predictions"))
        assert predictions is not None, f"{row.protocol} run {row.run_key[:12]} kept no predictions"
        top1 = dict(zip(predictions["id"], predictions["top1"].astype(int), strict=True))
        found[(row.protocol, row.dataset, axis, int(row.seed))] = {
            "run_key": row.run_key, "accuracy": float(row.value), "top1": top1,
        }  # fmt: skip
    return found


@dataclass
class Agreement:
    """One path's agreement with the reference on one protocol (its runs summed)."""

    path: str
    protocol: str
    runs: int
    differ: int  # images whose top-1 differs from the reference's, over the runs
    total: int  # images scored, over the runs
    same_keys: bool  # every run has the reference run's key
    accuracy: float  # mean over the runs (%)
    reference_accuracy: float


def compare(reference: dict[tuple, dict], other: dict[tuple, dict], path: str) -> list[Agreement]:
    rows = []
    for protocol in sorted({key[0] for key in reference}):
        keys = [key for key in reference if key[0] == protocol]
        missing = [key for key in keys if key not in other]
        assert not missing, f"{path}: no run for {missing[0]}"
        differ = total = 0
        for key in keys:
            theirs, ours = reference[key]["top1"], other[key]["top1"]
            assert set(theirs) == set(ours), f"{path} {key}: scored other images than the reference"
            differ += sum(theirs[i] != ours[i] for i in theirs)
            total += len(theirs)
        rows.append(Agreement(
            path, protocol, len(keys), differ, total,
            all(other[key]["run_key"] == reference[key]["run_key"] for key in keys),
            100 * sum(other[key]["accuracy"] for key in keys) / len(keys),
            100 * sum(reference[key]["accuracy"] for key in keys) / len(keys),
        ))  # fmt: skip
    return rows


def markdown(rows: list[Agreement]) -> str:
    lines = [
        "| path (device · pipeline · precision) | protocol | runs | top-1 differs / images | run keys | accuracy (%) "
        "| reference (%) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        keys = "the reference's" if r.same_keys else "its own"
        lines.append(
            f"| {r.path.replace('-', ' · ')} | {r.protocol} | {r.runs} | {r.differ} / {r.total} | {keys} "
            f"| {r.accuracy:.2f} | {r.reference_accuracy:.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--device", default="cpu", help="cpu, or cuda: that device's paths beside the CPU reference")
    parser.add_argument("--cifar-cut", default="1102,1017", help="train,test images of the CIFAR-10 subset to use")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--skip", default="", help="comma list of path names to leave out")
    args = parser.parse_args(argv)
    if not DEIT_WEIGHTS.exists():
        sys.exit(f"{SHARED_DATA}: not present (the suite runs on the shared real data)")
    args.out.mkdir(parents=True, exist_ok=True)
    n_train, n_test = (int(v) for v in args.cifar_cut.split(","))
    cifar = cut_cifar10(SHARED_DATA / "cifar-10-batches-py", args.out / "data", n_train, n_test)
    rows: list[Agreement] = []
    reference: dict = {}
    timings = {}
    for path in paths_on(args.device):
        if path.name in args.skip.split(","):
            continue
        started = time.perf_counter()
        results = run_path(path, args.out, SHARED_DATA, cifar, args.workers)
        timings[path.name] = round(time.perf_counter() - started, 1)
        runs = stored_runs(results)
        if path == Route(*REFERENCE):
            reference = runs
        rows += compare(reference, runs, path.name)
        report = {"device": args.device, "seconds": timings, "rows": [asdict(r) for r in rows]}
        (args.out / "conformance.json").write_text(json.dumps(report, indent=1))  # after every path
        (args.out / "conformance.md").write_text(markdown(rows) + "\n")
        print(markdown(rows), flush=True)


if __name__ == "__main__":
    main()

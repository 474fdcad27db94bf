"""k-NN's, few-shot's and the linear probe's memory in the number of train images (`nox -s bench`;
issue 89, item 10 and goal 2: k-NN over 2,000 shard images peaked at 1.03 GB, over 20,000 at 1.30 GB;
200,000 at 1.96 GB).

`vitbench run --protocol knn` of a random ViT-Ti/16 at 32 px over synthetic 256-px JPEGs in
WebDataset shards (benchmarks/test_container_scale.py's), each a process of its own as typed, from
nothing (extraction included), again with its features cached (`--rerun`: the search alone), then
`--protocol fewshot` and `--protocol linear` on the same cache; peak RSS as `/usr/bin/time` reads
it. Held: k-NN from nothing, k-NN cached and few-shot within 1.2x of 2,000's at 200,000 (Xeon,
2026-11-29: 1.18x, 1.19x, 1.16x; from nothing 1.29x before a pass's parts were handed out a batch
at a time and its freed heap given back, 1.46x before a batch's features were copied out of the
tokens they view, 1.87x at first). What grows is the work itself, the features: 768 bytes an image
at ViT-Ti's width. The linear probe's fits are capped at LINEAR_ITERATIONS (memory, not
convergence); what it adds is held to LINEAR_SLACK times its arrays. With `--benchmark-disable` (CI)
200 and 2,000 images, no ratio asserted."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from test_container_scale import _jpegs, _shards

pytest.importorskip("webdataset")

RATIO = 1.2
WIDTH = 192  # ViT-Ti's features
# the linear probe's fits capped at a few L-BFGS iterations: memory, not convergence, is measured (its
# 19-fit λ sweep to CLIP's 1,000 iterations over 200,000 random-init features runs for hours on a CPU)
LINEAR_ITERATIONS = 3
# measured 1.44x (Xeon, 2026-11-29: +625 MiB against 435 MiB of arrays, 1,000 classes: torch's chunked
# L-BFGS); the ~190 MiB beyond the work is not explained yet (issue 89). 2x catches one more full copy.
LINEAR_SLACK = 2.0


def _peak_mib(shards: Path, results: Path, *extra: str, iterations: int | None = None) -> float:
    """Peak RSS of `vitbench run` over the shards, a process of its own. `iterations`: each L-BFGS fit
    of the linear probe capped there (logistic.MAX_ITER, CLIP's 1,000, set in that process)."""
    vitbench = ["-m", "vitbench"] if iterations is None else [
        "-c", f"import sys; import vitbench.engine.logistic as L; L.MAX_ITER = {iterations}; "
        "from vitbench.cli import main; main()"]  # fmt: skip
    command = [sys.executable, "-c", "import resource, subprocess, sys; "
               "done = subprocess.run(sys.argv[1:]); "
               "print('PEAK', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(done.returncode)",
               sys.executable, *vitbench, "run", "--model", "vit-ti/16", "--weights", "random",
               "--dataset", f"wds:{shards}", "--res", "32", "--results", str(results),
               *extra]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=3600)
    assert done.returncode == 0, done.stderr[-2000:]
    return int(done.stdout.split("PEAK")[-1].split()[0]) / 1024


def test_knn_and_fewshot_memory_is_flat_in_the_number_of_train_images(tmp_path, request):
    sizes = (200, 2_000) if request.config.getoption("benchmark_disable") else (2_000, 200_000)
    jpegs = _jpegs()
    peaks: dict[str, dict[int, float]] = {
        "k-NN from nothing": {}, "k-NN, features cached": {}, "few-shot, cached": {}, "linear probe, cached": {}
    }  # fmt: skip
    for n in sizes:
        shards, results = _shards(tmp_path / f"wds-{n}", n, jpegs), tmp_path / f"results-{n}"
        peaks["k-NN from nothing"][n] = _peak_mib(shards, results, "--protocol", "knn")
        peaks["k-NN, features cached"][n] = _peak_mib(shards, results, "--protocol", "knn", "--rerun")
        peaks["few-shot, cached"][n] = _peak_mib(shards, results, "--protocol", "fewshot")
        linear = _peak_mib(shards, results, "--protocol", "linear", iterations=LINEAR_ITERATIONS)
        peaks["linear probe, cached"][n] = linear
    for way, found in peaks.items():
        ratio = found[sizes[1]] / found[sizes[0]]
        print(f"\n{way}: " + ", ".join(f"{n:,} images {mib:.0f} MiB" for n, mib in found.items()) +
              f"; ratio {ratio:.2f}x")  # fmt: skip
        if sizes[0] == 2_000 and not way.startswith("linear"):
            assert ratio <= RATIO, (way, found)
    # the linear probe's solve is float64 (the reference's numbers): what it adds is held to a multiple
    # of the work, the train features and their float64 copy; its ratio is printed
    added, work = (peaks["linear probe, cached"][sizes[1]] - peaks["linear probe, cached"][sizes[0]],
                   (sizes[1] - sizes[0]) * WIDTH * (4 + 8) / 2**20)  # fmt: skip
    print(f"linear probe: +{added:.0f} MiB from {sizes[0]:,} to {sizes[1]:,} images; the work's arrays {work:.0f} MiB")
    if sizes[0] == 2_000:
        assert added <= LINEAR_SLACK * work, (added, work)

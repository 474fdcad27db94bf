"""k-NN's memory flat in the number of train images (`nox -s bench`; issue 89, item 10 and goal 2:
k-NN over 2,000 shard images peaked at 1.03 GB, over 20,000 at 1.30 GB; 200,000 at 1.96 GB).

`vitbench run --protocol knn` of a random ViT-Ti/16 at 32 px over synthetic 256-px JPEGs in
WebDataset shards (benchmarks/test_container_scale.py's), each a process of its own as typed, from
nothing (extraction included) and again with its features cached (`--rerun`: the search alone);
peak RSS as `/usr/bin/time` reads it. Held: the search over 200,000 images within 1.2x of 2,000's
(what grows is the work itself, the features: 768 bytes an image at ViT-Ti's width; the similarity
block is at most 2^22 values and the train features are normalised a chunk at a time). Printed, not
held: the run from nothing (Xeon, 2026-11-29: 1.46x, where extraction's last merge of a chunk into
the held features still has them twice; 1.87x before). With `--benchmark-disable` (CI) 200 and
2,000 images, no ratio asserted."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from test_container_scale import _jpegs, _shards

pytest.importorskip("webdataset")

RATIO = 1.2


def _peak_mib(shards: Path, results: Path, *extra: str) -> float:
    command = [sys.executable, "-c", "import resource, subprocess, sys; "
               "done = subprocess.run(sys.argv[1:]); "
               "print('PEAK', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(done.returncode)",
               sys.executable, "-m", "vitbench", "run", "--model", "vit-ti/16", "--weights", "random",
               "--dataset", f"wds:{shards}", "--protocol", "knn", "--res", "32", "--results", str(results),
               *extra]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=3600)
    assert done.returncode == 0, done.stderr[-2000:]
    return int(done.stdout.split("PEAK")[-1].split()[0]) / 1024


def test_knn_memory_is_flat_in_the_number_of_train_images(tmp_path, request):
    sizes = (200, 2_000) if request.config.getoption("benchmark_disable") else (2_000, 200_000)
    jpegs = _jpegs()
    peaks: dict[str, dict[int, float]] = {"from nothing": {}, "features cached": {}}
    for n in sizes:
        shards = _shards(tmp_path / f"wds-{n}", n, jpegs)
        peaks["from nothing"][n] = _peak_mib(shards, tmp_path / f"results-{n}")
        peaks["features cached"][n] = _peak_mib(shards, tmp_path / f"results-{n}", "--rerun")
    for way, found in peaks.items():
        ratio = found[sizes[1]] / found[sizes[0]]
        print(f"\nk-NN, {way}: " + ", ".join(f"{n:,} images {mib:.0f} MiB" for n, mib in found.items()) +
              f"; ratio {ratio:.2f}x")  # fmt: skip
        if sizes[0] == 2_000 and way == "features cached":
            assert ratio <= RATIO, (way, found)

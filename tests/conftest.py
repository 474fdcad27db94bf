"""Shared fixtures: small real data written in the datasets' own on-disk formats, and the CLI."""

from __future__ import annotations

import pickle
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
DEIT_WEIGHTS = SHARED_DATA / "weights" / "deit_tiny_patch16_224.safetensors"
needs_shared_data = pytest.mark.skipif(not DEIT_WEIGHTS.exists(), reason="../shared/data is not present")


def write_cifar_batch(path: Path, n: int, num_classes: int, label_key: str, seed: int = 0) -> None:
    """One batch in the original CIFAR pickle layout: N x 3072 uint8 rows (CHW), labels list."""
    rng = np.random.default_rng(seed)
    labels = [int(i % num_classes) for i in range(n)]
    # class-dependent colour so a linear probe has something to find
    data = rng.integers(0, 60, size=(n, 3072), dtype=np.uint8)
    for i, y in enumerate(labels):
        data[i, (y % 3) * 1024 : (y % 3 + 1) * 1024] += np.uint8(40 + 15 * (y % 10))
    batch = {
        "batch_label": "testing batch",
        label_key: labels,
        "data": data,
        "filenames": [f"img_{i}.png" for i in range(n)],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        pickle.dump(batch, f, protocol=2)


def write_image(path: Path, mode: str = "RGB", size=(40, 30), seed: int = 0) -> None:
    """A real image file; greyscale, CMYK and palette modes exercise the RGB conversion."""
    rng = np.random.default_rng(seed)
    img = Image.fromarray(rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8))
    if mode != "RGB":
        img = img.convert(mode)
    path.parent.mkdir(parents=True, exist_ok=True)
    img.save(path, format="JPEG" if mode in ("RGB", "L", "CMYK") else "PNG")


@pytest.fixture
def cifar10_dir(tmp_path: Path) -> Path:
    root = tmp_path / "data"
    write_cifar_batch(root / "cifar-10-batches-py" / "data_batch_1", 60, 10, "labels", seed=1)
    write_cifar_batch(root / "cifar-10-batches-py" / "test_batch", 40, 10, "labels", seed=2)
    return root


@pytest.fixture
def imagenet_dir(tmp_path: Path) -> Path:
    """val/<synset>/ILSVRC2012_val_*.JPEG for two real synsets, as JPEG files."""
    root = tmp_path / "data"
    rng = np.random.default_rng(0)
    for synset, n in [("n01440764", 3), ("n15075141", 2)]:  # first and last of the canonical order
        folder = root / "imagenet" / "val" / synset
        folder.mkdir(parents=True)
        for i in range(n):
            Image.fromarray(rng.integers(0, 255, (40, 48, 3), dtype=np.uint8)).save(
                folder / f"ILSVRC2012_val_{i:08d}.JPEG"
            )
    return root


@pytest.fixture
def results(tmp_path: Path) -> Path:
    """A results folder that does not exist yet (vitbench creates it)."""
    return tmp_path / "results"


@pytest.fixture
def cli(capsys, monkeypatch):
    """Run `vitbench ARGS` in-process; returns (exit code, stdout, stderr)."""
    from vitbench import cli as cli_module

    # rich wraps to the terminal width, read once when the console is made: widen both consoles
    # so that a table cell holding a long path (CI's checkout may be deep) stays on one line.
    for console in (cli_module.out, cli_module.err):
        monkeypatch.setattr(console, "width", 1000)

    def run(*args: str) -> tuple[int, str, str]:
        from vitbench.cli import main

        monkeypatch.setattr(sys, "argv", ["vitbench", *map(str, args)])
        with pytest.raises(SystemExit) as exit_info:
            main()
        captured = capsys.readouterr()
        return int(exit_info.value.code or 0), captured.out, captured.err

    return run

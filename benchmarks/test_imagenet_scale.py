"""An ImageNet-sized tree, planned and run (`nox -s bench`): 1,000 classes × 300 train and × 50 val
tiny JPEGs in ImageNet's layout (350,000 files), a random ViT-Ti/16 at 32 px, 1-shot few-shot.
Where the time goes per image — listing, fingerprinting, planning, the run (sampling, decode,
forward, solve, store) — against a bare loop that decodes and forwards the same images.

With `--benchmark-disable` (CI) the tree is 20 classes × 6 × 2 and the run happens once."""

from __future__ import annotations

import io
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import vitbench
from vitbench.catalog import registry
from vitbench.datasets import DATASETS, imagenet_synsets
from vitbench.protocols.registry import get_protocol
from vitbench.provenance import fingerprint_files

FULL = (1000, 300, 50)  # classes, train and val images per class
SMALL = (20, 6, 2)
# one process each (no DataLoader workers), the same batch as the bare loop's
RUN = dict(model="vit-ti/16", weights="random", datasets="imagenet", res=32, shots=(1,), seeds=(0,), workers=0,
           extraction_batch=256)  # fmt: skip


@pytest.fixture(scope="module")
def tree(request, tmp_path_factory) -> tuple[Path, tuple[int, int, int]]:
    """data/imagenet/{train,val}/<synset>/ with one tiny JPEG's bytes per class, written n times."""
    classes, train, val = SMALL if request.config.getoption("benchmark_disable") else FULL
    root = tmp_path_factory.mktemp("imagenet-scale") / "data"
    rng = np.random.default_rng(0)
    number = 0
    for synset in imagenet_synsets(root)[:classes]:
        buffer = io.BytesIO()
        Image.fromarray(rng.integers(0, 255, (16, 16, 3), dtype=np.uint8)).save(buffer, format="JPEG")
        jpeg = buffer.getvalue()
        for split, count in (("train", train), ("val", val)):
            folder = root / "imagenet" / split / synset
            folder.mkdir(parents=True)
            for i in range(count):
                number += split == "val"
                name = f"ILSVRC2012_val_{number:08d}.JPEG" if split == "val" else f"{synset}_{i}.JPEG"
                (folder / name).write_bytes(jpeg)
    return root, (classes, train, val)


def test_imagenet_sized_tree_planned_and_run_against_a_bare_loop(benchmark, tree, tmp_path, capsys):
    benchmark.group = "ImageNet-sized tree: plan and run a 1-shot few-shot of a random ViT-Ti @32, per image"
    root, (classes, train, val) = tree
    times: dict[str, float] = {}

    def measure():
        start = time.perf_counter()
        split = DATASETS["imagenet"].load_split(root, "train")
        times["list + fingerprint train"] = time.perf_counter() - start
        start = time.perf_counter()
        fingerprint_files(root / "imagenet", split.paths or [], content=False)
        times["fingerprint train (again, alone)"] = time.perf_counter() - start
        start = time.perf_counter()
        (group,) = vitbench.plan(**RUN, data_dir=root, results=tmp_path / "results")
        times["plan (both splits)"] = time.perf_counter() - start
        start = time.perf_counter()
        summary = vitbench.run(**RUN, data_dir=root, results=tmp_path / "results", rerun=True)
        times["run (plan, sample, decode, forward, solve, store)"] = time.perf_counter() - start
        assert summary.ran == 1
        times.update(_bare(group, root))

    benchmark.pedantic(measure, rounds=1, iterations=1)
    read = classes * 1 + classes * val  # the run reads one drawn train image per class and every val image
    benchmark.extra_info.update({k: v for k, v in times.items()}, images_read=read, files=classes * (train + val))
    bare = times["bare decode + resize"] + times["bare forward"]
    with capsys.disabled():
        print(f"\n  {classes * (train + val):,} files, {read:,} images read by the run")
        files = {"list + fingerprint train": classes * train, "fingerprint train (again, alone)": classes * train,
                 "plan (both splits)": classes * (train + val)}  # fmt: skip
        for name, seconds in times.items():
            per, unit = (seconds / files[name], "file") if name in files else (seconds / read, "image read")
            print(f"  {name:52s} {seconds:7.2f} s  {per * 1e6:8.1f} µs per {unit}")
        run = times["run (plan, sample, decode, forward, solve, store)"]
        print(f"  run / bare decode + forward: {run / bare:.2f}")


def _bare(group, root: Path) -> dict[str, float]:
    """The same images (the drawn train ones, every val one), decoded, resized and forwarded by hand."""
    train, test = (group.splits[name] for name in get_protocol("fewshot").splits(group.dataset))
    first = np.unique(train.labels, return_index=True)[1]  # one image per class, as 1-shot draws
    paths = [train.paths[i] for i in first] + list(test.paths)  # type: ignore[index]
    pre = group.preprocessing
    resize_crop = pre.transform(uint8=True)  # the run's own recipe (TensorFlow's resize), image by image
    start = time.perf_counter()
    pixels = []
    for path in paths:
        with Image.open(path) as image:
            pixels.append(resize_crop(image.convert("RGB")))
    batch = torch.stack(pixels)
    decode = time.perf_counter() - start
    spec = registry.get_model("vit-ti/16")
    model = spec.backend.create(spec, num_classes=0, img_size=32).eval()
    start = time.perf_counter()
    with torch.inference_mode():
        for i in range(0, len(batch), 256):
            spec.backend.features(model, pre.normalize(batch[i : i + 256]))
    return {"bare decode + resize": decode, "bare forward": time.perf_counter() - start}

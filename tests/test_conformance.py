"""The same number on every device: the device input pipeline, run here on the CPU device (the same
tensor operations a GPU runs), gives the reference's pixels and predictions, and whatever moves a
prediction moves the run key. `tests/conformance.py` is the suite; on a GPU `nox -s conformance`
fills docs/performance.md's table with it."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from conformance import Route, compare, cut_cifar10, run_path, stored_runs
from conftest import SHARED_DATA, needs_shared_data

from vitbench.datasets.base import decode
from vitbench.engine import device_eval
from vitbench.models.backend import Preprocessing

pytestmark = needs_shared_data

DEIT = Preprocessing.from_timm("deit_tiny_patch16_224")  # bicubic, shorter side to 248, centre crop 224
IMAGENET = sorted((SHARED_DATA / "imagenet" / "val").glob("*/*.JPEG"))
PHOTOS = (
    sorted((SHARED_DATA / "oxford-iiit-pet" / "images").glob("*.jpg"))[:24]
    + sorted((SHARED_DATA / "flowers-102" / "jpg").glob("*.jpg"))[:24]
)


def both_ways(path: Path, pre: Preprocessing) -> tuple[torch.Tensor, torch.Tensor]:
    """(the workers' pixels: timm's transform on the PIL image, the device path's on its tensor)."""
    image = decode(path)
    workers = pre.transform(uint8=True)(image)
    pixels = torch.from_numpy(np.array(image)).permute(2, 0, 1)
    return workers, device_eval.eval_resize(pixels[None], pre)[0]


def test_the_device_path_gives_pils_pixels_for_the_500_shared_imagenet_jpegs():
    assert len(IMAGENET) == 500
    worst = 0
    for path in IMAGENET:
        workers, device = both_ways(path, DEIT)
        assert device.shape == workers.shape == (3, 224, 224)
        worst = max(worst, int((device.int() - workers.int()).abs().max()))
    assert worst == 0  # the issue asks for ±1; PIL's arithmetic gives every grey level


@pytest.mark.parametrize(
    "pre",
    [
        DEIT,  # shrinking camera-sized photos (~500x375) is where antialiasing shows
        Preprocessing(size=384, crop_pct=1.0, crop_mode="squash", interpolation="bicubic", family="timm"),
        Preprocessing(size=160, crop_pct=0.875, crop_mode="center", interpolation="bilinear", family="timm"),
        Preprocessing(size=224, crop_pct=0.95, crop_mode="center", interpolation="lanczos", family="timm"),
        Preprocessing(size=96, crop_pct=0.875, crop_mode="squash", interpolation="hamming", family="timm"),
    ],
    ids=lambda pre: f"{pre.interpolation}-{pre.crop_mode}-{pre.size}",
)
def test_the_device_path_gives_pils_pixels_for_photos(pre):
    for path in PHOTOS:
        workers, device = both_ways(path, pre)
        assert torch.equal(device, workers), path.name


def test_the_device_path_scores_353_of_500_with_the_cpus_key_and_predictions(deit_imagenet_eval, tmp_path):
    """The reference (the session's DeiT-Ti eval: PIL in the workers) against `--input-pipeline
    device` on the CPU: one run key, the same prediction for every image, 70.60 % and ReaL 76.63 %."""
    reference = stored_runs(deit_imagenet_eval)
    results = run_path(Route("cpu", "device", "fp32"), tmp_path, SHARED_DATA, None, workers=2)
    device = stored_runs(results)
    [row] = compare(reference, device, "cpu-device-fp32")
    assert row.same_keys and row.differ == 0 and row.total == 500
    assert row.accuracy == pytest.approx(70.6)
    import vitbench

    real = vitbench.results(results)["accuracy_real"]
    assert list(real.round(4)) == [0.7663]


def test_what_moves_a_prediction_moves_the_run_key(tmp_path):
    """Every protocol through the workers, the device path and the device path in bf16 (the CPU
    standing in for a GPU), on 100 ImageNet images and 60 + 60 CIFAR-10 images: a path whose
    predictions differ from the reference's anywhere has run keys of its own; the device path's
    pixels are the workers', so it shares their keys and gives their predictions."""
    imagenet = tmp_path / "data"
    for path in IMAGENET[::5]:
        target = imagenet / "imagenet" / "val" / path.parent.name / path.name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, target)
    cifar = cut_cifar10(SHARED_DATA / "cifar-10-batches-py", tmp_path / "cifar", 60, 60)
    runs = {
        route: stored_runs(run_path(route, tmp_path / "out", imagenet, cifar, workers=0))
        for route in (Route("cpu", "workers", "fp32"), Route("cpu", "device", "fp32"), Route("cpu", "device", "bf16"))
    }
    reference, *others = runs.values()
    rows = [row for route, found in list(runs.items())[1:] for row in compare(reference, found, route.name)]
    assert {row.protocol for row in rows} == {"eval", "fewshot", "knn", "linear"}
    for row in rows:
        assert not row.same_keys or row.differ == 0, row  # one key, one set of predictions
    exact = [row for row in rows if row.path == "cpu-device-fp32"]
    assert all(row.same_keys and row.differ == 0 for row in exact), exact
    bf16 = [row for row in rows if row.path == "cpu-device-bf16"]
    assert not any(row.same_keys for row in bf16), bf16  # bf16 is keyed: its own runs, differ or not

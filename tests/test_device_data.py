"""The on-device input pipeline (device_data.py), run here on the CPU device: the same code, the
same draws and the same tensor ops. Images decoded by PIL (in memory, or by the workers) must come
out bit-identical to the worker pipeline; JPEGs decoded by torchvision (nvjpeg's stand-in here)
within one grey level."""

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.io import read_file

from vitbench.catalog.registry import get_model
from vitbench.datasets import DATASETS, Split
from vitbench.engine import device_data, device_eval, training
from vitbench.engine.distributed import World
from vitbench.engine.inference import loader, run_over
from vitbench.engine.train_data import Stream, TrainTransform, train_loader
from vitbench.errors import UserError
from vitbench.models.backend import Preprocessing
from vitbench.weights import build_model

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def digits():
    return DATASETS["digits"].load_split(None, "train").subset("few", np.arange(48))


def jpeg_split(folder: Path, n: int = 12, corrupt: int | None = None) -> Split:
    """Real JPEG files of different sizes (photos are never one size), one of them truncated if asked."""
    rng = np.random.default_rng(0)
    paths = []
    for i in range(n):
        h, w = 40 + 7 * i, 60 - 3 * i
        gradient = np.linspace(0, 255, w)[None, :, None] * np.ones((h, 1, 3))
        pixels = np.clip(gradient + rng.normal(0, 20, (h, w, 3)), 0, 255).astype(np.uint8)
        path = folder / f"img{i:02d}.jpg"
        Image.fromarray(pixels).save(path, quality=90)
        if i == corrupt:
            path.write_bytes(path.read_bytes()[:40])
        paths.append(str(path))
    return Split("photos", "train", np.arange(n) % 3, "folder", "fp", paths=paths)


def both_train(split: Split, crop: str = "inception", flip: bool = True, on_device: bool = False):
    stream = Stream(len(split), 8, 4, seed=5)
    aug = device_data.Augmentation(32, crop, flip)
    held = device_data.DeviceImages(split, CPU, on_device=on_device)
    ours = list(device_data.train_batches(held, split.labels, stream, 0, 3, aug))
    workers = list(train_loader(split, stream, 0, 3, TrainTransform(32, crop, flip), 0, False))
    return ours, workers


@pytest.mark.parametrize("crop,flip", [("inception", True), ("none", True), ("inception", False), ("random", True)])
def test_in_memory_augmentation_is_bit_identical_to_the_workers(digits, crop, flip):
    ours, workers = both_train(digits, crop, flip)
    assert len(ours) == len(workers) == 6  # 3 steps x 2 micro-batches
    for (x, y, i, bad), (x2, y2, i2, bad2) in zip(ours, workers, strict=True):
        assert x.dtype == torch.uint8 and x.shape == (4, 3, 32, 32)
        assert torch.equal(i, i2) and torch.equal(y, y2) and bad == bad2 == []
        assert torch.equal(x, x2)


@pytest.mark.parametrize("on_device", [False, True])
def test_jpeg_augmentation_matches_the_workers(tmp_path, on_device):
    """Decoded by the workers' PIL (auto), exactly the workers' pixels; decoded on the device
    (torchvision's decoder here, nvjpeg on a GPU), within a grey level."""
    split = jpeg_split(tmp_path)
    ours, workers = both_train(split, on_device=on_device)
    for (x, y, i, _), (x2, y2, i2, _) in zip(ours, workers, strict=True):
        assert torch.equal(i, i2) and torch.equal(y, y2)
        assert (x.int() - x2.int()).abs().max() <= (1 if on_device else 0)


@pytest.mark.parametrize("on_device", [False, True])
def test_the_device_decodes_files_only_when_asked(tmp_path, monkeypatch, on_device):
    """`on_device` (`--input-pipeline device`) sends the files' bytes to the device decoder, held or
    streamed; otherwise the workers decode them and the device decoder is never called."""
    calls = []
    real = device_data.decode_many
    monkeypatch.setattr(device_eval, "decode_many", lambda files, *a: calls.append(len(files)) or real(files, *a))
    monkeypatch.setattr(device_data, "decode_many", lambda files, *a: calls.append(len(files)) or real(files, *a))
    split = jpeg_split(tmp_path, n=6)
    for preload in (10**6, 0):
        monkeypatch.setattr(device_data, "PRELOAD_MAX_IMAGES", preload)
        list(device_eval.eval_batches(split, Preprocessing(size=24), 4, CPU, 0, False, on_device))
    assert sum(calls) == (12 if on_device else 0)


@pytest.mark.parametrize("on_device", [False, True])
def test_streamed_jpegs_equal_preloaded_ones(tmp_path, monkeypatch, on_device):
    split = jpeg_split(tmp_path)
    stream = Stream(len(split), 8, 4, seed=1)
    aug = device_data.Augmentation(32, "inception", True)
    images = device_data.DeviceImages(split, CPU, on_device=on_device)
    held = list(device_data.train_batches(images, split.labels, stream, 0, 2, aug))
    streamed = list(device_data.streamed_train_batches(split, stream, 0, 2, aug, CPU, 0, on_device))
    for (x, y, i, _), (x2, y2, i2, _) in zip(held, streamed, strict=True):
        assert torch.equal(x, x2) and torch.equal(y, y2) and torch.equal(i, i2)
    monkeypatch.setattr(device_data, "PRELOAD_MAX_IMAGES", 0)  # eval: the streamed path for a large split
    pre = Preprocessing(size=24)
    streamed_eval = list(device_eval.eval_batches(split, pre, 5, CPU, 0, False, on_device))
    monkeypatch.setattr(device_data, "PRELOAD_MAX_IMAGES", 10**6)
    held_eval = list(device_eval.eval_batches(split, pre, 5, CPU, 0, False, on_device))
    for (x, y, i, _), (x2, y2, i2, _) in zip(held_eval, streamed_eval, strict=True):
        assert torch.equal(x, x2) and torch.equal(y, y2) and torch.equal(i, i2)


@pytest.mark.parametrize("on_device", [False, True])
@pytest.mark.parametrize("crop_mode,antialias", [("squash", True), ("center", True), ("squash", False)])
def test_eval_resize_matches_the_workers_transform(digits, tmp_path, crop_mode, antialias, on_device):
    """In memory, or decoded by the workers' PIL, exactly the workers' pixels, for TensorFlow's
    resize and PIL's (pil_resample.py) alike; decoded on the device, within a grey level."""
    pre = Preprocessing(size=28, crop_pct=0.875, crop_mode=crop_mode, antialias=antialias)
    jpeg_tolerance = 1 if on_device else 0
    for split, tolerance in ((digits, 0), (jpeg_split(tmp_path), jpeg_tolerance)):
        ours = list(device_eval.eval_batches(split, pre, 16, CPU, 0, False, on_device))
        workers = list(loader(split, pre.transform(uint8=True), 16, 0, CPU))
        for (x, y, i, _), (x2, y2, i2, _) in zip(ours, workers, strict=True):
            assert torch.equal(i, i2) and torch.equal(y, y2)
            assert (x.int() - x2.int()).abs().max() <= tolerance


def test_a_corrupt_jpeg_is_named_or_skipped(tmp_path):
    split = jpeg_split(tmp_path, corrupt=3)
    spec = get_model("vit-ti/16")
    model = spec.backend.create(spec, 3, 32)
    pre = Preprocessing(size=32)
    with pytest.raises(UserError, match=r"img03\.jpg: corrupt or truncated image"):
        run_over(spec.backend.features, model, split, pre, CPU, 4, 0, "t", pipeline="device")
    found = run_over(spec.backend.features, model, split, pre, CPU, 4, 0, "t", True, pipeline="device")
    assert len(found.labels) == 11 and 3 not in found.indices and "img03.jpg" in found.skipped[0]
    # decoded by the workers (auto on a GPU): the same file named, the same images kept
    batches = list(device_eval.eval_batches(split, pre, 4, CPU, 0, True, on_device=False))
    assert torch.cat([i for _, _, i, _ in batches]).tolist() == found.indices.tolist()
    assert "img03.jpg: corrupt or truncated image" in batches[0][3][0][1]


@pytest.mark.parametrize("on_device", [False, True])
def test_files_read_by_worker_processes_give_the_batches_read_here(tmp_path, monkeypatch, on_device):
    """Workers send a batch's bytes (or decoded pixels) as one tensor, not a shared-memory
    descriptor per file (a 256-file batch ran out of them on a GPU machine); a file that cannot be
    read is named."""
    monkeypatch.setattr(device_data, "PRELOAD_MAX_IMAGES", 0)  # the streamed path, as for ImageNet
    split = jpeg_split(tmp_path, n=18)
    pre = Preprocessing(size=24)
    here = list(device_eval.eval_batches(split, pre, 4, CPU, 0, False, on_device))
    workers = list(device_eval.eval_batches(split, pre, 4, CPU, 2, False, on_device))
    for (x, y, i, _), (x2, y2, i2, _) in zip(here, workers, strict=True):
        assert torch.equal(x, x2) and torch.equal(y, y2) and torch.equal(i, i2)
    Path(split.paths[5]).unlink()
    batches = list(device_eval.eval_batches(split, pre, 4, CPU, 2, True, on_device))
    assert 5 not in torch.cat([i for _, _, i, _ in batches]).tolist()
    assert "img05.jpg: corrupt or truncated image" in batches[1][3][0][1]


def test_fine_tuning_on_the_device_pipeline_follows_the_same_trajectory(digits, tmp_path):
    """In memory, the device pipeline feeds exactly the worker pipeline's pixels: same losses."""
    spec = get_model("vit-ti/16")
    curves = {}
    for pipeline in ("workers", "device"):
        settings = training.Settings(
            steps=3, batch=8, lr=0.03, warmup=1, res=32, crop="inception", flip=True, precision="fp32", workers=0,
            input_pipeline=pipeline,
        )  # fmt: skip
        model = build_model(spec, 10, 32, "random", pre_logits=False)
        outcome = training.train(
            model, digits, settings, Preprocessing(size=32), CPU, World(), tmp_path / pipeline, "k"
        )
        curves[pipeline] = outcome.curves["train_loss"]
    assert curves["workers"] == curves["device"]


def test_auto_uses_the_device_on_a_gpu_and_workers_on_a_cpu(tmp_path):
    cuda = torch.device("cuda")
    assert device_data.choose("auto", CPU) == "workers"
    assert device_data.choose("auto", cuda) == "device"
    assert device_data.choose("nvjpeg", cuda) == "device" and device_data.choose("device", CPU) == "device"
    # what the device cannot resize as the workers do stays with them
    for pre in (Preprocessing(crop_mode="border"), Preprocessing(interpolation="nearest"), Preprocessing(crop_pct=1.2)):
        assert device_data.choose("device", cuda, pre) == "workers"
    # image files are decoded by the workers' libjpeg under auto and device (nvjpeg repeats 4:2:0
    # colour planes), on the GPU only when asked; a run that asks records the decoder
    assert not any(device_data.decodes_on_device(p) for p in ("auto", "workers", "device"))
    assert device_data.decodes_on_device("nvjpeg")
    files, in_memory = (
        jpeg_split(tmp_path, n=2),
        Split("mem", "test", np.zeros(2, np.int64), "mem", "f", images=np.zeros((2, 8, 8, 3), np.uint8)),
    )
    pre = Preprocessing()
    assert device_data.decoder_note("auto", cuda, pre, [files, in_memory]) is None
    assert device_data.decoder_note("device", cuda, pre, [files]) is None
    assert device_data.decoder_note("nvjpeg", cuda, pre, [files]) == device_data.NVJPEG_DECODER
    assert device_data.decoder_note("nvjpeg", cuda, pre, [in_memory]) is None


@pytest.mark.parametrize("antialias", [True, False])
def test_a_same_sized_batch_is_resized_in_one_call_as_image_by_image(tmp_path, antialias):
    """A val set resized to one size by its uploader (the shared ImageNet subset) goes through one
    batched resize: the same pixels as one call per image."""
    pre = Preprocessing(size=24, crop_pct=0.875, antialias=antialias)
    rng = np.random.default_rng(1)
    images = [torch.from_numpy(rng.integers(0, 256, (3, 50, 40), dtype=np.uint8)) for _ in range(5)]
    batched = device_eval.eval_resize(images, pre)
    one_by_one = torch.stack([device_eval.eval_resize(x[None], pre)[0] for x in images])
    assert batched.shape == (5, 3, 24, 24) and torch.equal(batched, one_by_one)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_batched_nvjpeg_decodes_as_one_call_per_image_and_names_a_corrupt_file(tmp_path):
    split = jpeg_split(tmp_path, n=9)
    cuda = torch.device("cuda")
    files = [read_file(p) for p in split.paths]
    batched = device_data.decode_many(files, cuda, split.paths)
    for image, data, path in zip(batched, files, split.paths, strict=True):
        assert torch.equal(image, device_data._decode_bytes(data, cuda, path))
    (tmp_path / "bad").mkdir()
    bad = jpeg_split(tmp_path / "bad", n=9, corrupt=4)
    found = device_data.decode_many([read_file(p) for p in bad.paths], cuda, bad.paths)
    assert isinstance(found[4], device_data.CorruptImage) and "img04.jpg" in str(found[4])
    assert all(isinstance(x, torch.Tensor) for i, x in enumerate(found) if i != 4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_nvjpeg_repeats_subsampled_colour_planes_so_auto_leaves_files_to_the_workers(tmp_path):
    """Why `decodes_on_device("auto")` is False: nvjpeg (torchvision's flags) decodes a
    4:4:4 JPEG as libjpeg does, but repeats the colour planes of a 4:2:0 one where libjpeg (PIL,
    TensorFlow) interpolates them. If a torchvision release changes that, this fails: revisit auto."""
    rng = np.random.default_rng(0)
    coarse = np.repeat(np.repeat(rng.normal(128, 40, (4, 4, 3)), 8, axis=0), 8, axis=1)
    pixels = np.clip(coarse + rng.normal(0, 30, (32, 32, 3)), 0, 255).astype(np.uint8)
    gap = {}
    for subsampling in (0, 2):  # PIL: 0 is 4:4:4, 2 is 4:2:0
        path = tmp_path / f"s{subsampling}.jpg"
        Image.fromarray(pixels).save(path, quality=90, subsampling=subsampling)
        theirs = torch.from_numpy(np.asarray(Image.open(path).convert("RGB"))).permute(2, 0, 1).int()
        ours = device_data.decode_many([read_file(str(path))] * 2, torch.device("cuda"), [str(path)] * 2)
        gap[subsampling] = float((ours[0].cpu().int() - theirs).abs().float().mean())
    assert gap[0] <= 1.0 and gap[2] > 2 * max(gap[0], 0.5), gap

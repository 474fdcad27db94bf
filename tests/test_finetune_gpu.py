"""What only a GPU can show: bf16 autocast and torch.compile change the speed, not the result.
Skipped (cleanly) where torch sees no CUDA device, as on CI."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vitbench.catalog import registry
from vitbench.datasets import DATASETS
from vitbench.engine import training
from vitbench.engine.distributed import World
from vitbench.models.backend import Preprocessing
from vitbench.weights import build_model

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def curve(tmp_path, key: str, **kw) -> list[float]:
    spec = registry.get_model("vit-ti/16")
    split = DATASETS["digits"].load_split(None, "train").subset("few", np.arange(256))
    settings = training.Settings(
        **{
            **dict(
                steps=20, batch=64, lr=0.03, warmup=4, res=64, crop="inception", flip=True, precision="fp32", workers=2
            ),
            **kw,
        }
    )
    model = build_model(spec, 10, 64, "random", pre_logits=False)
    device = torch.device("cuda")
    outcome = training.train(model, split, settings, Preprocessing(size=64), device, World(), tmp_path / key, key)
    return outcome.curves["train_loss"]


def test_bf16_follows_the_fp32_trajectory(tmp_path):
    fp32, bf16 = curve(tmp_path, "fp32"), curve(tmp_path, "bf16", precision="bf16")
    assert np.allclose(bf16, fp32, rtol=0.05, atol=0.02)


def test_compile_gives_the_eager_trajectory(tmp_path):
    eager = curve(tmp_path, "eager", precision="bf16")
    compiled = curve(tmp_path, "compiled", precision="bf16", compile=True)
    assert np.allclose(compiled, eager, rtol=0.02, atol=0.01)


def test_device_pipeline_follows_the_worker_pipeline_on_the_gpu(tmp_path):
    """nvjpeg/CUDA resampling differ from PIL by at most a grey level: the trajectory stays."""
    workers = curve(tmp_path, "w", precision="bf16", input_pipeline="workers")
    device = curve(tmp_path, "d", precision="bf16", input_pipeline="device")
    assert np.allclose(device, workers, rtol=0.02, atol=0.01)


def test_memory_plan_measures_and_checkpointing_keeps_the_trajectory(tmp_path):
    from vitbench.engine import memory

    spec = registry.get_model("vit-b/16")
    model = build_model(spec, 10, 224, "random", pre_logits=False).cuda()
    settings = training.Settings(
        steps=1, batch=64, lr=0.01, warmup=0, res=224, crop="inception", flip=True, precision="bf16"
    )
    plain = memory.measure_footprint(model, settings, torch.device("cuda"), checkpointing=False)
    ckpt = memory.measure_footprint(model, settings, torch.device("cuda"), checkpointing=True)
    assert 0 < ckpt.per_image < plain.per_image  # recomputing activations keeps fewer of them
    eager = curve(tmp_path, "plain", precision="bf16", checkpointing=False)
    recomputed = curve(tmp_path, "ckpt", precision="bf16", checkpointing=True)
    assert np.allclose(recomputed, eager, rtol=0.02, atol=0.01)


def test_extraction_on_the_gpu_gives_the_cpu_features():
    """The batches made on a side stream and the outputs' asynchronous copies to the host are
    complete before they are read: every image's features, in split order, exactly as one batch at
    a time on the main stream, each copied back synchronously; and, within the device resize's grey
    level and cuDNN's TF32 patch embedding, as the CPU computes them."""
    from vitbench.engine import device_eval
    from vitbench.engine.inference import _full_batch, run_over

    spec = registry.get_model("vit-ti/16")
    split = DATASETS["digits"].load_split(None, "train").subset("few", np.arange(300))
    model = build_model(spec, 0, 32, "random", pre_logits=False)
    pre = Preprocessing(size=32)
    cuda = torch.device("cuda")
    cpu = run_over(spec.backend.features, model, split, pre, torch.device("cpu"), 64, 0, "cpu")
    gpu = run_over(spec.backend.features, model, split, pre, cuda, 64, 0, "gpu", pipeline="device")
    with torch.inference_mode():  # each batch padded to 64 as run_over pads it: the same matrix shapes
        one_by_one = [
            _full_batch(spec.backend.features, model, pre.normalize(x), 64).float().cpu()
            for x, *_ in device_eval._eval_batches_here(split, pre, 64, cuda, 0)
        ]
    assert np.array_equal(gpu.indices, cpu.indices) and np.array_equal(gpu.labels, cpu.labels)
    assert np.allclose(gpu.values, torch.cat(one_by_one).numpy(), atol=1e-6, rtol=1e-6)
    # the CPU resizes with PIL, the device with torchvision (a grey level apart), and cuDNN's
    # patch-embedding convolution runs in TF32: each image's features point the same way (about
    # 0.1 % apart elementwise on an H200), which a missing or misplaced row would not
    cosine = (gpu.values * cpu.values).sum(1) / np.linalg.norm(gpu.values, axis=1) / np.linalg.norm(cpu.values, axis=1)
    assert cosine.min() > 0.99

"""A dry run's micro-benchmark: a few seconds of timed passes of random images through a model at
random init, on this device (execution/estimate.py `micro_rate` keeps what it measures)."""

from __future__ import annotations

import time

import torch

from vitbench.engine.bench import _fresh_model, _timed
from vitbench.engine.optimization import fusable
from vitbench.host.devices import autocast
from vitbench.models.backend import ModelSpec

# the forward rate a dry run estimates with: batches of this many images (extraction runs 64; one
# image left a CPU's threads half idle), one untimed, then timed until both counts below are reached
RATE_IMAGES, RATE_PASSES, RATE_SECONDS, RATE_MAX_PASSES = 8, 5, 2.0, 12


def forward_rate(
    spec: ModelSpec,
    res: int,
    device: torch.device,
    precision: str | None = None,
    batch: int = RATE_IMAGES,
    mode: str = "inference",
) -> tuple[list[float], float]:
    """A few seconds' micro-benchmark: the FLOP/s of each timed pass of random images through the
    model at random init, fp32 on a CPU, bf16 autocast on an accelerator. What a dry run estimates
    with where `vitbench bench` has measured nothing on this device. At least RATE_PASSES passes
    and RATE_SECONDS seconds after an untimed one, so that their median holds still and their
    spread says how steady this machine is now (one timed image, as before, swung 60-fold on a
    loaded 2-core machine). The untimed pass is of one image; the timed ones of `batch` (the run's:
    per image, DeiT-Ti at 224 px ran 93 images/s in batches of 8 and 78 in batches of 64 on this
    CPU), or as many as take 2 s at that pace (a ViT-L at 384 px on a CPU: one). `mode` "train":
    each pass a training step (forward, backward, an SGD step), its FLOPs three forward passes', as
    the estimate counts them (the demo's pre-training ran at half the forward rate's pace).
    `precision`: another than the device's own (bf16 on a CPU: what a run with `--precision bf16`
    pays). Returns the FLOP/s and the seconds making the model took (its layers' random init: what
    loading weights into it adds to reading the file)."""
    assert spec.backend is not None
    start = time.perf_counter()
    model = _fresh_model(spec, res, 1000).to(device)
    made = time.perf_counter() - start
    precision = precision or ("bf16" if device.type != "cpu" else "fp32")
    training = mode == "train"
    model.train(training)
    params = list(model.parameters())  # fused where the run is (optimization.fusable)
    optimizer = torch.optim.SGD(params, lr=1e-4, momentum=0.9, fused=fusable(params)) if training else None

    def one_pass(images: torch.Tensor) -> None:
        if optimizer is None:
            with torch.inference_mode(), autocast(device, precision):
                model(images)
            return
        with autocast(device, precision):
            loss = model(images).float().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    one = torch.randn(1, 3, res, res, device=device)
    images = max(1, min(batch, int(2.0 / max(_timed(lambda: one_pass(one), device), 1e-9))))
    inputs = torch.randn(images, 3, res, res, device=device)
    times: list[float] = []
    while len(times) < RATE_MAX_PASSES and (len(times) < RATE_PASSES or sum(times) < RATE_SECONDS):
        times.append(_timed(lambda: one_pass(inputs), device))
    flops = images * spec.backend.flops_per_image(spec, res) * (3 if training else 1)
    return [flops / max(t, 1e-9) for t in times], made

"""The fine-tuning protocol: schedule, clipping, head, position embeddings, the input stream,
determinism, EMA. End-to-end CLI runs (sweep, resume after SIGKILL, DDP) are in test_finetune_cli.py."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import scipy.ndimage
import torch

from vitbench.catalog import registry
from vitbench.datasets import DATASETS
from vitbench.engine import training
from vitbench.engine.distributed import World
from vitbench.engine.train_data import Stream
from vitbench.host.devices import peak_flops
from vitbench.models.backend import Preprocessing
from vitbench.protocols import finetune as finetune_protocol
from vitbench.weights import build_model

VIT_TI = registry.get_model("vit-ti/16")
CPU = torch.device("cpu")


def vit_jax_cosine(step, base_lr, total_steps, warmup_steps):
    """vit_jax/utils.py::create_learning_rate_schedule(decay_type='cosine'), transcribed (jnp -> np)."""
    progress = (step - warmup_steps) / float(total_steps - warmup_steps)
    progress = np.clip(progress, 0.0, 1.0)
    lr = base_lr * 0.5 * (1.0 + np.cos(np.pi * progress))
    if warmup_steps:
        lr = lr * np.minimum(1.0, step / warmup_steps)
    return np.asarray(lr, dtype=np.float64)


@pytest.mark.parametrize(("total", "base"), [(500, 0.003), (10_000, 0.01), (2_500, 0.01), (20, 0.03)])
def test_schedule_equals_vit_jax_step_by_step(total, base):
    warmup = finetune_protocol.warmup_steps(total)
    assert warmup == {500: 100, 10_000: 500, 2_500: 500, 20: 4}[total]
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=base, momentum=0.9)
    scheduler = training.schedule(optimizer, total, warmup)
    for step in range(total):
        scheduler.step_update(step)
        assert optimizer.param_groups[0]["lr"] == pytest.approx(
            float(vit_jax_cosine(step, base, total, warmup)), abs=1e-12
        )


def test_table4_settings():
    assert finetune_protocol.table4(DATASETS["imagenet"], 1_281_167) == (20_000, (0.003, 0.01, 0.03, 0.06))
    assert finetune_protocol.table4(DATASETS["cifar100"], 50_000) == (10_000, (0.001, 0.003, 0.01, 0.03))
    assert finetune_protocol.table4(DATASETS["pets"], 3_680)[0] == 500
    assert finetune_protocol.table4(DATASETS["vtab/dtd"], 1_000) == (2_500, (0.01,))
    assert finetune_protocol.table4(DATASETS["digits"], 1_000)[0] == 500  # not in the paper: BiT's size rule


def settings(**kw) -> training.Settings:
    base = dict(steps=4, batch=8, lr=0.03, warmup=1, res=32, crop="inception", flip=True, precision="fp32", workers=0)
    return training.Settings(**{**base, **kw})


@pytest.fixture(scope="module")
def digits():
    return DATASETS["digits"].load_split(None, "train").subset("few", np.arange(64))


def fresh_model():
    return build_model(VIT_TI, 10, 32, "random", pre_logits=False)


def train(model, split, tmp_path: Path, key="k", **kw):
    return training.train(
        model, split, settings(**kw), Preprocessing(size=32), CPU, World(), tmp_path / key / "c.pt", key
    )


def test_clipping_bounds_the_global_norm(digits, tmp_path):
    # one step, no warmup, LR 1: with momentum's buffer empty the update is the clipped gradient itself
    model = fresh_model()
    before = [p.detach().clone() for p in model.parameters()]
    outcome = train(model, digits, tmp_path, steps=1, warmup=0, lr=1.0)
    assert outcome.curves["grad_norm"][0] > training.CLIP_NORM  # the raw gradient was larger: clipping acted
    update = torch.sqrt(sum(((p.detach() - b) ** 2).sum() for p, b in zip(model.parameters(), before, strict=True)))
    assert float(update) == pytest.approx(training.CLIP_NORM, rel=1e-4)
    # without clipping (Table 3's JFT and ImageNet-21k rows) the step is the raw gradient, of its measured norm
    model = fresh_model()
    before = [p.detach().clone() for p in model.parameters()]
    outcome = train(model, digits, tmp_path, key="unclipped", steps=1, warmup=0, lr=1.0, clip_norm=None)
    update = torch.sqrt(sum(((p.detach() - b) ** 2).sum() for p, b in zip(model.parameters(), before, strict=True)))
    assert float(update) == pytest.approx(outcome.curves["grad_norm"][0], rel=1e-4) and float(update) > 1.5


def test_head_starts_at_zero_and_pre_logits_is_dropped(tmp_path):
    source = fresh_model()
    state = {**source.state_dict(), "pre_logits.weight": torch.randn(192, 192), "pre_logits.bias": torch.randn(192)}
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in state.items()}, str(tmp_path / "up.safetensors"))
    model = build_model(VIT_TI, 37, 32, str(tmp_path / "up.safetensors"), pre_logits=False)
    assert torch.count_nonzero(model.head.weight) == 0 and torch.count_nonzero(model.head.bias) == 0
    assert model.head.weight.shape == (37, 192)
    assert not hasattr(model, "pre_logits")  # the whole pre-training head goes (B.1.1)


def test_position_embeddings_are_zoomed_as_vit_jax_does(tmp_path):
    from safetensors.torch import save_file

    source = build_model(VIT_TI, 10, 224, "random")  # a 14x14 grid
    save_file(source.state_dict(), str(tmp_path / "vit.safetensors"))
    model = build_model(VIT_TI, 10, 384, str(tmp_path / "vit.safetensors"), pre_logits=False)  # 24x24
    old = source.pos_embed.detach()
    grid = old[0, 1:].reshape(14, 14, 192).double().numpy()
    expected = scipy.ndimage.zoom(grid, (24 / 14, 24 / 14, 1), order=1)  # vit_jax interpolate_posembed
    assert torch.equal(model.pos_embed[0, 0], old[0, 0])  # the class token's embedding is kept as is
    np.testing.assert_allclose(model.pos_embed[0, 1:].detach().reshape(24, 24, 192).numpy(), expected, atol=1e-6)


def test_stream_is_a_function_of_seed_and_position():
    full = Stream(n=10, batch=4, micro=2, seed=3)
    items = list(full.micro_batches(0, 6))
    assert len(items) == 12 and all(len(b) == 2 for b in items)
    positions = [p for b in items for _, p in b]
    assert positions == list(range(24))
    first_epoch = [i for b in items for i, p in b if p < 10]
    assert sorted(first_epoch) == list(range(10))  # every epoch is a permutation of the split
    assert list(full.micro_batches(4, 6)) == items[8:]  # a resumed stream continues exactly
    # two processes: each takes its half of every global batch, together the same images
    ranks = [list(Stream(10, 4, 1, 3, rank=r, world=2).micro_batches(0, 6)) for r in (0, 1)]
    for step in range(6):
        together = ranks[0][2 * step] + ranks[0][2 * step + 1] + ranks[1][2 * step] + ranks[1][2 * step + 1]
        assert together == items[2 * step] + items[2 * step + 1]


def test_uneven_batch_is_a_clear_error():
    from vitbench.errors import UserError

    with pytest.raises(UserError, match="--batch 10: must split evenly"):
        settings(batch=10, micro_batch=4).micro(1)
    assert settings(batch=8, micro_batch=2).micro(2) == 2


def test_same_seed_same_trajectory_other_seed_another(digits, tmp_path):
    a = train(fresh_model(), digits, tmp_path, "a")
    b = train(fresh_model(), digits, tmp_path, "b")
    c = train(fresh_model(), digits, tmp_path, "c", seed=1)
    assert a.curves["train_loss"] == b.curves["train_loss"] and len(a.curves["train_loss"]) == 4
    assert all(
        torch.equal(x, y) for x, y in zip(a.model.state_dict().values(), b.model.state_dict().values(), strict=True)
    )
    assert a.curves["train_loss"] != c.curves["train_loss"]  # another seed: other images and crops
    assert a.curves["lr"] == pytest.approx([0.0, 0.03, 0.0225, 0.0075])  # warmup 1, then cosine over 3 steps
    assert a.train_images == 4 * 8 and a.restarts == 0 and a.seconds > 0


def test_polyak_evaluates_the_average_not_the_last_weights(digits, tmp_path):
    initial = fresh_model().state_dict()
    frozen = train(fresh_model(), digits, tmp_path, "ema1", polyak=1.0)  # decay 1: the average never moves
    assert all(torch.equal(frozen.model.state_dict()[k], v) for k, v in initial.items())
    tracked = train(fresh_model(), digits, tmp_path, "ema0", polyak=0.0 + 1e-12)  # decay ~0: the last weights
    raw = train(fresh_model(), digits, tmp_path, "raw")
    for k, v in raw.model.state_dict().items():
        torch.testing.assert_close(tracked.model.state_dict()[k], v)


def test_mfu_peaks_are_known_by_device_name():
    assert peak_flops("NVIDIA H100 80GB HBM3") == 989e12
    assert peak_flops("NVIDIA H100 PCIe") == 756e12
    assert peak_flops("NVIDIA H200") == 989e12
    assert peak_flops("NVIDIA A100-SXM4-80GB") == 312e12
    assert peak_flops("CPU: AMD EPYC (2 cores)") is None  # unknown: throughput only, never a guessed MFU
    assert math.isclose(finetune_protocol.smoke_res(14), 70) and finetune_protocol.smoke_res(16) == 64
    assert [finetune_protocol.checkpoint_interval(s) for s in (20, 500, 2_500, 20_000)] == [50, 50, 250, 500]


class RunsOutOfMemoryAbove(torch.nn.Module):
    """A model that fails as a GPU does when a micro-batch is too large (no GPU here to run out)."""

    def __init__(self, model: torch.nn.Module, limit: int):
        super().__init__()
        self.model, self.limit = model, limit

    def forward(self, x):
        if x.shape[0] > self.limit:
            raise torch.OutOfMemoryError(f"{x.shape[0]} images do not fit")
        return self.model(x)


def test_out_of_memory_halves_the_micro_batch_and_redoes_the_same_step(digits, tmp_path):
    limited = train(RunsOutOfMemoryAbove(fresh_model(), 4), digits, tmp_path, "oom", batch=16)
    assert limited.micro_batch == 4  # 16 -> 8 -> 4
    explicit = train(RunsOutOfMemoryAbove(fresh_model(), 4), digits, tmp_path, "four", batch=16, micro_batch=4)
    assert limited.curves["train_loss"] == explicit.curves["train_loss"]  # the same images, the same gradients
    from vitbench.errors import UserError

    with pytest.raises(UserError, match="out of device memory at micro-batch 8; give a smaller --micro-batch"):
        train(RunsOutOfMemoryAbove(fresh_model(), 4), digits, tmp_path, "given", batch=16, micro_batch=8)

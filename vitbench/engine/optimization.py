"""The optimizers, LR schedules and default loss of the training loop (engine/training.py): SGD
with momentum for fine-tuning (App. B.1.1), Adam with decoupled weight decay for pre-training
(App. B.1), linear warmup then cosine or linear decay, as vit_jax's `create_learning_rate_schedule`."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from vitbench.engine import bit_hyperrule
from vitbench.engine.train_settings import Settings

MOMENTUM = 0.9
CLIP_NORM = 1.0
LINEAR_END = 1e-5  # vit_jax/utils.py::create_learning_rate_schedule(linear_end=1e-5): where linear decay ends


def schedule(
    optimizer: torch.optim.Optimizer, total: int, warmup: int, decay_steps: tuple[int, ...] = (), decay: str = "cosine"
):
    """timm's schedulers set up to equal vit_jax's `create_learning_rate_schedule`: linear warmup
    from 0, then cosine (or, for pre-training, linear) to 0; the update at step k (from 0) uses the
    LR of step k, as optax's schedules count updates from 0 (tests/test_finetune.py and
    tests/test_pretrain.py check every step). With `decay_steps`, BiT-HyperRule's warmup and step decay instead."""
    from timm.scheduler import CosineLRScheduler, PolyLRScheduler

    if decay_steps:
        return bit_hyperrule.StepDecay(optimizer, decay_steps)
    if decay == "linear":  # a polynomial of power 1 down to vit_jax's linear_end: lr_end + (lr - lr_end)(1 - progress)
        return PolyLRScheduler(
            optimizer,
            t_initial=total - warmup,
            power=1.0,
            warmup_t=warmup,
            warmup_lr_init=0.0,
            warmup_prefix=True,
            lr_min=LINEAR_END,
            t_in_epochs=False,
        )
    return CosineLRScheduler(
        optimizer,
        t_initial=total - warmup,
        warmup_t=warmup,
        warmup_lr_init=0.0,
        warmup_prefix=True,
        lr_min=0.0,
        t_in_epochs=False,
    )


def make_optimizer(params: list[nn.Parameter], settings: Settings) -> torch.optim.Optimizer:
    """SGD with momentum and no weight decay (fine-tuning, App. B.1.1), or Adam 0.9/0.999 with
    decoupled weight decay scaled by the LR (pre-training, App. B.1: vit_jax used
    flax.optim.Adam(weight_decay=wd), whose update is lr * (adam + wd * param): torch's AdamW)."""
    fused = fusable(params)
    if settings.optimizer == "adamw":
        return torch.optim.AdamW(
            params, lr=settings.lr, betas=(0.9, 0.999), weight_decay=settings.weight_decay, fused=fused
        )
    return torch.optim.SGD(params, lr=settings.lr, momentum=MOMENTUM, weight_decay=settings.weight_decay, fused=fused)


def fusable(params: list[nn.Parameter]) -> bool:
    """Whether torch's fused kernels can update these parameters: one kernel per parameter instead
    of about eight small ops (AdamW: lerp, mul, addcmul, sqrt, div, add, addcdiv, the decay), each
    a parallel region where both threads meet. The same update; on 2 CPU cores a ViT-Ti step at 32
    px took 70 ms instead of 77-80, and beside two busy processes 203-223 ms instead of 251-265
    (docs/performance.md, "A busy machine"). Elsewhere (a device without fused kernels) the
    per-parameter loop, as before."""
    return bool(params) and all(p.device.type in ("cpu", "cuda") and p.is_floating_point() for p in params)


def classification_loss(label_smoothing: float = 0.0):
    """The default objective: cross-entropy summed over the micro-batch (the loop divides by the batch)."""

    def loss(outputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(outputs.float(), labels, reduction="sum", label_smoothing=label_smoothing)

    return loss

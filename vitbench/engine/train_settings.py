"""One fine-tune's settings, and how its batch splits over processes and micro-batches."""

from __future__ import annotations

import math
from dataclasses import dataclass

from vitbench.errors import UserError

# A CPU cannot report running out of memory (the kernel kills the process), so it accumulates
# micro-batches of at most this size unless told otherwise
CPU_MICRO_BATCH = 32


@dataclass(frozen=True)
class Settings:
    """One fine-tune. Everything that changes the numbers goes into the run's hparams (and key);
    `micro_batch`, `compile`, `channels_last`, `workers` and the intervals only change speed."""

    steps: int
    batch: int
    lr: float
    warmup: int
    res: int
    crop: str  # train_data.CROP_MODES: inception (vit_jax), random (BiT, VTAB) or none (some structured VTAB tasks)
    flip: bool  # BiT's train-time random flip (off for some structured VTAB tasks)
    precision: str  # bf16 (autocast) or fp32
    polyak: float | None = None  # parameter EMA, evaluated in place of the raw weights
    # the EMA's decay warmed up as timm's ModelEmaV3 does (1 - (1 + step)^-2/3, up to `polyak`)
    # instead of constant from the pre-trained weights
    polyak_warmup: bool = False
    seed: int = 0
    # BiT-HyperRule (engine/bit_hyperrule.py): its step-decay schedule (the steps: warmup end,
    # decays, end) instead of the cosine, MixUp's alpha, and the square its random crop is taken from
    decay_steps: tuple[int, ...] = ()
    mixup: float = 0.0
    precrop: int | None = None
    # the optimizer: "sgd" (fine-tuning: momentum 0.9, no weight decay) or "adamw" (pre-training:
    # Adam 0.9/0.999 with decoupled weight decay, as flax.optim.Adam(weight_decay=...) in vit_jax)
    optimizer: str = "sgd"
    weight_decay: float = 0.0
    decay: str = "cosine"  # the LR after the warmup: "cosine" or "linear" to 0
    label_smoothing: float = 0.0
    # global-norm gradient clipping: 1 for fine-tuning (App. B.1.1) and Table 3's ImageNet rows; None: none
    clip_norm: float | None = 1.0
    eval_every: int = 0  # steps between validations for early stopping (0: no validation)
    # images per forward/backward pass per process; None: the whole per-process batch on a GPU
    # (halved on an out-of-memory error until it fits), CPU_MICRO_BATCH on a CPU
    micro_batch: int | None = None
    compile: bool = False
    channels_last: bool = False
    workers: int = 1
    # where augmentation runs: "workers" (DataLoader processes, PIL), "device" (device_data: the
    # same draws on the accelerator) or "synthetic" (one random batch on the device: `vitbench bench`)
    input_pipeline: str = "workers"
    # the device pipeline's image files: decoded on the device (nvjpeg; `--input-pipeline device`)
    # instead of by the workers with PIL (device_data.decodes_on_device)
    decode_on_device: bool = False
    # activation checkpointing: None chooses it with the micro-batch from free memory (memory.py)
    checkpointing: bool | None = None
    log_every: int = 50
    checkpoint_every: int = 500
    # the training stream's order: "random" (a permutation of the split each epoch) or "shards" (the
    # container's files in a shuffled order, each file's images shuffled: train_data.Stream); in hparams
    train_order: str = "random"
    timed_from: int = 0  # Outcome.timed_seconds counts from this step (a benchmark's warm-up excluded)

    def micro(self, world: int, device_type: str = "cpu") -> int:
        return micro_batch_size(self.batch, world, self.micro_batch, device_type)


def micro_batch_size(batch: int, world: int, asked: int | None, device_type: str) -> int:
    """Images per forward/backward pass per process, or a one-line error when `batch` does not
    split evenly over the processes and into passes of that size."""
    if batch % world:
        raise UserError(f"--batch {batch}: must split evenly over the {world} processes (--devices)")
    per_process = batch // world
    default = per_process if device_type == "cuda" else math.gcd(per_process, CPU_MICRO_BATCH)
    micro = min(asked or default, per_process)
    if per_process % micro:
        raise UserError(
            f"--batch {batch}: must split evenly over {world} process(es) and into micro-batches of {micro}"
        )
    return micro

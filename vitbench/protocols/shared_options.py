"""Options more than one built-in protocol reads, declared once: one name is one option
(`--seeds` of few-shot, fine-tuning and pre-training; `--steps` of fine-tuning and pre-training)."""

from __future__ import annotations

from dataclasses import dataclass

from vitbench.datasets.base import Split
from vitbench.protocols.bounds import INT32_MAX, MAX_BATCH
from vitbench.protocols.options import FINETUNE_PANEL, WHAT_PANEL, ProtocolOptions, limits, option

SEEDS = (0, 1, 2)  # the paper's three runs per setting (App. B; big_vision's few-shot seeds)


@dataclass(frozen=True)
class SeededOptions(ProtocolOptions):
    seeds: tuple[int, ...] = option(
        SEEDS, "Comma-separated seeds [default: 0,1,2].", panel=WHAT_PANEL, many=True, bound=limits(int, 0, INT32_MAX)
    )


@dataclass(frozen=True)
class TrainingOptions(SeededOptions):
    """What fine-tuning and pre-training both take (None: the protocol's recipe decides)."""

    steps: int | None = option(
        None,
        "finetune, pretrain: optimizer steps [default: Table 4's / 3's].",
        panel=FINETUNE_PANEL,
        kind=int,
        bound=limits(int, 1, INT32_MAX),
    )
    batch: int | None = option(
        None,
        "finetune, pretrain: global batch over all devices [512 / 4096].",
        panel=FINETUNE_PANEL,
        kind=int,
        bound=limits(int, 1, MAX_BATCH),
    )
    micro_batch: int | None = option(
        None,
        "finetune: images per pass per device; the rest is accumulated.",
        panel=FINETUNE_PANEL,
        kind=int,
        bound=limits(int, 1, MAX_BATCH),
    )
    lr: float | None = option(
        None,
        "finetune: a fixed base LR instead of the dev sweep; pretrain: the LR.",
        panel=FINETUNE_PANEL,
        kind=float,
        bound=limits(float, 0, low_open=True),
    )
    smoke: bool = option(
        False,
        "finetune: 20 steps, batch 32, 64 px (pretrain: 50, 64, 48 px); marked, never compared.",
        panel=FINETUNE_PANEL,
    )
    train_order: str = option(
        "random",
        "finetune, pretrain: random (each epoch a permutation of the split: a folder's numbers from any format) "
        "or shards (shard by shard, shards then their images shuffled: sequential reads, for shards on an "
        "object store; hf:, wds:, tfds: splits).",
        panel=FINETUNE_PANEL,
        choices=("random", "shards"),
    )
    checkpoint_every: int | None = option(
        None,
        "finetune: steps between resumable checkpoints [default: steps/10, 50..500].",
        panel=FINETUNE_PANEL,
        kind=int,
        bound=limits(int, 1, INT32_MAX),
    )


# what a run records (and is keyed on) when its training stream goes shard by shard; the default
# (random) records nothing, so the runs made before the option keep their keys
SHARD_ORDER = "shards: each epoch the files in a shuffled order, each file's images shuffled"


def train_order_hparams(o: TrainingOptions, train: Split) -> dict[str, str]:
    """The hparams of --train-order; a split not in shards is refused as the run is planned."""
    if o.train_order != "shards":
        return {}
    train.file_groups()  # a one-line error for a split of files or arrays
    return {"train_order": SHARD_ORDER}


def train_order(h: dict) -> str:
    """The Settings.train_order of a run's hparams."""
    return "shards" if "train_order" in h else "random"

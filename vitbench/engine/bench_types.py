"""What `vitbench bench` measures: a configuration (model @ resolution), the run's options, and one
measured row."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from vitbench.catalog.registry import get_model
from vitbench.errors import UserError

if TYPE_CHECKING:  # a type only: `vitbench bench --help` reads these without loading torch
    import torch

MODES = ("train", "inference")


@dataclass(frozen=True)
class Config:
    model: str
    res: int

    @classmethod
    def parse(cls, text: str) -> Config:
        """`vit-b/16@384`; without `@res`, the model's own resolution."""

        name, _, res = text.partition("@")
        spec = get_model(name.strip())
        if res and not res.isdigit():
            raise UserError(f"--config {text}: expected MODEL@RES, e.g. vit-b/16@384")
        size = int(res) if res else spec.preprocessing.size
        assert spec.backend is not None
        spec.backend.check_img_size(spec, size)
        return cls(spec.name, size)

    def __str__(self) -> str:
        return f"{self.model}@{self.res}"


@dataclass
class Options:
    batch: int
    steps: int
    warmup: int
    precision: str  # bf16 or fp32
    compile: bool
    device: torch.device
    dataset: str = "digits"  # the real data for the real-pipeline rows
    data_dir: Path | None = None
    workers: int = 1
    input_pipeline: str = "auto"
    micro_batch: int | None = None
    timm_script: Path | None = None
    modes: tuple[str, ...] = MODES
    # vitbench and the bare loop are timed alternately, who goes first alternating, and the median
    # round kept: on a shared machine load drifts, and whoever ran second was seen 10-25 % slower
    rounds: int = 1


@dataclass
class Row:
    """One measured throughput: a row of the `bench` table."""

    config: Config
    mode: str  # train or inference
    runner: str  # vitbench, bare or timm
    data: str  # synthetic, or the real dataset's name
    images_per_second: float
    batch: int
    micro_batch: int | None = None
    checkpointing: bool = False
    input_pipeline: str | None = None
    peak_memory_bytes: int | None = None
    mfu: float | None = None
    notes: dict = field(default_factory=dict)

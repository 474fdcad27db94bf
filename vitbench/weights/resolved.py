"""The weights a run starts from, resolved once: `--weights` as the planner reads it (a name, a
file, random init) becomes a `Weights` value that every later layer reads (the engine builds the
model from its path, the frozen-feature protocols key on its representation, the recorder stores
its origin) instead of parsing the string again."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from vitbench.errors import UserError
from vitbench.models.backend import ModelSpec
from vitbench.provenance import sha256_file
from vitbench.weights.names import RANDOM

log = logging.getLogger("vitbench")

ABSENT = "absent:"  # a dry run's weights that are not here yet: planned by name


@dataclass(frozen=True)
class Weights:
    """`path` is `random` or the checkpoint file (named weights resolved to theirs); `sha256` the
    file's (`random` for random init; `absent:<name>` for a dry run's weights not fetched yet). What
    is read from the file (its provenance, whether it carries `pre_logits`) is read on first use."""

    path: str
    sha256: str

    @property
    def kind(self) -> str:
        """random, file, or absent (a dry run's, planned by name)."""
        return "random" if self.path == RANDOM else "absent" if self.sha256.startswith(ABSENT) else "file"

    @property
    def random(self) -> bool:
        return self.kind == "random"

    @cached_property
    def provenance(self) -> dict | None:
        """The pre-training run that wrote the file (weights vitbench pre-trained); None for any other."""
        if self.kind != "file":
            return None
        from vitbench.weights import pretrained

        return pretrained.provenance(self.path)

    @cached_property
    def pre_logits(self) -> bool:
        """Whether the file carries the upstream representation layer (its keys, not its tensors)."""
        if self.kind != "file":
            return False
        from vitbench.weights.loading import has_pre_logits

        return has_pre_logits(self.path)

    @property
    def in21k(self) -> bool:
        """ImageNet-21k weights by their name: the file's, or a Hugging Face cache folder's
        (`models--timm--vit_base_patch16_224.augreg_in21k/...`)."""
        path = Path(self.path)
        return any(
            "in21k" in part.lower() for part in (path.name, *(p for p in path.parts if p.startswith("models--")))
        )

    def __str__(self) -> str:
        return self.path


def resolve(
    text: str, model: ModelSpec, cache: Path | None = None, dry_run: bool = False, download: bool = False
) -> Weights:
    """One `--weights` item for `model`: checked, resolved to its file (fetched first where
    `download`) and fingerprinted (the sha256 cached under `cache`). A dry run plans weights that
    are not here yet by name."""
    from vitbench.weights.loading import check_weights_arg

    try:
        path = check_weights_arg(text, model, download)
    except UserError as e:
        if not dry_run:
            raise
        log.warning("%s; the dry run plans it by name (the run keys change once the file is there)", e)
        return Weights(text, ABSENT + text)
    return Weights(path, RANDOM if path == RANDOM else sha256_file(Path(path), cache))

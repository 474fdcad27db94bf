"""timm weight tags from the local Hugging Face cache, offline only (HF_HUB_OFFLINE=1 is set
before timm is imported: see vitbench/__init__.py). Nothing is ever downloaded."""

from __future__ import annotations

import os
from pathlib import Path

from vitbench.backend import ModelSpec
from vitbench.errors import UserError

FILES = ("model.safetensors", "pytorch_model.bin")


def hub_cache() -> Path:
    """Where huggingface_hub keeps downloads: HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    return Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface")) / "hub"


def resolve_timm_tag(weights: str, spec: ModelSpec | None) -> Path:
    """`timm:<arch>.<tag>` (or `timm:paper`: the paper's upstream weights of --model) -> a cached file."""
    import timm
    from huggingface_hub import try_to_load_from_cache

    name = weights.removeprefix("timm:")
    if name == "paper":
        if spec is None or not spec.paper_tag:
            raise UserError(f"--weights {weights}: {spec.name if spec else 'this model'} has no paper upstream tag")
        name = spec.paper_tag
    cfg = timm.models.get_pretrained_cfg(name)
    if cfg is None or "." not in name:
        raise UserError(f"--weights {weights}: not a timm weights tag (expected timm:<architecture>.<tag>)")
    if spec is not None and name.split(".")[0] != spec.arch:
        raise UserError(f"--weights {weights}: weights for {name.split('.')[0]}, but {spec.name} is {spec.arch}")
    repo = cfg.hf_hub_id or f"timm/{name}"
    cache = hub_cache()
    for filename in FILES:
        found = try_to_load_from_cache(repo, filename, cache_dir=cache)
        if isinstance(found, str):
            return Path(found)
    folder = cache / f"models--{repo.replace('/', '--')}"
    raise UserError(
        f"--weights {weights}: not in the local Hugging Face cache (looked in {folder}); download it on a "
        f"connected machine (huggingface-cli download {repo}) and copy that folder here, or pass --weights FILE"
    )

"""Weights that vitbench pre-trained itself: written as .safetensors under `<results>/weights/`, with
the run's provenance in the file's metadata, and found again by `--weights run:<key>`.

Every protocol reads them as any other checkpoint; a run on them records the pre-training run's
provenance (`notes.pretrained`), so a downstream number names the run that made its weights.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from vitbench.errors import UserError
from vitbench.files.atomic import write_atomic

FOLDER = "weights"
RUN_PREFIX = "run:"
METADATA_KEY = "vitbench"


def weights_file(results: Path, run_key: str, label: str) -> Path:
    """Where a pre-training run's weights go: a readable label, then the run key's first 16 digits."""
    slug = re.sub(r"[^A-Za-z0-9.%+-]+", "-", label).strip("-")
    return results / FOLDER / f"{slug}-{run_key[:16]}.safetensors"


def save(path: Path, state: dict[str, torch.Tensor], provenance: dict) -> None:
    """Write `state` atomically, with `provenance` (JSON) in the safetensors metadata."""
    from safetensors.torch import save_file

    tensors = {k: v.detach().to("cpu").contiguous() for k, v in state.items()}
    metadata = {METADATA_KEY: json.dumps(provenance, sort_keys=True)}
    write_atomic(path, lambda tmp: save_file(tensors, str(tmp), metadata=metadata))


def provenance(path: str | Path) -> dict | None:
    """The pre-training provenance in a weights file vitbench wrote; None for any other file."""
    path = Path(path)
    if path.suffix != ".safetensors" or not path.is_file():
        return None
    from safetensors import safe_open

    try:
        with safe_open(str(path), "pt") as f:
            text = (f.metadata() or {}).get(METADATA_KEY)
    except Exception:
        return None  # unreadable: the loader reports it properly
    if not text:
        return None
    try:
        found = json.loads(text)
    except ValueError:
        found = None
    if not isinstance(found, dict) or not isinstance(found.get("run_key", ""), str):
        raise UserError(f"{path}: its '{METADATA_KEY}' metadata is not the JSON object vitbench writes; damaged?")
    return found


def resolve_run(text: str, results: Path) -> str:
    """`run:<key prefix>` -> the weights file that run wrote, or a one-line error."""
    prefix = text[len(RUN_PREFIX) :].strip()
    if len(prefix) < 4 or not re.fullmatch(r"[0-9a-f]+", prefix):
        raise UserError(
            f"--weights {text}: expected run:<run key> (4+ hex digits; `vitbench table --view pretrain` lists them)"
        )
    folder = results / FOLDER
    found = sorted(folder.glob(f"*-{prefix[:16]}*.safetensors")) if folder.is_dir() else []
    found = [p for p in found if (provenance(p) or {}).get("run_key", "").startswith(prefix)]
    if not found:
        raise UserError(f"--weights {text}: no pre-training run with that key has weights under {folder}")
    if len(found) > 1:
        raise UserError(f"--weights {text}: {len(found)} runs match; give more digits of the key")
    return str(found[0])

"""`--weights paper:<name>`: the checkpoints the paper's authors released, by the names their
READMEs use, kept in vitbench's cache (downloads.cache_root()/weights) and fetched only with
`--download` (or VITBENCH_DOWNLOAD=1).

The lists are those of google-research/vision_transformer's README ("Available models": the
ImageNet-21k upstreams, and the same fine-tuned on ImageNet at 384 px, or 224 px for the "-224"
files; the R50+ViT-B/16 hybrid) and google-research/big_transfer's README (BiT-S and BiT-M
ResNets). Each file is fetched from the same public bucket (VITBENCH_PAPER_WEIGHTS_URL replaces
https://storage.googleapis.com, for a lab mirror), and its size and sha256 are written next to it
(`<file>.json`) when it arrives: a later run checks the file against them before using it."""

from __future__ import annotations

import json
import os
import urllib.parse
from datetime import UTC, datetime
from pathlib import Path

from vitbench.catalog.registry import get_model
from vitbench.errors import UserError
from vitbench.files import downloads
from vitbench.files.atomic import write_atomic
from vitbench.models.backend import ModelSpec
from vitbench.provenance import sha256_file
from vitbench.weights.names import PAPER, PAPER_PREFIX

DEFAULT_BASE = "https://storage.googleapis.com"
UPSTREAM = "imagenet21k"  # `paper:ViT-B_16` without a collection: the pre-trained (not fine-tuned) weights

# collection -> the .npz files in it (vision_transformer's README; big_transfer's for BiT)
VIT_COLLECTIONS = {
    "imagenet21k": ("ViT-B_16", "ViT-B_32", "ViT-L_16", "ViT-L_32", "ViT-H_14", "R50+ViT-B_16"),
    "imagenet21k+imagenet2012": (
        "ViT-B_16",
        "ViT-B_16-224",
        "ViT-B_32",
        "ViT-L_16",
        "ViT-L_16-224",
        "ViT-L_32",
        "R50+ViT-B_16",
    ),
}
BIT_FILES = tuple(
    f"BiT-{kind}-R{depth}x{width}"
    for kind in "SM"
    for depth, width in [(50, 1), (50, 3), (101, 1), (101, 3), (152, 2), (152, 4)]
)
# vitbench's model name of each file (the "-224" fine-tunes and BiT-S share their architecture)
MODEL_OF = {
    **{f"ViT-{s}_{p}": f"vit-{s.lower()}/{p}" for s, p in [("B", 16), ("B", 32), ("L", 16), ("L", 32), ("H", 14)]},
    "ViT-B_16-224": "vit-b/16",
    "ViT-L_16-224": "vit-l/16",
    "R50+ViT-B_16": "r50+vit-b/16",
    **{name: "bit-m-" + name.split("-")[2].lower() for name in BIT_FILES},
}


# `paper` alone: a model's ImageNet-21k upstream (BiT: BiT-M, its ImageNet-21k one)
UPSTREAM_FILES = (*VIT_COLLECTIONS[UPSTREAM], *(name for name in BIT_FILES if name.startswith("BiT-M")))


def names() -> list[str]:
    """Every `paper:` name, for help texts and errors."""
    return [f"{c}/{f}" for c, files in VIT_COLLECTIONS.items() for f in files] + list(BIT_FILES)


def is_paper_name(weights: str) -> bool:
    return weights == PAPER or weights.startswith(PAPER_PREFIX)


def resolve(weights: str, spec: ModelSpec | None, download: bool = False) -> Path:
    """`paper` (the --model's own ImageNet-21k checkpoint), `paper:<file>` or `paper:<collection>/<file>`
    -> the file in the cache, downloaded first where downloads are allowed."""
    collection, name = _parse(weights, spec)
    model = MODEL_OF[name]
    if spec is not None and spec.arch != get_model(model).arch:
        raise UserError(f"--weights {weights}: the checkpoint of {model}, but --model is {spec.name}")
    bucket = "bit_models" if name.startswith("BiT-") else f"vit_models/{collection}"
    url = f"{os.environ.get('VITBENCH_PAPER_WEIGHTS_URL', DEFAULT_BASE).rstrip('/')}/{urllib.parse.quote(bucket)}/"
    url += urllib.parse.quote(f"{name}.npz")
    path = downloads.cache_root() / "weights" / bucket / f"{name}.npz"
    record = path.with_name(path.name + ".json")
    if path.is_file():
        problem = downloads.format_problem(path, ".npz")
        if problem is None:
            _check_against_record(path, record, weights)
            return path
        if not downloads.allowed(download):  # cached before vitbench checked what arrived
            raise UserError(
                f"--weights {weights}: {path} is cached but {problem}; add --download to fetch it again "
                "(it is replaced), or delete it"
            )
        path.unlink()
        record.unlink(missing_ok=True)
    if not downloads.allowed(download):
        raise UserError(
            f"--weights {weights}: not downloaded yet (looked for {path}); add --download (or set "
            f"{downloads.ENV}=1) to fetch {url}, or fetch it on a connected machine into that path"
        )
    fetched = downloads.fetch(url, path, f"--weights {weights}")
    fetched_at = datetime.now(UTC).isoformat()
    write_atomic(record, json.dumps({"url": url, "size": fetched.size, "sha256": fetched.sha256, "at": fetched_at}))
    return path


def _parse(weights: str, spec: ModelSpec | None) -> tuple[str, str]:
    if weights == PAPER:
        own = next((f for f in UPSTREAM_FILES if spec is not None and MODEL_OF[f] == spec.name), None)
        if own is None:
            have = sorted({MODEL_OF[f] for f in UPSTREAM_FILES})
            raise UserError(
                f"--weights paper: {spec.name if spec else 'this model'} has no released paper checkpoint "
                f"(those that do: {', '.join(have)})"
            )
        return UPSTREAM, own
    text = weights.removeprefix(PAPER_PREFIX)
    collection, _, name = text.rpartition("/")
    if name in BIT_FILES and not collection:
        return "", name
    collection = collection or UPSTREAM
    if name not in VIT_COLLECTIONS.get(collection, ()):
        raise UserError(
            f"--weights {weights}: not a released checkpoint (expected paper:<name>, one of: {', '.join(names())})"
        )
    return collection, name


def _check_against_record(path: Path, record: Path, weights: str) -> None:
    """A file that arrived through `fetch` still has the size and sha256 it arrived with (the sha256
    is cached by path, size and mtime, so this reads the file once)."""
    if not record.is_file():
        return  # placed there by hand: used as it is, fingerprinted like any file
    try:
        expected = json.loads(record.read_text())
        size, sha = int(expected["size"]), str(expected["sha256"])
    except (OSError, ValueError, KeyError, TypeError):
        raise UserError(f"{record}: not the record of a download (delete it and the file to fetch again)") from None
    if path.stat().st_size != size or sha256_file(path, downloads.cache_root()) != sha:
        raise UserError(
            f"--weights {weights}: {path} is no longer the file that was downloaded (size or sha256 differ from "
            f"{record.name}); delete both to download it again"
        )

"""Google .npz checkpoints (vit_jax, its scan layout, big_vision; R50+ViT hybrids; BiT), read
through timm's own loaders and checked tensor by tensor.

timm's loaders copy what they find and silently leave the rest at its random init. So the model
is filled with NaN first (any tensor still NaN afterwards was missing from the file), and the
archive timm opens is wrapped to record which arrays it read (any unread array except the head
and `pre_logits` is unexpected). The model is built at the checkpoint's own grid so that timm
does not resize anything; vitbench resizes afterwards, the way vit_jax does.
"""

from __future__ import annotations

import contextlib
import math
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import timm
import torch

from vitbench.errors import UserError, one_line
from vitbench.models.backend import ModelSpec

PREFIXES = ("opt/target/", "params/img/", "params/", "resnet/", "")


def open_npz(path: Path) -> np.lib.npyio.NpzFile:
    try:
        archive = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        detail = one_line(e, 160)
        raise UserError(f"{path}: not a readable .npz archive, truncated or corrupt ({detail})") from None
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise UserError(f"{path}: a single .npy array, expected a keyed .npz checkpoint")
    try:
        _check_numeric(archive, path)
    except UserError:
        archive.close()
        raise
    return archive


def _check_numeric(archive: np.lib.npyio.NpzFile, path: Path) -> None:
    """Every array's header (not its data) says numbers: an object array cannot be read without
    pickle, which vitbench never allows, so it is named here instead of failing on first use."""
    members = archive.zip
    assert members is not None  # an open archive
    for member in members.namelist():
        try:
            with members.open(member) as f:
                version = np.lib.format.read_magic(f)
                read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else None
                dtype = (read_header or np.lib.format.read_array_header_2_0)(f)[2]  # shape, order, dtype
        except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
            raise UserError(f"{path}: entry '{member}' is not a readable array ({one_line(e, 120)})") from None
        name = member.removesuffix(".npy")
        if dtype.hasobject:
            raise UserError(f"{path}: array '{name}' holds Python objects, expected numbers (a weights checkpoint)")
        if dtype.kind in "iub":  # every array of a checkpoint is a weight: cast to float it gave 25.60 % from integers
            raise UserError(
                f"{path}: array '{name}' is {dtype}, expected floating-point values (as a .safetensors file is "
                "refused); saved with the wrong type?"
            )


def npz_keys(path: Path) -> list[str]:
    with open_npz(path) as archive:
        return list(archive.files)


def layout_prefix(keys: list[str]) -> str:
    for prefix in PREFIXES:
        if f"{prefix}embedding/kernel" in keys or f"{prefix}root_block/standardized_conv2d/kernel" in keys:
            return prefix
    raise UserError("not a Google ViT/BiT checkpoint: no embedding/kernel or resnet/root_block in the archive")


class _TrackedArchive:
    """An NpzFile that remembers which arrays were read."""

    def __init__(self, archive):
        self.archive, self.read = archive, set()
        self.files = archive.files

    def __contains__(self, key: str) -> bool:
        return key in self.archive.files

    def __getitem__(self, key: str):
        self.read.add(key)
        return self.archive[key]

    def close(self) -> None:
        self.archive.close()


@contextlib.contextmanager
def _tracking(model: torch.nn.Module) -> Iterator[list[_TrackedArchive]]:
    """Every archive the model's timm module opens while it loads a .npz (the module that defines
    its class: vision_transformer for ViT and the R50 hybrid, resnetv2 for BiT, a plugin's own),
    with the keys it read."""
    opened: list[_TrackedArchive] = []
    module = sys.modules[type(model).__module__]
    modules = [module] if hasattr(module, "_load_npz_checkpoint") else []
    originals = [m._load_npz_checkpoint for m in modules]

    def wrapper(original):
        def load(*args, **kwargs):
            tracked = _TrackedArchive(original(*args, **kwargs))
            opened.append(tracked)
            return tracked

        return load

    with contextlib.ExitStack() as stack:
        for module, original in zip(modules, originals, strict=True):
            stack.enter_context(mock.patch.object(module, "_load_npz_checkpoint", wrapper(original)))
        yield opened


def grid_side(tokens: int) -> int:
    """Side of the square patch grid behind `tokens` position embeddings, with or without a class token."""
    with_class = math.isqrt(tokens - 1)
    return with_class if with_class * with_class == tokens - 1 else math.isqrt(tokens)


def native_img_size(spec: ModelSpec, archive, prefix: str) -> int | None:
    """The resolution a ViT/hybrid checkpoint was trained at, from its position-embedding grid."""
    for key in (f"{prefix}Transformer/posembed_input/pos_embedding", f"{prefix}pos_embedding"):
        if key in archive.files:
            return grid_side(archive[key].shape[-2]) * spec.input_multiple
    return None  # BiT: convolutional, any size


def read_npz(path: Path, spec: ModelSpec) -> dict[str, torch.Tensor]:
    """A timm state dict for `spec` from a Google .npz, every tensor accounted for.

    The head is returned when the file has one (protocols drop it); an upstream representation
    layer comes back as `pre_logits.weight` / `pre_logits.bias` (timm drops it; vitbench keeps it).
    """
    with open_npz(path) as archive:
        keys = list(archive.files)
        try:
            prefix = layout_prefix(keys)
        except UserError as e:
            raise UserError(f"{path}: {e}") from None
        head_key = f"{prefix}head/conv2d/kernel" if prefix == "resnet/" else f"{prefix}head/kernel"
        num_classes = int(archive[head_key].shape[-1]) if head_key in keys else 0
        img_size = native_img_size(spec, archive, prefix)
        pre_logits = {
            name: torch.from_numpy(np.ascontiguousarray(archive[f"{prefix}pre_logits/{part}"].astype(np.float32)))
            for name, part in (("weight", "kernel"), ("bias", "bias"))
            if f"{prefix}pre_logits/{part}" in keys
        }
    assert spec.backend is not None
    kwargs = spec.backend.timm_kwargs(img_size) if img_size else {}
    model = timm.create_model(spec.arch, pretrained=False, num_classes=num_classes, **kwargs)
    with torch.no_grad():
        for tensor in model.state_dict().values():
            if tensor.is_floating_point():
                tensor.fill_(float("nan"))
    loader: Any = model  # timm's VisionTransformer / ResNetV2 .load_pretrained(path, prefix)
    with _tracking(model) as opened, torch.no_grad():
        try:
            loader.load_pretrained(str(path), prefix=prefix) if prefix == "resnet/" else loader.load_pretrained(
                str(path)
            )
        except KeyError as e:
            raise UserError(
                f"{path}: no array {e} that {spec.name} needs; a checkpoint of another architecture?"
            ) from None
        except (RuntimeError, ValueError) as e:
            raise UserError(f"{path}: does not fit {spec.name} ({one_line(e)})") from None
    read = set().union(*(t.read for t in opened)) if opened else set()

    state = model.state_dict()
    missing = [k for k, v in state.items() if v.is_floating_point() and torch.isnan(v).all()]
    if missing:
        raise UserError(
            f"{path}: nothing in the file for '{missing[0]}'"
            + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
        )
    handled = {f"{prefix}pre_logits/kernel", f"{prefix}pre_logits/bias", head_key, head_key.replace("kernel", "bias")}
    extra = sorted(set(keys) - read - handled)
    if extra:
        raise UserError(
            f"{path}: array '{extra[0]}'"
            + (f" (and {len(extra) - 1} more)" if len(extra) > 1 else "")
            + f" is not part of {spec.name}; a checkpoint of another architecture?"
        )
    if pre_logits:
        # Flax Dense kernel (in, out) -> torch Linear weight (out, in)
        state["pre_logits.weight"] = pre_logits["weight"].T.contiguous()
        state["pre_logits.bias"] = pre_logits["bias"]
    return state

"""`vitbench weights inspect` and `convert`: what a weights file holds, read from its shapes alone,
and a one-time conversion of a Google .npz into a safetensors file that loads faster."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import torch

from vitbench.catalog import registry
from vitbench.errors import UserError, one_line
from vitbench.files.atomic import write_atomic
from vitbench.files.out_paths import check_out_file
from vitbench.provenance import sha256_file
from vitbench.weights import apply_state, check_weights_file, read_state_dict
from vitbench.weights.npz import grid_side, layout_prefix, open_npz


def _shapes(path: Path) -> tuple[str, dict[str, tuple[int, ...]]]:
    """(format, {key: shape}) without materialising a model."""
    if path.suffix == ".npz":
        with open_npz(path) as archive:
            shapes = {k: tuple(archive[k].shape) for k in archive.files}
        try:
            prefix = layout_prefix(list(shapes))
        except UserError as e:
            raise UserError(f"{path}: {e}") from None
        layout = {
            "resnet/": "BiT (resnet/)",
            "params/": "big_vision",
            "params/img/": "big_vision",
            "opt/target/": "vit_jax (optimizer)",
        }.get(prefix, "vit_jax")
        if any("Transformer/encoderblock/" in k for k in shapes):
            layout += ", scan"
        return f"Google .npz ({layout})", {k.removeprefix(prefix): v for k, v in shapes.items()}
    if path.suffix == ".safetensors":
        from safetensors import safe_open

        try:
            with safe_open(str(path), "pt") as f:
                return "safetensors (timm)", {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118
        except Exception as e:
            raise UserError(f"{path}: not a readable safetensors file ({one_line(e, 160)})") from None

    return "PyTorch state dict (timm)", {k: tuple(v.shape) for k, v in read_state_dict(path).items()}


def describe(path: Path) -> dict[str, object]:
    """Format, inferred architecture, parameter count, patch/grid/width/depth/heads, head, pre_logits."""

    fmt, shapes = _shapes(check_weights_file(path, str(path)))
    info: dict[str, object] = {
        "file": str(path),
        "format": fmt,
        "parameters": sum(math.prod(s) for s in shapes.values()),
    }
    if "embedding/kernel" in shapes:  # Google ViT / hybrid
        patch, _, _, width = shapes["embedding/kernel"]
        blocks = {m.group(1) for k in shapes if (m := re.match(r"Transformer/encoderblock_(\d+)/", k))}
        scan = shapes.get("Transformer/encoderblock/LayerNorm_0/scale")
        query = next(v for k, v in shapes.items() if re.search(r"Attention_\d/query/kernel$", k))
        pos = shapes.get("Transformer/posembed_input/pos_embedding") or shapes.get("pos_embedding")
        hybrid = "conv_root/kernel" in shapes
        info.update(
            family="hybrid" if hybrid else "vit",
            width=width,
            depth=scan[0] if scan else len(blocks),
            heads=query[-2],
            patch=None if hybrid else patch,
            grid=_grid(pos),
            head_classes=shapes.get("head/kernel", (0, 0))[-1],
            pre_logits="pre_logits/kernel" in shapes,
        )
    elif "root_block/standardized_conv2d/kernel" in shapes:  # BiT
        units = [len({m.group(1) for k in shapes if (m := re.match(rf"block{b}/unit(\d+)/", k))}) for b in range(1, 5)]
        width = shapes["root_block/standardized_conv2d/kernel"][-1] // 64
        info.update(
            family="bit",
            width=width,
            depth=_bit_depth(units),
            blocks=units,
            head_classes=shapes.get("head/conv2d/kernel", (0, 0, 0, 0))[-1],
            pre_logits=False,
        )
    elif "patch_embed.proj.weight" in shapes:  # timm ViT
        width, _, patch, _ = shapes["patch_embed.proj.weight"]
        depth = len({k.split(".")[1] for k in shapes if k.startswith("blocks.")})
        info.update(
            family="vit",
            width=width,
            depth=depth,
            heads="not stored (fused qkv)",
            patch=patch,
            grid=_grid(shapes.get("pos_embed")),
            head_classes=shapes.get("head.weight", (0,))[0],
            pre_logits="pre_logits.weight" in shapes,
        )
    matches = _matching_models(path, shapes)
    info["matches"] = ", ".join(matches) or "no vitbench model"
    if info.get("heads") == "not stored (fused qkv)" and matches:
        heads = {_num_heads(name) for name in matches}
        if len(heads) == 1:
            info["heads"] = f"{heads.pop()} (from the matching architecture; a fused qkv does not store it)"
    return info


def _num_heads(model_name: str) -> int:

    spec = registry.get_model(model_name)
    assert spec.backend is not None
    with torch.device("meta"):
        model: Any = spec.backend.create(spec, num_classes=0, img_size=224)
    return int(model.blocks[0].attn.num_heads)


def _grid(pos: tuple[int, ...] | None) -> str | None:
    if not pos:
        return None

    side = grid_side(pos[-2])
    return f"{side}x{side}"


def _bit_depth(units: list[int]) -> int:
    return 3 * sum(units) + 2  # bottleneck units of 3 convs, plus the root conv and the head


def _matching_models(path: Path, shapes: dict[str, tuple[int, ...]]) -> list[str]:
    """Registered models whose tensors this file fills (the head and pre_logits aside)."""

    found = []
    for spec in registry.models().values():
        if spec.reference_only or spec.backend is None:
            continue
        try:
            if path.suffix == ".npz":
                if _npz_fits(spec, shapes):
                    found.append(spec.name)
                continue
            with torch.device("meta"):
                model = spec.backend.create(spec, num_classes=0, img_size=224)
            expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
            theirs = {k: v for k, v in shapes.items() if not k.startswith(("head.", "pre_logits."))}
            if set(expected) == set(theirs) and all(expected[k] == theirs[k] or k == "pos_embed" for k in expected):
                found.append(spec.name)
        except Exception:
            continue
    return found


def _npz_fits(spec, shapes: dict[str, tuple[int, ...]]) -> bool:
    """Cheap structural match of a Google .npz against a spec: its backend knows its own layout."""
    with torch.device("meta"):
        model = spec.backend.create(spec, num_classes=0, img_size=224)
    return bool(spec.backend.fits_npz(spec, model, shapes))


def convert(path: Path, model_name: str | None, out: Path) -> str:
    """Any supported weights file -> safetensors with timm keys (plus pre_logits when present) and
    the metadata vitbench needs; every tensor is checked against the architecture first."""
    from safetensors.torch import save

    check_weights_file(path, str(path))
    if out.suffix != ".safetensors":
        raise UserError(f"{out}: the output must be a .safetensors file")
    if out.exists() and out.resolve() == path.resolve():
        raise UserError(f"{out}: is the file being converted; name another output (vitbench never replaces its input)")
    check_out_file(out, "output")
    if model_name is None:
        matches = str(describe(path)["matches"]).split(", ")
        if len(matches) != 1 or matches[0] == "no vitbench model":
            raise UserError(f"{path}: cannot tell the architecture (matches: {', '.join(matches)}); pass --model")
        model_name = matches[0]
    spec = registry.get_model(model_name)
    assert spec.backend is not None
    state = read_state_dict(path, spec)  # read once: a Google .npz builds and loads a whole model
    model = spec.backend.create(spec, num_classes=0, img_size=spec.preprocessing.size)
    apply_state(model, spec, dict(state), path)  # the same every-tensor check a run makes
    metadata = {
        "format": "pt",
        "vitbench_model": spec.name,
        "timm_arch": spec.arch,
        "source": path.name,
        "source_sha256": sha256_file(path),
        "pre_logits": str("pre_logits.weight" in state).lower(),
    }
    converted = _sorted_header(save({k: v.contiguous() for k, v in state.items()}, metadata=metadata))
    write_atomic(out, lambda tmp: tmp.write_bytes(converted))  # whole or not at all
    return spec.name


def _sorted_header(data: bytes) -> bytes:
    """A safetensors file with its JSON header's keys sorted: safetensors writes the metadata in the
    order of a Rust hash map, which differs between processes, so one conversion gave two sha256s.
    The same keys and values re-serialised keep the header's length (padded as safetensors pads)."""
    size = int.from_bytes(data[:8], "little")
    header = json.dumps(json.loads(data[8 : 8 + size]), sort_keys=True, separators=(",", ":")).encode()
    return data[:8] + header.ljust(size, b" ") + data[8 + size :]

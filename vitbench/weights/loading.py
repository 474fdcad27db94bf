"""Weights from explicit files, checked tensor by tensor. Never a download.

`random` must be asked for by name; it is recorded as such (weights_sha256 = "random") and
marked in every table.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from vitbench.errors import UserError, one_line
from vitbench.models.backend import ModelSpec
from vitbench.weights import paper_weights
from vitbench.weights.hub import resolve_hf_hub, resolve_timm_tag
from vitbench.weights.names import HF_PREFIX, RANDOM, RANDOM_INIT_SEED, TIMM_PREFIX
from vitbench.weights.npz import npz_keys, read_npz

SUFFIXES = (".npz", ".safetensors", ".pth", ".pt", ".bin")
PRE_LOGITS = ("pre_logits.weight", "pre_logits.bias")  # the upstream representation layer, as vitbench keeps it


def build_model(
    spec: ModelSpec,
    num_classes: int,
    img_size: int,
    weights: str,
    gelu: str = "exact",
    keep_head: bool = False,
    pre_logits: bool = True,
    dropout: float = 0.0,
) -> nn.Module:
    """The backbone at `img_size` with a zero-initialised `num_classes` head, and every other tensor
    from `weights` (a checked path), or, for `random`, timm's init drawn from RANDOM_INIT_SEED.
    With `keep_head` the checkpoint's own classifier is loaded too (the eval protocol). Without
    `pre_logits` an upstream representation layer is dropped with the head (fine-tuning, B.1.1)."""
    assert spec.backend is not None
    with torch.random.fork_rng(devices=[]):  # leave the caller's RNG as it was
        torch.manual_seed(RANDOM_INIT_SEED)
        model = spec.backend.create(spec, num_classes, img_size, gelu, dropout)
    if weights != RANDOM:
        state = read_state_dict(Path(weights), spec)
        if not pre_logits:
            state = {k: v for k, v in state.items() if k not in PRE_LOGITS}
        apply_state(model, spec, state, Path(weights), keep_head)
    return model


def check_weights_arg(weights: str, spec: ModelSpec | None = None, download: bool = False) -> str:
    """Validate `--weights` early (before any work): `random`; `timm:<tag>` or `hf-hub:<repo>` from the
    Hugging Face cache, `paper:<name>` from vitbench's (each fetched first where `download`); or an
    existing file of a known format. Returns `random` or an absolute path."""
    if weights == RANDOM:
        return RANDOM
    if weights.startswith(TIMM_PREFIX):
        return str(resolve_timm_tag(weights, spec, download))
    if weights.startswith(HF_PREFIX):
        return str(resolve_hf_hub(weights, download))
    if paper_weights.is_paper_name(weights):
        return str(paper_weights.resolve(weights, spec, download))
    path = Path(weights).expanduser()
    if not path.exists():
        raise UserError(
            f"--weights {weights}: no such file (expected .npz/.safetensors/.pth, timm:<tag>, hf-hub:<repo>, "
            f"paper:<name>, or 'random')"
        )
    return str(check_weights_file(path, f"--weights {weights}").resolve())


def check_weights_file(path: Path, label: str) -> Path:
    """An existing file with a weights suffix vitbench reads; `label` names it in the error."""
    if not path.is_file():
        what = "no such file"
        if path.exists():
            what = "a folder" if path.is_dir() else "not a regular file (a device or FIFO)"
        raise UserError(f"{label}: {what}, expected a weights file ({', '.join(SUFFIXES)})")
    if path.suffix not in SUFFIXES:
        raise UserError(f"{label}: unknown format '{path.suffix}', expected one of {', '.join(SUFFIXES)}")
    return path


def read_state_dict(path: Path, spec: ModelSpec | None = None) -> dict[str, torch.Tensor]:
    """A timm-style state dict from any supported file: a Google .npz (through timm's own loader,
    which needs the architecture), a .safetensors file, or a .pth loaded with weights_only=True."""
    if path.suffix == ".npz":
        if spec is None:
            raise UserError(f"{path}: reading a Google .npz needs the model (--model)")
        return read_npz(path, spec)
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        try:
            return load_file(str(path))
        except Exception as e:  # safetensors raises its own error types for truncation / bad headers
            raise UserError(f"{path}: not a readable safetensors file, truncated or corrupt ({one_line(e)})") from None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        if "Weights only load failed" in str(e):  # torch's advice to load it otherwise was quoted without its warning
            raise UserError(
                f"{path}: holds Python objects besides tensors, which vitbench never unpickles (loading them can run "
                "code the file carries); save its state_dict, or convert it to .safetensors where you trust it"
            ) from None
        raise UserError(f"{path}: not a readable PyTorch weights file, truncated or corrupt ({one_line(e)})") from None
    for key in ("state_dict", "model", "model_ema"):  # common training-checkpoint wrappers
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
            break
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise UserError(f"{path}: expected a state dict of tensors")
    return state


def load_into(model: nn.Module, spec: ModelSpec, path: Path, keep_head: bool = False) -> None:
    """Load every tensor of `model` from `path`, except the head, which the protocols replace by a
    fresh zero-initialised layer (paper App. B.1.1), unless `keep_head`. Any missing, extra or
    mis-shaped tensor is an error naming it: never a silently random layer."""
    apply_state(model, spec, read_state_dict(path, spec), path, keep_head)


def apply_state(
    model: nn.Module, spec: ModelSpec, state: dict[str, torch.Tensor], path: Path, keep_head: bool = False
) -> None:
    """`load_into` for a state dict already read from `path` (named in the errors)."""
    assert spec.backend is not None
    head = spec.backend.head_prefix(model) + "."
    if keep_head:
        _check_head(model, state, head, path)

    def replaced(key: str) -> bool:  # the head is replaced by a fresh one, unless it is kept
        return not keep_head and key.startswith(head)

    state = {k: v for k, v in state.items() if not replaced(k)}
    _check_values(state, path)
    if PRE_LOGITS[0] in state:
        spec.backend.add_pre_logits(model, spec, state[PRE_LOGITS[0]].shape)
    _check_pos_embed(model, spec, state, path)
    try:
        state = spec.backend.adapt_state_dict(state, model)
    except (ValueError, RuntimeError) as e:  # a grid the resampler cannot read (not a square, say)
        raise UserError(
            f"{path}: cannot fit its tensors to {spec.name} ({one_line(e)}); another architecture?"
        ) from None
    expected = {k: v for k, v in model.state_dict().items() if not replaced(k)}

    missing = [k for k in expected if k not in state]
    extra = [k for k in state if k not in expected]
    if missing:
        raise UserError(
            f"{path}: no tensor '{missing[0]}'{_more(missing)} that {spec.name} needs; weights of another architecture?"
        )
    if extra:
        raise UserError(
            f"{path}: tensor '{extra[0]}'{_more(extra)} is not part of {spec.name}; weights of another architecture?"
        )
    for key, tensor in expected.items():
        if state[key].shape != tensor.shape:
            raise UserError(
                f"{path}: tensor '{key}' has shape {tuple(state[key].shape)}, {spec.name} expects "
                f"{tuple(tensor.shape)}; weights of another architecture?"
            )
        if tensor.is_floating_point() and not state[key].is_floating_point():  # load_state_dict would cast it
            raise UserError(
                f"{path}: tensor '{key}' is {str(state[key].dtype).removeprefix('torch.')}, {spec.name} expects "
                "floating-point values; saved with the wrong type?"
            )
    model.load_state_dict(state, strict=False)


def _check_values(state: dict[str, torch.Tensor], path: Path) -> None:
    """Weights holding NaN or infinity give a number that means nothing (all-NaN weights once stored
    9.91 %): refused, naming the first such tensor."""
    for key, tensor in state.items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise UserError(f"{path}: tensor '{key}' holds NaN or infinite values; a diverged or damaged checkpoint?")


def _check_pos_embed(model: nn.Module, spec: ModelSpec, state: dict[str, torch.Tensor], path: Path) -> None:
    """A position embedding must be (1, tokens, width) with the model's width before it is resampled
    to the model's grid (the resampler's own error would be a traceback)."""
    given, target = state.get("pos_embed"), getattr(model, "pos_embed", None)
    if given is None or not isinstance(target, torch.Tensor) or given.shape == target.shape:
        return
    if given.ndim != 3 or given.shape[0] != 1 or given.shape[-1] != target.shape[-1] or given.shape[1] < 2:
        raise UserError(
            f"{path}: tensor 'pos_embed' has shape {tuple(given.shape)}, {spec.name} expects (1, tokens, "
            f"{target.shape[-1]}) to resample to its grid; weights of another architecture?"
        )


def _check_head(model: nn.Module, state: dict[str, torch.Tensor], head: str, path: Path) -> None:
    """The checkpoint's own classifier must be there and have the dataset's number of classes."""
    weight = head + "weight"
    if weight not in state:
        raise UserError(f"{path}: has no classifier '{weight}'; scoring a checkpoint's own classifier needs one")
    expected = model.state_dict()[weight].shape[0]
    if state[weight].shape[0] != expected:
        raise UserError(
            f"{path}: its classifier has {state[weight].shape[0]} classes, scoring the dataset needs {expected}; "
            "the eval protocol needs a checkpoint trained on its classes (ImageNet-1k's for a robustness set)"
        )


def _more(items: list[str]) -> str:
    return f" (and {len(items) - 1} more)" if len(items) > 1 else ""


def has_pre_logits(weights: str) -> bool:
    """Whether a weights file carries the upstream representation layer (read from keys only)."""
    if weights == RANDOM:
        return False
    path = Path(weights)
    if path.suffix == ".npz":
        return any(k.endswith("pre_logits/kernel") for k in npz_keys(path))
    if path.suffix == ".safetensors":
        from safetensors import safe_open

        try:
            with safe_open(str(path), "pt") as f:
                return PRE_LOGITS[0] in f.keys()  # noqa: SIM118 (safe_open is not a dict)
        except Exception:
            return False  # unreadable: load_into reports it properly
    try:  # memory-mapped: reading the key list must not load a multi-GB checkpoint twice
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:
        state = read_state_dict(path)  # legacy (non-zip) format, or unreadable: reported properly there
    return any(PRE_LOGITS[0] in part for part in (state, *(v for v in state.values() if isinstance(v, dict))))

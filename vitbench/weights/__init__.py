"""Weights files: reading Google .npz, .safetensors, .pth and local hub tags into a backbone
(loading.py, npz.py, hub.py), and describing or converting a file (describe.py).

This package's public API (what the rest of vitbench and users import as `vitbench.weights`)."""

from vitbench.weights.loading import (
    RANDOM,
    RANDOM_INIT_SEED,
    apply_state,
    build_model,
    check_weights_arg,
    check_weights_file,
    has_pre_logits,
    load_into,
    read_state_dict,
)

__all__ = [
    "RANDOM",
    "RANDOM_INIT_SEED",
    "apply_state",
    "build_model",
    "check_weights_arg",
    "check_weights_file",
    "has_pre_logits",
    "load_into",
    "read_state_dict",
]

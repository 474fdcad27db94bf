"""Weights files: reading Google .npz, .safetensors, .pth and local hub tags into a backbone
(loading.py, npz.py, hub.py), and describing or converting a file (describe.py).

This package's public API (what the rest of vitbench and users import as `vitbench.weights`).

May import: vitbench.reference, the catalog, host, models, datasets, provenance and files; never
the engine, the protocols or anything above."""

from typing import TYPE_CHECKING

from vitbench.weights.names import RANDOM, RANDOM_INIT_SEED

if TYPE_CHECKING:
    from vitbench.weights.loading import (
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


def __getattr__(name: str):
    """The loading functions on first use: they load torch, which `vitbench.weights.RANDOM` need not."""
    if name in __all__:
        from vitbench.weights import loading

        return getattr(loading, name)
    raise AttributeError(f"module 'vitbench.weights' has no attribute {name!r}")

"""The names `--weights` gives random init and named checkpoints, without loading torch (the planner
and the views test them)."""

RANDOM = "random"
# Random-init weights are timm's init drawn from this seed, so one run_key always gives one number.
RANDOM_INIT_SEED = 0
# named checkpoints, never paths: timm tags and Hub repositories (hub.py), the paper's files (paper_weights.py)
TIMM_PREFIX, HF_PREFIX, PAPER_PREFIX = "timm:", "hf-hub:", "paper:"
PAPER = "paper"  # alone: --model's own released upstream checkpoint


def is_named(weights: str) -> bool:
    """Whether `--weights` names weights (random init or a checkpoint by name) rather than a path."""
    return weights in (RANDOM, PAPER) or weights.startswith((TIMM_PREFIX, HF_PREFIX, PAPER_PREFIX))

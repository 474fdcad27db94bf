"""The names `--weights` gives random init, without loading torch (the planner and the views test them)."""

RANDOM = "random"
# Random-init weights are timm's init drawn from this seed, so one run_key always gives one number.
RANDOM_INIT_SEED = 0

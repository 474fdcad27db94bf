"""Turning a request into stored results: planning run specs, skipping finished ones, leasing,
running them here, under torchrun, or as submitit jobs, and recording each as a shard.

May import: the protocols and everything below them; never a view, the API or the CLI."""
